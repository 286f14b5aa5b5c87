// The chunked delta rule's TF32 products (the CUDA state pass,
// backend/cuda/gdn/gdn.h): TF32 rounding as the kernel's cvt.rna does, and
// the statistical bound the CUDA tests hold the chunked form to
// (tests/cuda_ops/test_gdn_cuda.cpp says what it assumes;
// tests/backend_cpu/test_gdn.cpp checks a host model of the kernel's
// roundings against it).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace fp8kv::test_util {

inline constexpr double kUt = 0x1.0p-11;  // TF32's unit roundoff (10 mantissa bits, round to nearest)

// Relative RMS error allowed for the outputs and states of a sequence whose
// states went through `chunks` chunks of the chunked form.
inline double tf32_rel_rms_bound(int chunks) { return 2 * std::sqrt(2.0 * (chunks + 1)) * kUt; }

// x rounded to TF32, to nearest with ties away from zero (cvt.rna.tf32.f32;
// finite x): half a TF32 ulp added to the magnitude bits, the low 13 cut.
inline float tf32_rna(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// A TF32 value x (|x| <= 1) as the kernel stores q, KD and A^T: an f16,
// exact from 2^-14 up; below, rounded to f16's subnormal grid of 2^-24
// (to nearest even, as __floats2half2_rn).
inline float f16_of_tf32(float x) {
  if (std::fabs(x) >= 0x1.0p-14f) return x;
  return static_cast<float>(std::nearbyint(static_cast<double>(x) * 0x1.0p24) * 0x1.0p-24);
}

}  // namespace fp8kv::test_util
