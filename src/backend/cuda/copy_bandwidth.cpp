#include "backend/cuda/copy_bandwidth.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/ops.h"

namespace fp8kv::cuda {

double d2d_copy_bytes_per_s(size_t bytes, int reps) {
  if (!cuda_device_available()) throw std::runtime_error("d2d_copy_bytes_per_s: no CUDA device");
  reps = std::max(reps, 1);
  void *src = nullptr, *dst = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  std::vector<float> ms;
  try {
    FP8KV_CU(cudaMalloc(&src, bytes));
    FP8KV_CU(cudaMalloc(&dst, bytes));
    FP8KV_CU(cudaMemset(src, 1, bytes));
    FP8KV_CU(cudaEventCreate(&a));
    FP8KV_CU(cudaEventCreate(&b));
    for (int i = 0; i < 2; ++i) FP8KV_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
    for (int r = 0; r < reps; ++r) {
      FP8KV_CU(cudaEventRecord(a, 0));
      FP8KV_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
      FP8KV_CU(cudaEventRecord(b, 0));
      FP8KV_CU(cudaEventSynchronize(b));
      float t = 0.0f;
      FP8KV_CU(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
  } catch (...) {
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    cudaFree(src);
    cudaFree(dst);
    throw;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(src);
  cudaFree(dst);
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(bytes) / (1e-3 * ms[ms.size() / 2]);
}

}  // namespace fp8kv::cuda
