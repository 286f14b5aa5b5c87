// The linear kernels on fp8 (e4m3) weights (ops.h "fp8 weights"): the decode
// GEMV and the dequantize + cuBLASLt path, every scale granularity, against
// a double-precision reference of the same bf16 x and the exactly
// dequantized weight (numerics/fp8_weights.h dequantize_fp8_weight_rows).
//
// Tolerances. GEMV (gemv_fp8, tensor cores): each e4m3 weight enters a bf16
// mma.sync as e4m3 * 2^-120 (exact), each product with a bf16 x is exact,
// and one mma k16 step adds its 16 products and the fp32 accumulator C as a
// fused sum: every addend truncated below 2^(E - F), E the largest addend's
// exponent but at least -126 (an empty C counts as 2^-126), F >= 23
// fraction bits (MMA-Sim, the bit-accurate model of Xie et al., has 25 on
// Hopper; 23 is assumed here), then the sum rounded toward zero to fp32
// with gradual underflow. A product's significand is >= 1/8 (a subnormal
// e4m3 as a subnormal bf16, 0.mmm with mmm >= 1), so 2^E <= max(8 M, 2^-126)
// with M the largest addend, and one step errs by at most 17 2^-23 (8 M) +
// 2^-23 |D| + 18 2^-149 <= 137 2^-23 S_g + 18 2^-149, S_g = the 128-column
// group's sum |x_k e4m3_k 2^-120| (which bounds M and |D| to first order).
// A group is 8 steps into a fresh accumulator: <= 1096 2^-23 S_g + 144
// 2^-149; times 2^120 (exact) and the group's scale s_g, summed over the
// groups: 1096 2^-23 sum_k |x_k w_k| + 144 2^-29 sum_g s_g. Then fp32 (u =
// 2^-24): one fmaf per group (L = ceil(K / 128) of them) and up to 7 adds
// of the split-K partials, each <= u sum |x w|:
//   |y - ref| <= (2192 + L + 7) u sum_k |x_k w_k| + 144 2^-29 sum_g s_g
// (~1.3e-4 relative: tighter than the SIMT kernel's K u at K = 4096, looser
// at K = 256; a wrong scale, row, k permutation or tail is off by ~100%).
// Dequantize + GEMM: each weight is rounded once to bf16 (relative <= 2^-9),
// then cuBLASLt's fp32 accumulation of exact bf16 products: |y - ref| <=
// (2^-9 + gamma_K) * sum_k |x_k w_k|.
//
// W8A8 (Gemm::linear_w8a8): the activation quantization kernel equals the
// host's quantize_activations_e4m3 bit for bit (codes and scales); the GEMM
// is checked against a double reference built from the same e4m3 codes and
// scales of both operands (every product exact), so only the accumulation
// is measured. Its bound: cuBLASLt runs with fast accumulation off, which
// promotes the tensor cores' partial sums into fp32 registers every 128 k
// (4 MMAs of k = 32; the 1x128 / 128x128 block scales are applied at that
// point, and CUTLASS's 2xAcc promotion interval is 4 MMAs). Inside such a
// chunk the Hopper FP8 tensor core aligns each MMA's 32 products and the
// accumulator to the largest exponent, keeps the top 14 bits of each and
// stores the sum with 14 bits too (DeepSeek-V3 report 3.5.2; 13 mantissa
// bits measured, DeepGEMM issue 176). One MMA step then errs by less than
// 33 truncations of 2^-13 of its largest addend plus 2^-13 of its sum, each
// <= S_c = sum over the chunk of |x_k w_k|: <= 34 2^-13 S_c per step, 4
// steps per chunk. The promotion adds, the scale multiplies and the
// epilogue are fp32: (L + 3) 2^-24 sum |x_k w_k| (L = ceil(K / 128)):
//   |y - ref| <= (136 2^-13 + (L + 3) 2^-24) sum_k |x_k w_k|
// plus 2^-23 |ref| for the bias / accumulate adds (and 2^-8 |ref| for a
// bf16 output). That worst case is ~1.7% of sum |x w|: it catches a wrong
// scale layout, padding or row (errors of order 100%), not the last bits;
// the test prints the worst error against it and against the fp32-only
// part (what full fp32 accumulation would allow), so the tensor cores'
// share is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/linear/e4m3_bf16.h"
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

// Row n's scale of 128-column group g (the DeviceMatrix layout, ops.h).
double group_scale(const DeviceFp8& d, int64_t n, int64_t g) {
  return d.host.scales[static_cast<size_t>((n >> d.m.scale_row_shift) * d.m.scale_ld + g * d.m.scale_k_step)];
}

// Checks y [T][N] against the fp64 reference with bound rel * sum |x w| (+
// abs_per_group * sum_g s_g: the GEMV's absolute floor, header comment).
void expect_close(const std::vector<float>& y, const std::vector<float>& xf, const DeviceFp8& d, int64_t T,
                  const std::vector<float>& bias, const std::vector<float>& y0, double rel, const char* what,
                  double abs_per_group = 0.0) {
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
      double floor = 0.0;
      for (int64_t g = 0; abs_per_group > 0.0 && g < (K + 127) / 128; ++g) floor += abs_per_group * group_scale(d, n, g);
      // + 2 roundings of the bias / accumulate adds.
      const double tol = rel * mag + floor + 2 * 0x1.0p-24 * std::fabs(ref) + 1e-30;
      const double err = std::fabs(y[t * N + n] - ref);
      worst = std::max(worst, err / tol);
      ASSERT_LE(err, tol) << what << " T=" << T << " N=" << N << " K=" << K << " at t=" << t << " n=" << n
                          << ": got " << y[t * N + n] << ", reference " << ref;
    }
  std::printf("%s T=%lld N=%lld K=%lld: worst error %.3f of the bound\n", what, static_cast<long long>(T),
              static_cast<long long>(N), static_cast<long long>(K), worst);
}

