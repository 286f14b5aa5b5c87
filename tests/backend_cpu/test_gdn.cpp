// The Gated DeltaNet CPU reference (backend/cpu/gdn.h): the chunked form
// (prefill) equals the recurrent form (decode, the rule's definition) within
// a bound derived from fp32 rounding; chunk alignment makes split prefills
// bitwise equal to one-shot ones; the conv state carries exactly; a bf16
// recurrent state is the f32 step rounded once at its end (bitwise), and
// over many steps stays within the bound its roundings imply.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <random>
#include <vector>

#include "../common/gdn_tf32.h"
#include "backend/cpu/gdn.h"
#include "numerics/fp8.h"

using namespace fp8kv;

namespace {

struct Inputs {
  GdnShape s;
  int64_t T = 0;
  std::vector<float> qkv, g, beta;
};

Inputs make_inputs(int Hk, int Hv, int Dk, int Dv, int64_t T, uint64_t seed) {
  Inputs in;
  in.s = GdnShape{Hk, Hv, Dk, Dv, 4};
  in.T = T;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  in.qkv.resize(static_cast<size_t>(T * in.s.conv_dim()));
  for (auto& x : in.qkv) x = nd(rng);
  std::vector<float> a(static_cast<size_t>(T) * Hv), b(a.size()), A_log(Hv), dt(Hv);
  for (auto& x : a) x = nd(rng);
  for (auto& x : b) x = nd(rng);
  std::uniform_real_distribution<float> ud(0.01f, 16.0f);  // transformers' A init range
  for (auto& x : A_log) x = std::log(ud(rng)) - 3.0f;       // slower decays: a long memory
  for (auto& x : dt) x = 1.0f;
  in.g.resize(a.size());
  in.beta.resize(a.size());
  gdn_gates(a.data(), b.data(), T, Hv, A_log.data(), dt.data(), in.g.data(), in.beta.data());
  return in;
}

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  float worst = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LE(worst, tol) << what;
  std::printf("%s: max |chunked - recurrent| = %.3g (bound %.3g)\n", what, worst, tol);
}

// Both forms compute the same sums in different orders. Per token the
// recurrent form rounds each state element ~(2 Dk + 4) times; the chunked
// form reassociates each chunk's sums (chunk length C, Dk-long dots, the
// triangular solve of at most C terms). Every term is bounded by the
// largest state or value magnitude M (|k| = 1, beta < 1, decays <= 1), so
// the difference is below (C + 4 Dk + 8) x (chunks + 1) x 2^-24 x M per
// element, M taken as max|S| + max|v| over the run.
float derived_bound(const Inputs& in, const std::vector<float>& S, float vmax) {
  const double chunks = std::ceil(static_cast<double>(in.T) / kGdnChunk) + 1;
  const double terms = kGdnChunk + 4.0 * in.s.k_head_dim + 8;
  return static_cast<float>(terms * chunks * std::ldexp(1.0, -24) * (max_abs(S) + vmax));
}

}  // namespace

TEST(Gdn, ChunkedEqualsRecurrentWithinBound) {
  for (auto [Dk, Dv, Hk, Hv] : {std::tuple{16, 24, 2, 4}, std::tuple{64, 64, 1, 2}}) {
    Inputs in = make_inputs(Hk, Hv, Dk, Dv, 150, 7 + Dk);
    const int64_t O = in.T * in.s.value_dim();
    std::vector<float> S_rec(in.s.ssm_state_elems(), 0.0f), S_chk(S_rec), o_rec(O), o_chk(O);
    gdn_rule_recurrent(in.s, in.qkv.data(), in.T, in.g.data(), in.beta.data(), S_rec.data(), o_rec.data());
    gdn_rule_chunked(in.s, 0, in.qkv.data(), in.T, in.g.data(), in.beta.data(), S_chk.data(), o_chk.data());
    const float tol = derived_bound(in, S_rec, max_abs(in.qkv));
    expect_close(o_chk, o_rec, tol, "outputs");
    expect_close(S_chk, S_rec, tol, "final state");
    // The bound is not vacuous: below 1% of the largest output.
    EXPECT_LT(tol, 0.01f * max_abs(o_rec));
  }
}

