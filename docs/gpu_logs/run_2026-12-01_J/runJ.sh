#!/usr/bin/env bash
# Run J (session 6): fp8 ws producer with one page lookup per two keys: prefill tests + bench.
cd .wt/j && ln -sfn ../../.debs .debs
T0=$SECONDS
source scripts/gpu_env.sh
source scripts/gpu_kernel_build.sh
echo "build $((SECONDS-T0)) s"
timeout 40 $BENCH prefill-wgmma 2>&1 | grep '"prefill"' | tee $OUT/bench.txt
FP8KV_WGMMA_CFG=wsp timeout 30 $BENCH prefill-wgmma 2>&1 | grep '"prefill"' | tee -a $OUT/bench.txt
timeout 30 python3 tools/bench_sdpa.py --prefill-only 2>&1 | grep sdpa_prefill | tee -a $OUT/bench.txt
timeout 100 $TEST --gtest_filter='Kernels/CudaPrefill.*/wgmma:CudaWgmma.*' > $OUT/test.log 2>&1; echo "test rc=$? at $((SECONDS-T0)) s"
grep -E "worst|OK|FAILED|PASSED" $OUT/test.log | head -20