uint32_t f32_bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

double gamma(int64_t K) {
  const double u = 0x1.0p-24;
  return static_cast<double>(K) * u / (1.0 - static_cast<double>(K) * u);
}

// The fp8 GEMV's bound (header comment): relative part and absolute floor
// per 128-column group (times the group's scale).
double gemv_rel(int64_t K) { return static_cast<double>(2192 + (K + 127) / 128 + 7) * 0x1.0p-24; }
constexpr double kGemvAbsPerGroup = 144 * 0x1.0p-29;

TEST(CudaFp8Linear, GemvAndSlicedGemmMatchReferenceEveryGranularity) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  // Every split of the GEMV (gemv_fp8_split, checked below): 1 (200 x 384
  // and smaller), 2 (256 x 512), 4 (3000 x 1024), 8 (64 x 4096, 300 x 2064).
  // K not a multiple of 128 (384, 2064: a partial last scale group; 272: a
  // last group of one 16-byte piece) and N not a multiple of the 16-row tile
  // (200, 130, 300, 3000).
  const Fp8Case cases[] = {{256, 512, ScaleGranularity::block128},  {200, 384, ScaleGranularity::block128},
                           {96, 272, ScaleGranularity::block128},   {130, 256, ScaleGranularity::channel},
                           {64, 4096, ScaleGranularity::tensor},    {3000, 1024, ScaleGranularity::block128},
                           {300, 2064, ScaleGranularity::channel}};
  EXPECT_EQ(cuda::gemv_fp8_split(200, 384), 1);
  EXPECT_EQ(cuda::gemv_fp8_split(256, 512), 2);
  EXPECT_EQ(cuda::gemv_fp8_split(3000, 1024), 4);
  EXPECT_EQ(cuda::gemv_fp8_split(64, 4096), 8);
  EXPECT_EQ(cuda::gemv_fp8_split(300, 2064), 8);
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
      const bool gemv = T <= cuda::kGemvMaxRows;
      const double rel = gemv ? gemv_rel(c.K) : 0x1.0p-9 + gamma(c.K);
      for (bool acc : {false, true}) {
        cuda::DeviceBuffer dy = to_device(acc ? y0 : std::vector<float>(static_cast<size_t>(T * c.N), 0.0f));
        gemm.linear(dx.as<uint16_t>(), T, d.m, acc ? db.as<float>() : nullptr, dy.as<float>(), acc, nullptr);
        expect_close(to_host<float>(dy, static_cast<size_t>(T * c.N)), xf, d, T,
                     acc ? bias : std::vector<float>{}, acc ? y0 : std::vector<float>{}, rel,
                     acc ? "fp8 linear (bias, accumulate)" : "fp8 linear", gemv ? kGemvAbsPerGroup : 0.0);
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

// The GEMV's e4m3 -> bf16 bit trick (backend/cuda/linear/e4m3_bf16.h, its
// host path: the same selectors and mask, PRMT emulated): for every byte
// pair of a word, each finite e4m3 value comes out as exactly e4m3 *
// 2^-120 in bf16 (signed zeros, subnormals and +-448 included); the NaN
// bytes come out as +-480 * 2^-120 (the kernel's documented difference).
TEST(CudaFp8Linear, E4m3ToBf16BitTrickIsExact) {
  namespace e = cuda::e4m3;
  for (uint32_t b = 0; b < 256; ++b) {
    const float want = (b & 0x7f) == 0x7f ? ((b & 0x80) ? -480.0f : 480.0f) : e4m3_to_f32(static_cast<uint8_t>(b));
    for (int pos = 0; pos < 4; ++pos) {
      const uint32_t w = (0x5aa5c33cu & ~(0xffu << (8 * pos))) | (b << (8 * pos));  // other bytes: noise
      const uint32_t h = pos < 2 ? e::to_bf16x2_biased<0>(w) : e::to_bf16x2_biased<1>(w);
      const uint16_t bits = static_cast<uint16_t>(pos % 2 ? h >> 16 : h & 0xffffu);
      const float got = std::ldexp(bf16_to_f32(bits), e::kBiasExp);
      ASSERT_EQ(f32_bits_of(got), f32_bits_of(want)) << "byte " << b << " at " << pos << ": " << got << " vs " << want;
    }
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
  // The fused gate|up kernel holds a gate and an up tile of S warps each in
  // a block of 8 warps: not at split 8.
  m.scale = reinterpret_cast<const float*>(256);
  m.rows = 64;
  m.cols = 1024;
  ASSERT_EQ(cuda::gemv_fp8_split(m.rows, m.cols), 4);
  EXPECT_TRUE(cuda::gemv_fp8_gated_act_fits(reinterpret_cast<const uint16_t*>(256), 1, m));
  m.cols = 4096;
  ASSERT_EQ(cuda::gemv_fp8_split(m.rows, m.cols), 8);
  EXPECT_FALSE(cuda::gemv_fp8_gated_act_fits(reinterpret_cast<const uint16_t*>(256), 1, m));
}

// The fp8 gate|up GEMV with the activation fused (gemv_fp8_gated_act) writes
// bitwise what gemv_fp8 followed by the activation kernel writes: every
// granularity and activation, with and without a bias, at 1 and 2 rows, I
// not a multiple of the 16-row tile (so each up row sits at another place
// of its tile than in gemv_fp8's tiles of the [2I][K] matrix), K not a
// whole number of 128-column scale groups, and each split the fused kernel
// takes (1, 2, 4: both kernels take gemv_fp8_split of the same matrix).
TEST(CudaFp8Linear, GemvGatedActMatchesTwoKernels) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int64_t I = 203;
  auto db = to_device(randn(rng, 2 * I, 0.5f));
  for (const auto& [K, split] : {std::pair<int64_t, int>{272, 1}, {528, 2}, {1040, 4}})
  for (ScaleGranularity g : {ScaleGranularity::tensor, ScaleGranularity::channel, ScaleGranularity::block128}) {
    ASSERT_EQ(cuda::gemv_fp8_split(2 * I, K), split) << "K=" << K;
    DeviceFp8 w = make_fp8(rng, 2 * I, K, g);
    for (int T = 1; T <= cuda::kGemvGatedActMaxRows; ++T)
      for (Activation act : {Activation::silu, Activation::gelu_tanh, Activation::gelu})
        for (bool bias : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "K=" << K << " g=" << static_cast<int>(g) << " T=" << T
                                            << " act=" << static_cast<int>(act) << " bias=" << bias);
          auto dx = to_device(to_bf16(randn(rng, static_cast<size_t>(T * K), 1.0f)));
          ASSERT_TRUE(cuda::gemv_fp8_gated_act_fits(dx.as<uint16_t>(), T, w.m));
          const float* bp = bias ? db.as<float>() : nullptr;
          auto gu = to_device(std::vector<float>(static_cast<size_t>(T * 2 * I), 0.0f));
          auto two = to_device(std::vector<uint16_t>(static_cast<size_t>(T * I), 0));
          auto one = to_device(std::vector<uint16_t>(static_cast<size_t>(T * I), 0));
          cuda::gemv_fp8(dx.as<uint16_t>(), T, w.m, bp, gu.as<float>(), false, nullptr);
          cuda::gated_act(act, gu.as<float>(), gu.as<float>() + I, 2 * I, T, I, two.get(), true, nullptr);
          cuda::gemv_fp8_gated_act(act, dx.as<uint16_t>(), T, w.m, bp, one.as<uint16_t>(), nullptr);
          const auto a = to_host<uint16_t>(two, static_cast<size_t>(T * I));
          const auto b = to_host<uint16_t>(one, static_cast<size_t>(T * I));
          EXPECT_EQ(a, b);
          EXPECT_NE(std::count(a.begin(), a.end(), uint16_t{0}), static_cast<long>(a.size()));  // not all zero
        }
    auto dx3 = to_device(to_bf16(randn(rng, static_cast<size_t>(3 * K), 1.0f)));
    EXPECT_FALSE(cuda::gemv_fp8_gated_act_fits(dx3.as<uint16_t>(), 3, w.m));  // past kGemvGatedActMaxRows
  }
}

