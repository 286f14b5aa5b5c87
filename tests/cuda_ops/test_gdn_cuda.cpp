// The CUDA Gated DeltaNet kernels (backend/cuda/gdn/gdn.h) and CudaBackend's
// Qwen3.5 ops against the CPU reference (backend/cpu/gdn.h, CpuBackend), on
// random inputs: batches of several sequences of different lengths (decode
// rows, fresh and continuing prefills over several 64-row chunk boundaries,
// starting unaligned, padding sequences of slot -1), and states carried
// across calls. Skipped without a GPU (the plan test runs anyway).
//
// Tolerances (u = 2^-24, the fp32 unit roundoff). The conv, the recurrent
// rule and the norms run the CPU's IEEE operations in the CPU's order (no
// contraction: the host build has no FMA); what differs is expf / log1pf
// (CUDA: at most 2 ulp = 4u; glibc: under 1 ulp):
//  - silu(x) = x / (1 + exp(-x)) and sigmoid: exp within 6u relative, so the
//    result within 6u + 2u (the two divisions' roundings) = 8u relative;
//    a product with it 10u. The conv's sums are bitwise the CPU's, its
//    states bitwise equal.
//  - The delta rule, recurrent form on both sides (rows of one-row
//    sequences; every row with GdnRuleOptions::recurrent_only): only the
//    per-token decay exp(g) and beta differ, each within 8u relative (g's
//    exp and log1p(exp) within 4u each, then exp(g): |g| 8u exp(g) <= 8u/e
//    absolute plus 4u). Per token that perturbs a state column (2-norm) by
//    at most 8u (||S_col|| + 2 (|v| + ||S_col||)) <= 24u (sqrt(Dk) M_S + M_v),
//    M_S the largest state element along the run, M_v the largest v; the
//    token map d (I - beta k k^T) does not grow a column's 2-norm (|k| = 1,
//    beta, d in (0, 1)), so after n tokens the difference is below
//    R(n) = n 24u (sqrt(Dk) M_S + M_v) per element, and the same for the
//    outputs (|q| = 1/sqrt(Dk) <= 1).
//  - The delta rule, chunked form on both sides (sequences of two or more
//    rows): the CUDA kernels run the CPU's gdn_rule_chunked on the same q,
//    k (the same sequential norms) with the gates above, the prep's sums in
//    f32 (the L and A dots, the forward substitution), and the state pass's
//    products on TF32 tensor cores: each chunk rounds six MMA operands to
//    TF32 (u_t = 2^-11 relative, round to nearest): q, the state's copy, W,
//    A, KD and v_new, and accumulates in f32. Worst-case bounds of the
//    f32 kind (tests/backend_cpu/test_gdn.cpp's B_c) scale with u_t to a
//    fifth of the outputs here, so these sequences are checked by a
//    statistical bound instead, per sequence (outputs) and per slot
//    (states): the relative RMS error sqrt(sum d^2 / sum ref^2) at most
//    tf32_rel_rms_bound(chunks) = 2 sqrt(2 (chunks + 1)) u_t, chunks the
//    chunks the state went through (tests/common/gdn_tf32.h). The model: a
//    rounding is an independent relative error of RMS u_t / sqrt(3); an
//    output's chain within a chunk holds at most six rounded operands (q
//    and the state in Q S; A, v_new, and W and the state inside v_new), so
//    sqrt(6 / 3) u_t for sums without cancellation; the state carries its
//    error into the next chunk (the token maps do not grow a column),
//    independent chunk to chunk: sqrt(chunks + 1); 2 is an allowance for
//    cancellation, not derived. A host model of the kernel's roundings
//    (tests/backend_cpu/test_gdn.cpp) measures 0.86 u_t on these inputs,
//    flat in the chunks: 6.5x below the bound at 3 chunks. The largest
//    elementwise error is also held to 6 x the bound x the largest
//    reference element. The tests print what they measure beside the bound.
//  - Bitwise: the chunked kernel gives every column the same operations
//    whatever the Dv split (checked at every split the shape allows), and
//    chunks end at absolute multiples of 64, so a prefill split at a
//    multiple of 64 equals the one-shot prefill bitwise (the CPU's property).
//  - Through the whole op the conv outputs differ too (8u relative: q, k, v
//    within 10u, normalized q, k within 12u), so the per-token factor is
//    taken as 64u instead of 24u for one-row steps; a slot that has been
//    through the chunked form is held to the statistical bound.
//  - The gated RMSNorm y = w o / rms(o) silu(z): |dy| <= |w silu(z)| do (1 /
//    rms + |o| / rms^2) + 10u |y| per element, rms from the reference core.
// Each failure prints the largest error, where it is, and the bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gdn.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gdn/gdn.h"
#include "../common/gdn_tf32.h"
#include "cuda_ops_util.h"
#include "kv/kv_cache_manager.h"
#include "kv/planner.h"
#include "model/weights.h"

