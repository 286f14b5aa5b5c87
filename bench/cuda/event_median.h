// Event-timed median shared by the CUDA GEMM/GEMV benchmarks (bench_linear,
// bench_prefill_gemm): 3 warm-up calls, then 5 batches of `reps` calls on
// stream st, each batch timed by two events; returns the median batch's time
// per call in microseconds.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/check.h"

namespace fp8kv::bench {

template <class Run>
double median_call_us(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int reps, Run&& run) {
  for (int r = 0; r < 3; ++r) run();
  std::vector<float> ms;
  for (int rep = 0; rep < 5; ++rep) {
    FP8KV_CU(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; ++r) run();
    FP8KV_CU(cudaEventRecord(e1, st));
    FP8KV_CU(cudaEventSynchronize(e1));
    float t = 0;
    FP8KV_CU(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / reps);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

}  // namespace fp8kv::bench