TEST(Gdn, ChunkedFromAStateAtAnUnalignedPosition) {
  // A prefill resuming at position 37 from the recurrent state of 37 tokens.
  Inputs in = make_inputs(2, 4, 32, 32, 170, 11);
  const GdnShape& s = in.s;
  const int64_t p = 37, O = in.T * s.value_dim();
  std::vector<float> S_rec(s.ssm_state_elems(), 0.0f), o_rec(O), o_mix(O);
  gdn_rule_recurrent(s, in.qkv.data(), in.T, in.g.data(), in.beta.data(), S_rec.data(), o_rec.data());
  std::vector<float> S_mix(s.ssm_state_elems(), 0.0f);
  gdn_rule_recurrent(s, in.qkv.data(), p, in.g.data(), in.beta.data(), S_mix.data(), o_mix.data());
  gdn_rule_chunked(s, p, in.qkv.data() + p * s.conv_dim(), in.T - p, in.g.data() + p * s.num_v_heads,
                   in.beta.data() + p * s.num_v_heads, S_mix.data(), o_mix.data() + p * s.value_dim());
  const float tol = derived_bound(in, S_rec, max_abs(in.qkv));
  expect_close(o_mix, o_rec, tol, "outputs (recurrent 37, then chunked)");
  expect_close(S_mix, S_rec, tol, "final state");
}

TEST(Gdn, SplitAtAChunkBoundaryIsBitwiseOneShot) {
  Inputs in = make_inputs(1, 2, 16, 16, 200, 3);
  const GdnShape& s = in.s;
  const int64_t O = in.T * s.value_dim();
  std::vector<float> S1(s.ssm_state_elems(), 0.0f), S2(S1), o1(O), o2(O);
  gdn_rule_chunked(s, 0, in.qkv.data(), in.T, in.g.data(), in.beta.data(), S1.data(), o1.data());
  for (int64_t a : {0, 64, 128}) {
    const int64_t n = std::min<int64_t>(a == 128 ? in.T - a : 64, in.T - a);
    gdn_rule_chunked(s, a, in.qkv.data() + a * s.conv_dim(), n, in.g.data() + a * s.num_v_heads,
                     in.beta.data() + a * s.num_v_heads, S2.data(), o2.data() + a * s.value_dim());
  }
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(S1, S2);
}

// ---- a bf16 recurrent state (gdn_rule_step) ----