// ---- W8A8 -------------------------------------------------------------------

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// Rows with the awkward cases (the host test tests/numerics/
// test_fp8_activations.cpp has the same): zero rows with -0 and a NaN, a
// NaN among normals, one huge value, denormal inputs, a group whose amax is
// a denormal (amax / 448 underflows to 0), values near the fp32 maximum.
std::vector<float> awkward_rows(std::mt19937_64& rng, int64_t T, int64_t K) {
  std::vector<float> x = randn(rng, static_cast<size_t>(T * K), 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    float* r = x.data() + t * K;
    switch (t % 9) {
      case 0: std::fill(r, r + K, 0.0f); r[K / 3] = -0.0f; break;
      case 1: std::fill(r, r + K, 0.0f); r[K - 1] = std::nanf(""); break;
      case 2: r[5] = std::nanf(""); break;
      case 3: r[K / 2] = 3.0e38f; break;
      case 4: for (int64_t c = 0; c < K; ++c) r[c] *= 1e-39f; break;
      case 5: for (int64_t c = 0; c < K; ++c) r[c] = (c % 3 ? 1.0f : -1.0f) * 1.4e-45f * static_cast<float>(c % 7); break;
      case 6: for (int64_t c = 0; c < K; ++c) r[c] *= 1e30f; break;
      case 7: for (int64_t c = 0; c < K; ++c) r[c] *= static_cast<float>(1 + c % 129); break;  // uneven groups
      default: break;
    }
  }
  return x;
}

