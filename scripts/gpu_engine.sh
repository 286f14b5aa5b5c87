#!/usr/bin/env bash
# GPU machine: build and run the CUDA forward-op and CudaBackend tests
# (tests/cuda_ops), and, when the engine wires `--backend cuda`, compare
# `fp8kv score` on models/fp8kv-mini between --backend cuda and cpu.
#   run(command="cd .wt/cudabe && ln -sfn ../../models models && ln -sfn ../../.debs .debs && bash scripts/gpu_engine.sh",
#       carry=[".wt/cudabe", ".debs"])
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
T0=$(date +%s)
phase() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
nvcc --version | tail -1 | tee -a "$OUT/env.txt"
phase build
BUILD=build-gpu
cmake -S . -B $BUILD -G Ninja -DFP8KV_CUDA=ON -DFP8KV_WERROR=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
  cmake --build $BUILD --target test_cuda_ops fp8kv -j16 >>"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; }
phase test
if [ -x $BUILD/tests/test_cuda_ops ]; then
  $BUILD/tests/test_cuda_ops 2>&1 | tee "$OUT/test_cuda_ops.log" |
    grep -vE "^\[ (RUN|       OK) " | tail -60
fi
phase engine
if [ -x $BUILD/fp8kv ] && grep -q make_cuda_backend src/engine/backend_factory.cpp 2>/dev/null && [ -d models/fp8kv-mini ]; then
  mkdir -p /tmp/fp8kv-score  # scratch (only a few files come back from $OUT)
  bash scripts/gpu_engine_score.sh $BUILD/fp8kv models/fp8kv-mini /tmp/fp8kv-score 2>&1 | tee "$OUT/score.log" | tail -30
else
  echo "engine not wired for --backend cuda in this tree: score comparison skipped"
fi
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/test_cuda_ops.log" 2>/dev/null
phase done
