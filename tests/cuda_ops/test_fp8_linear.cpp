// The linear kernels on fp8 (e4m3) weights (ops.h "fp8 weights"): the decode
// GEMV and the dequantize + cuBLASLt path, every scale granularity, against
// a double-precision reference of the same bf16 x and the exactly
// dequantized weight (numerics/fp8_weights.h dequantize_fp8_weight_rows).
//
// Tolerances. GEMV: fp32 products of exact values (bf16 x e4m3 fits fp32's
// mantissa) summed in fp32, one multiply by the scale per 16-column chunk,
// so |y - ref| <= gamma_K * sum_k |x_k w_k| with gamma_K = K u / (1 - K u),
// u = 2^-24 (the textbook dot-product bound; K covers every rounding on a
// path: 16 chunk adds, the scale multiply, the chunk and warp adds).
// Dequantize + GEMM: each weight is rounded once to bf16 (relative <= 2^-9),
// then cuBLASLt's fp32 accumulation of exact bf16 products: |y - ref| <=
// (2^-9 + gamma_K) * sum_k |x_k w_k|.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/linear/routes.h"
#include "cuda_ops_util.h"
#include "numerics/fp8.h"
#include "numerics/fp8_weights.h"

namespace fp8kv {
namespace {

using namespace cudaops_test;

struct Fp8Case {
  int64_t N, K;
  ScaleGranularity g;
};

// A device fp8 matrix made from random normals, as a checkpoint would hold it.
struct DeviceFp8 {
  Fp8QuantizedWeight host;
  cuda::DeviceBuffer q, s;
  cuda::DeviceMatrix m;
  std::vector<float> dequant;  // [N][K] exact
};

DeviceFp8 make_fp8(std::mt19937_64& rng, int64_t N, int64_t K, ScaleGranularity g) {
  DeviceFp8 d;
  // Rows of very different magnitudes, so per-channel / per-block scales matter.
  std::vector<float> w = randn(rng, static_cast<size_t>(N * K), 0.05f);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < K; ++c) w[r * K + c] *= static_cast<float>(1 + (r * 7 + c / 128) % 5);
  d.host = quantize_weight_e4m3(w.data(), N, K, g);
  d.q = to_device(d.host.q);
  d.s = to_device(d.host.scales);
  d.m.rows = N;
  d.m.cols = K;
  d.m.fp8 = d.q.as<const uint8_t>();
  d.m.scale = d.s.as<const float>();
  if (g == ScaleGranularity::channel) d.m.scale_ld = 1;
  if (g == ScaleGranularity::block128) {
    d.m.scale_row_shift = 7;
    d.m.scale_ld = (K + 127) / 128;
    d.m.scale_k_step = 1;
  }
  d.dequant.resize(static_cast<size_t>(N * K));
  dequantize_fp8_weight_rows(d.host.q.data(), Fp8WeightScales{d.host.scales.data(), g}, N, K, 0, N, d.dequant.data());
  return d;
}

// Checks y [T][N] against the fp64 reference with bound coef(K) * sum |x w|.
void expect_close(const std::vector<float>& y, const std::vector<float>& xf, const DeviceFp8& d, int64_t T,
                  const std::vector<float>& bias, const std::vector<float>& y0, double rel, const char* what) {
  const int64_t N = d.m.rows, K = d.m.cols;
  double worst = 0.0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(xf[t * K + k]) * d.dequant[n * K + k];
        ref += p;
        mag += std::fabs(p);
      }
      if (!bias.empty()) ref += bias[n];
      if (!y0.empty()) ref += y0[t * N + n];
      // + 2 roundings of the bias / accumulate adds.
      const double tol = rel * mag + 2 * 0x1.0p-24 * std::fabs(ref) + 1e-30;
      const double err = std::fabs(y[t * N + n] - ref);
      worst = std::max(worst, err / tol);
      ASSERT_LE(err, tol) << what << " T=" << T << " N=" << N << " K=" << K << " at t=" << t << " n=" << n
                          << ": got " << y[t * N + n] << ", reference " << ref;
    }
  std::printf("%s T=%lld N=%lld K=%lld: worst error %.3f of the bound\n", what, static_cast<long long>(T),
              static_cast<long long>(N), static_cast<long long>(K), worst);
}

