#include "backend/cuda/membw.h"

#include <algorithm>
#include <vector>

#include "backend/cuda/common.cuh"

namespace fp8kv::cuda {

bool device_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

double d2d_copy_bytes_per_s(size_t bytes, int reps) {
  if (!device_present()) throw std::runtime_error("d2d_copy_bytes_per_s: no CUDA device");
  reps = std::max(reps, 1);
  void *src = nullptr, *dst = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  std::vector<float> ms;
  try {
    FP8KV_CUDA_CHECK(cudaMalloc(&src, bytes));
    FP8KV_CUDA_CHECK(cudaMalloc(&dst, bytes));
    FP8KV_CUDA_CHECK(cudaMemset(src, 1, bytes));
    FP8KV_CUDA_CHECK(cudaEventCreate(&a));
    FP8KV_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 2; ++i) FP8KV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
    for (int r = 0; r < reps; ++r) {
      FP8KV_CUDA_CHECK(cudaEventRecord(a, 0));
      FP8KV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
      FP8KV_CUDA_CHECK(cudaEventRecord(b, 0));
      FP8KV_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0.0f;
      FP8KV_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
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