// quantize_rows_e4m3 against the host function: codes and scales bitwise,
// f32 and bf16 inputs, gathered rows, padded codes rows (K % 16 != 0), and
// the scale layouts of the direct / padded / tail GEMMs.
TEST(CudaW8a8, QuantizeRowsIsBitwiseTheHostFunction) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  for (int64_t K : {128, 200, 272, 4096}) {
    const int64_t Kc = round_up(K, 16);
    for (int64_t group : {int64_t{128}, K}) {
      const int64_t G = (K + group - 1) / group;
      for (int64_t T : {1, 5, 33}) {
        const int64_t q4 = cuda::Gemm::kW8a8Rows;
        const int64_t T_pad = round_up(T, q4), S = T + 3;  // S source rows, T gathered
        const std::vector<float> src = awkward_rows(rng, S, K);
        std::vector<int32_t> rows(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) rows[t] = static_cast<int32_t>((t * 5 + 2) % S);
        for (bool f32 : {true, false}) {
          for (bool gather : {false, true}) {
            // The values the kernel sees (bf16 inputs widen exactly).
            const std::vector<uint16_t> src_b = to_bf16(src);
            const std::vector<float> seen_src = f32 ? src : from_bf16(src_b);
            std::vector<float> seen(static_cast<size_t>(T * K));
            for (int64_t t = 0; t < T; ++t)
              std::copy_n(seen_src.begin() + (gather ? rows[t] : t) * K, K, seen.begin() + t * K);
            std::vector<uint8_t> q(static_cast<size_t>(T * K));
            std::vector<float> sc(static_cast<size_t>(T * G));
            quantize_activations_e4m3(seen.data(), T, K, group, q.data(), sc.data());
            cuda::DeviceBuffer dx = f32 ? to_device(src) : to_device(src_b);
            cuda::DeviceBuffer dr = to_device(rows);
            // n_main: T_pad (one padded GEMM), T - T % q4 (+ a q4-row tail), or T (T % q4 == 0).
            for (int64_t n_main : {T_pad, T - T % q4}) {
              if (n_main == T - T % q4 && T % q4 == 0) continue;
              cuda::DeviceBuffer codes(static_cast<size_t>(T_pad * Kc)), main(static_cast<size_t>(G * n_main + 1) * 4),
                  tail(static_cast<size_t>(G * q4) * 4);
              FP8KV_CU(cudaMemset(codes.get(), 0xee, codes.bytes()));
              const cuda::W8a8ScaleOut so{main.as<float>(), n_main, tail.as<float>(), T_pad - n_main};
              cuda::quantize_rows_e4m3(dx.get(), f32, gather ? dr.as<int32_t>() : nullptr, T, T_pad, K, Kc, group,
                                       codes.as<uint8_t>(), so, nullptr);
              const auto got = to_host<uint8_t>(codes, static_cast<size_t>(T_pad * Kc));
              const auto gm = to_host<float>(main, static_cast<size_t>(G * n_main));
              const auto gt = to_host<float>(tail, static_cast<size_t>(G * q4));
              auto slot = [&](int64_t t, int64_t g) {
                return t < n_main ? gm[g * n_main + t] : gt[g * (T_pad - n_main) + t - n_main];
              };
              for (int64_t t = 0; t < T_pad; ++t) {
                for (int64_t c = 0; c < Kc; ++c) {
                  const uint8_t want = t < T && c < K ? q[t * K + c] : 0;
                  ASSERT_EQ(got[t * Kc + c], want) << "K=" << K << " group=" << group << " T=" << T << " f32=" << f32
                                                   << " gather=" << gather << " n_main=" << n_main << " t=" << t
                                                   << " c=" << c;
                }
                for (int64_t g = 0; g < G; ++g) {
                  const float want = t < T ? sc[t * G + g] : 0.0f;
                  ASSERT_EQ(f32_bits_of(slot(t, g)), f32_bits_of(want))
                      << "scale K=" << K << " group=" << group << " T=" << T << " f32=" << f32 << " t=" << t
                      << " g=" << g << ": " << slot(t, g) << " vs " << want;
                }
              }
            }
          }
        }
      }
    }
  }
}

std::string first_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int64_t ld) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i])
      return "row " + std::to_string(static_cast<int64_t>(i) / ld) + " col " + std::to_string(static_cast<int64_t>(i) % ld) +
             ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
  return "none";
}

// gated_act_quantize_e4m3 (the down projection's quantization fused into the
// MLP activation) against the two kernels it replaces, gated_act_bf16_in
// into out (bf16 or f32) and quantize_rows_e4m3 of out: codes (every byte of
// [T_pad][Kc], the padding rows and columns included) and scales (both
// scale layouts, the padded and the tail GEMM's) bitwise. I = 14336 (the
// Llama-3.1-8B MLP), 272 (a partial last group), 200 (Kc = 208: a padded
// down weight); 1x128 groups and per token; gate / up with the awkward
// values (NaN, -0, huge, denormal) of awkward_rows.
TEST(CudaW8a8, GatedActQuantizeIsBitwiseTwoKernels) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int64_t q4 = cuda::Gemm::kW8a8Rows;
  for (int64_t K : {int64_t{14336}, int64_t{272}, int64_t{200}}) {
    const int64_t Kc = round_up(K, 16);
    for (int64_t T : {9, 17, 64, 300}) {
      const int64_t T_pad = round_up(T, q4);
      std::vector<float> gu_f = awkward_rows(rng, T, 2 * K);
      for (int64_t t = 0; t < T; ++t)  // up: plain normals (the awkward values sit in gate and up alike otherwise)
        if (t % 2 == 1) {
          const std::vector<float> u = randn(rng, static_cast<size_t>(K), 2.0f);
          std::copy(u.begin(), u.end(), gu_f.begin() + t * 2 * K + K);
        }
      cuda::DeviceBuffer gu = to_device(to_bf16(gu_f));
      const auto* g = gu.as<uint16_t>();
      for (int64_t group : {int64_t{128}, K}) {
        const int64_t G = (K + group - 1) / group;
        for (Activation act : {Activation::silu, Activation::gelu_tanh, Activation::gelu})
          for (bool out_bf16 : {true, false})
            for (int64_t n_main : {T_pad, T - T % q4}) {
              if (n_main == T - T % q4 && T % q4 == 0) continue;
              SCOPED_TRACE(::testing::Message() << "K=" << K << " T=" << T << " group=" << group << " act="
                                                << static_cast<int>(act) << " out_bf16=" << out_bf16
                                                << " n_main=" << n_main);
              cuda::DeviceBuffer out(static_cast<size_t>(T * K) * (out_bf16 ? 2 : 4));
              cuda::DeviceBuffer c1(static_cast<size_t>(T_pad * Kc)), c2(static_cast<size_t>(T_pad * Kc));
              cuda::DeviceBuffer m1(static_cast<size_t>(G * n_main + 1) * 4), m2(static_cast<size_t>(G * n_main + 1) * 4);
              cuda::DeviceBuffer t1(static_cast<size_t>(G * q4) * 4), t2(static_cast<size_t>(G * q4) * 4);
              // Different garbage in each: a byte either kernel leaves unwritten differs.
              for (auto* b : {&c1, &m1, &t1}) FP8KV_CU(cudaMemset(b->get(), 0xee, b->bytes()));
              for (auto* b : {&c2, &m2, &t2}) FP8KV_CU(cudaMemset(b->get(), 0x11, b->bytes()));
              const cuda::W8a8ScaleOut s1{m1.as<float>(), n_main, t1.as<float>(), T_pad - n_main};
              const cuda::W8a8ScaleOut s2{m2.as<float>(), n_main, t2.as<float>(), T_pad - n_main};
              cuda::gated_act_bf16_in(act, g, g + K, 2 * K, T, K, out.get(), out_bf16, nullptr);
              cuda::quantize_rows_e4m3(out.get(), !out_bf16, nullptr, T, T_pad, K, Kc, group, c1.as<uint8_t>(), s1,
                                       nullptr);
              cuda::gated_act_quantize_e4m3(act, g, g + K, 2 * K, out_bf16, T, T_pad, K, Kc, group,
                                            c2.as<uint8_t>(), s2, nullptr);
              const auto a = to_host<uint8_t>(c1, static_cast<size_t>(T_pad * Kc));
              const auto b = to_host<uint8_t>(c2, static_cast<size_t>(T_pad * Kc));
              ASSERT_TRUE(a == b) << "codes differ, first at " << first_diff(a, b, Kc);
              EXPECT_GT(std::count_if(a.begin(), a.end(), [](uint8_t v) { return v != 0 && v != 0x80; }),
                        static_cast<long>(a.size() / 8));  // real codes (awkward rows aside)
              EXPECT_EQ(to_host<uint32_t>(m1, static_cast<size_t>(G * n_main)),
                        to_host<uint32_t>(m2, static_cast<size_t>(G * n_main)));
              if (n_main < T_pad) {
                EXPECT_EQ(to_host<uint32_t>(t1, static_cast<size_t>(G * q4)),
                          to_host<uint32_t>(t2, static_cast<size_t>(G * q4)));
              }
            }
      }
    }
  }
}