namespace {

// A state of n elements, N(0, 0.3) rounded to bf16: the values (f32, each
// bf16-representable) and their bf16 bits.
struct GdnBf16State {
  std::vector<float> values;
  std::vector<uint16_t> bits;
};
GdnBf16State gdn_bf16_state(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  GdnBf16State s;
  for (int64_t i = 0; i < n; ++i) {
    s.bits.push_back(f32_to_bf16(nd(rng)));
    s.values.push_back(bf16_to_f32(s.bits.back()));
  }
  return s;
}

bool gdn_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// The exact case: from a state whose values are bf16-representable, a step
// on the bf16 state computes bitwise what the same step computes on an f32
// state holding those values (widening is exact, the step is the same f32
// code), and stores exactly that step's final state rounded to bf16 (one
// rounding, at the end: no rounding inside the step). A step at position 0
// starts from zeros whatever the slot holds (NaN here).
TEST(Gdn, Bf16StateStepIsTheF32StepRoundedOnce) {
  for (auto [Dk, Dv, Hk, Hv] : {std::tuple{16, 24, 2, 4}, std::tuple{64, 64, 1, 2}}) {
    const Inputs in = make_inputs(Hk, Hv, Dk, Dv, 170, 21 + Dk);
    const GdnShape& s = in.s;
    const int64_t SE = s.ssm_state_elems();
    const GdnBf16State init = gdn_bf16_state(SE, 5 + Dk);
    struct Case {
      int64_t pos0, row0, n;  // the step's position, its first input row, its rows
    };
    // Chunked from a carried state at an unaligned position (over two chunk
    // boundaries), one recurrent row, a fresh chunked prefill.
    for (const Case c : {Case{37, 0, 133}, Case{9, 140, 1}, Case{0, 100, 70}}) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> S32 = c.pos0 == 0 ? std::vector<float>(SE, nan) : init.values;
      std::vector<uint16_t> S16 = c.pos0 == 0 ? std::vector<uint16_t>(SE, f32_to_bf16(nan)) : init.bits;
      std::vector<float> o32(c.n * s.value_dim()), o16(o32.size());
      const float* qkv = in.qkv.data() + c.row0 * s.conv_dim();
      const float* g = in.g.data() + c.row0 * s.num_v_heads;
      const float* beta = in.beta.data() + c.row0 * s.num_v_heads;
      gdn_rule_step(s, c.pos0, qkv, c.n, g, beta, S32.data(), GdnStateType::f32, o32.data());
      gdn_rule_step(s, c.pos0, qkv, c.n, g, beta, S16.data(), GdnStateType::bf16, o16.data());
      const std::string tag = "Dk " + std::to_string(Dk) + ", pos0 " + std::to_string(c.pos0) + ", " +
                              std::to_string(c.n) + " rows";
      EXPECT_TRUE(gdn_same_bits(o16, o32)) << tag << ": the outputs differ from the f32 state's";
      size_t bad = 0;
      for (int64_t i = 0; i < SE; ++i) bad += S16[i] != f32_to_bf16(S32[i]) ? 1 : 0;
      EXPECT_EQ(bad, 0u) << tag << ": stored state elements that are not the f32 step's rounded to bf16";
      EXPECT_GT(max_abs(S32), 0.0f) << tag;
    }
  }
}

