// What the bf16 and the fp8 decode GEMVs (gemv.cu, gemv_fp8.cu) share: the
// block shape, the PDL wait of the weight-streaming kernels, the bf16 ->
// fp32 unpacking of a 16-byte chunk, and the host dispatch from run-time
// rows / split to the kernels' template arguments.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "backend/cuda/ops/launch.cuh"

namespace fp8kv::cuda::gemv {

constexpr int kWarps = 8;   // per block
constexpr int kUnroll = 4;  // 16-byte weight chunks in flight per lane

// The GEMV kernels are launched as programmatic dependents (launch.cuh): a
// block may start while the previous kernel still runs (when that kernel
// triggered early: the norm, RoPE and activation kernels do), loads its
// first weight tiles (W never depends on an earlier kernel), and only then
// waits (pdl_wait) before it reads x or y. After the wait it triggers its
// own dependents (the next norm / RoPE / activation kernel, PDL-launched
// with the GEMV on), which wait for this grid in turn.
__device__ __forceinline__ void wait_for_inputs() {
  pdl_wait();
  pdl_trigger();
}

__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// f(std::integral_constant<int, T>{}) for T = rows (1..8; others: nothing).
template <class F>
void for_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: break;
  }
}

// f(std::integral_constant<int, S>{}) for S = split (1, 2, 4 or 8; else
// std::invalid_argument naming `what`).
template <class F>
void for_split(int split, const char* what, F&& f) {
  switch (split) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default:
      throw std::invalid_argument(std::string("cuda::") + what + ": split must be 1, 2, 4 or 8, got " +
                                  std::to_string(split));
  }
}

}  // namespace fp8kv::cuda::gemv
