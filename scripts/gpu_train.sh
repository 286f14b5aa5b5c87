#!/usr/bin/env bash
# Train the bundled model (models/fp8kv-mini) on the GPU machine.
# Called by the lead through the device tool with carry ["corpus"]:
#   bash scripts/gpu_train.sh [extra train_bundled.py args]
# corpus/ is built here first by tools/prepare_corpus.sh. Needs $OUT (the
# device tool sets it). What comes back (<= 8 files):
#   $OUT/fp8kv-mini/{config.json, generation_config.json, model-0000{1,2}-of-00002.safetensors,
#                    model.safetensors.index.json, tokenizer.json, tokenizer_config.json}
#   $OUT/summary.json   (params, tokens seen, loss, held-out ppl, needle accuracy)
# Copy them back with:
#   cp <files_at>/fp8kv-mini/* models/fp8kv-mini/ && cp <files_at>/summary.json models/fp8kv-mini/train_summary.json
# A checkpoint lands in $OUT every ~60 s, so even a timed-out run returns a model.
set -uo pipefail
cd "$(dirname "$0")/.."
NAME=${NAME:-fp8kv-mini}
OUT=${OUT:-out}
mkdir -p "$OUT"
test -s corpus/train.txt || { echo "corpus/train.txt missing: run tools/prepare_corpus.sh here and carry [\"corpus\"]" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
PYTHONUNBUFFERED=1 python3 tools/train_bundled.py --corpus corpus --out "models/$NAME" \
  --export-dir "$OUT" --minutes "${MINUTES:-5.5}" --deadline-minutes "${DEADLINE:-9.3}" "$@"
rc=$?
echo "train_bundled.py exit $rc"
echo "--- files under \$OUT (these come back):"
find "$OUT" -type f -printf '%s\t%p\n' | sort -k2
echo "--- models/$NAME on the GPU machine:"
ls -l "models/$NAME"
exit $rc