// Many steps on a bf16 state against the same steps on an f32 state, from
// zero, within a bound derived from the roundings (no fit to what is seen):
//  - A rounding to bf16 (8 significant bits, round to nearest even) moves
//    an element by at most 2^-8 of its magnitude (half an ulp; 2^-8 / (1 +
//    2^-8) at worst), so a column of a head's state [Dk] (over Dk for one
//    Dv index) by at most 2^-8 of its 2-norm.
//  - Between roundings both sides apply the same token maps, S -> d (I -
//    beta k k^T) S + beta k v^T with |k| <= 1 and beta, d in (0, 1]: in
//    exact arithmetic the difference of two states goes through d (I - beta
//    k k^T), which does not grow a column's 2-norm. Each side's f32 step
//    differs from exact arithmetic by at most f_i per element,
//    derived_bound's terms for the step's chunks (above: it bounds either
//    form's rounding, computed with the f32 side's largest state and v).
//  - So with D_{i-1} the bound on a column's 2-norm difference after step
//    i - 1 (D_0 = 0: both start from zeros) and N_i the largest column
//    2-norm of the f32 side's state after step i, before step i's rounding
//    the difference is at most P_i = D_{i-1} + 2 sqrt(Dk) f_i, and after it
//    D_i = P_i + 2^-8 (N_i + P_i) (the bf16 side's column is at most N_i +
//    P_i long).
//  - An output o = S^T q (|q| <= 1/sqrt(Dk)) of step i differs by at most
//    D_{i-1} / sqrt(Dk) + 2 f_i (the state it starts from, then either
//    side's rounding of the step); the final states elementwise by D_last.
TEST(Gdn, Bf16StateOverStepsWithinTheRoundingBound) {
  const Inputs in = make_inputs(2, 4, 32, 32, 200, 17);
  const GdnShape& s = in.s;
  const int64_t SE = s.ssm_state_elems(), VD = s.value_dim(), Dk = s.k_head_dim, Dv = s.v_head_dim;
  const double u = std::ldexp(1.0, -24), r = std::ldexp(1.0, -8);
  const std::vector<int64_t> steps = {37, 1, 1, 27, 64, 1, 50, 19};  // 200 rows: decodes, aligned and unaligned chunks
  std::vector<float> S32(SE, 0.0f), o32(in.T * VD), o16(o32.size());
  std::vector<uint16_t> S16(SE, 0);
  const float M_v = max_abs(in.qkv);
  double D = 0.0, N_max = 0.0, worst_out = 0.0, worst_ratio = 0.0;
  int64_t row = 0;
  for (const int64_t n : steps) {
    const float* qkv = in.qkv.data() + row * s.conv_dim();
    const float* g = in.g.data() + row * s.num_v_heads;
    const float* beta = in.beta.data() + row * s.num_v_heads;
    const float M_S_before = max_abs(S32);
    gdn_rule_step(s, row, qkv, n, g, beta, S32.data(), GdnStateType::f32, o32.data() + row * VD);
    gdn_rule_step(s, row, qkv, n, g, beta, S16.data(), GdnStateType::bf16, o16.data() + row * VD);
    // f_i: derived_bound's terms for this step's chunks (aligned to multiples of 64).
    int chunks = 0;
    for (int64_t t = 0; t < n; ++chunks) t += std::min<int64_t>(n - t, kGdnChunk - (row + t) % kGdnChunk);
    const double M = std::max(M_S_before, max_abs(S32)) + M_v;
    const double f = (kGdnChunk + 4.0 * Dk + 8) * (chunks + 1) * u * M;
    const double out_tol = D / std::sqrt(static_cast<double>(Dk)) + 2 * f;
    for (int64_t i = row * VD; i < (row + n) * VD; ++i) {
      const double d = std::fabs(static_cast<double>(o16[i]) - o32[i]);
      ASSERT_LE(d, out_tol) << "row " << i / VD << " (step at " << row << ", " << n << " rows)";
      worst_out = std::max(worst_out, d);
      worst_ratio = std::max(worst_ratio, d / out_tol);
    }
    double N = 0.0;
    for (int h = 0; h < s.num_v_heads; ++h)
      for (int64_t c = 0; c < Dv; ++c) {
        double ss = 0.0;
        for (int64_t a = 0; a < Dk; ++a) ss += std::pow(static_cast<double>(S32[(h * Dk + a) * Dv + c]), 2);
        N = std::max(N, std::sqrt(ss));
      }
    N_max = std::max(N_max, N);
    const double P = D + 2 * std::sqrt(static_cast<double>(Dk)) * f;
    D = P + r * (N + P);
    row += n;
  }
  ASSERT_EQ(row, in.T);
  double worst_state = 0.0;
  for (int64_t i = 0; i < SE; ++i)
    worst_state = std::max(worst_state, std::fabs(static_cast<double>(bf16_to_f32(S16[i])) - S32[i]));
  EXPECT_LE(worst_state, D);
  std::printf("bf16 vs f32 state over %zu steps: outputs max %.3g (at most %.2f of their bound), final state max %.3g "
              "(bound %.3g), largest output %.3g\n",
              steps.size(), worst_out, worst_ratio, worst_state, D, max_abs(o32));
  // The roundings happened (the sides differ). The bound is what 8
  // roundings allow, about 8 x 2^-8 = 3.1% of the longest state column plus
  // the f32 terms: below 5% of it, so a state that lost its content (a
  // wrong slot, stride or element size) is caught. The exact semantics (one
  // rounding, at the end of a step) is Bf16StateStepIsTheF32StepRoundedOnce's.
  EXPECT_GT(worst_state, 0.0);
  EXPECT_LT(D, 0.05 * N_max);
}

