// One K/V element -> its cache code, exactly as the store kernel writes it
// (store.cu; CPU reference numerics/fp8.h): shared by store.cu and the store
// fused into qkv_prep (ops/qkv.cuh), so both write the same bytes.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace fp8kv::cuda::detail {

// saturate(rne(x / s)) with the IEEE division's result. A NaN input stores
// the canonical 0x7f, as the hardware conversion and the CPU reference do.
template <int DT>
__device__ __forceinline__ uint32_t quant_fp8_exact(float x, float s) {
  const float y = __fdiv_rn(x, s);
  uint32_t r = __nv_cvt_float_to_fp8(y, __NV_SATFINITE, DT == kE5m2 ? __NV_E5M2 : __NV_E4M3);
  return r;
}

// int8 code (per-token-head int8) of a quotient q, as numerics/fp8.h
// f32_to_int8_sat: round to nearest even, clamp to [-127, 127], NaN -> 0;
// the byte is the two's complement.
__device__ __forceinline__ uint32_t int8_code(float q) {
  if (q != q) return 0u;
  return static_cast<uint32_t>(max(-127, min(127, __float2int_rn(q)))) & 0xffu;
}
// The code of x with scale s through the IEEE division, for every cache code
// of one byte (fp8 kinds, per-token-head e4m3, int8).
template <int DT>
__device__ __forceinline__ uint32_t quant_code_exact(float x, float s) {
  if constexpr (DT == kI8Pth) return int8_code(__fdiv_rn(x, s));
  else return quant_fp8_exact<DT == kE5m2 ? kE5m2 : kE4m3>(x, s);
}

// fp32 -> bf16 bits exactly as numerics/fp8.h f32_to_bf16 (RNE, NaN keeps
// sign and top payload bits, quieted).
__device__ __forceinline__ uint32_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

}  // namespace fp8kv::cuda::detail
