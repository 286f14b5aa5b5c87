// Each CUDA forward op (backend/cuda/ops/ops.h) against its CPU reference
// (backend/cpu/ops.h, model/rope.h) on random inputs. Tolerances are derived
// per element (comments); the CPU gets the same bf16-rounded inputs, so only
// accumulation order, library math (exp/tanh/erf: <= 2 ulp) and the final
// bf16 rounding (unit roundoff 2^-8) differ.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "../common/rope_params.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/attention/attention.h"
#include "cuda_ops_util.h"
#include "io/errors.h"
#include "model/rope.h"

namespace fp8kv {
namespace {

using namespace cudaops_test;

// ---- linear -------------------------------------------------------------------

// y = x W^T (+ b) (+ y0). Both sides see bf16-exact x and W; fp32 accumulation
// in any order differs from exact by <= K u sum|x w| each (Higham), so
// |gpu - cpu| <= 2 (K + 2) u (sum|x w| + |b| + |y0|).
// kernel: "" = through cuda::Gemm (cuBLASLt, or gemv_bf16 for T <= gemv_rows),
// "simt" / "mma" = that GEMV kernel called directly.
void check_linear(std::mt19937_64& rng, int T, int N, int K, bool bias, bool accumulate, bool f32_weights,
                  int gemv_rows = 0, const std::string& kernel = "") {
  SCOPED_TRACE(::testing::Message() << "T=" << T << " N=" << N << " K=" << K << " bias=" << bias
                                    << " acc=" << accumulate << " f32w=" << f32_weights << " gemv=" << gemv_rows
                                    << " kernel=" << kernel);
  std::vector<float> x = from_bf16(to_bf16(randn(rng, static_cast<size_t>(T) * K, 1.0f)));
  std::vector<float> w = randn(rng, static_cast<size_t>(N) * K, 0.05f);
  std::vector<float> b = bias ? randn(rng, N, 0.5f) : std::vector<float>();
  std::vector<float> y0 = randn(rng, static_cast<size_t>(T) * N, 2.0f);
  cuda::DeviceBuffer dW;
  std::vector<uint16_t> wb = to_bf16(w);
  const MatrixRef host_w = f32_weights ? MatrixRef{w.data(), WeightType::f32, N, K}
                                       : MatrixRef{wb.data(), WeightType::bf16, N, K};
  const cuda::DeviceMatrix W = cuda::upload_matrix_bf16(host_w, dW);
  auto dx = to_device(to_bf16(x));
  auto db = to_device(b);
  auto dy = to_device(y0);
  cuda::Gemm gemm;
  gemm.set_gemv_max_rows(gemv_rows);
  const float* bp = bias ? db.as<float>() : nullptr;
  if (kernel == "simt")
    cuda::gemv_bf16_simt(dx.as<uint16_t>(), T, W, bp, dy.as<float>(), accumulate, nullptr);
  else if (kernel == "mma")
    cuda::gemv_bf16_mma(dx.as<uint16_t>(), T, W, bp, dy.as<float>(), accumulate, nullptr);
  else if (kernel.rfind("simt", 0) == 0)  // simt2 / simt4 / simt8; simtk: the auto split
    cuda::gemv_bf16_simt_split(dx.as<uint16_t>(), T, W, bp, dy.as<float>(), accumulate,
                               kernel == "simtk" ? 0 : std::stoi(kernel.substr(4)), nullptr);
  else
    gemm.linear(dx.as<uint16_t>(), T, W, bp, dy.as<float>(), accumulate, nullptr);
  const auto y = to_host<float>(dy, static_cast<size_t>(T) * N);

  std::vector<float> ref(static_cast<size_t>(T) * N);
  linear_cpu(x.data(), T, MatrixRef{wb.data(), WeightType::bf16, N, K}, bias ? b.data() : nullptr, ref.data());
  double worst = 0.0;
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double mag = bias ? std::fabs(b[n]) : 0.0;
      for (int k = 0; k < K; ++k) mag += std::fabs(static_cast<double>(x[t * K + k]) * bf16_to_f32(wb[n * K + k]));
      double r = ref[t * N + n];
      if (accumulate) {
        r += y0[t * N + n];
        mag += std::fabs(y0[t * N + n]);
      }
      const double tol = 2.0 * (K + 2) * kU32 * mag + 1e-30;
      const double err = std::fabs(y[t * N + n] - r);
      worst = std::max(worst, err / tol);
      ASSERT_LE(err, tol) << "t=" << t << " n=" << n << " gpu=" << y[t * N + n] << " cpu=" << r;
    }
  std::printf("[ linear ] T=%d N=%d K=%d worst |err|/tol %.3f\n", T, N, K, worst);
}

TEST(CudaOps, LinearMatchesCpu) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  for (int T : {1, 5, 37})
    for (bool bias : {false, true})
      for (bool acc : {false, true}) check_linear(rng, T, 200, 320, bias, acc, false);
  check_linear(rng, 3, 64, 128, true, false, true);  // fp32 checkpoint: rounded to bf16 at upload
  check_linear(rng, 130, 1000, 64, false, true, false);
}