TEST(Gdn, CausalConvCarriesItsState) {
  const int64_t T = 9, C = 5;
  const int K = 4;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * C), w(C * K);
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  for (GdnStateType st : {GdnStateType::f32, GdnStateType::bf16}) {
    const size_t eb = st == GdnStateType::bf16 ? 2 : 4;
    std::vector<unsigned char> s1(C * (K - 1) * eb, 0), s2(s1);
    std::vector<float> o1(T * C), o2(T * C);
    gdn_causal_conv(x.data(), T, C, K, w.data(), s1.data(), st, o1.data());
    // Token by token (decode) from a zero state: the same bits.
    for (int64_t t = 0; t < T; ++t) gdn_causal_conv(x.data() + t * C, 1, C, K, w.data(), s2.data(), st, o2.data() + t * C);
    EXPECT_EQ(o1, o2);
    EXPECT_EQ(s1, s2);
    // The definition: out[t][c] = silu(sum_j w[c][j] x[t - 3 + j][c]), zeros before 0.
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int j = 0; j < K; ++j) {
          const int64_t p = t - (K - 1) + j;
          float xv = p >= 0 ? x[p * C + c] : 0.0f;
          if (st == GdnStateType::bf16) {
            uint32_t u;
            std::memcpy(&u, &xv, 4);
            u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;  // round to nearest even bf16
            std::memcpy(&xv, &u, 4);
          }
          acc += static_cast<double>(w[c * K + j]) * xv;
        }
        const double want = acc / (1 + std::exp(-acc));
        EXPECT_NEAR(o1[t * C + c], want, 1e-5 * (1 + std::fabs(want))) << t << " " << c;
      }
  }
}