namespace fp8kv {
namespace {

using namespace cudaops_test;

constexpr double kU = 0x1.0p-24;

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

using test_util::tf32_rel_rms_bound;  // the chunked form's statistical bound (header comment)

// got vs want over the elements idx: relative RMS error <= bound and the
// largest error <= 6 bound max |want| (header comment); prints both.
void expect_rel_rms(const std::vector<float>& got, const std::vector<float>& want, const std::vector<size_t>& idx,
                    double bound, const std::string& what) {
  double dd = 0, ww = 0, dmax = 0, wmax = 0;
  size_t nan = 0;
  for (size_t i : idx) {
    const double d = static_cast<double>(got[i]) - want[i];
    if (!std::isfinite(d)) ++nan;
    dd += d * d;
    ww += static_cast<double>(want[i]) * want[i];
    dmax = std::max(dmax, std::fabs(d));
    wmax = std::max(wmax, std::fabs(static_cast<double>(want[i])));
  }
  const double rel = ww > 0 ? std::sqrt(dd / ww) : std::sqrt(dd);
  std::printf("%s: relative RMS error %.3g (bound %.3g, %.1fx below), max |cuda - cpu| %.3g (bound %.3g)\n",
              what.c_str(), rel, bound, bound / std::max(rel, 1e-300), dmax, 6 * bound * wmax);
  EXPECT_EQ(nan, 0u) << what << ": non-finite differences";
  EXPECT_LE(rel, bound) << what << ": relative RMS error over " << idx.size() << " elements";
  EXPECT_LE(dmax, 6 * bound * wmax) << what << ": largest error (largest reference element " << wmax << ")";
}

// The element indices of rows [r0, r0 + n) of a [rows][cols] array.
std::vector<size_t> row_elems(int64_t r0, int64_t n, int64_t cols) {
  std::vector<size_t> v(static_cast<size_t>(n * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<size_t>(r0 * cols) + i;
  return v;
}

// Elementwise |got - want| <= tol(i); reports the worst element (by excess
// over its bound) with its index decoded as [row][col] of `cols` columns.
template <class Tol>
void expect_within(const std::vector<float>& got, const std::vector<float>& want, int64_t cols, Tol tol,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0, worst_ratio = 0.0;
  size_t at = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]), t = tol(i);
    if (!(d <= t)) ++bad;  // NaN counts
    const double r = t > 0 ? d / t : (d > 0 ? INFINITY : 0.0);
    if (!(r <= worst_ratio)) {
      worst_ratio = r;
      at = i;
    }
    worst = std::max(worst, d);
  }
  std::printf("%s: max |cuda - cpu| = %.3g; worst vs bound at [%zu][%zu]: %.3g vs %.3g (cuda %.7g, cpu %.7g)\n",
              what.c_str(), worst, at / cols, at % cols, std::fabs(static_cast<double>(got[at]) - want[at]), tol(at),
              got[at], want[at]);
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements outside the bound; worst at ["
                     << at / cols << "][" << at % cols << "]: cuda " << got[at] << ", cpu " << want[at] << ", bound "
                     << tol(at);
}

// One test batch: sequences with their rows, start positions and slots.
struct Seq {
  int n;      // rows this step
  int pos0;   // first position (0: fresh states)
  int slot;   // state slot, -1: padding
};

struct Batch {
  std::vector<Seq> seqs;
  std::vector<int32_t> q_start, context_lens, slots;
  int T = 0;
  explicit Batch(std::vector<Seq> s) : seqs(std::move(s)) {
    q_start = {0};
    for (const Seq& q : seqs) {
      q_start.push_back(q_start.back() + q.n);
      context_lens.push_back(q.pos0 + q.n);
      slots.push_back(q.slot);
    }
    T = q_start.back();
  }
};

// Device copies of a Batch's arrays (for the kernels).
struct DevBatch {
  cuda::DeviceBuffer qs, ctx, sl;
  cuda::GdnSeqs seqs;
  explicit DevBatch(const Batch& b)
      : qs(to_device(b.q_start)), ctx(to_device(b.context_lens)), sl(to_device(b.slots)) {
    seqs = cuda::GdnSeqs{static_cast<int>(b.seqs.size()), qs.as<int32_t>(), ctx.as<int32_t>(), sl.as<int32_t>()};
    seqs.num_tokens = b.T;
  }
};

// The chunked delta rule's scratch for T rows (cuda::gdn_rule_scratch_bytes).
cuda::DeviceBuffer rule_scratch(const cuda::GdnDims& d, int64_t T) {
  return cuda::DeviceBuffer(std::max<size_t>(cuda::gdn_rule_scratch_bytes(d, T), 256));
}

// decode (continuing), fresh prefill over a chunk boundary, continuing
// prefill, a fresh one-token sequence, a padding sequence.
Batch mixed_batch() { return Batch({{1, 9, 2}, {70, 0, 0}, {5, 33, 3}, {1, 0, 1}, {1, 0, -1}}); }
constexpr int kSlots = 5;  // slot 4 is never touched

// ---- the conv ------------------------------------------------------------------

// (state type bf16, conv kernel size K): K = 4 runs the kernel sized at
// compile time, other sizes the one sized at run time.
class GdnConvCuda : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(GdnConvCuda, MatchesCpuAndCarriesItsState) {
  FP8KV_NEED_GPU();
  const auto [bf16, K] = GetParam();
  const GdnStateType st = bf16 ? GdnStateType::bf16 : GdnStateType::f32;
  const cuda::GdnDims d{2, 4, 16, 24, K};
  const int64_t C = d.conv_dim(), P = d.conv_kernel - 1, E = bf16 ? 2 : 4;
  std::mt19937_64 rng(test_seed());
  const Batch b = mixed_batch();
  const std::vector<float> x = randn(rng, static_cast<size_t>(b.T * C), 1.0f);
  const std::vector<float> w = randn(rng, static_cast<size_t>(C * d.conv_kernel), 0.5f);
  // Initial pool: random states (rounded to bf16 where the state is bf16).
  std::vector<float> init = randn(rng, static_cast<size_t>(kSlots * C * P), 1.0f);
  std::vector<uint8_t> pool(static_cast<size_t>(kSlots * C * P * E));
  for (size_t i = 0; i < init.size(); ++i) {
    if (bf16) {
      const uint16_t h = f32_to_bf16(init[i]);
      std::memcpy(pool.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(pool.data() + 4 * i, &init[i], 4);
    }
  }
  // CPU reference, sequence by sequence.
  std::vector<uint8_t> ref_pool = pool;
  std::vector<float> ref(static_cast<size_t>(b.T * C), 0.0f);
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const Seq& q = b.seqs[s];
    if (q.slot < 0) continue;
    uint8_t* cs = ref_pool.data() + q.slot * C * P * E;
    if (q.pos0 == 0) std::memset(cs, 0, C * P * E);
    gdn_causal_conv(x.data() + b.q_start[s] * C, q.n, C, d.conv_kernel, w.data(), cs, st, ref.data() + b.q_start[s] * C);
  }
  DevBatch db(b);
  cuda::DeviceBuffer dx = to_device(x), dw = to_device(w), dpool = to_device(pool), dout(b.T * C * 4);
  cuda::gdn_conv(d, db.seqs, dx.as<float>(), dw.as<float>(), dpool.get(), bf16, dout.as<float>(), nullptr);
  const std::vector<float> got = to_host<float>(dout, b.T * C);
  expect_within(got, ref, C, [&](size_t i) { return 10 * kU * std::fabs(ref[i]) + 1e-37; },
                std::string("conv out (") + (bf16 ? "bf16" : "f32") + " state)");
  const std::vector<uint8_t> got_pool = to_host<uint8_t>(dpool, pool.size());
  size_t first_diff = got_pool.size();
  for (size_t i = 0; i < got_pool.size(); ++i)
    if (got_pool[i] != ref_pool[i]) {
      first_diff = i;
      break;
    }
  EXPECT_EQ(first_diff, got_pool.size()) << "conv states differ from the CPU's first at byte " << first_diff
                                         << " (slot " << first_diff / (C * P * E) << ", channel "
                                         << first_diff % (C * P * E) / (P * E) << ")";
}

INSTANTIATE_TEST_SUITE_P(StateTypes, GdnConvCuda, ::testing::Combine(::testing::Bool(), ::testing::Values(4, 6)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "bf16" : "f32") + "_K" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- the delta rule ------------------------------------------------------------

struct RuleCase {
  int Hk, Hv, Dk, Dv;
};

class GdnRuleCuda : public ::testing::TestWithParam<RuleCase> {};

// Every row in the recurrent kernel (GdnRuleOptions::recurrent_only), the
// prefill rows included, against the CPU's recurrent form.
TEST_P(GdnRuleCuda, MatchesCpuRecurrentForm) {
  FP8KV_NEED_GPU();
  const RuleCase rc = GetParam();
  const cuda::GdnDims d{rc.Hk, rc.Hv, rc.Dk, rc.Dv, 4};
  const GdnShape s{rc.Hk, rc.Hv, rc.Dk, rc.Dv, 4};
  const int64_t C = d.conv_dim(), VD = d.value_dim(), Hv = rc.Hv, SE = s.ssm_state_elems();
  std::mt19937_64 rng(test_seed());
  const Batch b = mixed_batch();
  const std::vector<float> qkv = randn(rng, static_cast<size_t>(b.T * C), 1.0f);
  const std::vector<float> a = randn(rng, static_cast<size_t>(b.T * Hv), 1.0f), bb = randn(rng, a.size(), 1.0f);
  std::vector<float> A_log(Hv), dt = randn(rng, Hv, 0.5f);
  std::uniform_real_distribution<float> ud(0.01f, 16.0f);
  for (auto& v : A_log) v = std::log(ud(rng)) - 3.0f;  // slow decays: a long memory
  const std::vector<float> init = randn(rng, static_cast<size_t>(kSlots * SE), 0.3f);
  // CPU: gates, then the recurrent rule one token at a time (tracking the
  // largest state element along the run for the bound).
  std::vector<float> g(a.size()), beta(a.size());
  gdn_gates(a.data(), bb.data(), b.T, static_cast<int>(Hv), A_log.data(), dt.data(), g.data(), beta.data());
  std::vector<float> ref_pool = init, ref(static_cast<size_t>(b.T * VD), 0.0f);
  float M_S = max_abs(init);
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    const Seq& q = b.seqs[si];
    if (q.slot < 0) continue;
    float* S = ref_pool.data() + q.slot * SE;
    if (q.pos0 == 0) std::fill(S, S + SE, 0.0f);
    for (int t = b.q_start[si]; t < b.q_start[si + 1]; ++t) {
      gdn_rule_recurrent(s, qkv.data() + t * C, 1, g.data() + t * Hv, beta.data() + t * Hv, S, ref.data() + t * VD);
      for (int64_t i = 0; i < SE; ++i) M_S = std::max(M_S, std::fabs(S[i]));
    }
  }
  float M_v = 0.0f;
  for (int t = 0; t < b.T; ++t)
    for (int64_t i = 2 * s.key_dim(); i < C; ++i) M_v = std::max(M_v, std::fabs(qkv[t * C + i]));
  int n_max = 0;
  for (const Seq& q : b.seqs) n_max = std::max(n_max, q.n);
  const double tol = n_max * 24 * kU * (std::sqrt(static_cast<double>(rc.Dk)) * M_S + M_v);

  DevBatch db(b);
  cuda::DeviceBuffer dqkv = to_device(qkv), da = to_device(a), db_ = to_device(bb), dA = to_device(A_log),
                     ddt = to_device(dt), dpool = to_device(init);
  // NaN in the output first: padding rows must come back as zeros.
  cuda::DeviceBuffer dout = to_device(std::vector<float>(static_cast<size_t>(b.T * VD), NAN));
  cuda::GdnRuleOptions opt;
  opt.recurrent_only = true;  // the prefill rows too (the chunked form: GdnRuleChunkedCuda)
  cuda::gdn_rule(d, db.seqs, dqkv.as<float>(), da.as<float>(), db_.as<float>(), dA.as<float>(), ddt.as<float>(),
                 dpool.get(), /*state_bf16=*/false, dout.as<float>(), /*scratch=*/nullptr, 0, nullptr, opt);
  const std::vector<float> got = to_host<float>(dout, b.T * VD), got_pool = to_host<float>(dpool, init.size());
  const std::string tag = "Dk " + std::to_string(rc.Dk) + " Dv " + std::to_string(rc.Dv);
  expect_within(got, ref, VD, [&](size_t) { return tol; }, "rule outputs [row][Hv*Dv], " + tag);
  expect_within(got_pool, ref_pool, SE, [&](size_t) { return tol; }, "rule states [slot][Hv*Dk*Dv], " + tag);
  // The bound is not vacuous: below a tenth of the largest output (the
  // host side measures 0.6-3.5% for these shapes).
  EXPECT_LT(tol, 0.1 * max_abs(ref)) << tag << ": bound " << tol << ", largest output " << max_abs(ref);
  // Slot 4 (in no sequence) is untouched: bitwise.
  EXPECT_TRUE(std::equal(got_pool.begin() + 4 * SE, got_pool.end(), init.begin() + 4 * SE)) << "slot 4 was written";
}

// Dv not a multiple of 32 (idle threads), Hv/Hk = 2; and Qwen3.5's 128 x 128
// heads (66 KB of shared memory: the opt-in above 48 KB).
INSTANTIATE_TEST_SUITE_P(Shapes, GdnRuleCuda, ::testing::Values(RuleCase{2, 4, 32, 48}, RuleCase{1, 2, 128, 128}),
                         [](const auto& info) {
                           return "Dk" + std::to_string(info.param.Dk) + "_Dv" + std::to_string(info.param.Dv);
                         });

// ---- the chunked delta rule ------------------------------------------------------

static_assert(cuda::kGdnCudaChunk == kGdnChunk, "the CUDA chunked rule's chunk is the CPU's");

// How many chunks rows [pos0, pos0 + n) span (chunks end at multiples of 64).
int chunks_of(int pos0, int n) {
  int c = 0;
  for (int t = 0; t < n; ++c) t += std::min(n - t, kGdnChunk - (pos0 + t) % kGdnChunk);
  return c;
}

// Random rule inputs for T rows and a pool of `slots` slots.
struct RuleInputs {
  std::vector<float> qkv, a, b, A_log, dt, init;
};
RuleInputs rule_inputs(const GdnShape& s, int T, int slots, std::mt19937_64& rng) {
  RuleInputs in;
  in.qkv = randn(rng, static_cast<size_t>(T) * s.conv_dim(), 1.0f);
  in.a = randn(rng, static_cast<size_t>(T) * s.num_v_heads, 1.0f);
  in.b = randn(rng, in.a.size(), 1.0f);
  in.A_log.resize(s.num_v_heads);
  in.dt = randn(rng, s.num_v_heads, 0.5f);
  std::uniform_real_distribution<float> ud(0.01f, 16.0f);
  for (auto& v : in.A_log) v = std::log(ud(rng)) - 3.0f;  // slow decays: a long memory
  in.init = randn(rng, static_cast<size_t>(slots) * s.ssm_state_elems(), 0.3f);
  return in;
}

// What the CPU backend computes for a batch (one row: the recurrent form;
// more: the chunked form from the sequence's position), and each
// sequence's bound: R(n) for one row, the chunks for the chunked form's
// statistical bound (header comment),
// with M_S the largest state element along the sequence's recurrent run and
// its chunked result, M_v the largest of its v.
struct RuleRef {
  std::vector<float> out, pool;
  std::vector<double> tol;  // per sequence: the elementwise bound R(n) of a one-row sequence
  std::vector<int> chunks;  // per sequence: the chunks of a chunked one (0: one row or padding)
};
RuleRef cpu_rule(const GdnShape& s, const Batch& b, const RuleInputs& in) {
  const int64_t C = s.conv_dim(), VD = s.value_dim(), Hv = s.num_v_heads, SE = s.ssm_state_elems();
  std::vector<float> g(in.a.size()), beta(in.a.size());
  gdn_gates(in.a.data(), in.b.data(), b.T, static_cast<int>(Hv), in.A_log.data(), in.dt.data(), g.data(), beta.data());
  RuleRef r;
  r.pool = in.init;
  r.out.assign(static_cast<size_t>(b.T) * VD, 0.0f);
  r.tol.assign(b.seqs.size(), 0.0);
  r.chunks.assign(b.seqs.size(), 0);
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    const Seq& q = b.seqs[si];
    if (q.slot < 0) continue;  // padding: zero rows
    const int64_t t0 = b.q_start[si];
    float* S = r.pool.data() + q.slot * SE;
    if (q.pos0 == 0) std::fill(S, S + SE, 0.0f);
    std::vector<float> S_rec(S, S + SE), o(VD);
    float M_S = max_abs(S_rec), M_v = 0.0f;
    for (int t = 0; t < q.n; ++t) {
      gdn_rule_recurrent(s, in.qkv.data() + (t0 + t) * C, 1, g.data() + (t0 + t) * Hv, beta.data() + (t0 + t) * Hv,
                         S_rec.data(), o.data());
      M_S = std::max(M_S, max_abs(S_rec));
      for (int64_t i = 2 * s.key_dim(); i < C; ++i) M_v = std::max(M_v, std::fabs(in.qkv[(t0 + t) * C + i]));
    }
    if (q.n == 1)
      gdn_rule_recurrent(s, in.qkv.data() + t0 * C, 1, g.data() + t0 * Hv, beta.data() + t0 * Hv, S,
                         r.out.data() + t0 * VD);
    else
      gdn_rule_chunked(s, q.pos0, in.qkv.data() + t0 * C, q.n, g.data() + t0 * Hv, beta.data() + t0 * Hv, S,
                       r.out.data() + t0 * VD);
    M_S = std::max(M_S, max_abs(std::vector<float>(S, S + SE)));
    r.tol[si] = q.n * 24 * kU * (std::sqrt(static_cast<double>(s.k_head_dim)) * M_S + M_v);
    r.chunks[si] = q.n > 1 ? chunks_of(q.pos0, q.n) : 0;
  }
  return r;
}

// The step's hints as CudaBackend passes them: the most rows of one
// sequence, and the leading one-row sequences.
void set_hints(cuda::GdnSeqs& sq, const Batch& b) {
  sq.max_query_len = 0;
  sq.num_decodes = 0;
  bool lead = true;
  for (const Seq& q : b.seqs) {
    sq.max_query_len = std::max(sq.max_query_len, q.n);
    lead = lead && q.n == 1;
    sq.num_decodes += lead ? 1 : 0;
  }
}

// One gdn_rule call on the device: returns the outputs (NaN-filled before,
// so unwritten rows show) and the pool after it.
struct RuleRun {
  std::vector<float> out, pool;
};
RuleRun cuda_rule(const cuda::GdnDims& d, const Batch& b, const RuleInputs& in, const cuda::GdnRuleOptions& opt,
                  bool hints) {
  DevBatch db(b);
  if (hints) set_hints(db.seqs, b);
  cuda::DeviceBuffer dqkv = to_device(in.qkv), da = to_device(in.a), dbb = to_device(in.b),
                     dA = to_device(in.A_log), ddt = to_device(in.dt), dpool = to_device(in.init);
  const size_t on = static_cast<size_t>(b.T) * d.value_dim();
  cuda::DeviceBuffer dout = to_device(std::vector<float>(on, NAN)), scratch = rule_scratch(d, b.T);
  cuda::gdn_rule(d, db.seqs, dqkv.as<float>(), da.as<float>(), dbb.as<float>(), dA.as<float>(), ddt.as<float>(),
                 dpool.get(), /*state_bf16=*/false, dout.as<float>(), scratch.get(), scratch.bytes(), nullptr, opt);
  return RuleRun{to_host<float>(dout, on), to_host<float>(dpool, in.init.size())};
}

// The first element whose bits differ (size() when none).
size_t first_bit_diff(const std::vector<float>& x, const std::vector<float>& y) {
  if (x.size() != y.size()) return 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) return i;
  return x.size();
}

