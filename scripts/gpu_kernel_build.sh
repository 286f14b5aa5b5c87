# Sourced (not run) by scripts/gpu_cuda.sh, gpu_decode.sh and gpu_prefill.sh on
# the GPU machine, after scripts/gpu_env.sh: uses PREBUILT's binaries (below)
# or builds test_cuda and
# bench_attention in $BUILD (default build-gpu) with CMake. When another module
# does not build right now, it compiles only what the CUDA tests need
# (kernels, the CPU reference, numerics) with nvcc directly. Sets TEST and
# BENCH; logs to $OUT/build.log; exits the caller when neither build worked.
BUILD=${BUILD:-build-gpu}
# PREBUILT=DIR: test_cuda and bench_attention built elsewhere (this
# project's development machine has the same nvcc), used when they run here
# (nothing is then built); DIR/lib may hold shared libraries the image lacks.
PREBUILT=${PREBUILT:-}
[ -n "$PREBUILT" ] && [ -d "$PREBUILT/lib" ] && export LD_LIBRARY_PATH="$PREBUILT/lib:${LD_LIBRARY_PATH:-}"
if [ -n "$PREBUILT" ] && "$PREBUILT/test_cuda" --gtest_list_tests >/dev/null 2>&1 &&
   ! ldd "$PREBUILT/bench_attention" | grep -q "not found"; then
  echo "using prebuilt binaries in $PREBUILT" | tee "$OUT/build.log"
  TEST=$PREBUILT/test_cuda
  BENCH=$PREBUILT/bench_attention
  ls -la $TEST $BENCH
  return 0
fi
ok=1
cmake -S . -B $BUILD -G Ninja -DFP8KV_CUDA=ON -DFP8KV_WERROR=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
  cmake --build $BUILD --target test_cuda bench_attention -j16 >>"$OUT/build.log" 2>&1 || ok=0
TEST=$BUILD/tests/test_cuda
BENCH=$BUILD/bench/bench_attention
if [ $ok = 0 ]; then
  echo "CMake build failed (errors below); direct nvcc fallback"; grep -E "error" "$OUT/build.log" | head -20
  P=${FP8KV_PREFIX:-/tmp/fp8kv-prefix}
  F="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -I$P/usr/include -Xcompiler=-fopenmp"
  mkdir -p $BUILD/direct
  nvcc $F src/backend/cuda/*.cu src/backend/cuda/*/*.cu src/backend/cpu/kv_ops.cpp src/numerics/fp8.cpp tests/cuda/*.cpp \
    -L$P/usr/lib/x86_64-linux-gnu -lgtest -lgtest_main -lgomp -o $BUILD/direct/test_cuda >>"$OUT/build.log" 2>&1 &
  nvcc $F src/backend/cuda/*.cu src/backend/cuda/*/*.cu src/numerics/fp8.cpp bench/cuda/bench_attention.cu \
    -o $BUILD/direct/bench_attention >>"$OUT/build.log" 2>&1 &
  wait
  TEST=$BUILD/direct/test_cuda
  BENCH=$BUILD/direct/bench_attention
fi
ls -la $TEST $BENCH || { tail -40 "$OUT/build.log"; exit 1; }