// The decode GEMV (Gemm with gemv rows on): same bound, every T it takes,
// K not a multiple of the 32 x 8 lane stride, and T past the limit (cuBLASLt).
TEST(CudaOps, LinearGemvMatchesCpu) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  for (int T : {1, 2, 3, 8})
    for (bool bias : {false, true})
      for (bool acc : {false, true}) check_linear(rng, T, 200, 320, bias, acc, false, cuda::kGemvMaxRows);
  check_linear(rng, 5, 77, 4104, true, false, false, cuda::kGemvMaxRows);
  check_linear(rng, 1, 3000, 64, false, false, false, cuda::kGemvMaxRows);
  check_linear(rng, 9, 200, 320, true, false, false, cuda::kGemvMaxRows);  // > kGemvMaxRows: cuBLASLt
  // Each kernel on its own at every T: N not a multiple of the mma's 16
  // columns, K not a multiple of its 32-k chunk (4104 = 128 x 32 + 8) or of
  // the 8-warp x 4-unroll stride, and an 8B-like K.
  for (const std::string kernel : {"simt", "mma"})
    for (int T = 1; T <= cuda::kGemvMaxRows; ++T) {
      check_linear(rng, T, 200, 320, T % 2 == 1, T % 3 == 0, false, 0, kernel);
      check_linear(rng, T, 77, 4104, true, true, false, 0, kernel);
      check_linear(rng, T, 40, 4096, false, false, false, 0, kernel);
    }
  check_linear(rng, 3, 24, 8, true, false, false, 0, "mma");  // K = 8: one partial chunk
  // The split-K SIMT kernel (2, 4, 8 warps per column): N not a multiple of
  // the columns per block (8 / split), K shorter than one lane stride of the
  // split (K = 8, 320) and long (the 8B down_proj's K).
  for (const std::string kernel : {"simt2", "simt4", "simt8", "simtk"})
    for (int T : {1, 2, 3, 8}) {
      check_linear(rng, T, 201, 320, T % 2 == 1, T % 3 == 0, false, 0, kernel);
      check_linear(rng, T, 77, 4104, true, true, false, 0, kernel);
      check_linear(rng, T, 5, 8, false, true, false, 0, kernel);
    }
  check_linear(rng, 1, 64, 14336, true, false, false, 0, "simt4");
  EXPECT_EQ(cuda::gemv_simt_auto_split(4096, 14336), 4);   // 8B down_proj
  EXPECT_EQ(cuda::gemv_simt_auto_split(28672, 4096), 1);   // 8B gate|up
  EXPECT_EQ(cuda::gemv_simt_auto_split(4096, 4096), 4);    // 8B o_proj
  EXPECT_EQ(cuda::gemv_simt_auto_split(128256, 4096), 1);  // LM head
  EXPECT_FALSE(cuda::gemv_bf16_fits(reinterpret_cast<const uint16_t*>(256), 1, cuda::DeviceMatrix{nullptr, 4, 12}));
}

// The gate|up GEMV with the activation fused (gemv_gated_act_bf16) writes
// bitwise what the SIMT GEMV followed by the activation kernel writes, for
// every activation, with and without a bias, at 1 and 2 rows, with I not a
// multiple of the 4 columns a block owns.
TEST(CudaOps, GemvGatedActMatchesTwoKernels) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int I = 203, K = 4104;
  const std::vector<uint16_t> wb = to_bf16(randn(rng, static_cast<size_t>(2 * I) * K, 0.05f));
  cuda::DeviceBuffer dW;
  const cuda::DeviceMatrix W = cuda::upload_matrix_bf16(MatrixRef{wb.data(), WeightType::bf16, 2 * I, K}, dW);
  auto db = to_device(randn(rng, 2 * I, 0.5f));
  for (int T = 1; T <= cuda::kGemvGatedActMaxRows; ++T)
    for (Activation act : {Activation::silu, Activation::gelu_tanh, Activation::gelu})
      for (bool bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "T=" << T << " act=" << static_cast<int>(act) << " bias=" << bias);
        auto dx = to_device(to_bf16(randn(rng, static_cast<size_t>(T) * K, 1.0f)));
        const float* bp = bias ? db.as<float>() : nullptr;
        auto gu = to_device(std::vector<float>(static_cast<size_t>(T) * 2 * I, 0.0f));
        auto two = to_device(std::vector<uint16_t>(static_cast<size_t>(T) * I, 0));
        auto one = to_device(std::vector<uint16_t>(static_cast<size_t>(T) * I, 0));
        cuda::gemv_bf16_simt(dx.as<uint16_t>(), T, W, bp, gu.as<float>(), false, nullptr);
        cuda::gated_act(act, gu.as<float>(), gu.as<float>() + I, 2 * I, T, I, two.get(), true, nullptr);
        cuda::gemv_gated_act_bf16(act, dx.as<uint16_t>(), T, W, bp, one.as<uint16_t>(), nullptr);
        const auto a = to_host<uint16_t>(two, static_cast<size_t>(T) * I);
        const auto b = to_host<uint16_t>(one, static_cast<size_t>(T) * I);
        EXPECT_EQ(a, b);
        EXPECT_NE(std::count(a.begin(), a.end(), uint16_t{0}), static_cast<long>(a.size()));  // not all zero
      }
}

