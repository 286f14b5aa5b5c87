#!/usr/bin/env bash
# A newcomer's first command: sets up, builds the fp8kv binary alone, and runs
# the main job on the bundled default model: generation with an fp8 (e4m3) KV
# cache. Extra args go to `fp8kv generate`.
# MODEL=DIR picks another model, e.g. the bundled Qwen3.5-style hybrid:
#   MODEL=models/fp8kv-mini-gdn scripts/run.sh
# (FP8KV_MODEL, the older name, still works; MODEL wins when both are set.)
# With a usable GPU (nvidia-smi -L works) the CUDA backend is built in build/;
# without one, a CPU-only build (no CUDA, tests or benchmarks) in build-run/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh run
if nvidia-smi -L >/dev/null 2>&1; then
  B=build
  TARGETS=fp8kv BUILD_DIR=$B ./scripts/build.sh >&2
else
  B=build-run
  echo "run.sh: no usable GPU: CPU-only build in $B" >&2
  TARGETS=fp8kv BUILD_DIR=$B ./scripts/build.sh -DFP8KV_CUDA=OFF -DFP8KV_TESTS=OFF -DFP8KV_BENCH=OFF >&2
fi
MODEL=${MODEL:-${FP8KV_MODEL:-}}
if [ -z "$MODEL" ]; then
  MODEL=models/fp8kv-mini
  if [ ! -f "$MODEL/config.json" ]; then
    echo "run.sh: bundled model $MODEL not present; inspecting the small test checkpoint instead" >&2
    exec "./$B/fp8kv" inspect tests/data/tiny_llama
  fi
elif [ ! -f "$MODEL/config.json" ]; then
  echo "run.sh: MODEL=$MODEL: no config.json there" >&2
  exit 2
fi
"./$B/fp8kv" inspect "$MODEL" >&2
exec "./$B/fp8kv" generate "$MODEL" --kv-cache-dtype fp8 \
  --prompt "${PROMPT:-The old lighthouse keeper looked out over the sea and}" --max-tokens "${MAX_TOKENS:-64}" "$@"