// rmsnorm_residual_e4m3 (the W8A8 GEMM's quantization fused into the norm
// in front of it: CudaBackend::add_rmsnorm_for) against the two kernels it
// replaces, rmsnorm_residual into out (bf16 or f32) and quantize_rows_e4m3
// of out: the residual h, the codes and the scales bitwise. n = 4096 and
// 5120 (the 8B and 27B hidden sizes: 16 and 20 elements per thread), 8192
// (the widest), 1040 (per token only: n % 128 != 0); with and without the
// residual delta; rows of plain normals, outlier columns and the awkward
// values (NaN, -0, huge, denormal) of awkward_rows.
TEST(CudaW8a8, NormQuantizeIsBitwiseTwoKernels) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  for (int n : {4096, 5120, 8192, 1040}) {
    for (int64_t T : {12, 64, 300}) {
      std::vector<float> h = randn(rng, static_cast<size_t>(T * n), 1.0f);
      for (int64_t t = 0; t < T; t += 7) h[t * n + (t * 37) % n] *= 300.0f;  // outlier columns
      const std::vector<float> odd = awkward_rows(rng, 2, n);
      std::copy(odd.begin(), odd.end(), h.begin() + (T - 2) * n);
      const std::vector<float> delta = randn(rng, static_cast<size_t>(T * n), 0.5f);
      std::vector<float> w = randn(rng, static_cast<size_t>(n), 1.0f);
      cuda::DeviceBuffer dd = to_device(delta), dw = to_device(w);
      for (int64_t group : {int64_t{128}, int64_t{n}}) {
        if (group == 128 && n % 128 != 0) continue;
        const int64_t G = n / group;
        for (bool out_bf16 : {true, false})
          for (bool with_delta : {true, false}) {
            SCOPED_TRACE(::testing::Message() << "n=" << n << " T=" << T << " group=" << group
                                              << " out_bf16=" << out_bf16 << " delta=" << with_delta);
            cuda::DeviceBuffer h1 = to_device(h), h2 = to_device(h);
            cuda::DeviceBuffer out(static_cast<size_t>(T * n) * (out_bf16 ? 2 : 4));
            cuda::DeviceBuffer c1(static_cast<size_t>(T * n)), c2(static_cast<size_t>(T * n));
            cuda::DeviceBuffer s1(static_cast<size_t>(G * T) * 4), s2(static_cast<size_t>(G * T) * 4);
            for (auto* b : {&c1, &s1}) FP8KV_CU(cudaMemset(b->get(), 0xee, b->bytes()));
            for (auto* b : {&c2, &s2}) FP8KV_CU(cudaMemset(b->get(), 0x11, b->bytes()));
            const float* dp = with_delta ? dd.as<float>() : nullptr;
            cuda::rmsnorm_residual(h1.as<float>(), dp, nullptr, dw.as<float>(), 1e-5f, T, n, out.get(), out_bf16,
                                   nullptr);
            cuda::quantize_rows_e4m3(out.get(), !out_bf16, nullptr, T, T, n, n, group, c1.as<uint8_t>(),
                                     cuda::W8a8ScaleOut{s1.as<float>(), T, nullptr, 0}, nullptr);
            cuda::rmsnorm_residual_e4m3(h2.as<float>(), dp, dw.as<float>(), 1e-5f, T, n, out_bf16, group,
                                        c2.as<uint8_t>(), cuda::W8a8ScaleOut{s2.as<float>(), T, nullptr, 0},
                                        nullptr);
            EXPECT_EQ(to_host<uint32_t>(h1, static_cast<size_t>(T * n)),
                      to_host<uint32_t>(h2, static_cast<size_t>(T * n)));
            const auto a = to_host<uint8_t>(c1, static_cast<size_t>(T * n));
            const auto b = to_host<uint8_t>(c2, static_cast<size_t>(T * n));
            ASSERT_TRUE(a == b) << "codes differ, first at " << first_diff(a, b, n);
            EXPECT_GT(std::count_if(a.begin(), a.end(), [](uint8_t v) { return v != 0 && v != 0x80; }),
                      static_cast<long>(a.size() / 2));
            EXPECT_EQ(to_host<uint32_t>(s1, static_cast<size_t>(G * T)),
                      to_host<uint32_t>(s2, static_cast<size_t>(G * T)));
          }
      }
    }
  }
  // Refused: a group of 128 on n % 128 != 0, n past 8192, padding rows.
  cuda::DeviceBuffer h(64 * 4), w(64 * 4), c(64), s(64);
  const cuda::W8a8ScaleOut so{s.as<float>(), 1, nullptr, 0};
  EXPECT_THROW(cuda::rmsnorm_residual_e4m3(h.as<float>(), nullptr, w.as<float>(), 1e-5f, 1, 48, true, 128,
                                           c.as<uint8_t>(), so, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::rmsnorm_residual_e4m3(h.as<float>(), nullptr, w.as<float>(), 1e-5f, 1, 8208, true, 8208,
                                           c.as<uint8_t>(), so, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::rmsnorm_residual_e4m3(h.as<float>(), nullptr, w.as<float>(), 1e-5f, 2, 48, true, 48,
                                           c.as<uint8_t>(), so, nullptr),
               std::invalid_argument);
}

// A DeviceFp8 with the W8A8 fields: the scales in the cuBLASLt layout of
// ops.h (built here from that description, independently of the upload),
// and for K % 16 != 0 the e4m3 rows zero-padded to a multiple of 16.
struct DeviceW8a8 {
  DeviceFp8 d;
  cuda::DeviceBuffer q_padded, s_lt;
  cuda::DeviceMatrix m;
};

DeviceW8a8 make_w8a8(std::mt19937_64& rng, int64_t N, int64_t K, ScaleGranularity g) {
  DeviceW8a8 w;
  w.d = make_fp8(rng, N, K, g);
  w.m = w.d.m;
  const std::vector<float>& s = w.d.host.scales;
  std::vector<float> lt;
  if (g == ScaleGranularity::block128) {
    const int64_t L = (K + 127) / 128, L4 = round_up(L, 4), nb = (N + 127) / 128;
    lt.assign(static_cast<size_t>(nb * L4), 0.0f);
    for (int64_t r = 0; r < nb; ++r)
      for (int64_t c = 0; c < L; ++c) lt[r * L4 + c] = s[r * L + c];
    w.m.w8a8_scale_ld = L4;
  } else {
    lt.assign(static_cast<size_t>(N), s[0]);
    if (g == ScaleGranularity::channel) lt = s;
  }
  w.s_lt = to_device(lt);
  w.m.w8a8_scale = w.s_lt.as<const float>();
  if (K % 16 != 0) {
    const int64_t ld = round_up(K, 16);
    std::vector<uint8_t> p(static_cast<size_t>(N * ld), 0);
    for (int64_t r = 0; r < N; ++r) std::copy_n(w.d.host.q.begin() + r * K, K, p.begin() + r * ld);
    w.q_padded = to_device(p);
    w.m.fp8 = w.q_padded.as<const uint8_t>();
    w.m.fp8_ld = ld;
  }
  return w;
}

struct W8a8Worst {
  double bound = 0, fp32 = 0;
};

// y [T][N] against the double reference from the same quantized operands
// (header comment: the bound).
void expect_w8a8_close(const std::vector<float>& y, const std::vector<float>& x_seen, const DeviceW8a8& w, int64_t T,
                       const std::vector<float>& bias, const std::vector<float>& y0, bool out_bf16, const char* what,
                       W8a8Worst& worst) {
  const int64_t N = w.m.rows, K = w.m.cols;
  const int64_t group = fp8_activation_group(w.m.block128() ? ScaleGranularity::block128 : ScaleGranularity::channel, K);
  const int64_t G = (K + group - 1) / group, L = (K + 127) / 128;
  std::vector<uint8_t> q(static_cast<size_t>(T * K));
  std::vector<float> sx(static_cast<size_t>(T * G));
  quantize_activations_e4m3(x_seen.data(), T, K, group, q.data(), sx.data());
  std::vector<double> xa(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < K; ++c)
      xa[t * K + c] = static_cast<double>(e4m3_to_f32(q[t * K + c])) * sx[t * G + c / group];
  const double tc = 136 * 0x1.0p-13, f32 = static_cast<double>(L + 3) * 0x1.0p-24;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      const double* xr = xa.data() + t * K;
      const float* wr = w.d.dequant.data() + n * K;
      for (int64_t k = 0; k < K; ++k) {
        const double p = xr[k] * wr[k];
        ref += p;
        mag += std::fabs(p);
      }
      if (!bias.empty()) ref += bias[n];
      if (!y0.empty()) ref += y0[t * N + n];
      const double tol = (tc + f32) * mag + 0x1.0p-23 * std::fabs(ref) + (out_bf16 ? 0x1.0p-8 * std::fabs(ref) : 0) +
                         1e-30;
      const double err = std::fabs(y[t * N + n] - ref);
      worst.bound = std::max(worst.bound, err / tol);
      worst.fp32 = std::max(worst.fp32, err / (f32 * mag + 0x1.0p-23 * std::fabs(ref) + 1e-30));
      ASSERT_LE(err, tol) << what << " T=" << T << " N=" << N << " K=" << K << " at t=" << t << " n=" << n << ": got "
                          << y[t * N + n] << ", reference " << ref << " (sum |x w| " << mag << ")";
    }
}