// The prefill gate|up path (past the GEMV rows): the GEMM with bf16 output
// is the fp32-output GEMM rounded to bf16 (up to the accumulation order: one
// bf16 ulp plus the fp32 bound), and the activation on bf16 inputs is
// bitwise the activation on the same values in fp32.
TEST(CudaOps, GemmBf16OutAndActBf16In) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int T = 40, I = 96, K = 320;
  const std::vector<uint16_t> wb = to_bf16(randn(rng, static_cast<size_t>(2 * I) * K, 0.05f));
  cuda::DeviceBuffer dW;
  const cuda::DeviceMatrix W = cuda::upload_matrix_bf16(MatrixRef{wb.data(), WeightType::bf16, 2 * I, K}, dW);
  auto dx = to_device(to_bf16(randn(rng, static_cast<size_t>(T) * K, 1.0f)));
  auto y32 = to_device(std::vector<float>(static_cast<size_t>(T) * 2 * I, 0.0f));
  auto y16 = to_device(std::vector<uint16_t>(static_cast<size_t>(T) * 2 * I, 0));
  cuda::Gemm gemm;
  gemm.set_gemv_max_rows(0);
  gemm.linear(dx.as<uint16_t>(), T, W, nullptr, y32.as<float>(), false, nullptr);
  gemm.linear_bf16_out(dx.as<uint16_t>(), T, W, y16.as<uint16_t>(), nullptr);
  const auto a = to_host<float>(y32, static_cast<size_t>(T) * 2 * I);
  const auto b = from_bf16(to_host<uint16_t>(y16, static_cast<size_t>(T) * 2 * I));
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::fabs(a[i] - b[i]), std::ldexp(std::fabs(a[i]), -7) + 1e-4) << i << ": " << a[i] << " vs " << b[i];
  // Activation: bf16 inputs == the same values as fp32 inputs, bitwise.
  auto g32 = to_device(b);
  auto o1 = to_device(std::vector<uint16_t>(static_cast<size_t>(T) * I, 0));
  auto o2 = to_device(std::vector<uint16_t>(static_cast<size_t>(T) * I, 0));
  for (Activation act : {Activation::silu, Activation::gelu_tanh, Activation::gelu}) {
    cuda::gated_act(act, g32.as<float>(), g32.as<float>() + I, 2 * I, T, I, o1.get(), true, nullptr);
    cuda::gated_act_bf16_in(act, y16.as<uint16_t>(), y16.as<uint16_t>() + I, 2 * I, T, I, o2.get(), true, nullptr);
    EXPECT_EQ(to_host<uint16_t>(o1, static_cast<size_t>(T) * I), to_host<uint16_t>(o2, static_cast<size_t>(T) * I));
  }
}

// ---- per-projection GEMV routes (routes.h) ---------------------------------

// A named shape runs the kernel of its projection's entry in kGemvRoutes
// (bitwise that kernel called directly); unnamed shapes and shapes named for
// two projections take gemv_bf16's choice; T past the GEMV rows cuBLASLt.
TEST(CudaOps, GemvRoutesDispatch) {
  FP8KV_NEED_GPU();
  using cuda::GemvKernel;
  using cuda::LinearProj;
  std::mt19937_64 rng(test_seed());
  const int N = 96, K = 512;
  const std::vector<float> w = randn(rng, static_cast<size_t>(N) * K, 0.05f);
  const std::vector<uint16_t> wb = to_bf16(w);
  cuda::DeviceBuffer dW;
  const cuda::DeviceMatrix W = cuda::upload_matrix_bf16(MatrixRef{wb.data(), WeightType::bf16, N, K}, dW);
  auto dx = to_device(to_bf16(randn(rng, K, 1.0f)));
  auto y_of = [&](const std::function<void(float*)>& f) {
    auto dy = to_device(std::vector<float>(N, 0.0f));
    f(dy.as<float>());
    return to_host<float>(dy, N);
  };
  const auto y_simt = y_of([&](float* y) { cuda::gemv_bf16_simt(dx.as<uint16_t>(), 1, W, nullptr, y, false, nullptr); });
  const auto y_mma = y_of([&](float* y) { cuda::gemv_bf16_mma(dx.as<uint16_t>(), 1, W, nullptr, y, false, nullptr); });
  const auto y_simt8 =
      y_of([&](float* y) { cuda::gemv_bf16_simt_split(dx.as<uint16_t>(), 1, W, nullptr, y, false, 8, nullptr); });
  const auto y_simtk =
      y_of([&](float* y) { cuda::gemv_bf16_simt_split(dx.as<uint16_t>(), 1, W, nullptr, y, false, 0, nullptr); });
  const auto y_simt1 =
      y_of([&](float* y) { cuda::gemv_bf16_simt_split(dx.as<uint16_t>(), 1, W, nullptr, y, false, 1, nullptr); });
  EXPECT_EQ(y_simt1, y_simt);  // split 1 is the one-warp kernel, bitwise
  ASSERT_NE(y_simt, y_mma);    // the kernels sum in different orders: the checks below can tell them apart
  ASSERT_NE(y_simt, y_simt8);

  auto want_of = [&](GemvKernel k) -> const std::vector<float>& {
    return k == GemvKernel::simt_or_mma ? y_simt : k == GemvKernel::simt_split ? y_simtk : y_simt8;  // 1 row: SIMT
  };
  for (int p = 0; p < cuda::kNumLinearProj; ++p) {
    const LinearProj proj = static_cast<LinearProj>(p);
    SCOPED_TRACE(p);
    cuda::Gemm gemm;
    gemm.set_gemv_max_rows(1);
    gemm.name_shape(N, K, proj);
    const GemvKernel k = cuda::gemv_route(proj);
    ASSERT_NE(k, GemvKernel::lt);
    EXPECT_EQ(gemm.route(1, N, K), k);
    EXPECT_EQ(gemm.route(2, N, K), GemvKernel::lt);  // past gemv_max_rows
    const auto y = y_of([&](float* yp) { gemm.linear(dx.as<uint16_t>(), 1, W, nullptr, yp, false, nullptr); });
    EXPECT_EQ(y, want_of(k));
    EXPECT_EQ(gemm.route(1, N + 1, K), GemvKernel::simt_or_mma);  // unnamed shape
    gemm.name_shape(N, K, proj == LinearProj::qkv ? LinearProj::down : LinearProj::qkv);  // now named twice
    EXPECT_EQ(gemm.route(1, N, K), GemvKernel::simt_or_mma);
  }
}

