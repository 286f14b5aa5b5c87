// The wgmma building blocks of the Hopper prefill kernel (prefill_wgmma.cu)
// against a CPU matmul: S = Q K^T with both operands in 128B-swizzled shared
// memory (wgmma m64n64k16, K-major descriptors), and O = P V with P in
// registers and V N-major (transposed descriptor, wgmma m64n128k16). Inputs
// are exact in the operand type (bf16 or f16), so only the fp32 accumulation
// differs from the double-precision CPU sum: |err| <= n * 2^-23 * sum |a_k b_k|
// (n = 128 or 64 terms; 2^-23 covers the tensor core's accumulation, which
// may truncate rather than round). A wrong descriptor or fragment layout
// moves values between rows/columns: errors of order the values themselves.
#include <cmath>
#include <cstdio>

#include "backend/cuda/prefill_wgmma.h"
#include "cuda_test_util.h"
#include "numerics/fp8.h"

namespace fp8kv::cudatest {
namespace {

// Exact 16-bit codes of k / 32, k in [-96, 96] (exact in bf16 and f16).
struct Operand {
  std::vector<uint16_t> bits;
  std::vector<double> val;
};
uint16_t f16_bits_exact(float x) {  // x is 0 or a normal f16 value with <= 11 significant bits
  if (x == 0.0f) return 0;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, e = (u >> 23) & 0xffu, man = u & 0x7fffffu;
  return static_cast<uint16_t>(sign | ((e - 127 + 15) << 10) | (man >> 13));
}
Operand random_operand(std::mt19937_64& rng, size_t n, bool f16) {
  std::uniform_int_distribution<int> u(-96, 96);
  Operand o;
  for (size_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(u(rng)) / 32.0f;
    o.bits.push_back(f16 ? f16_bits_exact(x) : f32_to_bf16(x));
    o.val.push_back(x);
  }
  return o;
}

TEST(CudaWgmma, QkFromSwizzledSharedMemoryMatchesCpu) {
  FP8KV_REQUIRE_GPU();
  std::mt19937_64 rng(test_seed());
  for (bool f16 : {false, true}) {
    const Operand q = random_operand(rng, 64 * 128, f16), k = random_operand(rng, 64 * 128, f16);
    const std::vector<float> s = cuda::wgmma_selftest_qk(q.bits, k.bits, f16);
    double worst = 0;
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        double ref = 0, mag = 0;
        for (int d = 0; d < 128; ++d) {
          ref += q.val[i * 128 + d] * k.val[j * 128 + d];
          mag += std::fabs(q.val[i * 128 + d] * k.val[j * 128 + d]);
        }
        const double tol = 128 * std::ldexp(1.0, -23) * mag + 1e-30;
        const double e = std::fabs(s[i * 64 + j] - ref) / tol;
        ASSERT_LE(e, 1.0) << (f16 ? "f16" : "bf16") << " S[" << i << "][" << j << "] gpu " << s[i * 64 + j]
                          << " cpu " << ref;
        worst = std::max(worst, e);
      }
    std::printf("wgmma qk %s worst |err|/tol = %.3f\n", f16 ? "f16" : "bf16", worst);
  }
}

TEST(CudaWgmma, PvWithRegisterATransposedBMatchesCpu) {
  FP8KV_REQUIRE_GPU();
  std::mt19937_64 rng(test_seed() + 1);
  for (bool f16 : {false, true}) {
    const Operand p = random_operand(rng, 64 * 64, f16), v = random_operand(rng, 64 * 128, f16);
    const std::vector<float> o = cuda::wgmma_selftest_pv(p.bits, v.bits, f16);
    double worst = 0;
    for (int i = 0; i < 64; ++i)
      for (int d = 0; d < 128; ++d) {
        double ref = 0, mag = 0;
        for (int j = 0; j < 64; ++j) {
          ref += p.val[i * 64 + j] * v.val[j * 128 + d];
          mag += std::fabs(p.val[i * 64 + j] * v.val[j * 128 + d]);
        }
        const double tol = 64 * std::ldexp(1.0, -23) * mag + 1e-30;
        const double e = std::fabs(o[i * 128 + d] - ref) / tol;
        ASSERT_LE(e, 1.0) << (f16 ? "f16" : "bf16") << " O[" << i << "][" << d << "] gpu " << o[i * 128 + d]
                          << " cpu " << ref;
        worst = std::max(worst, e);
      }
    std::printf("wgmma pv %s worst |err|/tol = %.3f\n", f16 ? "f16" : "bf16", worst);
  }
}

}  // namespace
}  // namespace fp8kv::cudatest