TEST(CudaW8a8, GemmMatchesReferenceEveryGranularity) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  // K multiples of 128, one multiple of 16 only (272: a partial last 1x128
  // group and 128x128 block), one padded (200: rows zero-padded to 208).
  const Fp8Case cases[] = {{256, 512, ScaleGranularity::block128},  {384, 272, ScaleGranularity::block128},
                           {128, 1024, ScaleGranularity::channel},  {256, 384, ScaleGranularity::tensor},
                           {192, 200, ScaleGranularity::block128},  {96, 200, ScaleGranularity::channel},
                           {512, 4096, ScaleGranularity::block128}};
  cuda::Gemm gemm;
  gemm.reserve_fp8_scratch();
  for (const Fp8Case& c : cases) {
    DeviceW8a8 w = make_w8a8(rng, c.N, c.K, c.g);
    gemm.check_w8a8(w.m);
    // 1, 8: below the W8A8 rows (called directly here); 33: padded or tail;
    // 1023: tail; 256, 1024: direct.
    for (int64_t T : {1, 8, 33, 256, 1023, 1024}) {
      if (c.K >= 4096 && T > 33) continue;  // host reference time
      std::vector<float> x = randn(rng, static_cast<size_t>(T * c.K), 1.0f);
      for (int64_t t = 0; t < T; ++t)  // rows of different magnitudes, and a zero row
        for (int64_t k = 0; k < c.K; ++k) x[t * c.K + k] *= t == 3 ? 0.0f : std::ldexp(1.0f, static_cast<int>(t % 7) - 3);
      const std::vector<float> bias = randn(rng, static_cast<size_t>(c.N), 0.5f);
      const std::vector<float> y0 = randn(rng, static_cast<size_t>(T * c.N), 0.5f);
      cuda::DeviceBuffer scratch(cuda::Gemm::w8a8_scratch_bytes(T, w.m.fp8_row_bytes(), w.m.block128()));
      W8a8Worst worst;
      for (bool f32 : {true, false}) {
        const std::vector<uint16_t> xb = to_bf16(x);
        const std::vector<float> seen = f32 ? x : from_bf16(xb);
        cuda::DeviceBuffer dx = f32 ? to_device(x) : to_device(xb), db = to_device(bias);
        for (int mode = 0; mode < 3; ++mode) {  // plain, bias + accumulate, bf16 out
          const bool acc = mode == 1, bf16_out = mode == 2;
          if (bf16_out && (c.N % 8 != 0 || !f32)) continue;
          cuda::DeviceBuffer dy = acc ? to_device(y0) : cuda::DeviceBuffer(static_cast<size_t>(T * c.N) * 4);
          gemm.linear_w8a8(cuda::Gemm::W8a8Input{dx.get(), f32, nullptr}, T, w.m, acc ? db.as<float>() : nullptr,
                           dy.get(), acc, bf16_out, scratch.get(), scratch.bytes(), nullptr);
          const std::vector<float> y = bf16_out ? from_bf16(to_host<uint16_t>(dy, static_cast<size_t>(T * c.N)))
                                                : to_host<float>(dy, static_cast<size_t>(T * c.N));
          expect_w8a8_close(y, seen, w, T, acc ? bias : std::vector<float>{}, acc ? y0 : std::vector<float>{},
                            bf16_out, acc ? "w8a8 (bias, accumulate)" : bf16_out ? "w8a8 bf16 out" : "w8a8", worst);
          if (HasFatalFailure()) return;
        }
      }
      std::printf("w8a8 %s N=%lld K=%lld T=%lld: worst error %.4f of the bound, %.2f of the fp32-only part\n",
                  std::string(scale_granularity_name(c.g)).c_str(), static_cast<long long>(c.N),
                  static_cast<long long>(c.K), static_cast<long long>(T), worst.bound, worst.fp32);
    }
  }
}