int max_smem_optin() {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return 0;
  return v;
}

class GdnRuleChunkedCuda : public ::testing::TestWithParam<RuleCase> {};

// A batch's outputs and states against the CPU's: one-row sequences
// elementwise within R(n) (their states: t + state_round (2 |ref| + t), the
// rounding of a bf16 store), chunked ones by the statistical bound (outputs
// per sequence, states per slot; state_round added to the states' bound);
// slots in no sequence exact.
void expect_matches_cpu(const std::vector<float>& out, const std::vector<float>& pool,
                        const std::vector<float>& ref_out, const std::vector<float>& ref_pool, const RuleRef& ref,
                        const Batch& b, int slots, int64_t VD, int64_t SE, double state_round, const std::string& tag) {
  std::vector<int> row_seq(b.T), slot_seq(slots, -1);
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    for (int r = b.q_start[si]; r < b.q_start[si + 1]; ++r) row_seq[r] = static_cast<int>(si);
    if (b.seqs[si].slot >= 0) slot_seq[b.seqs[si].slot] = static_cast<int>(si);
  }
  // Elementwise: one-row sequences and untouched slots (chunked ones: below).
  expect_within(out, ref_out, VD, [&](size_t i) {
    const int si = row_seq[i / VD];
    return ref.chunks[si] > 0 ? INFINITY : ref.tol[si];
  }, "rule outputs [row][Hv*Dv], one-row sequences, " + tag);
  expect_within(pool, ref_pool, SE, [&](size_t i) {
    const int si = slot_seq[i / SE];
    if (si < 0) return 0.0;
    if (ref.chunks[si] > 0) return static_cast<double>(INFINITY);
    const double t = ref.tol[si];
    return t + state_round * (2 * std::fabs(ref_pool[i]) + t);
  }, "rule states [slot][Hv*Dk*Dv], one-row sequences, " + tag);
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    const Seq& q = b.seqs[si];
    if (ref.chunks[si] == 0) continue;
    const double bound = tf32_rel_rms_bound(ref.chunks[si]);
    const std::string w = tag + ", sequence " + std::to_string(si) + " (" + std::to_string(q.n) + " rows at " +
                          std::to_string(q.pos0) + ", " + std::to_string(ref.chunks[si]) + " chunks)";
    expect_rel_rms(out, ref_out, row_elems(b.q_start[si], q.n, VD), bound, "rule outputs, " + w);
    expect_rel_rms(pool, ref_pool, row_elems(q.slot, 1, SE), bound + state_round, "rule state, " + w);
  }
}



