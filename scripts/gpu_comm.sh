#!/usr/bin/env bash
# GPU machine (nvidia-h200-x2): build the collectives (backend/cuda/comm_*),
# run their tests (CommTcp / CommNccl / CommMultiProcess in test_comm) and the
# all-reduce benchmark, print a short table. Logs under $OUT. ~1-2 minutes.
#   run(command="bash scripts/gpu_comm.sh", kind="nvidia-h200-x2", carry=[".debs"])
# NVLink multicast stays off (docs/design.md "Collectives"): NCCL_NVLS_ENABLE=0
# here, and the communicator factories set it again before NCCL starts.
# Build: nvcc/g++ directly on the comm sources only (fast, independent of the
# other modules); BUILD=cmake uses CMake's test_cuda + bench_allreduce instead.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8kv-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
T0=$(date +%s)
phase() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
source scripts/gpu_env.sh
P=${FP8KV_PREFIX:-/tmp/fp8kv-prefix}
{ nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; nvidia-smi topo -m; nvcc --version | tail -1; } 2>&1 | tee "$OUT/env.txt"
phase build
B=build-gpu-comm
mkdir -p $B
if [ "${BUILD:-direct}" = cmake ]; then
  cmake -S . -B $B -G Ninja -DFP8KV_CUDA=ON -DFP8KV_WERROR=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
    cmake --build $B --target test_cuda bench_allreduce -j16 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  TEST=$B/tests/test_cuda
  BENCH=$B/bench/bench_allreduce
else
  NCCL_INC=$(dirname "$(ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2>/dev/null | head -1)")
  NCCL_LIB=$(ls /usr/local/cuda/lib64/libnccl.so /usr/local/cuda/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so \
             /usr/lib/x86_64-linux-gnu/libnccl.so.2 2>/dev/null | head -1)
  echo "nccl: include $NCCL_INC, library $NCCL_LIB" | tee -a "$OUT/env.txt"
  [ -n "$NCCL_INC" ] && [ -n "$NCCL_LIB" ] || { echo "NCCL not found"; exit 1; }
  CU=/usr/local/cuda
  CXXF="-std=c++20 -O2 -Wall -Wextra -DFP8KV_HAVE_NCCL=1 -Isrc -I$NCCL_INC -I$CU/include -I$P/usr/include"
  (
    nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -I$P/usr/include -c src/backend/cuda/comm/oneshot.cu -o $B/comm_oneshot.o &
    g++ $CXXF -c src/backend/cuda/comm/nccl.cpp -o $B/comm_nccl.o &
    g++ $CXXF -c src/backend/cuda/comm_tcp.cpp -o $B/comm_tcp.o &
    g++ $CXXF -Itests/cuda -c tests/cuda/test_comm.cpp -o $B/test_comm.o &
    g++ $CXXF -c bench/cuda/bench_allreduce.cpp -o $B/bench_allreduce.o &
    wait
  ) >"$OUT/build.log" 2>&1
  LIBS="-L$CU/lib64 -L$P/usr/lib/x86_64-linux-gnu $NCCL_LIB -lcudart_static -ldl -lrt -lpthread -Wl,-rpath,$(dirname "$NCCL_LIB")"
  g++ $B/test_comm.o $B/comm_*.o -o $B/test_comm $LIBS -lgtest -lgtest_main >>"$OUT/build.log" 2>&1
  g++ $B/bench_allreduce.o $B/comm_*.o -o $B/bench_allreduce $LIBS >>"$OUT/build.log" 2>&1
  TEST=$B/test_comm
  BENCH=$B/bench_allreduce
fi
ls -la $TEST $BENCH || { tail -40 "$OUT/build.log"; exit 1; }
phase test
timeout 240 $TEST --gtest_filter='Comm*' --gtest_output=json:"$OUT/test_comm.json" 2>&1 | tee "$OUT/test_comm.log" |
  grep -vE "^\[ (RUN|       OK) " | tail -40
test_rc=${PIPESTATUS[0]}
phase bench
timeout 120 $BENCH --json "$OUT/bench_allreduce.jsonl" 2>&1 | tee "$OUT/bench_allreduce.txt"
bench_rc=${PIPESTATUS[0]}
phase table
echo "test_comm rc=$test_rc  bench_allreduce rc=$bench_rc"
grep -E "one-shot:|^\[  (PASSED|FAILED) |tests ran" "$OUT/test_comm.log"
grep -E "^ +[0-9]+ \||faster than" "$OUT/bench_allreduce.txt"
phase done
[ "$test_rc" = 0 ] && [ "$bench_rc" = 0 ]
