// Per-token-head KV cache dtypes (fp8_per_token_head, int8_per_token_head) on
// the CPU reference (backend/cpu/kv_ops.h): the scale rule, the store (round
// trip, zero and denormal vectors, NaN, bit-equality with the per-tensor store
// at equal scales) and paged attention against a dequantize-then-attend
// reference in double with a tolerance derived from the f32 arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/kv_ops.h"

namespace fp8kv {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // f32 unit roundoff

KvCacheLayout layout(KvDtype d, int blocks = 8, int block_size = 4, int heads = 2, int dim = 64) {
  KvCacheLayout L;
  L.num_blocks = blocks;
  L.block_size = block_size;
  L.num_kv_heads = heads;
  L.head_dim = dim;
  L.dtype = d;
  return L;
}

struct Cache {
  std::vector<uint8_t> k, v;
  std::vector<float> ks, vs;
  explicit Cache(const KvCacheLayout& L)
      : k(L.cache_bytes()), v(L.cache_bytes()), ks(L.scale_bytes() / 4), vs(L.scale_bytes() / 4) {}
};

// Values with a heavy tail: most |x| ~ 1, a few outliers up to ~1300 (beyond e4m3's 448).
std::vector<float> outlier_values(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng) * (u(rng) < 0.02f ? 600.0f : 1.0f);
  return x;
}

// |q * s - x| for one stored value: e4m3, half an ulp of 3 mantissa bits
// (2^-4 relative) for normals and half the subnormal step 2^-9 below 2^-6;
// int8, half a step. Both on x / s, so times s; plus the f32 rounding of the
// division and of the product q * s.
double roundtrip_bound(KvDtype d, float x, float s) {
  const double ax = std::fabs(double(x));
  if (d == KvDtype::int8_pth) return 0.5 * s + 2 * kU * ax;
  return std::max(ax * 0x1p-4, 0x1p-10 * s) * (1 + 4 * kU) + 2 * kU * ax;
}

TEST(KvPth, DtypeTable) {
  EXPECT_EQ(parse_kv_dtype("fp8_per_token_head"), KvDtype::fp8_e4m3_pth);
  EXPECT_EQ(parse_kv_dtype("int8_per_token_head"), KvDtype::int8_pth);
  EXPECT_EQ(kv_dtype_name(KvDtype::fp8_e4m3_pth), "fp8_per_token_head");
  EXPECT_EQ(kv_dtype_name(KvDtype::int8_pth), "int8_per_token_head");
  EXPECT_EQ(kv_dtype_elem_max(KvDtype::fp8_e4m3_pth), 448.0f);
  EXPECT_EQ(kv_dtype_elem_max(KvDtype::int8_pth), 127.0f);
  EXPECT_TRUE(kv_dtype_is_fp8(KvDtype::fp8_e4m3_pth));
  EXPECT_FALSE(kv_dtype_is_fp8(KvDtype::int8_pth));
  EXPECT_TRUE(kv_dtype_per_token_head(KvDtype::int8_pth));
  EXPECT_FALSE(kv_dtype_per_token_head(KvDtype::fp8_e4m3));
  // Scale bytes: 4 / head_dim of the element bytes.
  const KvCacheLayout L = layout(KvDtype::fp8_e4m3_pth, 8, 16, 8, 128);
  EXPECT_EQ(L.scale_block_bytes() * 128, L.block_bytes() * 4);
  EXPECT_EQ(layout(KvDtype::fp8_e4m3).scale_block_bytes(), 0u);
  EXPECT_EQ(L.scale_offset(37, 5), 37 * 8 + 5);
}

TEST(KvPth, Int8Saturating) {
  EXPECT_EQ(f32_to_int8_sat(2.5f), 2);  // ties to even
  EXPECT_EQ(f32_to_int8_sat(3.5f), 4);
  EXPECT_EQ(static_cast<int8_t>(f32_to_int8_sat(-2.5f)), -2);
  EXPECT_EQ(static_cast<int8_t>(f32_to_int8_sat(-126.7f)), -127);
  EXPECT_EQ(f32_to_int8_sat(127.49f), 127);
  EXPECT_EQ(f32_to_int8_sat(1e9f), 127);
  EXPECT_EQ(static_cast<int8_t>(f32_to_int8_sat(-INFINITY)), -127);
  EXPECT_EQ(f32_to_int8_sat(NAN), 0);
  EXPECT_EQ(f32_to_int8_sat(1e-30f), 0);
  for (int i = -127; i <= 127; ++i) EXPECT_EQ(int8_to_f32(f32_to_int8_sat(static_cast<float>(i))), i);
}