// gdn_rule on batch b (pool of `slots` slots) as CudaBackend calls it (its
// hints: the chunked kernels for the multi-row sequences after the leading
// decodes, at the planned split), against the CPU backend's forms within
// R(n) (one row) or the statistical bound (chunked; expect_matches_cpu);
// padding rows exact zeros, slots in no sequence untouched;
// then the chunked kernels over the whole batch (no hints: they skip the
// one-row sequences at run time) at every split the shape allows: bitwise
// the same outputs and states.
void check_chunked_batch(const RuleCase& rc, const Batch& b, int slots) {
  const cuda::GdnDims d{rc.Hk, rc.Hv, rc.Dk, rc.Dv, 4};
  const GdnShape s{rc.Hk, rc.Hv, rc.Dk, rc.Dv, 4};
  const int64_t VD = d.value_dim(), SE = s.ssm_state_elems();
  std::mt19937_64 rng(test_seed());
  const RuleInputs in = rule_inputs(s, b.T, slots, rng);
  const RuleRef ref = cpu_rule(s, b, in);
  const RuleRun got = cuda_rule(d, b, in, {}, /*hints=*/true);
  const std::string tag = "Dk " + std::to_string(rc.Dk) + " Dv " + std::to_string(rc.Dv);
  int sms = 0, lead = 0;  // gdn_rule plans for the sequences after the leading decodes
  while (lead < static_cast<int>(b.seqs.size()) && b.seqs[lead].n == 1) ++lead;
  const int multi = static_cast<int>(b.seqs.size()) - lead;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const cuda::GdnChunkPlan plan = cuda::gdn_chunk_plan(d, multi, sms, static_cast<size_t>(max_smem_optin()));
  ASSERT_TRUE(plan.ok()) << tag << ": the chunked kernel does not take the shape";
  std::printf("%s: planned split %d (%zu bytes of shared memory)\n", tag.c_str(), plan.split, plan.smem);
  expect_matches_cpu(got.out, got.pool, ref.out, ref.pool, ref, b, slots, VD, SE, 0.0, tag);
  // Padding rows are zeros (exact, from the NaN fill).
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    if (b.seqs[si].slot >= 0) continue;
    for (int64_t i = b.q_start[si] * VD; i < b.q_start[si + 1] * VD; ++i)
      ASSERT_EQ(got.out[i], 0.0f) << tag << ": padding sequence " << si << ", element " << i;
  }
  // The bounds are not vacuous: the largest elementwise one below a quarter
  // of the largest output, the statistical one below 2% relative RMS.
  double worst_tol = 0.0;
  int worst_chunks = 0;
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    if (b.seqs[si].slot < 0) continue;
    if (ref.chunks[si] == 0) worst_tol = std::max(worst_tol, ref.tol[si]);
    worst_chunks = std::max(worst_chunks, ref.chunks[si]);
  }
  std::printf("%s: largest elementwise bound %.3g = %.1f%% of the largest output; statistical bound at %d chunks %.3g\n",
              tag.c_str(), worst_tol, 100 * worst_tol / max_abs(ref.out), worst_chunks,
              tf32_rel_rms_bound(worst_chunks));
  EXPECT_LT(worst_tol, 0.25 * max_abs(ref.out)) << tag << ": bound " << worst_tol << ", largest output "
                                                << max_abs(ref.out);
  EXPECT_LT(tf32_rel_rms_bound(worst_chunks), 0.02) << tag;
  // Every split: bitwise the planned run.
  int splits = 0;
  for (const int split : {1, 2, 3, 4, 6, 8, 12, 16, 32}) {
    if (!cuda::gdn_chunk_plan_at(d, split, static_cast<size_t>(max_smem_optin())).ok()) continue;
    cuda::GdnRuleOptions opt;
    opt.chunk_split = split;
    const RuleRun r = cuda_rule(d, b, in, opt, /*hints=*/false);
    const size_t od = first_bit_diff(r.out, got.out), pd = first_bit_diff(r.pool, got.pool);
    EXPECT_EQ(od, r.out.size()) << tag << ", split " << split << ": output bits differ from the planned run's first "
                                << "at [" << od / VD << "][" << od % VD << "]";
    EXPECT_EQ(pd, r.pool.size()) << tag << ", split " << split << ": state bits differ from the planned run's first "
                                 << "at [" << pd / SE << "][" << pd % SE << "]";
    ++splits;
  }
  EXPECT_GE(splits, 3) << tag;
  // A split the shape does not take is refused by name.
  cuda::GdnRuleOptions bad;
  bad.chunk_split = 5;
  EXPECT_THROW(cuda_rule(d, b, in, bad, false), std::invalid_argument);
}

// A batch mixing decode rows (continuing, fresh, padding) and prefills: a
// fresh one over three chunks (140 rows), one continuing at position 37
// over [37, 64), [64, 128), [128, 157), two rows on either side of the
// boundary at 64 (two one-row chunks), a padding prefill, a short one
// inside a chunk (check_chunked_batch).
TEST_P(GdnRuleChunkedCuda, MatchesCpuChunkedFormAtEverySplit) {
  FP8KV_NEED_GPU();
  // Slot 6 is in no sequence.
  check_chunked_batch(GetParam(),
                      Batch({{1, 9, 2}, {1, 0, 5}, {1, 0, -1}, {140, 0, 0}, {120, 37, 3}, {2, 63, 1}, {70, 0, -1},
                             {5, 33, 4}}),
                      7);
}

// The prep kernel's chunk enumeration (one CTA per 64-row block of the
// step, taking the chunks that start in it): several chunk starts in one
// block, chunks and sequences across block boundaries, decodes and padding
// between prefills (no leading decodes: the chunked kernels take every
// sequence and skip the one-row ones at run time). The 162 rows, blocks
// [0, 64), [64, 128), [128, 162): a 3-row prefill at position 62 (chunks of
// 2 and 1 rows), a decode, a fresh 2-row one, 5 rows at 60 (4 + 1), 70 rows
// at 100 across blocks 0-2 (28 + 42), a padding decode, a 4-row padding
// prefill, a fresh 65-row one (64 + 1), 2 rows at 127 (1 + 1), 9 rows at
// 10 (check_chunked_batch).
TEST_P(GdnRuleChunkedCuda, MixedLengthsAcrossRowBlocks) {
  FP8KV_NEED_GPU();
  // Slot 8 is in no sequence.
  check_chunked_batch(GetParam(),
                      Batch({{3, 62, 0}, {1, 5, 1}, {2, 0, 2}, {5, 60, 3}, {70, 100, 4}, {1, 0, -1}, {4, 0, -1},
                             {65, 0, 5}, {2, 127, 6}, {9, 10, 7}}),
                      9);
}

// A prefill split at multiples of 64 == the one-shot prefill, bitwise: rows
// [0, 37) then [37, 187) in one slot (each call alone in its batch) against
// [0, 37), [37, 64), [64, 128), [128, 187) in another, each call beside
// other sequences (a decode, a padding prefill, a fresh prefill) and at
// two splits in turn (the one-shot calls: the planned split). Same output
// bits, same final state bits; then one decode row in both slots agrees
// bitwise.
TEST_P(GdnRuleChunkedCuda, SplitAtMultipleOf64IsBitwise) {
  FP8KV_NEED_GPU();
  const RuleCase rc = GetParam();
  const cuda::GdnDims d{rc.Hk, rc.Hv, rc.Dk, rc.Dv, 4};
  const GdnShape s{rc.Hk, rc.Hv, rc.Dk, rc.Dv, 4};
  const int64_t C = d.conv_dim(), VD = d.value_dim(), Hv = rc.Hv, SE = s.ssm_state_elems();
  constexpr int kN = 188, kExtra = 80;  // the sequence's rows (the last one decoded), other sequences' rows
  std::mt19937_64 rng(test_seed());
  const RuleInputs seq = rule_inputs(s, kN, 4, rng), other = rule_inputs(s, kExtra, 0, rng);
  cuda::DeviceBuffer dA = to_device(seq.A_log), ddt = to_device(seq.dt), dpool = to_device(seq.init);
  // A call: its sequences, each with its rows (from `seq`: first row, or
  // from `other` when src < 0); returns the outputs.
  struct Part {
    Seq q;
    int src;  // first row in `seq`, -1: rows from `other`
  };
  auto call = [&](const std::vector<Part>& parts, int chunk_split = 0) {
    std::vector<Seq> qs;
    std::vector<float> qkv, a, bb;
    int extra = 0;
    for (const Part& p : parts) {
      qs.push_back(p.q);
      const RuleInputs& from = p.src >= 0 ? seq : other;
      const int r0 = p.src >= 0 ? p.src : extra;
      if (p.src < 0) extra += p.q.n;
      qkv.insert(qkv.end(), from.qkv.begin() + r0 * C, from.qkv.begin() + (r0 + p.q.n) * C);
      a.insert(a.end(), from.a.begin() + r0 * Hv, from.a.begin() + (r0 + p.q.n) * Hv);
      bb.insert(bb.end(), from.b.begin() + r0 * Hv, from.b.begin() + (r0 + p.q.n) * Hv);
    }
    const Batch b(qs);
    DevBatch db(b);
    set_hints(db.seqs, b);
    cuda::DeviceBuffer dqkv = to_device(qkv), da = to_device(a), dbb = to_device(bb),
                       dout(static_cast<size_t>(b.T) * VD * 4), scratch = rule_scratch(d, b.T);
    cuda::GdnRuleOptions opt;
    opt.chunk_split = chunk_split;
    cuda::gdn_rule(d, db.seqs, dqkv.as<float>(), da.as<float>(), dbb.as<float>(), dA.as<float>(), ddt.as<float>(),
                   dpool.get(), /*state_bf16=*/false, dout.as<float>(), scratch.get(), scratch.bytes(), nullptr, opt);
    return to_host<float>(dout, static_cast<size_t>(b.T) * VD);
  };
  auto rows = [&](const std::vector<float>& o, int r0, int n) {
    return std::vector<float>(o.begin() + r0 * VD, o.begin() + (r0 + n) * VD);
  };
  std::vector<float> one, split;  // the sequence's output rows, [0, 187)
  auto append = [](std::vector<float>& to, const std::vector<float>& v) { to.insert(to.end(), v.begin(), v.end()); };
  // Slot 0: 37 rows, then 150.
  append(one, call({{{37, 0, 0}, 0}}));
  append(one, call({{{150, 37, 0}, 37}}));
  // Slot 1: 37 rows, 27, 64, 59 (slot 2: a continuing decode; slot 3: a fresh prefill).
  // Two splits the kernel takes for the shape (Dv / split <= 64): 1 and 2,
  // or 2 and 4.
  const int sa = cuda::gdn_chunk_plan_at(d, 1, 232448).ok() ? 1 : 2, sb = 2 * sa;
  append(split, rows(call({{{1, 5, 2}, -1}, {{37, 0, 1}, 0}}, sb), 1, 37));
  append(split, rows(call({{{27, 37, 1}, 37}, {{3, 0, -1}, -1}}, sa), 0, 27));
  append(split, rows(call({{{1, 6, 2}, -1}, {{64, 64, 1}, 64}, {{70, 0, 3}, -1}}, sb), 1, 64));
  append(split, rows(call({{{59, 128, 1}, 128}}, sa), 0, 59));
  const std::string tag = "Dk " + std::to_string(rc.Dk) + " Dv " + std::to_string(rc.Dv);
  ASSERT_EQ(one.size(), split.size());
  const size_t od = first_bit_diff(split, one);
  EXPECT_EQ(od, one.size()) << tag << ": the split prefill's output bits differ from the one-shot's first at row "
                            << od / VD << ", element " << od % VD << ": " << split[od] << " vs " << one[od];
  const std::vector<float> pool = to_host<float>(dpool, seq.init.size());
  const std::vector<float> s0(pool.begin(), pool.begin() + SE), s1(pool.begin() + SE, pool.begin() + 2 * SE);
  const size_t sd = first_bit_diff(s1, s0);
  EXPECT_EQ(sd, s0.size()) << tag << ": the final states differ first at element " << sd;
  // Row 187 decoded in both slots in one step.
  const std::vector<float> dec = call({{{1, 187, 0}, 187}, {{1, 187, 1}, 187}});
  EXPECT_EQ(first_bit_diff(rows(dec, 0, 1), rows(dec, 1, 1)), static_cast<size_t>(VD))
      << tag << ": a decode after the two prefills differs";
}