// ---- rmsnorm -------------------------------------------------------------------

// fp32 sum of squares in another order: relative error <= n u; 1/sqrt adds a
// few u: the fp32 value before bf16 rounding is within (n + 8) u relative;
// bf16 rounding adds 2^-8 relative.
void check_rmsnorm(std::mt19937_64& rng, int rows, int n, bool delta, bool delta_w) {
  SCOPED_TRACE(::testing::Message() << "rows=" << rows << " n=" << n << " delta=" << delta << " delta_w=" << delta_w);
  const float eps = 1e-6f;
  auto h = randn(rng, static_cast<size_t>(rows) * n, 3.0f);
  auto d = randn(rng, static_cast<size_t>(rows) * n, 1.0f);
  auto w = randn(rng, n, 1.0f);
  auto dw = randn(rng, n, 1.0f);
  auto dh = to_device(h);
  auto dd = to_device(d);
  auto dwv = to_device(w);
  auto ddw = to_device(dw);
  cuda::DeviceBuffer dout(static_cast<size_t>(rows) * n * 2);
  cuda::rmsnorm_residual(dh.as<float>(), delta ? dd.as<float>() : nullptr, delta_w ? ddw.as<float>() : nullptr,
                         dwv.as<float>(), eps, rows, n, dout.get(), true, nullptr);
  const auto h_gpu = to_host<float>(dh, h.size());
  const auto out_gpu = from_bf16(to_host<uint16_t>(dout, h.size()));

  // Residual: exact without the post-norm (one fp32 add, the same on both
  // sides). With it, the GPU's and the CPU's norms of d are each within
  // (n + 8) u relative of the exact one, so 2 (n + 8) u |d| apart; then each
  // side rounds its own sum h + d once, u |ref| each (run P_2 of the tenth
  // session, FP8KV_SEED=437317722, was 1 ulp apart at |ref| in [4, 8), over
  // the one-rounding bound this had).
  std::vector<float> d_ref = d;
  if (delta_w) rmsnorm_cpu(d.data(), rows, n, dw.data(), eps, d_ref.data());
  for (size_t i = 0; i < h.size(); ++i) {
    const float ref = delta ? h[i] + d_ref[i] : h[i];
    const double tol = delta_w ? 2.0 * (n + 8) * kU32 * std::fabs(d_ref[i]) + 2.0 * kU32 * std::fabs(ref) : 0.0;
    ASSERT_LE(std::fabs(h_gpu[i] - ref), tol) << "h[" << i << "]";
  }
  // Output: the CPU norm of the GPU's residual.
  std::vector<float> out_ref(h.size());
  rmsnorm_cpu(h_gpu.data(), rows, n, w.data(), eps, out_ref.data());
  for (size_t i = 0; i < h.size(); ++i) {
    const double tol = std::fabs(out_ref[i]) * (kUbf16 + 2.0 * (n + 8) * kU32) + 1e-37;
    ASSERT_LE(std::fabs(out_gpu[i] - out_ref[i]), tol) << "out[" << i << "] gpu=" << out_gpu[i] << " cpu=" << out_ref[i];
  }
}