TEST(KvPth, ScaleRule) {
  for (KvDtype d : {KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
    const float M = kv_dtype_elem_max(d);
    const std::vector<float> x = {1.0f, -1300.0f, NAN, 3.0f};
    EXPECT_EQ(per_token_head_scale(x, d), 1300.0f / M);  // NaN ignored
    const std::vector<float> zero(16, 0.0f);
    EXPECT_EQ(per_token_head_scale(zero, d), FLT_MIN);
    const std::vector<float> den = {1e-40f, -3e-41f};
    EXPECT_EQ(per_token_head_scale(den, d), FLT_MIN);  // never denormal
    const std::vector<float> inf = {1.0f, INFINITY};
    EXPECT_EQ(per_token_head_scale(inf, d), INFINITY);
  }
}

// Store through store_kv_cpu; every element's dequantized value q * s within
// the format's rounding of x (no clipping: the largest element maps to M).
TEST(KvPth, StoreRoundTrip) {
  std::mt19937 rng(7);
  for (KvDtype d : {KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
    const KvCacheLayout L = layout(d);
    Cache c(L);
    const int T = 10;
    const auto k = outlier_values(rng, static_cast<size_t>(T) * L.token_stride());
    const auto v = outlier_values(rng, k.size());
    std::vector<int64_t> slots(T);
    for (int t = 0; t < T; ++t) slots[t] = 3 * t + 1;  // scattered over blocks
    const float junk = 1000.0f;                       // per-tensor scales: ignored
    store_kv_cpu(L, c.k.data(), c.v.data(), k.data(), v.data(), slots.data(), T, {&junk, 1}, {&junk, 1}, c.ks.data(),
                 c.vs.data());
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < L.num_kv_heads; ++h)
        for (int s = 0; s < 2; ++s) {
          const float* x = (s == 0 ? k : v).data() + t * L.token_stride() + h * L.head_dim;
          const void* cache = s == 0 ? c.k.data() : c.v.data();
          const float sc = (s == 0 ? c.ks : c.vs)[L.scale_offset(slots[t], h)];
          EXPECT_EQ(sc, per_token_head_scale({x, static_cast<size_t>(L.head_dim)}, d));
          double amax = 0;
          for (int i = 0; i < L.head_dim; ++i) amax = std::max(amax, std::fabs(double(x[i])));
          for (int i = 0; i < L.head_dim; ++i) {
            const double deq = double(load_cache_elem(L, cache, L.slot_offset(slots[t], h) + i)) * sc;
            ASSERT_LE(std::fabs(deq - x[i]), roundtrip_bound(d, x[i], sc)) << kv_dtype_name(d) << " t " << t << " h " << h << " i " << i;
            if (std::fabs(x[i]) == amax) {
              EXPECT_NEAR(deq, x[i], 4 * kU * amax);  // the peak is not clipped
            }
          }
        }
  }
}

TEST(KvPth, ZeroDenormalAndNaNVectors) {
  for (KvDtype d : {KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
    const KvCacheLayout L = layout(d, 2, 4, 3, 16);
    Cache c(L);
    std::vector<float> k(L.token_stride(), 0.0f), v(L.token_stride(), 0.0f);
    for (int i = 0; i < L.head_dim; ++i) {
      k[L.head_dim + i] = (i % 2 ? -1.0f : 1.0f) * 1e-40f * static_cast<float>(i + 1);  // head 1: denormals
      v[2 * L.head_dim + i] = static_cast<float>(i);                                      // head 2: one NaN
    }
    v[2 * L.head_dim + 3] = NAN;
    const int64_t slot = 5;
    store_kv_cpu(L, c.k.data(), c.v.data(), k.data(), v.data(), &slot, 1, {}, {}, c.ks.data(), c.vs.data());
    // Head 0 of K: zero vector -> s = FLT_MIN, zeros stored.
    EXPECT_EQ(c.ks[L.scale_offset(slot, 0)], FLT_MIN);
    for (int i = 0; i < L.head_dim; ++i) EXPECT_EQ(load_cache_elem(L, c.k.data(), L.slot_offset(slot, 0) + i), 0.0f);
    // Head 1 of K: denormals -> s = FLT_MIN (never denormal); each value within the format's rounding
    // (int8: all of them below half a step, stored as 0).
    const float s1 = c.ks[L.scale_offset(slot, 1)];
    EXPECT_EQ(s1, FLT_MIN);
    for (int i = 0; i < L.head_dim; ++i) {
      const float q = load_cache_elem(L, c.k.data(), L.slot_offset(slot, 1) + i);
      EXPECT_LE(std::fabs(double(q) * s1 - k[L.head_dim + i]), roundtrip_bound(d, k[L.head_dim + i], s1)) << i;
      if (d == KvDtype::int8_pth) {
        EXPECT_EQ(q, 0.0f);
      }
    }
    // Head 2 of V: NaN ignored by amax (s = 15 / M); fp8 stores the NaN code, int8 stores 0.
    EXPECT_EQ(c.vs[L.scale_offset(slot, 2)], 15.0f / kv_dtype_elem_max(d));
    const float back = load_cache_elem(L, c.v.data(), L.slot_offset(slot, 2) + 3);
    if (d == KvDtype::int8_pth) {
      EXPECT_EQ(back, 0.0f);
    } else {
      EXPECT_TRUE(std::isnan(back));
    }
  }
}

// Where the scales are equal, the bytes are the per-tensor path's: store each
// token through the fp8_e4m3 store with per-head ScaleRefs holding the
// per-token-head scales just written.
TEST(KvPth, BitEqualToPerTensorStoreAtEqualScales) {
  std::mt19937 rng(11);
  const KvCacheLayout P = layout(KvDtype::fp8_e4m3_pth), E = layout(KvDtype::fp8_e4m3);
  const KvCacheLayout I = layout(KvDtype::int8_pth);
  Cache cp(P), ce(E), ci(I);
  const int T = 12;
  auto k = outlier_values(rng, static_cast<size_t>(T) * P.token_stride());
  auto v = outlier_values(rng, k.size());
  k[5] = 1e-39f;  // a denormal among normals
  v[7] = -0.0f;
  std::vector<int64_t> slots(T);
  std::iota(slots.begin(), slots.end(), 2);
  store_kv_cpu(P, cp.k.data(), cp.v.data(), k.data(), v.data(), slots.data(), T, {}, {}, cp.ks.data(), cp.vs.data());
  store_kv_cpu(I, ci.k.data(), ci.v.data(), k.data(), v.data(), slots.data(), T, {}, {}, ci.ks.data(), ci.vs.data());
  for (int t = 0; t < T; ++t) {
    std::vector<float> ks(E.num_kv_heads), vs(E.num_kv_heads);
    for (int h = 0; h < E.num_kv_heads; ++h) {
      ks[h] = cp.ks[P.scale_offset(slots[t], h)];
      vs[h] = cp.vs[P.scale_offset(slots[t], h)];
    }
    store_kv_cpu(E, ce.k.data(), ce.v.data(), k.data() + t * E.token_stride(), v.data() + t * E.token_stride(),
                 &slots[t], 1, {ks.data(), E.num_kv_heads}, {vs.data(), E.num_kv_heads});
  }
  EXPECT_EQ(cp.k, ce.k);
  EXPECT_EQ(cp.v, ce.v);
  // int8: the same division and a saturating round to nearest even.
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < I.num_kv_heads; ++h)
      for (int i = 0; i < I.head_dim; ++i) {
        const int64_t e = t * I.token_stride() + h * I.head_dim + i;
        ASSERT_EQ(ci.k[I.slot_offset(slots[t], h) + i], f32_to_int8_sat(k[e] / ci.ks[I.scale_offset(slots[t], h)]));
        ASSERT_EQ(ci.v[I.slot_offset(slots[t], h) + i], f32_to_int8_sat(v[e] / ci.vs[I.scale_offset(slots[t], h)]));
      }
}

struct AttnCase {
  KvDtype dtype;
  int window;
  float softcap;
};

// paged_attention_cpu against attention in double over the dequantized cache
// (q * s per element). Tolerance per output element, from the f32 arithmetic:
// each score carries at most |delta| <= gamma(D + 3) * scale * sum_d |q_d k_d|
// (dot product of D terms, then two multiplies; the softcap's tanh has slope
// <= 1 and adds a few ulp of cap), each p_j = exp(s_j - m) then has relative
// error <= e^(2 delta + 4u) - 1 (= eps_p), and out = sum p_j vs_j vq_j / sum p_j
// moves by at most (2 eps_p + gamma(n + 3)) * max_j |v_j| (numerator and
// denominator each relatively off by eps_p; n-term f32 sums).
TEST(KvPth, AttentionMatchesDequantizedReference) {
  std::mt19937 rng(3);
  for (const AttnCase& ac : {AttnCase{KvDtype::fp8_e4m3_pth, 0, 0.0f}, AttnCase{KvDtype::int8_pth, 0, 0.0f},
                             AttnCase{KvDtype::fp8_e4m3_pth, 9, 30.0f}, AttnCase{KvDtype::int8_pth, 7, 0.0f}}) {
    const KvCacheLayout L = layout(ac.dtype, 16, 4, 2, 64);
    const int Hq = 4, D = L.head_dim, group = Hq / L.num_kv_heads;
    const int ctx = 37, nq = 5;
    Cache c(L);
    // Shuffled physical blocks.
    std::vector<int32_t> table(16);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<int64_t> slots(ctx);
    for (int j = 0; j < ctx; ++j) slots[j] = static_cast<int64_t>(table[j / L.block_size]) * L.block_size + j % L.block_size;
    const auto k = outlier_values(rng, static_cast<size_t>(ctx) * L.token_stride());
    const auto v = outlier_values(rng, k.size());
    store_kv_cpu(L, c.k.data(), c.v.data(), k.data(), v.data(), slots.data(), ctx, {}, {}, c.ks.data(), c.vs.data());
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(nq) * Hq * D), out(q.size());
    for (auto& x : q) x = nd(rng) * 0.05f;
    std::vector<int32_t> pos(nq);
    for (int i = 0; i < nq; ++i) pos[i] = ctx - nq + i;
    PagedAttentionArgs a;
    a.layout = L;
    a.k_cache = c.k.data();
    a.v_cache = c.v.data();
    a.block_table = table.data();
    a.context_len = ctx;
    a.window = ac.window;
    a.softmax_scale = 0.125f;
    a.logit_softcap = ac.softcap;
    const float junk[1] = {1000.0f};  // per-tensor scales: ignored
    a.k_scale = {junk, 1};
    a.v_scale = {junk, 1};
    a.k_scale_pth = c.ks.data();
    a.v_scale_pth = c.vs.data();
    paged_attention_cpu(a, q.data(), pos.data(), nq, Hq, out.data());

    for (int i = 0; i < nq; ++i)
      for (int h = 0; h < Hq; ++h) {
        const int kvh = h / group;
        const float* qi = &q[(static_cast<size_t>(i) * Hq + h) * D];
        const int first = ac.window > 0 ? std::max(0, pos[i] - ac.window + 1) : 0;
        const int n = pos[i] - first + 1;
        std::vector<double> sc(n);
        double m = -INFINITY, delta = 0.0, vmax = 0.0;
        for (int j = first; j <= pos[i]; ++j) {
          const float ksj = c.ks[L.scale_offset(slots[j], kvh)];
          double dot = 0.0, absdot = 0.0;
          for (int d = 0; d < D; ++d) {
            const double kd = double(load_cache_elem(L, c.k.data(), L.slot_offset(slots[j], kvh) + d)) * ksj;
            dot += qi[d] * kd;
            absdot += std::fabs(qi[d] * kd);
          }
          double s = dot * a.softmax_scale;
          if (ac.softcap > 0) s = ac.softcap * std::tanh(s / ac.softcap);
          delta = std::max(delta, (D + 3) * kU / (1 - (D + 3) * kU) * a.softmax_scale * absdot +
                                      (ac.softcap > 0 ? 4 * kU * ac.softcap : 0.0));
          sc[j - first] = s;
          m = std::max(m, s);
        }
        std::vector<double> ref(D, 0.0);
        double l = 0.0;
        for (int j = first; j <= pos[i]; ++j) {
          const double p = std::exp(sc[j - first] - m);
          l += p;
          const float vsj = c.vs[L.scale_offset(slots[j], kvh)];
          for (int d = 0; d < D; ++d) {
            const double vd = double(load_cache_elem(L, c.v.data(), L.slot_offset(slots[j], kvh) + d)) * vsj;
            ref[d] += p * vd;
            vmax = std::max(vmax, std::fabs(vd));
          }
        }
        const double eps_p = std::expm1(2 * delta + 4 * kU);
        const double tol = (2 * eps_p + (n + 3) * kU / (1 - (n + 3) * kU)) * vmax;
        for (int d = 0; d < D; ++d)
          ASSERT_NEAR(out[(static_cast<size_t>(i) * Hq + h) * D + d], ref[d] / l, tol)
              << kv_dtype_name(ac.dtype) << " window " << ac.window << " q " << i << " head " << h << " d " << d;
      }
  }
}

TEST(KvPth, MissingScaleArraysAreAnError) {
  const KvCacheLayout L = layout(KvDtype::int8_pth);
  Cache c(L);
  std::vector<float> k(L.token_stride()), v(L.token_stride());
  const int64_t slot = 0;
  EXPECT_THROW(store_kv_cpu(L, c.k.data(), c.v.data(), k.data(), v.data(), &slot, 1, {}, {}), std::invalid_argument);
}

}  // namespace
}  // namespace fp8kv