// ---- a bf16 recurrent state (--mamba-ssm-cache-dtype bfloat16) ----

// gdn_rule on a pool of bf16 states `bits` (the rest as cuda_rule): the
// outputs and the pool's bits after the call.
struct RuleRunBf16 {
  std::vector<float> out;
  std::vector<uint16_t> pool;
};
RuleRunBf16 cuda_rule_bf16(const cuda::GdnDims& d, const Batch& b, const RuleInputs& in,
                           const std::vector<uint16_t>& bits, const cuda::GdnRuleOptions& opt) {
  DevBatch db(b);
  set_hints(db.seqs, b);
  cuda::DeviceBuffer dqkv = to_device(in.qkv), da = to_device(in.a), dbb = to_device(in.b),
                     dA = to_device(in.A_log), ddt = to_device(in.dt), dpool = to_device(bits);
  const size_t on = static_cast<size_t>(b.T) * d.value_dim();
  cuda::DeviceBuffer dout = to_device(std::vector<float>(on, NAN)), scratch = rule_scratch(d, b.T);
  cuda::gdn_rule(d, db.seqs, dqkv.as<float>(), da.as<float>(), dbb.as<float>(), dA.as<float>(), ddt.as<float>(),
                 dpool.get(), /*state_bf16=*/true, dout.as<float>(), scratch.get(), scratch.bytes(), nullptr, opt);
  return RuleRunBf16{to_host<float>(dout, on), to_host<uint16_t>(dpool, bits.size())};
}

// Both kernels on a bf16 pool, the batch of MatchesCpuChunkedFormAtEverySplit
// (decodes, fresh and continuing prefills over chunk boundaries, padding),
// from states rounded to bf16:
//  - exact, on the device: the outputs are bitwise those of the same call on
//    an f32 pool holding the same values (the state is widened on the read,
//    the step is the f32 kernels' step), and every stored state is that
//    call's f32 state rounded to nearest even (one rounding, at the end);
//    the same with every row in the recurrent kernel;
//  - against the CPU backend's bf16 state (gdn_rule_step): the outputs
//    within each sequence's f32 bound (R(n), or the chunked form's
//    statistical one: the two sides start from the same values), the
//    states within what rounding adds to it: the f32 states a (CUDA) and b
//    (CPU) differ by at most t, and rounding moves each by at most 2^-8 of
//    its magnitude, |a| <= |b| + t, so |RNE(a) - RNE(b)| <= t + 2^-8 (2 |b|
//    + t) (for the statistical bound: + 2^-7 relative).
TEST_P(GdnRuleChunkedCuda, Bf16StateIsTheF32StepRoundedOnce) {
  FP8KV_NEED_GPU();
  const RuleCase rc = GetParam();
  const cuda::GdnDims d{rc.Hk, rc.Hv, rc.Dk, rc.Dv, 4};
  const GdnShape s{rc.Hk, rc.Hv, rc.Dk, rc.Dv, 4};
  const int64_t C = s.conv_dim(), VD = d.value_dim(), Hv = s.num_v_heads, SE = s.ssm_state_elems();
  constexpr int kRuleSlots = 7;  // slot 6 is in no sequence
  const Batch b({{1, 9, 2}, {1, 0, 5}, {1, 0, -1}, {140, 0, 0}, {120, 37, 3}, {2, 63, 1}, {70, 0, -1}, {5, 33, 4}});
  std::mt19937_64 rng(test_seed());
  RuleInputs in = rule_inputs(s, b.T, kRuleSlots, rng);
  std::vector<uint16_t> bits(in.init.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = f32_to_bf16(in.init[i]);
    in.init[i] = bf16_to_f32(bits[i]);  // the f32 pool holds the bf16 values
  }
  const std::string tag = "Dk " + std::to_string(rc.Dk) + " Dv " + std::to_string(rc.Dv);
  for (const bool recurrent_only : {false, true}) {
    cuda::GdnRuleOptions opt;
    opt.recurrent_only = recurrent_only;
    const RuleRun f32 = cuda_rule(d, b, in, opt, /*hints=*/true);
    const RuleRunBf16 bf = cuda_rule_bf16(d, b, in, bits, opt);
    const std::string what = tag + (recurrent_only ? ", every row recurrent" : "");
    const size_t od = first_bit_diff(bf.out, f32.out);
    EXPECT_EQ(od, bf.out.size()) << what << ": outputs differ from the f32 pool's first at [" << od / VD << "]["
                                 << od % VD << "]";
    size_t bad = 0, first = bf.pool.size();
    for (size_t i = 0; i < bf.pool.size(); ++i)
      if (bf.pool[i] != f32_to_bf16(f32.pool[i])) {
        ++bad;
        first = std::min(first, i);
      }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " stored elements are not the f32 call's state rounded to bf16, the "
                       << "first at [" << first / SE << "][" << first % SE << "]";
  }
  // The CPU backend's rule on the same bf16 pool, sequence by sequence.
  const RuleRef ref = cpu_rule(s, b, in);  // f32 states from the same values: outputs and bounds
  std::vector<float> g(in.a.size()), beta(in.a.size()), cpu_out(static_cast<size_t>(b.T) * VD, 0.0f);
  gdn_gates(in.a.data(), in.b.data(), b.T, static_cast<int>(Hv), in.A_log.data(), in.dt.data(), g.data(), beta.data());
  std::vector<uint16_t> cpu_pool = bits;
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    const Seq& q = b.seqs[si];
    if (q.slot < 0) continue;
    const int64_t t0 = b.q_start[si];
    gdn_rule_step(s, q.pos0, in.qkv.data() + t0 * C, q.n, g.data() + t0 * Hv, beta.data() + t0 * Hv,
                  cpu_pool.data() + q.slot * SE, GdnStateType::bf16, cpu_out.data() + t0 * VD);
  }
  ASSERT_EQ(first_bit_diff(cpu_out, ref.out), cpu_out.size()) << "the CPU's bf16 state changed its outputs";
  const RuleRunBf16 got = cuda_rule_bf16(d, b, in, bits, {});
  std::vector<float> got_s(got.pool.size()), cpu_s(got.pool.size());
  for (size_t i = 0; i < got.pool.size(); ++i) {
    got_s[i] = bf16_to_f32(got.pool[i]);
    cpu_s[i] = bf16_to_f32(cpu_pool[i]);
  }
  // The rounding term 2^-8 (2 |b| + t) with |b| from the rounded value
  // (|b| <= |RNE(b)| (1 + 2^-8)): at most 2^-7 (2 |RNE(b)| + t).
  expect_matches_cpu(got.out, got_s, cpu_out, cpu_s, ref, b, kRuleSlots, VD, SE, std::ldexp(1.0, -7),
                     "bf16 state, " + tag);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GdnRuleChunkedCuda,
                         ::testing::Values(RuleCase{2, 4, 32, 48}, RuleCase{1, 2, 128, 128}),
                         [](const auto& info) {
                           return "Dk" + std::to_string(info.param.Dk) + "_Dv" + std::to_string(info.param.Dv);
                         });

// The plan is a pure function of the shapes (no device needed): H100
// numbers (132 SMs, 232,448 bytes of opt-in shared memory per block).
TEST(GdnChunkPlan, FollowsTheShapes) {
  constexpr size_t kSmem = 232448;
  const cuda::GdnDims q27{16, 48, 128, 128, 4};  // Qwen3.5-27B
  cuda::GdnChunkPlan p = cuda::gdn_chunk_plan(q27, 1, 132, kSmem);
  // 96 CTAs of 64 columns, one per SM: split 4's 192 would take two waves,
  // and a chunk's fixed latency does not shrink with the columns; split 1
  // does not fit.
  EXPECT_EQ(p.split, 2);
  EXPECT_EQ(p.smem, 151824u);  // 4 (128 x 72 + 64 x 68 + 64 x 132 + 32 x 136 + 2 x 64 x 72 + 32 x 72 + 68)
  EXPECT_EQ(p.ctas_per_sm, 1);
  EXPECT_EQ(p.prep_ld_t, 72);
  EXPECT_EQ(p.prep_smem, 108304u);
  EXPECT_EQ(cuda::gdn_chunk_plan(q27, 4, 132, kSmem).split, 2);
  p = cuda::gdn_chunk_plan_at(q27, 4, kSmem);
  EXPECT_EQ(p.smem, 119056u);
  EXPECT_FALSE(cuda::gdn_chunk_plan_at(q27, 1, kSmem).ok());  // 128 columns: two state tiles per warp
  EXPECT_EQ(cuda::gdn_chunk_plan(cuda::GdnDims{8, 24, 128, 128, 4}, 1, 132, kSmem).split, 4);  // TP 2
  // Shapes it does not take: the recurrent form runs every row.
  EXPECT_FALSE(cuda::gdn_chunk_plan(cuda::GdnDims{16, 48, 136, 128, 4}, 1, 132, kSmem).ok());  // Dk % 16
  EXPECT_FALSE(cuda::gdn_chunk_plan(cuda::GdnDims{16, 48, 128, 124, 4}, 1, 132, kSmem).ok());  // Dv / split % 8
  EXPECT_FALSE(cuda::gdn_chunk_plan(cuda::GdnDims{16, 48, 144, 128, 4}, 1, 132, kSmem).ok());  // Dk > 128
  EXPECT_TRUE(cuda::gdn_chunk_plan(cuda::GdnDims{1, 4, 16, 32, 4}, 1, 132, kSmem).ok());       // the smallest goldens'
  EXPECT_FALSE(cuda::gdn_chunk_plan_at(q27, 3, kSmem).ok());  // 128 / 3
  EXPECT_FALSE(cuda::gdn_chunk_plan_at(q27, 2, 150000).ok());
  EXPECT_TRUE(cuda::gdn_chunk_plan_at(cuda::GdnDims{2, 4, 32, 48, 4}, 6, kSmem).ok());    // 8 columns per CTA
  EXPECT_FALSE(cuda::gdn_chunk_plan_at(cuda::GdnDims{2, 4, 32, 48, 4}, 12, kSmem).ok());  // 4
  // The scratch: 4 (Hv (2 Dk + Dv + 64 + 2) + Hk Dk / 2) bytes per row,
  // 256-byte aligned pieces.
  EXPECT_EQ(cuda::gdn_rule_scratch_bytes(q27, 8192), size_t{8192} * (48 * (2 * 128 + 128 + 64 + 2) + 16 * 64) * 4);
  EXPECT_EQ(cuda::gdn_rule_scratch_bytes(q27, 1), size_t{4} * (48 * 128 * 3 + 48 * 64 + 16 * 64) + 512);
}