double gamma(int64_t K) {
  const double u = 0x1.0p-24;
  return static_cast<double>(K) * u / (1.0 - static_cast<double>(K) * u);
}

TEST(CudaFp8Linear, GemvAndSlicedGemmMatchReferenceEveryGranularity) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const Fp8Case cases[] = {{256, 512, ScaleGranularity::block128},  {200, 384, ScaleGranularity::block128},
                           {96, 272, ScaleGranularity::block128},   {130, 256, ScaleGranularity::channel},
                           {64, 4096, ScaleGranularity::tensor},    {3000, 1024, ScaleGranularity::block128}};
  cuda::Gemm gemm;
  gemm.reserve_fp8_scratch();
  for (const Fp8Case& c : cases) {
    DeviceFp8 d = make_fp8(rng, c.N, c.K, c.g);
    for (int64_t T : {1, 2, 5, 8, 9, 40}) {
      const std::vector<uint16_t> xb = to_bf16(randn(rng, static_cast<size_t>(T * c.K), 1.0f));
      const std::vector<float> xf = from_bf16(xb);
      const std::vector<float> bias = randn(rng, static_cast<size_t>(c.N), 0.5f);
      const std::vector<float> y0 = randn(rng, static_cast<size_t>(T * c.N), 0.5f);
      cuda::DeviceBuffer dx = to_device(xb), db = to_device(bias);
      // GEMV rows go through gemv_fp8; more rows through the dequantized slices.
      const double rel = T <= cuda::kGemvMaxRows ? gamma(c.K) : 0x1.0p-9 + gamma(c.K);
      for (bool acc : {false, true}) {
        cuda::DeviceBuffer dy = to_device(acc ? y0 : std::vector<float>(static_cast<size_t>(T * c.N), 0.0f));
        gemm.linear(dx.as<uint16_t>(), T, d.m, acc ? db.as<float>() : nullptr, dy.as<float>(), acc, nullptr);
        expect_close(to_host<float>(dy, static_cast<size_t>(T * c.N)), xf, d, T,
                     acc ? bias : std::vector<float>{}, acc ? y0 : std::vector<float>{}, rel,
                     acc ? "fp8 linear (bias, accumulate)" : "fp8 linear");
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The dequantization is one fp32 multiply and one RNE rounding to bf16 per
// weight: bitwise the host's f32_to_bf16(e4m3 * scale).
TEST(CudaFp8Linear, DequantizeRowsIsBitwiseTheHostRounding) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  for (ScaleGranularity g : {ScaleGranularity::tensor, ScaleGranularity::channel, ScaleGranularity::block128}) {
    DeviceFp8 d = make_fp8(rng, 300, 400 - 400 % 16, g);
    const int64_t r0 = 130, n = 150, K = d.m.cols;
    cuda::DeviceBuffer out(static_cast<size_t>(n * K) * 2);
    cuda::dequantize_fp8_rows_bf16(d.m, r0, n, out.as<uint16_t>(), nullptr);
    const auto got = to_host<uint16_t>(out, static_cast<size_t>(n * K));
    for (int64_t i = 0; i < n * K; ++i)
      ASSERT_EQ(got[i], f32_to_bf16(d.dequant[(r0 + i / K) * K + i % K]))
          << "granularity " << scale_granularity_name(g) << " element " << i;
  }
}

TEST(CudaFp8Linear, FitsRejectsBadShapes) {
  cuda::DeviceMatrix m;
  m.rows = 4;
  m.cols = 24;  // not a multiple of 16
  m.fp8 = reinterpret_cast<const uint8_t*>(256);
  m.scale = reinterpret_cast<const float*>(256);
  EXPECT_FALSE(cuda::gemv_fp8_fits(reinterpret_cast<const uint16_t*>(256), 1, m));
  m.cols = 32;
  EXPECT_TRUE(cuda::gemv_fp8_fits(reinterpret_cast<const uint16_t*>(256), 1, m));
  EXPECT_FALSE(cuda::gemv_fp8_fits(reinterpret_cast<const uint16_t*>(256), cuda::kGemvMaxRows + 1, m));
  m.scale = nullptr;
  EXPECT_FALSE(cuda::gemv_fp8_fits(reinterpret_cast<const uint16_t*>(256), 1, m));
}

}  // namespace
}  // namespace fp8kv