TEST(CudaOps, RmsNormResidualMatchesCpu) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  // 64 .. 8192: the register kernel (8, 16, 32 elements per thread); 9000:
  // the loop kernel.
  for (int n : {64, 1000, 2049, 4096, 8192, 9000}) {
    check_rmsnorm(rng, 7, n, false, false);
    check_rmsnorm(rng, 7, n, true, false);
    check_rmsnorm(rng, 7, n, true, true);
  }
}

TEST(CudaOps, RmsNormRowsGathers) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int rows = 9, n = 300;
  auto h = randn(rng, static_cast<size_t>(rows) * n, 2.0f);
  auto w = randn(rng, n, 1.0f);
  const std::vector<int32_t> idx = {8, 0, 3, 3};
  auto dh = to_device(h);
  auto dw = to_device(w);
  auto di = to_device(idx);
  cuda::DeviceBuffer dout(idx.size() * n * 2);
  cuda::rmsnorm_rows(dh.as<float>(), di.as<int32_t>(), static_cast<int>(idx.size()), dw.as<float>(), 1e-5f, n,
                     dout.as<uint16_t>(), nullptr);
  const auto out = from_bf16(to_host<uint16_t>(dout, idx.size() * n));
  std::vector<float> ref(static_cast<size_t>(rows) * n);
  rmsnorm_cpu(h.data(), rows, n, w.data(), 1e-5f, ref.data());
  for (size_t r = 0; r < idx.size(); ++r)
    for (int i = 0; i < n; ++i) {
      const float e = ref[idx[r] * n + i];
      ASSERT_LE(std::fabs(out[r * n + i] - e), std::fabs(e) * (kUbf16 + 2.0 * (n + 8) * kU32) + 1e-37);
    }
}

// ---- qkv prep (QK-norm + RoPE) -------------------------------------------------