// ---- gated RMSNorm, split_q_gate, mul_sigmoid -------------------------------------

TEST(GdnSmallOpsCuda, GatedRmsnormSplitAndSigmoidMatchCpu) {
  FP8KV_NEED_GPU();
  std::mt19937_64 rng(test_seed());
  const int T = 7, Hv = 3, Dv = 160, Hq = 4, D = 64;
  const float eps = 1e-6f;
  const std::vector<float> x = randn(rng, T * Hv * Dv, 1.0f), z = randn(rng, x.size(), 1.5f),
                           w = randn(rng, Dv, 0.2f);
  std::vector<float> ref(x.size());
  gdn_gated_rmsnorm(x.data(), z.data(), T, Hv, Dv, w.data(), eps, ref.data());
  cuda::DeviceBuffer dx = to_device(x), dz = to_device(z), dw = to_device(w);
  cuda::gdn_gated_rmsnorm(dx.as<float>(), dz.as<float>(), T, Hv, Dv, dw.as<float>(), eps, dx.get(), false, nullptr);
  const std::vector<float> got = to_host<float>(dx, x.size());  // in place (y aliases x)
  expect_within(got, ref, Hv * Dv, [&](size_t i) { return 10 * kU * std::fabs(ref[i]) + 1e-37; }, "gated rmsnorm");
  // Many blocks of rows, the last one partial (21 rows above; 32 per block
  // at Dv 128), out of place.
  {
    const int T2 = 77, Hv2 = 5, Dv2 = 128;
    const std::vector<float> x2 = randn(rng, T2 * Hv2 * Dv2, 1.0f), z2 = randn(rng, x2.size(), 1.5f),
                             w2 = randn(rng, Dv2, 0.2f);
    std::vector<float> ref2(x2.size());
    gdn_gated_rmsnorm(x2.data(), z2.data(), T2, Hv2, Dv2, w2.data(), eps, ref2.data());
    cuda::DeviceBuffer dx2 = to_device(x2), dz2 = to_device(z2), dw2 = to_device(w2), dy2(x2.size() * 4);
    cuda::gdn_gated_rmsnorm(dx2.as<float>(), dz2.as<float>(), T2, Hv2, Dv2, dw2.as<float>(), eps, dy2.get(), false,
                            nullptr);
    const std::vector<float> got2 = to_host<float>(dy2, x2.size());
    expect_within(got2, ref2, Hv2 * Dv2, [&](size_t i) { return 10 * kU * std::fabs(ref2[i]) + 1e-37; },
                  "gated rmsnorm, 385 rows");
    // bf16 out (out_proj's input): the f32 result rounded once.
    cuda::DeviceBuffer dyb2(x2.size() * 2);
    cuda::gdn_gated_rmsnorm(dx2.as<float>(), dz2.as<float>(), T2, Hv2, Dv2, dw2.as<float>(), eps, dyb2.get(), true,
                            nullptr);
    const std::vector<uint16_t> gotb2 = to_host<uint16_t>(dyb2, x2.size());
    for (size_t i = 0; i < x2.size(); ++i)
      ASSERT_EQ(gotb2[i], f32_to_bf16(got2[i])) << "gated rmsnorm (bf16) element " << i;
    // Rows that are not 16-byte aligned (x one float in) and a Dv that is
    // not a multiple of 4: the scalar kernel, the same values.
    for (const int Dv3 : {Dv2, 130}) {
      const int64_t n3 = static_cast<int64_t>(T2) * Hv2 * Dv3;
      const std::vector<float> x3 = randn(rng, n3 + 1, 1.0f), z3 = randn(rng, n3, 1.5f), w3 = randn(rng, Dv3, 0.2f);
      std::vector<float> ref3(n3);
      gdn_gated_rmsnorm(x3.data() + 1, z3.data(), T2, Hv2, Dv3, w3.data(), eps, ref3.data());
      cuda::DeviceBuffer dx3 = to_device(x3), dz3 = to_device(z3), dw3 = to_device(w3), dy3(n3 * 4), dyb3(n3 * 2);
      cuda::gdn_gated_rmsnorm(dx3.as<float>() + 1, dz3.as<float>(), T2, Hv2, Dv3, dw3.as<float>(), eps, dy3.get(),
                              false, nullptr);
      cuda::gdn_gated_rmsnorm(dx3.as<float>() + 1, dz3.as<float>(), T2, Hv2, Dv3, dw3.as<float>(), eps, dyb3.get(),
                              true, nullptr);
      const std::vector<float> got3 = to_host<float>(dy3, n3);
      expect_within(got3, ref3, Hv2 * Dv3, [&](size_t i) { return 10 * kU * std::fabs(ref3[i]) + 1e-37; },
                    "gated rmsnorm, scalar rows");
      const std::vector<uint16_t> gotb3 = to_host<uint16_t>(dyb3, n3);
      for (int64_t i = 0; i < n3; ++i)
        ASSERT_EQ(gotb3[i], f32_to_bf16(got3[i])) << "gated rmsnorm (bf16, scalar) element " << i << ", Dv " << Dv3;
    }
  }

  const std::vector<float> qg = randn(rng, T * Hq * 2 * D, 1.0f);
  std::vector<float> q(T * Hq * D), gate(q.size());
  split_q_gate_cpu(qg.data(), T, Hq, D, q.data(), gate.data());
  cuda::DeviceBuffer dqg = to_device(qg), dq(q.size() * 4), dg(q.size() * 4);
  cuda::split_q_gate(dqg.as<float>(), T, Hq, D, dq.as<float>(), dg.as<float>(), nullptr);
  EXPECT_EQ(to_host<float>(dq, q.size()), q) << "split_q_gate: q";
  EXPECT_EQ(to_host<float>(dg, q.size()), gate) << "split_q_gate: gate";

  std::vector<float> m = q;
  mul_sigmoid_cpu(m.data(), gate.data(), static_cast<int64_t>(m.size()));
  cuda::mul_sigmoid(dq.as<float>(), dg.as<float>(), static_cast<int64_t>(q.size()), nullptr);
  expect_within(to_host<float>(dq, q.size()), m, Hq * D, [&](size_t i) { return 10 * kU * std::fabs(m[i]) + 1e-37; },
                "mul_sigmoid");
  const std::vector<float> got_m = to_host<float>(dq, q.size());

  // The gates read in place from fused q|k|v rows ([Hq][2][D] then k, v of
  // Hkv = 2 heads): the same values as split + mul_sigmoid, into f32 and
  // into bf16 (rounded once: bf16 of the f32 result).
  const int Hkv = 2;
  const int64_t row = 2 * Hq * D + 2 * Hkv * D;
  std::vector<float> qkv(T * row);
  std::vector<float> rest = randn(rng, qkv.size(), 1.0f);
  for (int t = 0; t < T; ++t)
    for (int64_t c = 0; c < row; ++c)
      qkv[t * row + c] = c < 2 * Hq * D ? qg[t * 2 * Hq * D + c] : rest[t * row + c];
  cuda::DeviceBuffer dqkv = to_device(qkv), dxq = to_device(q), dyf(q.size() * 4), dyb(q.size() * 2);
  cuda::mul_sigmoid_heads(dxq.as<float>(), T, Hq * D, D, dqkv.as<float>() + D, row, 2 * D, dyf.get(), false, nullptr);
  cuda::mul_sigmoid_heads(dxq.as<float>(), T, Hq * D, D, dqkv.as<float>() + D, row, 2 * D, dyb.get(), true, nullptr);
  EXPECT_EQ(to_host<float>(dyf, q.size()), got_m) << "mul_sigmoid_heads (f32) against mul_sigmoid";
  const std::vector<uint16_t> got_b = to_host<uint16_t>(dyb, q.size());
  for (size_t i = 0; i < q.size(); ++i)
    ASSERT_EQ(got_b[i], f32_to_bf16(got_m[i])) << "mul_sigmoid_heads (bf16) element " << i;
  // Unaligned strides (an odd row length): the scalar kernel, same values.
  {
    const int64_t row1 = row + 1;
    std::vector<float> qkv1(T * row1, 0.0f);
    for (int t = 0; t < T; ++t)
      for (int64_t c = 0; c < row; ++c) qkv1[t * row1 + c] = qkv[t * row + c];
    cuda::DeviceBuffer dqkv1 = to_device(qkv1), dy1(q.size() * 4);
    cuda::mul_sigmoid_heads(dxq.as<float>(), T, Hq * D, D, dqkv1.as<float>() + D, row1, 2 * D, dy1.get(), false,
                            nullptr);
    EXPECT_EQ(to_host<float>(dy1, q.size()), got_m) << "mul_sigmoid_heads, scalar";
  }
}

// ---- the whole op through the backends ----------------------------------------------

