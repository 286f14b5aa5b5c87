#!/usr/bin/env bash
# GPU machine: produce every golden reference in one call. Each step runs if
# its script exists; outputs land in the tree and are packed into
# $OUT/goldens.tar.gz (unpack at the repo root here, then commit).
# Usage (device run): bash scripts/gpu_goldens.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
declare -a SUMMARY=()
step() {
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "$OUT/log_$name.txt" 2>&1; then r=ok; else r="FAIL($?)"; fi
  SUMMARY+=("$(printf '%-22s %-9s %4ds' "$name" "$r" $((SECONDS - t0)))")
  tail -n 15 "$OUT/log_$name.txt"
}
fp8() {
  mkdir -p tests/golden/numerics
  nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Itools tools/gen_fp8_golden.cu -o /tmp/gen_fp8_golden &&
  /tmp/gen_fp8_golden /tmp/fp8_cuda_satfinite.bin &&
  gzip -9 -c /tmp/fp8_cuda_satfinite.bin > tests/golden/numerics/fp8_cuda_satfinite.bin.gz
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step fp8 fp8
[ -f tools/gen_tokenizer_goldens.py ] && [ ! -f tests/golden/tokenizer/manifest.json ] && step tokenizer python3 tools/gen_tokenizer_goldens.py
[ -f tools/gen_model_goldens.py ] && step models python3 tools/gen_model_goldens.py
[ -f tools/check_safetensors_interop.py ] && step safetensors python3 tools/check_safetensors_interop.py
[ -f tools/gen_stats_goldens.py ] && step stats python3 tools/gen_stats_goldens.py
for extra in ${GOLDEN_EXTRA:-}; do step "$(basename "$extra" .py)" python3 "$extra"; done
# CPU build of fp8kv here (deps from the carried .debs) for checks that run the CLI.
build_cpu() {
  source scripts/gpu_env.sh &&
  cmake -S . -B build-gpucpu -G Ninja -DFP8KV_CUDA=OFF -DFP8KV_TESTS=OFF -DFP8KV_BENCH=OFF -DFP8KV_WERROR=OFF >/dev/null &&
  cmake --build build-gpucpu -j16 --target fp8kv
}
if [ -f tools/check_injected_checkpoint.py ]; then
  step build_cpu build_cpu
  step injected bash -c "source scripts/gpu_env.sh; python3 tools/check_injected_checkpoint.py --fp8kv build-gpucpu/fp8kv"
fi
tar czf "$OUT/goldens.tar.gz" tests/golden
ls -la "$OUT"
echo "== goldens summary"
printf '%s\n' "${SUMMARY[@]}"