// Per head, s = max |x| after the norm. Norm: (D + 8) u relative. Rope: each
// output is a*c -/+ b*s: 3 roundings of terms <= s, plus cos/sin in double
// rounded to float (host libm vs CUDA: <= 1 ulp apart) -> (D + 16) 2^-23 s.
// T < 64 spreads the heads over blocks of 8 warps (T = 3 with 34 heads: 5
// head groups, the last one partial); T >= 64 runs one block per token.
void check_qkv(std::mt19937_64& rng, int D, const RopeParams& rp, bool norm, bool fused, int T = 9, int Hq = 4) {
  SCOPED_TRACE(::testing::Message() << "D=" << D << " rope=" << rp.type << " partial=" << rp.partial_rotary_factor
                                    << " norm=" << norm << " fused=" << fused << " T=" << T << " Hq=" << Hq);
  const int Hkv = 2, max_pos = 8192;
  const RopeTable rope(rp, D, max_pos);
  std::uniform_int_distribution<int> pd(0, max_pos - 1);
  std::vector<int32_t> pos(T);
  for (auto& p : pos) p = pd(rng);
  pos[0] = 0;
  const int64_t row = static_cast<int64_t>(Hq + 2 * Hkv) * D;
  auto qkv = randn(rng, static_cast<size_t>(T) * row, 2.0f);
  auto qn = randn(rng, D, 1.0f), kn = randn(rng, D, 1.0f);
  // Host reference.
  std::vector<float> q(static_cast<size_t>(T) * Hq * D), k(static_cast<size_t>(T) * Hkv * D), v(k.size());
  for (int t = 0; t < T; ++t) {
    std::copy_n(qkv.begin() + t * row, Hq * D, q.begin() + static_cast<int64_t>(t) * Hq * D);
    std::copy_n(qkv.begin() + t * row + Hq * D, Hkv * D, k.begin() + static_cast<int64_t>(t) * Hkv * D);
    std::copy_n(qkv.begin() + t * row + (Hq + Hkv) * D, Hkv * D, v.begin() + static_cast<int64_t>(t) * Hkv * D);
  }
  if (norm) {
    rmsnorm_cpu(q.data(), static_cast<int64_t>(T) * Hq, D, qn.data(), 1e-6f, q.data());
    rmsnorm_cpu(k.data(), static_cast<int64_t>(T) * Hkv, D, kn.data(), 1e-6f, k.data());
  }
  std::vector<float> scale_q(static_cast<size_t>(T) * Hq), scale_k(static_cast<size_t>(T) * Hkv);
  for (size_t h = 0; h < scale_q.size(); ++h)
    for (int i = 0; i < D; ++i) scale_q[h] = std::max(scale_q[h], std::fabs(q[h * D + i]));
  for (size_t h = 0; h < scale_k.size(); ++h)
    for (int i = 0; i < D; ++i) scale_k[h] = std::max(scale_k[h], std::fabs(k[h * D + i]));
  const int half = rope.rot_dim() / 2;
  std::vector<float> cs(static_cast<size_t>(T) * half), sn(cs.size());
  rope.fill(pos.data(), T, cs.data(), sn.data());
  rope_cpu(q.data(), T, Hq, D, rope.rot_dim(), cs.data(), sn.data());
  rope_cpu(k.data(), T, Hkv, D, rope.rot_dim(), cs.data(), sn.data());

  // Device: fused [T][q|k|v] rows, or three separate contiguous tensors.
  std::vector<float> qs, ks, vs;
  for (int t = 0; t < T; ++t) {
    qs.insert(qs.end(), qkv.begin() + t * row, qkv.begin() + t * row + Hq * D);
    ks.insert(ks.end(), qkv.begin() + t * row + Hq * D, qkv.begin() + t * row + (Hq + Hkv) * D);
    vs.insert(vs.end(), qkv.begin() + t * row + (Hq + Hkv) * D, qkv.begin() + (t + 1) * row);
  }
  auto dqkv = to_device(qkv);
  auto dqs = to_device(qs), dks = to_device(ks), dvs = to_device(vs);
  auto dqn = to_device(qn), dkn = to_device(kn), dpos = to_device(pos), dinv = to_device(rope.inv_freq());
  cuda::DeviceBuffer dq(q.size() * 4), dk(k.size() * 4), dv(v.size() * 4);
  cuda::QkvPrepArgs a;
  a.T = T;
  a.num_q_heads = Hq;
  a.num_kv_heads = Hkv;
  a.head_dim = D;
  if (fused) {
    a.q_in = dqkv.as<float>();
    a.k_in = a.q_in + Hq * D;
    a.v_in = a.q_in + (Hq + Hkv) * D;
    a.q_stride = a.k_stride = a.v_stride = row;
  } else {
    a.q_in = dqs.as<float>();
    a.k_in = dks.as<float>();
    a.v_in = dvs.as<float>();
    a.q_stride = Hq * D;
    a.k_stride = a.v_stride = Hkv * D;
  }
  if (norm) {
    a.q_norm_w = dqn.as<float>();
    a.k_norm_w = dkn.as<float>();
  }
  a.eps = 1e-6f;
  a.positions = dpos.as<int32_t>();
  a.inv_freq = dinv.as<float>();
  a.rot_dim = rope.rot_dim();
  a.attention_factor = rope.attention_factor();
  a.q_out = dq.as<float>();
  a.k_out = dk.as<float>();
  a.v_out = dv.as<float>();
  cuda::qkv_prep(a, nullptr);
  const auto qg = to_host<float>(dq, q.size()), kg = to_host<float>(dk, k.size()), vg = to_host<float>(dv, v.size());
  const double rel = (D + 16) * 0x1.0p-23;
  for (size_t i = 0; i < q.size(); ++i)
    ASSERT_LE(std::fabs(qg[i] - q[i]), rel * scale_q[i / D] * 2.0) << "q[" << i << "] gpu=" << qg[i] << " cpu=" << q[i];
  for (size_t i = 0; i < k.size(); ++i)
    ASSERT_LE(std::fabs(kg[i] - k[i]), rel * scale_k[i / D] * 2.0) << "k[" << i << "] gpu=" << kg[i] << " cpu=" << k[i];
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(vg[i], v[i]) << "v[" << i << "]";

  // The store fused into qkv_prep (QkvPrepArgs::FusedStore) writes the bytes
  // store_kv writes from the k/v just checked: one block of T + 1 slots,
  // token t -> slot T - t, token 1 skipped (-1), per-head fp8 scales small
  // enough that some codes saturate.
  const int64_t cap = T + 1;
  std::vector<int64_t> slots(T);
  for (int t = 0; t < T; ++t) slots[t] = t == 1 ? -1 : cap - 1 - t;
  auto dslots = to_device(slots);
  auto dks_scale = to_device(std::vector<float>{0.002f, 0.7f}), dvs_scale = to_device(std::vector<float>{1.3f, 0.01f});
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2}) {
    SCOPED_TRACE(kv_dtype_name(dt));
    KvCacheLayout L;
    L.num_blocks = 1;
    L.block_size = static_cast<int>(cap);
    L.num_kv_heads = Hkv;
    L.head_dim = D;
    L.dtype = dt;
    const size_t bytes = L.cache_bytes();
    std::vector<uint8_t> fill(bytes, 0xA5);
    auto rk = to_device(fill), rv = to_device(fill), fk = to_device(fill), fv = to_device(fill);
    cuda::StoreKvArgs sa;
    sa.layout = L;
    sa.k_cache = rk.get();
    sa.v_cache = rv.get();
    sa.k = dk.get();
    sa.v = dv.get();
    sa.slot_mapping = dslots.as<int64_t>();
    sa.num_tokens = T;
    sa.k_scale = {dks_scale.as<float>(), Hkv};
    sa.v_scale = {dvs_scale.as<float>(), Hkv};
    auto sclips = to_device(std::vector<unsigned long long>{0, 0}), fclips = to_device(std::vector<unsigned long long>{0, 0});
    sa.clips = sclips.as<unsigned long long>();
    cuda::store_kv(sa, nullptr);
    cuda::QkvPrepArgs b = a;
    cuda::DeviceBuffer dq2(q.size() * 4);
    b.q_out = dq2.as<float>();
    b.k_out = b.v_out = nullptr;
    b.store.k_cache = fk.get();
    b.store.v_cache = fv.get();
    b.store.dtype = dt;
    b.store.slots = dslots.as<int64_t>();
    b.store.capacity = cap;
    b.store.k_scale = dks_scale.as<float>();
    b.store.v_scale = dvs_scale.as<float>();
    b.store.k_scale_count = b.store.v_scale_count = Hkv;
    b.store.clips = fclips.as<unsigned long long>();
    cuda::qkv_prep(b, nullptr);
    EXPECT_EQ(to_host<uint8_t>(fk, bytes), to_host<uint8_t>(rk, bytes)) << "K cache bytes";
    EXPECT_EQ(to_host<uint8_t>(fv, bytes), to_host<uint8_t>(rv, bytes)) << "V cache bytes";
    // Both stores count the same clipped elements (docs/robustness.md "KV
    // clipping"); the small scales make some clip, bf16 counts none.
    const auto sc = to_host<unsigned long long>(sclips, 2), fc = to_host<unsigned long long>(fclips, 2);
    EXPECT_EQ(fc, sc) << "clip counts, fused vs store_kv";
    if (dt == KvDtype::fp8_e4m3) {
      EXPECT_GT(sc[0] + sc[1], 0u) << "no element clipped: the case tests nothing";
    }
    if (dt == KvDtype::bf16) {
      EXPECT_EQ(sc[0] + sc[1], 0u);
    }
    EXPECT_EQ(to_host<float>(dq2, q.size()), qg) << "q with the fused store";
  }
}