ModelConfig qwen3_5_config(int Hk, int Hv, int Dk, int Dv) {
  nlohmann::json j = {{"architectures", {"Qwen3_5ForCausalLM"}},
                      {"model_type", "qwen3_5_text"},
                      {"hidden_size", 128},
                      {"intermediate_size", 256},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 2},
                      {"num_key_value_heads", 1},
                      {"head_dim", 64},
                      {"vocab_size", 300},
                      {"max_position_embeddings", 1024},
                      {"rms_norm_eps", 1e-6},
                      {"eos_token_id", 2},
                      {"linear_conv_kernel_dim", 4},
                      {"linear_key_head_dim", Dk},
                      {"linear_value_head_dim", Dv},
                      {"linear_num_key_heads", Hk},
                      {"linear_num_value_heads", Hv},
                      {"layer_types", {"linear_attention", "full_attention"}},
                      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}}},
                      {"attn_output_gate", true}};
  return parse_model_config(j, "qwen3_5 cuda gdn test config");
}

// The KV plan of the Gated DeltaNet tests: a bf16 cache and kSlots state
// slots, the recurrent state f32 or (ssm_bf16) bf16.
KvPlan side_plan(const ModelConfig& cfg, bool ssm_bf16 = false) {
  KvPlanSettings ps;
  ps.ssm_state_dtype = ssm_bf16 ? StateDtype::bf16 : StateDtype::f32;
  ps.kv_memory_bytes = 16u << 20;
  ps.max_model_len = 256;
  ps.max_num_seqs = kSlots;
  ps.max_num_batched_tokens = 128;
  ps.block_size = 16;
  return plan_kv_cache(cfg, ps);
}

// One backend with a state pool of kSlots slots for cfg.
struct Side {
  std::unique_ptr<Backend> be;
  BackendWeights w;
  Side(std::unique_ptr<Backend> b, const ModelConfig& cfg, std::shared_ptr<const ModelWeights> mw,
       bool ssm_bf16 = false)
      : be(std::move(b)) {
    w = be->upload_weights(mw);
    const KvPlan plan = side_plan(cfg, ssm_bf16);
    be->allocate_kv(plan, kv_layout(plan));
  }
  Tensor put(const std::vector<float>& h, int64_t rows) {
    DeviceBuffer buf = be->alloc(h.size() * 4);
    be->upload(buf.data(), h.data(), h.size() * 4);
    Tensor t{buf.data(), ScalarType::f32, rows, static_cast<int64_t>(h.size()) / rows};
    keep.push_back(std::move(buf));
    return t;
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<float> h(static_cast<size_t>(t.numel()));
    be->download(h.data(), t.data, h.size() * 4);
    return h;
  }
  // gated_delta_net of layer 0 on one step; returns out [T][VD].
  std::vector<float> run(const StepBatch& sb, const std::vector<float>& qkv, const std::vector<float>& z,
                         const std::vector<float>& bt, const std::vector<float>& at, float eps) {
    be->begin_step(sb);
    const int64_t T = sb.num_tokens;
    Tensor tq = put(qkv, T), tz = put(z, T), tb = put(bt, T), ta = put(at, T),
           out = put(std::vector<float>(z.size(), 0.0f), T);
    be->gated_delta_net(sb, 0, w.layers[0], tq, tz, tb, ta, eps, out);
    return get(out);
  }
  std::vector<DeviceBuffer> keep;
};

// A StepBatch of `seqs` (decodes first, as the scheduler orders them): the
// fields gated_delta_net and begin_step read; the KV arrays are empty
// tables (no attention layer runs).
StepBatch step_batch(const Batch& b, int num_groups) {
  StepBatch sb;
  sb.num_seqs = static_cast<int>(b.seqs.size());
  sb.num_tokens = b.T;
  sb.num_groups = num_groups;
  sb.max_blocks_per_seq = 1;
  sb.query_start = b.q_start;
  sb.context_lens = b.context_lens;
  sb.state_slots = b.slots;
  for (const Seq& q : b.seqs) {
    sb.is_decode.push_back(q.n == 1 ? 1 : 0);
    sb.num_decodes += q.n == 1 ? 1 : 0;
    sb.max_query_len = std::max(sb.max_query_len, q.n);
    sb.max_context_len = std::max(sb.max_context_len, q.pos0 + q.n);
    for (int i = 0; i < q.n; ++i) {
      sb.token_ids.push_back(3);
      sb.positions.push_back(q.pos0 + i);
    }
  }
  sb.slot_mapping.assign(num_groups, std::vector<int64_t>(b.T, -1));
  sb.block_tables.assign(num_groups, std::vector<int32_t>(b.seqs.size(), -1));
  return sb;
}

// The shape and the recurrent state's dtype (true: bf16).
class GdnOpCuda : public ::testing::TestWithParam<std::tuple<RuleCase, bool>> {};

