// Host-side status checks for the CUDA ops and backend: CUDA runtime and
// cuBLASLt calls throw std::runtime_error naming the call, file:line and the
// library's message.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fp8kv::cuda::detail {

[[noreturn]] inline void throw_cuda(const char* call, const char* file, int line, cudaError_t e) {
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                           cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
[[noreturn]] void throw_cublas(const char* call, const char* file, int line, int status);

}  // namespace fp8kv::cuda::detail

#define FP8KV_CU(call)                                                                        \
  do {                                                                                        \
    const cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) ::fp8kv::cuda::detail::throw_cuda(#call, __FILE__, __LINE__, e_);  \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration) at once.
#define FP8KV_CU_LAUNCH() FP8KV_CU(cudaGetLastError())

#define FP8KV_CUBLAS(call)                                                                             \
  do {                                                                                                 \
    const int s_ = static_cast<int>(call);                                                             \
    if (s_ != 0) ::fp8kv::cuda::detail::throw_cublas(#call, __FILE__, __LINE__, s_);                   \
  } while (0)