// A host model of the CUDA state pass's TF32 roundings (backend/cuda/gdn/
// gdn.h): the chunked rule with the operands the kernel rounds rounded the
// same way (q and k normalized, the prep's L and A products reading them;
// W and A after the prep, v_new, KD = k exp(last - cum), the state's copy
// in the state pass's products; q, KD and A through their f16 pairs; U,
// the state and every sum in f32), against the CPU's f32 chunked rule on the CUDA tests'
// input distribution (tests/cuda_ops/test_gdn_cuda.cpp rule_inputs: a
// fresh 140-row prefill, 120 rows continuing from a random state at
// position 37, and 1,000 rows from position 5). Its relative RMS error
// must meet the statistical bound the CUDA tests use; the test prints how
// far below it lies (0.86 u_t, flat in the chunks: the bound's model checked
// on the host, where CI runs).
namespace {

// The model for one sequence of T rows from position pos0 and state S
// (all heads), outputs into out [T][Hv*Dv].
void tf32_model_chunked(const GdnShape& s, int64_t pos0, const float* qkv, int64_t T, const float* g,
                        const float* beta, float* S, float* out) {
  using test_util::f16_of_tf32;
  using test_util::tf32_rna;
  const int Hv = s.num_v_heads, Dk = s.k_head_dim, Dv = s.v_head_dim, C = kGdnChunk;
  const int64_t VD = s.value_dim();
  // q and k normalized, rounded to TF32 (the prep's L and A products
  // read them so); q S reads q's f16 pair copy.
  auto l2 = [&](const float* x, float scale, float* y) {
    float ss = 0.0f;
    for (int a = 0; a < Dk; ++a) ss += x[a] * x[a];
    const float inv = 1.0f / std::sqrt(ss + 1e-6f);
    for (int a = 0; a < Dk; ++a) y[a] = tf32_rna(x[a] * inv * scale);
  };
  for (int h = 0; h < Hv; ++h) {
    const int kh = h / (Hv / s.num_k_heads);
    float* Sh = S + static_cast<int64_t>(h) * Dk * Dv;
    std::vector<float> q(C * Dk), qr(C * Dk), k(C * Dk), W(C * Dk), U(C * Dv), A(C * C), Sr(Dk * Dv), cum(C), b(C);
    for (int64_t t0 = 0; t0 < T;) {
      const int n = static_cast<int>(std::min<int64_t>(T - t0, C - (pos0 + t0) % C));
      float run = 0.0f;
      for (int i = 0; i < n; ++i) {
        const float* row = qkv + (t0 + i) * s.conv_dim();
        l2(row + kh * Dk, 1.0f / std::sqrt(static_cast<float>(Dk)), &q[i * Dk]);
        for (int a = 0; a < Dk; ++a) qr[i * Dk + a] = f16_of_tf32(q[i * Dk + a]);
        l2(row + s.key_dim() + kh * Dk, 1.0f, &k[i * Dk]);
        b[i] = beta[(t0 + i) * Hv + h];
        run += g[(t0 + i) * Hv + h];
        cum[i] = run;
        const float* v = row + 2 * s.key_dim() + static_cast<int64_t>(h) * Dv;
        for (int d = 0; d < Dv; ++d) U[i * Dv + d] = v[d] * b[i];
        for (int a = 0; a < Dk; ++a) W[i * Dk + a] = k[i * Dk + a] * b[i] * std::exp(cum[i]);
      }
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < i; ++j) {
          float kk = 0.0f;
          for (int a = 0; a < Dk; ++a) kk += k[i * Dk + a] * k[j * Dk + a];
          const float lij = b[i] * kk * std::exp(cum[i] - cum[j]);
          for (int d = 0; d < Dv; ++d) U[i * Dv + d] -= lij * U[j * Dv + d];
          for (int a = 0; a < Dk; ++a) W[i * Dk + a] -= lij * W[j * Dk + a];
        }
      for (int i = 0; i < n; ++i) {
        for (int a = 0; a < Dk; ++a) W[i * Dk + a] = tf32_rna(W[i * Dk + a]);
        for (int j = 0; j <= i; ++j) {
          float qk = 0.0f;
          for (int a = 0; a < Dk; ++a) qk += q[i * Dk + a] * k[j * Dk + a];
          A[i * C + j] = f16_of_tf32(tf32_rna(qk * std::exp(cum[i] - cum[j])));
        }
      }
      for (int x = 0; x < Dk * Dv; ++x) Sr[x] = tf32_rna(Sh[x]);
      for (int i = 0; i < n; ++i)  // v_new, TF32
        for (int d = 0; d < Dv; ++d) {
          float ws = 0.0f;
          for (int a = 0; a < Dk; ++a) ws += W[i * Dk + a] * Sr[a * Dv + d];
          U[i * Dv + d] = tf32_rna(U[i * Dv + d] - ws);
        }
      for (int i = 0; i < n; ++i) {
        float* o = out + (t0 + i) * VD + static_cast<int64_t>(h) * Dv;
        for (int d = 0; d < Dv; ++d) {
          float acc = 0.0f;
          for (int a = 0; a < Dk; ++a) acc += qr[i * Dk + a] * Sr[a * Dv + d];
          acc *= std::exp(cum[i]);
          for (int j = 0; j <= i; ++j) acc += A[i * C + j] * U[j * Dv + d];
          o[d] = acc;
        }
      }
      const float last = cum[n - 1], el = std::exp(last);
      for (int x = 0; x < Dk * Dv; ++x) Sh[x] *= el;
      for (int i = 0; i < n; ++i) {
        const float di = std::exp(last - cum[i]);
        for (int a = 0; a < Dk; ++a) {
          const float kd = f16_of_tf32(tf32_rna(k[i * Dk + a] * di));
          for (int d = 0; d < Dv; ++d) Sh[a * Dv + d] += kd * U[i * Dv + d];
        }
      }
      t0 += n;
    }
  }
}

double rel_rms(const float* got, const float* want, size_t n) {
  double dd = 0, ww = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    dd += d * d;
    ww += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(dd / ww);
}

}  // namespace