TEST(CudaOps, QkvPrepMatchesCpuForEveryRopeType) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  RopeParams def;
  def.theta = 10000.0;
  RopeParams lin = def;
  lin.type = "linear";
  lin.factor = 4.0;
  RopeParams l3 = test_util::llama3_rope(1024);
  RopeParams yarn = test_util::yarn_rope(1000000.0, 2048);
  RopeParams dyn = def;
  dyn.type = "dynamic";
  RopeParams partial = def;
  partial.partial_rotary_factor = 0.5;
  for (int D : {64, 128, 256})
    for (const RopeParams* rp : {&def, &lin, &l3, &yarn, &dyn, &partial})
      for (bool norm : {false, true}) check_qkv(rng, D, *rp, norm, D == 128);
  for (bool fused : {false, true}) {
    check_qkv(rng, 128, l3, true, fused, 3, 30);
    check_qkv(rng, 128, l3, true, fused, 1, 32);
    check_qkv(rng, 64, def, false, fused, 70, 30);
  }
}

// ---- gated activation ------------------------------------------------------------

// exp/tanh/erf differ by <= 2 ulp between libm and CUDA; the worst
// amplification is 1 + tanh / 1 + erf near -1 (absolute error 2^-23 times
// 0.5 |g u|) and the rounding of gelu_tanh's inner term (relative 4u, slope
// <= 0.5 |g u| (|g| + 0.05 |g|^3)). Then bf16 rounding (2^-8 relative).
TEST(CudaOps, GatedActivationsMatchCpu) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int rows = 5, n = 300;
  auto gu = randn(rng, static_cast<size_t>(rows) * 2 * n, 2.0f);
  auto dgu = to_device(gu);
  cuda::DeviceBuffer dout(static_cast<size_t>(rows) * n * 2);
  std::vector<float> g(static_cast<size_t>(rows) * n), u(g.size());
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n; ++i) {
      g[r * n + i] = gu[r * 2 * n + i];
      u[r * n + i] = gu[r * 2 * n + n + i];
    }
  for (Activation act : {Activation::silu, Activation::gelu_tanh, Activation::gelu}) {
    cuda::gated_act(act, dgu.as<float>(), dgu.as<float>() + n, 2 * n, rows, n, dout.get(), true, nullptr);
    const auto out = from_bf16(to_host<uint16_t>(dout, g.size()));
    std::vector<float> ref(g.size());
    gated_act_cpu(act, g.data(), u.data(), ref.data(), static_cast<int64_t>(g.size()));
    for (size_t i = 0; i < g.size(); ++i) {
      const double ag = std::fabs(g[i]), gu_abs = ag * std::fabs(u[i]);
      const double tol = kUbf16 * std::fabs(ref[i]) * (1 + 1e-6) +
                         0x1.0p-20 * (std::fabs(ref[i]) + gu_abs * (1 + ag + 0.05 * ag * ag * ag));
      ASSERT_LE(std::fabs(out[i] - ref[i]), tol)
          << "act=" << static_cast<int>(act) << " i=" << i << " g=" << g[i] << " gpu=" << out[i] << " cpu=" << ref[i];
    }
  }
}

// ---- embedding, softcap -------------------------------------------------------

