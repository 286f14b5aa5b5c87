#!/usr/bin/env bash
# Sets up, builds, and runs the main job on the bundled default model:
# generation with an fp8 (e4m3) KV cache. Extra args go to `fp8kv generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
SKIP_TESTS=1 ./scripts/build.sh >&2
MODEL=${FP8KV_MODEL:-models/fp8kv-mini}
if [ -f "$MODEL/config.json" ]; then
  ./build/fp8kv inspect "$MODEL" >&2
  exec ./build/fp8kv generate "$MODEL" --kv-cache-dtype fp8 \
    --prompt "${PROMPT:-The old lighthouse keeper looked out over the sea and}" --max-tokens "${MAX_TOKENS:-64}" "$@"
else
  echo "run.sh: bundled model $MODEL not present; inspecting the small test checkpoint instead" >&2
  exec ./build/fp8kv inspect tests/data/tiny_llama
fi
