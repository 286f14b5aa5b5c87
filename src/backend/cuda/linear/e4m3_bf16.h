// Two e4m3 bytes -> two bf16 without a conversion instruction, for the fp8
// GEMV's tensor-core fragments (gemv_fp8.cu). A byte b = s.eeee.mmm becomes
// the bf16 bits (b & 0x80) << 8 | (b & 0x7f) << 4: sign to bit 15, the four
// exponent bits to the low four bits of bf16's exponent field and the three
// mantissa bits to the top of its mantissa. That bf16 is exactly
// e4m3(b) * 2^-120 for every finite byte, subnormals included (e = 0: bf16's
// own subnormal 0.mmm x 2^-126 against e4m3's 0.mmm x 2^-6), zeros keep
// their sign. The NaN bytes (S.1111.111) become the finite +-480 x 2^-120:
// see gemv_fp8.cu.
//
// Per pair it is one PRMT (each byte into its own 16-bit half, sign-extended:
// the selector's msb replicates a byte's sign bit), one shift and one AND:
// (sext16(b) << 4) keeps the magnitude at bits 4-10 and the sign at bits
// 11-15; the mask keeps bits 4-10 and 15 of each half (and drops the bits the
// low half's shift carries into the high one). Host and device share the
// constants; the host emulates PRMT (tests/cuda_ops/test_fp8_linear.cpp
// checks all 256 bytes).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FP8KV_E4M3_HD __host__ __device__ __forceinline__
#else
#define FP8KV_E4M3_HD inline
#endif

namespace fp8kv::cuda::e4m3 {

constexpr uint32_t kSelLo = 0x9180u;  // bytes b0, sign(b0), b1, sign(b1)
constexpr uint32_t kSelHi = 0xB3A2u;  // bytes b2, sign(b2), b3, sign(b3)
constexpr uint32_t kMask = 0x87f087f0u;
constexpr int kBiasExp = 120;  // the bf16 holds e4m3 * 2^-kBiasExp

// prmt.b32 d, a, 0, sel (the default mode: each selector nibble picks a
// byte of {a, 0}; its msb replicates that byte's sign bit instead).
FP8KV_E4M3_HD uint32_t prmt_zero(uint32_t a, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(d) : "r"(a), "r"(sel));
  return d;
#else
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nib = (sel >> (4 * i)) & 0xfu, idx = nib & 7u;
    uint32_t byte = idx < 4 ? (a >> (8 * idx)) & 0xffu : 0u;
    if (nib & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
    d |= byte << (8 * i);
  }
  return d;
#endif
}

// Bytes 0, 1 (kHalf 0) or 2, 3 (kHalf 1) of w as a bf16x2 word (low half:
// the lower byte), each e4m3 * 2^-120.
template <int kHalf>
FP8KV_E4M3_HD uint32_t to_bf16x2_biased(uint32_t w) {
  return (prmt_zero(w, kHalf == 0 ? kSelLo : kSelHi) << 4) & kMask;
}

}  // namespace fp8kv::cuda::e4m3