TEST(Gdn, Tf32ModelOfTheCudaStatePassMeetsItsBound) {
  for (auto [Dk, Dv, Hk, Hv] : {std::tuple{32, 48, 2, 4}, std::tuple{128, 128, 1, 2}}) {
    for (auto [pos0, T] : {std::pair<int64_t, int64_t>{0, 140}, std::pair<int64_t, int64_t>{37, 120}, std::pair<int64_t, int64_t>{5, 1000}}) {
      const GdnShape s{Hk, Hv, Dk, Dv, 4};
      std::mt19937_64 rng(11 + Dk + pos0);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> qkv(static_cast<size_t>(T * s.conv_dim())), a(static_cast<size_t>(T) * Hv), bb(a.size()),
          A_log(Hv), dt(Hv), S0(s.ssm_state_elems(), 0.0f);
      for (auto& x : qkv) x = nd(rng);
      for (auto& x : a) x = nd(rng);
      for (auto& x : bb) x = nd(rng);
      std::uniform_real_distribution<float> ud(0.01f, 16.0f);
      for (auto& x : A_log) x = std::log(ud(rng)) - 3.0f;
      for (auto& x : dt) x = 0.5f * nd(rng);
      if (pos0 > 0)
        for (auto& x : S0) x = 0.3f * nd(rng);
      std::vector<float> g(a.size()), beta(a.size());
      gdn_gates(a.data(), bb.data(), T, Hv, A_log.data(), dt.data(), g.data(), beta.data());
      const int64_t O = T * s.value_dim();
      std::vector<float> S_ref(S0), S_mod(S0), o_ref(O), o_mod(O);
      gdn_rule_chunked(s, pos0, qkv.data(), T, g.data(), beta.data(), S_ref.data(), o_ref.data());
      tf32_model_chunked(s, pos0, qkv.data(), T, g.data(), beta.data(), S_mod.data(), o_mod.data());
      int chunks = 0;
      for (int64_t t = 0; t < T; ++chunks) t += std::min<int64_t>(T - t, kGdnChunk - (pos0 + t) % kGdnChunk);
      const double bound = test_util::tf32_rel_rms_bound(chunks);
      const double eo = rel_rms(o_mod.data(), o_ref.data(), o_mod.size());
      const double es = rel_rms(S_mod.data(), S_ref.data(), S_mod.size());
      std::printf("Dk %d Dv %d, %lld rows at %lld (%d chunks): relative RMS error outputs %.3g, state %.3g; bound %.3g "
                  "(%.1fx / %.1fx below)\n",
                  Dk, Dv, static_cast<long long>(T), static_cast<long long>(pos0), chunks, eo, es, bound, bound / eo,
                  bound / es);
      EXPECT_LE(eo, bound);
      EXPECT_LE(es, bound);
      // The model rounds something: its error is not zero.
      EXPECT_GT(eo, 0.0);
    }
  }
}

TEST(Gdn, GatesFollowTransformers) {
  const float a[2] = {0.3f, 25.0f}, b[2] = {0.0f, -2.0f}, A_log[1] = {std::log(2.0f)}, dt[1] = {0.5f};
  float g[2], beta[2];
  gdn_gates(a, b, 2, 1, A_log, dt, g, beta);
  EXPECT_NEAR(g[0], -2.0 * std::log1p(std::exp(0.8)), 1e-6);
  EXPECT_NEAR(g[1], -2.0 * 25.5, 1e-5);  // softplus's threshold: x above 20 passes through
  EXPECT_FLOAT_EQ(beta[0], 0.5f);
  EXPECT_NEAR(beta[1], 1.0 / (1.0 + std::exp(2.0)), 1e-7);
}

TEST(Gdn, GatedNormAndQGateSplit) {
  const float x[4] = {1, 2, 3, 4}, z[4] = {0, 1, -1, 2}, w[2] = {1.0f, 0.5f};
  float y[4];
  gdn_gated_rmsnorm(x, z, 1, 2, 2, w, 0.0f, y);
  const double r0 = 1 / std::sqrt(2.5), r1 = 1 / std::sqrt(12.5);
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  EXPECT_NEAR(y[0], 1 * r0 * silu(0), 1e-6);
  EXPECT_NEAR(y[1], 0.5 * 2 * r0 * silu(1), 1e-6);
  EXPECT_NEAR(y[2], 1 * 3 * r1 * silu(-1), 1e-6);
  EXPECT_NEAR(y[3], 0.5 * 4 * r1 * silu(2), 1e-6);
  const float qg[8] = {1, 2, 10, 20, 3, 4, 30, 40};  // 2 heads of D = 2: [q q g g] each
  float q[4], gate[4];
  split_q_gate_cpu(qg, 1, 2, 2, q, gate);
  EXPECT_EQ(std::vector<float>(q, q + 4), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(std::vector<float>(gate, gate + 4), (std::vector<float>{10, 20, 30, 40}));
}
