# Sourced (not run) by scripts/gpu_bench.sh, gpu_prefill_engine.sh and
# gpu_step.sh on the GPU machine, with the CMake targets as arguments
# (`source scripts/gpu_engine_build.sh fp8kv test_cuda_ops ...`), after the
# caller set BUDGET_S. Sets up $OUT, the clock helpers (now, phase, left),
# the carried dependencies (gpu_env.sh) and $OUT/env.txt, then builds the
# targets in build-gpu (Release, -DFP8KV_WERROR=OFF: g++ 13 there). Sets
# BUILD and FP8KV; exits the caller when fp8kv did not build.
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
T0=$(date +%s)
now() { echo $(( $(date +%s) - T0 )); }
phase() { echo "== $1 ($(now) s)"; }
left() { echo $(( BUDGET_S - $(now) )); }
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/env.txt"
nvcc --version | tail -1 | tee -a "$OUT/env.txt"
# The runner's FP8KV_GIT_COMMIT when set: the device copy's .git can lag the tree.
{ [ -n "${FP8KV_GIT_COMMIT:-}" ] && echo "commit $FP8KV_GIT_COMMIT (FP8KV_GIT_COMMIT)" || git log -1 --format='commit %h %s' 2>/dev/null; } |
  tee -a "$OUT/env.txt"

phase build
BUILD=build-gpu
cmake -S . -B $BUILD -G Ninja -DFP8KV_CUDA=ON -DFP8KV_WERROR=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
  cmake --build $BUILD --target "$@" -j16 -- -k 0 >>"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; }
FP8KV=$BUILD/fp8kv
[ -x $FP8KV ] || { echo "build failed: no $FP8KV"; exit 1; }
