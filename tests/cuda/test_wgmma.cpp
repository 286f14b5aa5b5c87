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

#include "backend/cuda/attention/prefill_wgmma.h"
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

// Max |err|/tol of a GPU matrix against a.b (a: rows x n, b: cols x n or
// n x cols), and the first offending element.
struct Check {
  double worst = 0;
  int bad = 0, first_i = -1, first_j = -1;
  double gpu = 0, cpu = 0;
};
Check check_matmul(const std::vector<float>& got, const Operand& a, const Operand& b, int rows, int cols, int n,
                   bool b_is_n_by_cols) {
  Check c;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      double ref = 0, mag = 0;
      for (int k = 0; k < n; ++k) {
        const double bv = b_is_n_by_cols ? b.val[k * cols + j] : b.val[j * n + k];
        ref += a.val[i * n + k] * bv;
        mag += std::fabs(a.val[i * n + k] * bv);
      }
      const double tol = n * std::ldexp(1.0, -23) * mag + 1e-30;
      const double g = got[i * cols + j];
      const double e = std::isfinite(g) ? std::fabs(g - ref) / tol : 1e30;
      if (e > 1.0 && c.bad++ == 0) { c.first_i = i; c.first_j = j; c.gpu = g; c.cpu = ref; }
      c.worst = std::max(c.worst, e);
    }
  return c;
}

TEST(CudaWgmma, QkFromSwizzledSharedMemoryMatchesCpu) {
  FP8KV_REQUIRE_GPU();
  std::mt19937_64 rng(test_seed());
  for (bool f16 : {false, true}) {
    const Operand q = random_operand(rng, 64 * 128, f16), k = random_operand(rng, 64 * 128, f16);
    const Check c = check_matmul(cuda::wgmma_selftest_qk(q.bits, k.bits, f16), q, k, 64, 64, 128, false);
    EXPECT_EQ(c.bad, 0) << (f16 ? "f16" : "bf16") << ": " << c.bad << " of 4096 wrong; first S[" << c.first_i << "]["
                        << c.first_j << "] gpu " << c.gpu << " cpu " << c.cpu;
    std::printf("wgmma qk %s worst |err|/tol = %.3g\n", f16 ? "f16" : "bf16", c.worst);
  }
}

TEST(CudaWgmma, PvWithRegisterATransposedBMatchesCpu) {
  FP8KV_REQUIRE_GPU();
  std::mt19937_64 rng(test_seed() + 1);
  for (bool f16 : {false, true}) {
    const Operand p = random_operand(rng, 64 * 64, f16), v = random_operand(rng, 64 * 128, f16);
    const Check c = check_matmul(cuda::wgmma_selftest_pv(p.bits, v.bits, f16), p, v, 64, 128, 64, true);
    EXPECT_EQ(c.bad, 0) << (f16 ? "f16" : "bf16") << ": " << c.bad << " of 8192 wrong; first O[" << c.first_i << "]["
                        << c.first_j << "] gpu " << c.gpu << " cpu " << c.cpu;
    std::printf("wgmma pv %s worst |err|/tol = %.3g\n", f16 ? "f16" : "bf16", c.worst);
    if (c.bad) {  // diagnostic for the next fix: does the LBO/SBO-swapped descriptor match?
      const Check s = check_matmul(cuda::wgmma_selftest_pv(p.bits, v.bits, f16, true), p, v, 64, 128, 64, true);
      std::printf("wgmma pv %s DIAG with LBO/SBO swapped: %d wrong\n", f16 ? "f16" : "bf16", s.bad);
    }
  }
}

}  // namespace
}  // namespace fp8kv::cudatest