TEST(CudaOps, EmbeddingIsExact) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int V = 50, H = 130;
  auto e = to_bf16(randn(rng, static_cast<size_t>(V) * H, 1.0f));
  cuda::DeviceBuffer de;
  const cuda::DeviceMatrix E = cuda::upload_matrix_bf16(MatrixRef{e.data(), WeightType::bf16, V, H}, de);
  const std::vector<int32_t> ids = {3, 49, 0, 3, 17};
  auto dids = to_device(ids);
  cuda::DeviceBuffer dout(ids.size() * H * 4);
  for (float scale : {1.0f, bf16_to_f32(f32_to_bf16(std::sqrt(130.0f)))}) {
    cuda::embedding(E, dids.as<int32_t>(), static_cast<int>(ids.size()), scale, dout.as<float>(), nullptr);
    const auto out = to_host<float>(dout, ids.size() * H);
    std::vector<float> ref(out.size());
    std::vector<int> ids_i(ids.begin(), ids.end());
    embedding_cpu(MatrixRef{e.data(), WeightType::bf16, V, H}, ids_i.data(), static_cast<int64_t>(ids.size()), scale,
                  ref.data());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], ref[i]) << "i=" << i << " scale=" << scale;
  }
}

// tanh: <= 2 ulp of a value <= 1 (2^-22), times cap, plus the final rounding.
TEST(CudaOps, SoftcapMatchesCpu) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  auto x = randn(rng, 5000, 40.0f);
  auto dx = to_device(x);
  const float cap = 30.0f;
  cuda::softcap(dx.as<float>(), static_cast<int64_t>(x.size()), cap, nullptr);
  const auto y = to_host<float>(dx, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float ref = std::tanh(x[i] / cap) * cap;
    ASSERT_LE(std::fabs(y[i] - ref), cap * 0x1.0p-21) << "x=" << x[i];
  }
}

// fp32 outputs (the CUDA backend's activations are fp32): the norm in place
// over h (y aliases h) and the gated activation in place over gate. Same
// bounds without the bf16 term.
TEST(CudaOps, Fp32OutputsInPlace) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int rows = 5, n = 777;
  auto h = randn(rng, static_cast<size_t>(rows) * n, 2.0f);
  auto d = randn(rng, h.size(), 1.0f);
  auto w = randn(rng, n, 1.0f);
  auto dh = to_device(h), dd = to_device(d), dw = to_device(w);
  cuda::rmsnorm_residual(dh.as<float>(), dd.as<float>(), nullptr, dw.as<float>(), 1e-6f, rows, n, dh.get(), false,
                         nullptr);
  const auto y = to_host<float>(dh, h.size());
  std::vector<float> hs(h.size()), ref(h.size());
  for (size_t i = 0; i < h.size(); ++i) hs[i] = h[i] + d[i];
  rmsnorm_cpu(hs.data(), rows, n, w.data(), 1e-6f, ref.data());
  for (size_t i = 0; i < h.size(); ++i)
    ASSERT_LE(std::fabs(y[i] - ref[i]), std::fabs(ref[i]) * 2.0 * (n + 8) * kU32 + 1e-37) << i;

  auto g = randn(rng, h.size(), 2.0f), u = randn(rng, h.size(), 1.0f);
  auto dg = to_device(g), du = to_device(u);
  cuda::gated_act(Activation::silu, dg.as<float>(), du.as<float>(), n, rows, n, dg.get(), false, nullptr);
  const auto out = to_host<float>(dg, g.size());
  std::vector<float> aref(g.size());
  gated_act_cpu(Activation::silu, g.data(), u.data(), aref.data(), static_cast<int64_t>(g.size()));
  // silu = g / (1 + exp(-g)) * u: exp differs by <= 2.5 ulp (CUDA 2 + libm 0.5),
  // so 1 + exp by <= 3.5 u after each side's rounding; the division and the
  // product each add <= 1 u of difference: 5.5 u relative.
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::fabs(out[i] - aref[i]), 5.5 * kU32 * std::fabs(aref[i]) + 1e-37) << i;
}

TEST(CudaOps, ToBf16RowsAndAddAreExact) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int rows = 6, cols = 129;
  auto x = randn(rng, static_cast<size_t>(rows) * cols, 3.0f);
  auto y = randn(rng, x.size(), 3.0f);
  const std::vector<int32_t> idx = {5, 0, 2};
  auto dx = to_device(x), dy = to_device(y), di = to_device(idx);
  cuda::DeviceBuffer db(idx.size() * cols * 2);
  cuda::to_bf16_rows(dx.as<float>(), di.as<int32_t>(), static_cast<int64_t>(idx.size()), cols, db.as<uint16_t>(),
                     nullptr);
  const auto b = to_host<uint16_t>(db, idx.size() * cols);
  for (size_t r = 0; r < idx.size(); ++r)
    for (int c = 0; c < cols; ++c) ASSERT_EQ(b[r * cols + c], f32_to_bf16(x[idx[r] * cols + c]));
  cuda::add_inplace(dx.as<float>(), dy.as<float>(), static_cast<int64_t>(x.size()), nullptr);
  const auto s = to_host<float>(dx, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(s[i], x[i] + y[i]);
}

}  // namespace
}  // namespace fp8kv