// The whole W8A8 MLP as CudaBackend::linear_gated_act_linear runs it (gate|up
// GEMM to bf16, gated_act_quantize_e4m3 into w8a8_codes' layout for the
// down weight, linear_w8a8_codes) against the unfused ops (the same gate|up
// output, gated_act_bf16_in into out, linear_w8a8 on out): y bitwise.
// T = 9, 17 (padded GEMMs), 33 on I = 200 (a tail GEMM: 2 * 4 * 36 > 208),
// 64 (direct), 300; block-wise and per-channel weights, I a multiple of
// 128, a partial last group (272) and a padded down weight (200); with and
// without the down bias.
TEST(CudaW8a8, FusedMlpEqualsUnfusedOps) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  cuda::Gemm gemm;
  gemm.reserve_fp8_scratch();
  struct MlpCase {
    int64_t H, I;
    ScaleGranularity g;
  };
  for (const MlpCase& c : {MlpCase{256, 512, ScaleGranularity::block128}, MlpCase{256, 272, ScaleGranularity::block128},
                           MlpCase{128, 200, ScaleGranularity::block128}, MlpCase{256, 512, ScaleGranularity::channel},
                           MlpCase{128, 200, ScaleGranularity::tensor}}) {
    const int64_t H = c.H, I = c.I;
    DeviceW8a8 wgu = make_w8a8(rng, 2 * I, H, c.g), wd = make_w8a8(rng, H, I, c.g);
    gemm.check_w8a8(wgu.m);
    gemm.check_w8a8(wd.m);
    cuda::DeviceBuffer bias = to_device(randn(rng, static_cast<size_t>(H), 0.5f));
    for (int64_t T : {9, 17, 33, 64, 300}) {
      ASSERT_TRUE(gemm.takes_w8a8(T, wgu.m));
      ASSERT_TRUE(gemm.takes_w8a8(T, wd.m));
      cuda::DeviceBuffer x = to_device(to_bf16(randn(rng, static_cast<size_t>(T * H), 1.0f)));
      cuda::DeviceBuffer gu(static_cast<size_t>(T * 2 * I) * 2);
      cuda::DeviceBuffer scratch(std::max(cuda::Gemm::w8a8_scratch_bytes(T, wgu.m.fp8_row_bytes(), wgu.m.block128()),
                                          cuda::Gemm::w8a8_scratch_bytes(T, wd.m.fp8_row_bytes(), wd.m.block128())));
      gemm.linear_w8a8(cuda::Gemm::W8a8Input{x.get(), false, nullptr}, T, wgu.m, nullptr, gu.get(), false, true,
                       scratch.get(), scratch.bytes(), nullptr);
      const auto* g = gu.as<uint16_t>();
      for (Activation act : {Activation::silu, Activation::gelu_tanh})
        for (bool out_bf16 : {true, false})
          for (bool with_bias : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "H=" << H << " I=" << I << " g=" << static_cast<int>(c.g) << " T=" << T
                                              << " act=" << static_cast<int>(act) << " out_bf16=" << out_bf16
                                              << " bias=" << with_bias);
            const float* bp = with_bias ? bias.as<float>() : nullptr;
            cuda::DeviceBuffer out(static_cast<size_t>(T * I) * (out_bf16 ? 2 : 4));
            cuda::DeviceBuffer y1(static_cast<size_t>(T * H) * 4), y2(static_cast<size_t>(T * H) * 4);
            cuda::gated_act_bf16_in(act, g, g + I, 2 * I, T, I, out.get(), out_bf16, nullptr);
            gemm.linear_w8a8(cuda::Gemm::W8a8Input{out.get(), !out_bf16, nullptr}, T, wd.m, bp, y1.get(), false, false,
                             scratch.get(), scratch.bytes(), nullptr);
            FP8KV_CU(cudaMemset(scratch.get(), 0x5a, scratch.bytes()));  // no codes of the unfused run survive
            const cuda::Gemm::W8a8Codes q = gemm.w8a8_codes(T, wd.m, false, scratch.get());
            ASSERT_EQ(q.T_pad, round_up(T, cuda::Gemm::kW8a8Rows));
            ASSERT_EQ(q.Kc, wd.m.fp8_row_bytes());
            ASSERT_EQ(q.group, c.g == ScaleGranularity::block128 ? 128 : I);
            cuda::gated_act_quantize_e4m3(act, g, g + I, 2 * I, out_bf16, q.T, q.T_pad, q.K, q.Kc, q.group, q.codes,
                                          q.scales, nullptr);
            gemm.linear_w8a8_codes(T, wd.m, bp, y2.get(), false, false, scratch.get(), scratch.bytes(), nullptr);
            const auto a = to_host<uint32_t>(y1, static_cast<size_t>(T * H));
            const auto b = to_host<uint32_t>(y2, static_cast<size_t>(T * H));
            ASSERT_EQ(a, b);
            EXPECT_NE(std::count(a.begin(), a.end(), 0u), static_cast<long>(a.size()));  // not all zero
          }
    }
  }
}