// Two steps through CudaBackend and CpuBackend: step 1 runs a fresh
// one-row sequence and three fresh prefills (70 rows over a chunk boundary,
// 5 rows, 37 rows); step 2 decodes the first two beside a padding decode,
// continues the 5-row prefill with 9 rows at an unaligned position and the
// 37-row one with 100 rows over two chunk boundaries (both backends: the
// chunked form from a carried state). A step's states differ between the
// backends by the step's bound, and with a bf16 state by the rounding of two
// f32 values that far apart (Bf16StateIsTheF32StepRoundedOnce); step 2's
// bounds carry that difference: a state column c apart moves an output by
// at most |c| |q| <= c_elem sqrt(Dk) / sqrt(Dk) = c_elem, and the step's
// final state by at most |c| <= sqrt(Dk) c_elem (the token maps do not
// grow a column). A slot whose state went through the chunked form (TF32
// products) is checked by the statistical bound instead, over all the
// chunks it went through, with the bf16 store's 2^-7 per step, doubled for
// the gated norm (y = w o / rms(o) silu(z): a relative error of o moves y
// by at most twice as much, through o and through rms(o)).
TEST_P(GdnOpCuda, MatchesCpuBackendOverSteps) {
  FP8KV_NEED_GPU();
  const auto [rc, ssm_bf16] = GetParam();
  const ModelConfig cfg = qwen3_5_config(rc.Hk, rc.Hv, rc.Dk, rc.Dv);
  const GatedDeltaNetConfig& gc = *cfg.gdn;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  auto mw = ModelWeights::random(cfg, 99, 0.1f, /*bf16=*/true);
  Side cuda(std::make_unique<CudaBackend>(cfg, BackendOptions{}), cfg, mw, ssm_bf16);
  Side cpu(std::make_unique<CpuBackend>(cfg, BackendOptions{}), cfg, mw, ssm_bf16);
  const int G = static_cast<int>(side_plan(cfg).groups.size());
  const GdnShape s{gc.num_k_heads, gc.num_v_heads, gc.k_head_dim, gc.v_head_dim, gc.conv_kernel};
  const int64_t C = s.conv_dim(), VD = s.value_dim(), Hv = s.num_v_heads, Dv = s.v_head_dim;
  const LayerWeights& L0 = mw->layers[0];
  std::mt19937_64 rng(test_seed());
  // Host model of the states for the bound (what CpuBackend computes).
  std::vector<std::vector<uint16_t>> conv_st(kSlots, std::vector<uint16_t>(s.conv_state_elems(), 0));
  std::vector<std::vector<float>> ssm_st(kSlots, std::vector<float>(s.ssm_state_elems(), 0.0f));
  std::vector<double> carry(kSlots, 0.0);  // per slot: |CUDA state - CPU state| per element, after the last step
  std::vector<int> tf32_chunks(kSlots, 0);  // per slot: chunks through the chunked form (0: none)
  std::vector<int> bf16_stores(kSlots, 0);  // per slot: bf16 stores since its first chunk
  const std::vector<Batch> steps = {Batch({{1, 0, 1}, {70, 0, 0}, {5, 0, 3}, {37, 0, 4}}),
                                    Batch({{1, 1, 1}, {1, 70, 0}, {1, 0, -1}, {9, 5, 3}, {100, 37, 4}})};
  for (size_t st = 0; st < steps.size(); ++st) {
    const Batch& b = steps[st];
    const StepBatch sb = step_batch(b, G);
    const int64_t T = b.T;
    // Projections of a normed input: O(1) values.
    const std::vector<float> qkv = randn(rng, T * C, 1.0f), z = randn(rng, T * VD, 1.0f),
                             bt = randn(rng, T * Hv, 1.0f), at = randn(rng, T * Hv, 1.0f);
    const std::vector<float> got = cuda.run(sb, qkv, z, bt, at, eps);
    const std::vector<float> want = cpu.run(sb, qkv, z, bt, at, eps);
    // The reference core (before the norm) and the state magnitudes, with the
    // CPU backend's own steps (gdn.h), for the bound.
    std::vector<float> g(T * Hv), beta(g.size()), conv(T * C), core(T * VD);
    gdn_gates(at.data(), bt.data(), T, static_cast<int>(Hv), L0.A_log.data(), L0.dt_bias.data(), g.data(), beta.data());
    float M_S = 0.0f, M_v = 0.0f;
    std::vector<double> seq_tol(b.seqs.size());
    std::vector<float> seq_M_S(b.seqs.size(), 0.0f);  // the largest element of the sequence's f32 state after the step
    for (size_t si = 0; si < b.seqs.size(); ++si) {
      const Seq& q = b.seqs[si];
      const int64_t t0 = b.q_start[si];
      if (q.slot < 0) continue;  // padding: zero rows (core stays 0), no state
      if (q.pos0 == 0) {
        std::fill(conv_st[q.slot].begin(), conv_st[q.slot].end(), 0);
        std::fill(ssm_st[q.slot].begin(), ssm_st[q.slot].end(), 0.0f);
        carry[q.slot] = 0.0;
        tf32_chunks[q.slot] = 0;
        bf16_stores[q.slot] = 0;
      }
      if (q.n > 1) tf32_chunks[q.slot] += chunks_of(q.pos0, q.n);
      if (ssm_bf16 && tf32_chunks[q.slot] > 0) ++bf16_stores[q.slot];
      M_S = std::max(M_S, max_abs(ssm_st[q.slot]));
      gdn_causal_conv(qkv.data() + t0 * C, q.n, C, s.conv_kernel, L0.conv1d.data(), conv_st[q.slot].data(),
                      GdnStateType::bf16, conv.data() + t0 * C);
      std::vector<float> S_rec = ssm_st[q.slot], o_rec(VD);  // the recurrent run: max |S| along it
      for (int t = 0; t < q.n; ++t) {
        gdn_rule_recurrent(s, conv.data() + (t0 + t) * C, 1, g.data() + (t0 + t) * Hv, beta.data() + (t0 + t) * Hv,
                           S_rec.data(), o_rec.data());
        M_S = std::max(M_S, max_abs(S_rec));
      }
      float* S = ssm_st[q.slot].data();
      if (q.n == 1)
        gdn_rule_recurrent(s, conv.data() + t0 * C, 1, g.data() + t0 * Hv, beta.data() + t0 * Hv, S, core.data() + t0 * VD);
      else
        gdn_rule_chunked(s, q.pos0, conv.data() + t0 * C, q.n, g.data() + t0 * Hv, beta.data() + t0 * Hv, S,
                         core.data() + t0 * VD);
      seq_M_S[si] = max_abs(ssm_st[q.slot]);
      if (ssm_bf16)  // gdn_rule_step's store: the f32 step's state rounded once (its start values are bf16 values)
        for (float& x : ssm_st[q.slot]) x = round_bf16(x);
      for (int64_t t = 0; t < q.n; ++t)
        for (int64_t i = 2 * s.key_dim(); i < C; ++i) M_v = std::max(M_v, std::fabs(conv[(t0 + t) * C + i]));
    }
    // The core's bound per sequence (header comment): both backends run
    // the recurrent form for one row and the chunked form for more.
    for (size_t si = 0; si < b.seqs.size(); ++si) {
      const Seq& q = b.seqs[si];
      if (q.slot < 0) continue;  // exact zeros
      // (A sequence of two or more rows puts its slot under the statistical bound.)
      const double t = q.n * 64 * kU * (std::sqrt(static_cast<double>(s.k_head_dim)) * M_S + M_v);
      seq_tol[si] = t + carry[q.slot];  // the outputs: this step's bound and the carried states'
      // The states after the step (f32: before a bf16 store's rounding), then rounded.
      const double f = t + std::sqrt(static_cast<double>(s.k_head_dim)) * carry[q.slot];
      carry[q.slot] = ssm_bf16 ? f + std::ldexp(1.0, -8) * (2 * seq_M_S[si] + f) : f;
    }
    // The CPU backend is this host model (the same functions): bitwise.
    std::vector<float> y_ref(T * VD);
    gdn_gated_rmsnorm(core.data(), z.data(), T, static_cast<int>(Hv), static_cast<int>(Dv), L0.gdn_norm.data(), eps,
                      y_ref.data());
    ASSERT_EQ(want, y_ref) << "the test's host model is not what CpuBackend computes";
    std::vector<int> row_seq(T);
    for (size_t si = 0; si < b.seqs.size(); ++si)
      for (int r = b.q_start[si]; r < b.q_start[si + 1]; ++r) row_seq[r] = static_cast<int>(si);
    auto tol = [&](size_t i) {
      const int64_t r = static_cast<int64_t>(i) / VD, h = (static_cast<int64_t>(i) % VD) / Dv, e = i % Dv;
      const float* o = core.data() + r * VD + h * Dv;
      double ss = 0;
      for (int64_t k = 0; k < Dv; ++k) ss += static_cast<double>(o[k]) * o[k];
      const double rms = std::sqrt(ss / Dv + eps), zz = z[i], silu = zz / (1 + std::exp(-zz));
      const Seq& q = b.seqs[row_seq[r]];
      if (q.slot >= 0 && tf32_chunks[q.slot] > 0) return static_cast<double>(INFINITY);  // below
      const double d_o = seq_tol[row_seq[r]];
      return std::fabs(L0.gdn_norm[e] * silu) * d_o * (1 / rms + std::fabs(o[e]) / (rms * rms)) +
             10 * kU * std::fabs(want[i]) + 1e-30;
    };
    expect_within(got, want, VD,
                  tol, "gated_delta_net step " + std::to_string(st) + " (Dk " + std::to_string(rc.Dk) + ", Dv " +
                           std::to_string(rc.Dv) + (ssm_bf16 ? ", bf16 state" : "") + ") out [row][Hv*Dv]");
    for (size_t si = 0; si < b.seqs.size(); ++si) {
      const Seq& q = b.seqs[si];
      if (q.slot < 0 || tf32_chunks[q.slot] == 0) continue;
      // This step's store is not yet in its outputs.
      const int stores = bf16_stores[q.slot] - (ssm_bf16 ? 1 : 0);
      const double bound = 2 * (tf32_rel_rms_bound(tf32_chunks[q.slot]) + stores * std::ldexp(1.0, -7));
      expect_rel_rms(got, want, row_elems(b.q_start[si], q.n, VD), bound,
                     "gated_delta_net step " + std::to_string(st) + " (Dk " + std::to_string(rc.Dk) + ", Dv " +
                         std::to_string(rc.Dv) + (ssm_bf16 ? ", bf16 state" : "") + "), sequence " +
                         std::to_string(si) + " (" + std::to_string(tf32_chunks[q.slot]) + " chunks)");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GdnOpCuda,
                         ::testing::Combine(::testing::Values(RuleCase{2, 4, 32, 48}, RuleCase{1, 2, 128, 128}),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           const RuleCase& rc = std::get<0>(info.param);
                           return "Dk" + std::to_string(rc.Dk) + "_Dv" + std::to_string(rc.Dv) +
                                  (std::get<1>(info.param) ? "_bf16_state" : "_f32_state");
                         });

// The whole op: a 124-row prefill in one slot == 64 rows then 60 in
// another, bitwise (a split at a multiple of 64: the chunked form's chunks
// are the same, the conv is per row, the states round-trip through the pool
// exactly: f32 recurrent state, the conv state holding the bf16 rounding the
// conv inputs get anyway). Row 124 decoded in both slots in one step then
// also agrees bitwise (the carried states are equal). A split elsewhere, or
// decode rows after a prefill, agree within the chunked-vs-recurrent bound
// only (GdnOpCuda, GdnRuleChunkedCuda), as on the CPU.
TEST(GdnOpCudaStates, PrefillSplitAtMultipleOf64EqualsOneShot) {
  FP8KV_NEED_GPU();
  const ModelConfig cfg = qwen3_5_config(2, 4, 32, 48);
  const GatedDeltaNetConfig& gc = *cfg.gdn;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  auto mw = ModelWeights::random(cfg, 5, 0.1f, /*bf16=*/true);
  Side cuda(std::make_unique<CudaBackend>(cfg, BackendOptions{}), cfg, mw);
  const int G = static_cast<int>(side_plan(cfg).groups.size());
  const int64_t C = gc.conv_dim(), VD = gc.value_dim(), Hv = gc.num_v_heads;
  std::mt19937_64 rng(test_seed());
  const int N = 125;
  const std::vector<float> qkv = randn(rng, N * C, 1.0f), z = randn(rng, N * VD, 1.0f), bt = randn(rng, N * Hv, 1.0f),
                           at = randn(rng, N * Hv, 1.0f);
  auto rows = [&](const std::vector<float>& v, int64_t cols, int r0, int n) {
    return std::vector<float>(v.begin() + r0 * cols, v.begin() + (r0 + n) * cols);
  };
  // Batch b's rows: a padding decode's (row 0 of the inputs) if it leads,
  // then rows [r0, r0 + n) of the sequence.
  auto run = [&](const Batch& b, int r0) {
    std::vector<float> q, zz, bb, aa;
    for (const Seq& s : b.seqs) {
      const int from = s.slot < 0 ? 0 : r0;
      for (auto [dst, src, cols] : {std::tuple{&q, &qkv, C}, std::tuple{&zz, &z, VD}, std::tuple{&bb, &bt, Hv},
                                    std::tuple{&aa, &at, Hv}}) {
        const std::vector<float> r = rows(*src, cols, from, s.n);
        dst->insert(dst->end(), r.begin(), r.end());
      }
    }
    return cuda.run(step_batch(b, G), q, zz, bb, aa, eps);
  };
  // Slot 2: one 124-row prefill.
  const std::vector<float> one = run(Batch({{124, 0, 2}}), 0);
  // Slot 0: 64 rows (beside a padding decode), then 60.
  std::vector<float> split = run(Batch({{1, 0, -1}, {64, 0, 0}}), 0);
  for (int64_t i = 0; i < VD; ++i) ASSERT_EQ(split[i], 0.0f) << "padding row element " << i;
  split.erase(split.begin(), split.begin() + VD);
  const std::vector<float> rest = run(Batch({{60, 64, 0}}), 64);
  split.insert(split.end(), rest.begin(), rest.end());
  ASSERT_EQ(split.size(), one.size());
  for (int r = 0; r < 124; ++r)
    ASSERT_EQ(0, std::memcmp(split.data() + r * VD, one.data() + r * VD, VD * sizeof(float)))
        << "row " << r << " of the split prefill differs from the one-shot prefill's";
  // Row 124 in both slots (two decodes in one step).
  std::vector<float> q2 = rows(qkv, C, 124, 1), z2 = rows(z, VD, 124, 1), b2 = rows(bt, Hv, 124, 1),
                     a2 = rows(at, Hv, 124, 1);
  for (auto* v : {&q2, &z2, &b2, &a2}) v->insert(v->end(), v->begin(), v->end());
  const std::vector<float> o = cuda.run(step_batch(Batch({{1, 124, 0}, {1, 124, 2}}), G), q2, z2, b2, a2, eps);
  EXPECT_EQ(0, std::memcmp(o.data(), o.data() + VD, VD * sizeof(float)))
      << "the carried states differ: slot 0 (64 + 60 rows) vs slot 2 (124-row prefill)";
}

}  // namespace
}  // namespace fp8kv