// The dispatch: in W8A8 mode Gemm::linear takes linear_w8a8 from
// kW8a8MinRows rows on (bitwise its result), the fp8 GEMV below; a padded
// matrix takes W8A8 at every row count.
TEST(CudaW8a8, W8a8RowsAndGemvRows) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  cuda::Gemm gemm;
  gemm.reserve_fp8_scratch();
  const int rows = cuda::kW8a8MinRows;
  for (const Fp8Case& c : {Fp8Case{256, 512, ScaleGranularity::block128}, Fp8Case{64, 200, ScaleGranularity::tensor}}) {
    DeviceW8a8 w = make_w8a8(rng, c.N, c.K, c.g);
    for (int64_t T : {int64_t{1}, int64_t{rows - 1}, int64_t{rows}, int64_t{40}}) {
      const std::vector<uint16_t> xb = to_bf16(randn(rng, static_cast<size_t>(T * c.K), 1.0f));
      cuda::DeviceBuffer dx = to_device(xb), a(static_cast<size_t>(T * c.N) * 4), b(static_cast<size_t>(T * c.N) * 4);
      cuda::DeviceBuffer scratch(cuda::Gemm::w8a8_scratch_bytes(T, w.m.fp8_row_bytes(), w.m.block128()));
      const bool w8a8 = gemm.takes_w8a8(T, w.m);
      EXPECT_EQ(w8a8, T >= rows || c.K % 16 != 0) << "T=" << T << " K=" << c.K;
      gemm.linear(dx.as<uint16_t>(), T, w.m, nullptr, a.as<float>(), false, nullptr);
      if (w8a8)
        gemm.linear_w8a8(cuda::Gemm::W8a8Input{dx.get(), false, nullptr}, T, w.m, nullptr, b.get(), false, false,
                         scratch.get(), scratch.bytes(), nullptr);
      else
        cuda::gemv_fp8(dx.as<uint16_t>(), T, w.d.m, nullptr, b.as<float>(), false, nullptr);
      EXPECT_EQ(to_host<uint32_t>(a, static_cast<size_t>(T * c.N)), to_host<uint32_t>(b, static_cast<size_t>(T * c.N)))
          << "T=" << T << " K=" << c.K;
    }
  }
}

}  // namespace
}  // namespace fp8kv
