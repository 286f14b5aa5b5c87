// The KV store's saturation counter (backend/cpu/kv_ops.h store_kv_cpu's
// `clips`, Backend::kv_clip_counts; docs/robustness.md "KV clipping"): the
// count equals the elements with |x / s| beyond the format's max finite,
// counted here independently in double; counting leaves every stored byte
// equal to the plain saturating conversion; bf16 and per-token-head caches
// count 0; skipped slots count nothing; the CPU backend sums per layer over
// its store_kv calls.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cpu/kv_ops.h"
#include "kv/kv_cache_manager.h"
#include "kv/planner.h"
#include "model/config.h"

namespace fp8kv {
namespace {

KvCacheLayout clip_layout(KvDtype d) {
  KvCacheLayout L;
  L.num_blocks = 4;
  L.block_size = 4;
  L.num_kv_heads = 2;
  L.head_dim = 32;
  L.dtype = d;
  return L;
}

// Values of x / s spread over [0, 2M] in magnitude, none within 1e-4 of M
// (so that the fp32 division and the double count below cannot disagree on
// which side of M a value lies), plus inf, -inf and NaN at fixed places.
std::vector<float> values(std::mt19937& rng, size_t n, float s, float max_finite) {
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::vector<float> x(n);
  for (auto& v : x) {
    double r;
    do r = u(rng);
    while (std::fabs(std::fabs(r) - 1.0) < 1e-4);
    v = static_cast<float>(r * max_finite * s);
  }
  x[3] = std::numeric_limits<float>::infinity();
  x[40] = -std::numeric_limits<float>::infinity();
  x[77] = std::numeric_limits<float>::quiet_NaN();
  return x;
}

// The independent count: |x| / s > M in double; inf saturates, NaN does not.
uint64_t expected_clips(const std::vector<float>& x, const std::vector<int64_t>& slots, const KvCacheLayout& L,
                        const std::vector<float>& scale, float max_finite) {
  uint64_t n = 0;
  const size_t stride = static_cast<size_t>(L.num_kv_heads) * L.head_dim;
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    for (int h = 0; h < L.num_kv_heads; ++h)
      for (int d = 0; d < L.head_dim; ++d) {
        const double v = x[t * stride + static_cast<size_t>(h) * L.head_dim + d];
        if (std::fabs(v) / scale[static_cast<size_t>(h)] > max_finite) ++n;
      }
  }
  return n;
}

TEST(KvClip, CountEqualsIndependentCountAndBytesAreThePlainConversion) {
  for (const KvDtype d : {KvDtype::fp8_e4m3, KvDtype::fp8_e5m2}) {
    SCOPED_TRACE(std::string(kv_dtype_name(d)));
    const KvCacheLayout L = clip_layout(d);
    const float M = kv_dtype_elem_max(d);
    std::mt19937 rng(7);
    const std::vector<float> ks = {0.01f, 0.03f}, vs = {1e-3f, 2e-4f};  // per KV head
    const std::vector<int64_t> slots = {0, 5, -1, 9, 15, 2};             // one token skipped
    const size_t n = slots.size() * L.num_kv_heads * L.head_dim;
    // Each head's values drawn for that head's scale.
    std::vector<float> k(n), v(n);
    for (int h = 0; h < L.num_kv_heads; ++h) {
      const std::vector<float> kh = values(rng, n, ks[h], M), vh = values(rng, n, vs[h], M);
      for (size_t t = 0; t < slots.size(); ++t)
        for (int e = 0; e < L.head_dim; ++e) {
          const size_t i = (t * L.num_kv_heads + h) * L.head_dim + e;
          k[i] = kh[i];
          v[i] = vh[i];
        }
    }
    std::vector<uint8_t> kc(L.cache_bytes()), vc(L.cache_bytes());
    KvClipCounts c;
    store_kv_cpu(L, kc.data(), vc.data(), k.data(), v.data(), slots.data(), static_cast<int>(slots.size()),
                 ScaleRef{ks.data(), 2}, ScaleRef{vs.data(), 2}, nullptr, nullptr, &c);
    const uint64_t ek = expected_clips(k, slots, L, ks, M), ev = expected_clips(v, slots, L, vs, M);
    EXPECT_EQ(c.k, ek);
    EXPECT_EQ(c.v, ev);
    EXPECT_EQ(c.stored, 5u * L.num_kv_heads * L.head_dim);  // 5 stored tokens
    // About half of |x / s| lie in (M, 2M]: the counts are not trivially 0 or all.
    EXPECT_GT(ek, c.stored / 3);
    EXPECT_LT(ek, c.stored * 2 / 3);
    // A second call adds to the same counts.
    store_kv_cpu(L, kc.data(), vc.data(), k.data(), v.data(), slots.data(), static_cast<int>(slots.size()),
                 ScaleRef{ks.data(), 2}, ScaleRef{vs.data(), 2}, nullptr, nullptr, &c);
    EXPECT_EQ(c.k, 2 * ek);
    EXPECT_EQ(c.v, 2 * ev);
    // Every stored byte is the plain conversion f32_to_fp8(x / s), the
    // clipped ones +-M, and a store without the counter writes the same bytes.
    std::vector<uint8_t> kc2(L.cache_bytes()), vc2(L.cache_bytes());
    store_kv_cpu(L, kc2.data(), vc2.data(), k.data(), v.data(), slots.data(), static_cast<int>(slots.size()),
                 ScaleRef{ks.data(), 2}, ScaleRef{vs.data(), 2});
    EXPECT_EQ(kc, kc2);
    EXPECT_EQ(vc, vc2);
    for (size_t t = 0; t < slots.size(); ++t) {
      if (slots[t] < 0) continue;
      for (int h = 0; h < L.num_kv_heads; ++h)
        for (int e = 0; e < L.head_dim; ++e) {
          const size_t i = (t * L.num_kv_heads + h) * L.head_dim + e;
          const int64_t off = L.slot_offset(slots[t], h) + e;
          ASSERT_EQ(kc[off], f32_to_fp8(k[i] / ks[h], d)) << i;
          ASSERT_EQ(vc[off], f32_to_fp8(v[i] / vs[h], d)) << i;
          if (std::fabs(static_cast<double>(k[i])) / ks[h] > M) {
            ASSERT_EQ(std::fabs(load_cache_elem(L, kc.data(), off)), M) << i;
          }
        }
    }
  }
}

TEST(KvClip, Bf16AndPerTokenHeadCachesNeverCount) {
  for (const KvDtype d : {KvDtype::bf16, KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
    SCOPED_TRACE(std::string(kv_dtype_name(d)));
    const KvCacheLayout L = clip_layout(d);
    std::mt19937 rng(11);
    const std::vector<int64_t> slots = {1, 2, 3};
    const size_t n = slots.size() * L.num_kv_heads * L.head_dim;
    const std::vector<float> k = values(rng, n, 1.0f, 1e4f), v = values(rng, n, 1.0f, 1e4f);
    std::vector<uint8_t> kc(L.cache_bytes()), vc(L.cache_bytes());
    std::vector<float> kps(L.scale_bytes() / 4 + 1), vps(L.scale_bytes() / 4 + 1);
    const float one = 1.0f;
    KvClipCounts c;
    store_kv_cpu(L, kc.data(), vc.data(), k.data(), v.data(), slots.data(), 3, ScaleRef{&one, 1}, ScaleRef{&one, 1},
                 kps.data(), vps.data(), &c);
    EXPECT_EQ(c.k, 0u);
    EXPECT_EQ(c.v, 0u);
    EXPECT_EQ(c.stored, n);
  }
}

// Through the Backend interface: per layer, summed over store_kv calls.
TEST(KvClip, CpuBackendCountsPerLayer) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 64},
                      {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"vocab_size", 64}, {"max_position_embeddings", 64},
                      {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}};
  const ModelConfig cfg = parse_model_config(j, "test config");
  auto be = make_cpu_backend(cfg, BackendOptions{});
  KvPlanSettings s;
  s.max_model_len = 64;
  s.max_num_seqs = 1;
  s.max_num_batched_tokens = 64;
  s.block_size = 16;
  s.dtype = KvDtype::fp8_e4m3;
  s.kv_memory_bytes = 1 << 20;
  const KvPlan plan = plan_kv_cache(cfg, s);
  be->allocate_kv(plan, kv_layout(plan));
  KvScales sc = KvScales::unity(cfg.num_layers);
  sc.layers[1].v.values = {1e-3f};  // layer 1's V: |v| > 0.448 clips
  be->set_kv_scales(sc);
  ASSERT_TRUE(be->kv_clip_counts().has_value());
  EXPECT_EQ(be->kv_clip_counts()->at(1).v, 0u);

  const int T = 3, D = cfg.head_dim, Hq = cfg.num_heads, Hkv = cfg.num_kv_heads;
  StepBatch b;
  b.num_tokens = T;
  b.num_seqs = 1;
  b.max_query_len = T;
  b.max_context_len = T;
  b.num_groups = 1;
  b.max_blocks_per_seq = 1;
  b.token_ids = {1, 2, 3};
  b.positions = {0, 1, 2};
  b.query_start = {0, T};
  b.context_lens = {T};
  b.is_decode = {0};
  b.slot_mapping = {{0, 1, 2}};
  b.block_tables = {{0}};
  std::vector<float> q(static_cast<size_t>(T) * Hq * D, 0.0f), k(static_cast<size_t>(T) * Hkv * D, 0.1f),
      v(static_cast<size_t>(T) * Hkv * D, 0.1f);
  v[0] = 0.5f;      // > 0.448: clips at 1e-3
  v[5] = -600.0f;   // clips at 1e-3, and at unity (layer 0)
  v[9] = 0.4f;      // does not clip
  k[7] = 449.0f;    // clips at unity
  const Tensor tq{q.data(), ScalarType::f32, T, static_cast<int64_t>(Hq) * D};
  const Tensor tk{k.data(), ScalarType::f32, T, static_cast<int64_t>(Hkv) * D};
  const Tensor tv{v.data(), ScalarType::f32, T, static_cast<int64_t>(Hkv) * D};
  be->begin_step(b);
  for (int rep = 0; rep < 2; ++rep)
    for (int layer = 0; layer < cfg.num_layers; ++layer) be->store_kv(b, layer, tq, tk, tv);
  const std::vector<KvClipCounts> c = *be->kv_clip_counts();
  ASSERT_EQ(c.size(), 2u);
  const uint64_t stored = 2u * T * Hkv * D;
  EXPECT_EQ(c[0].k, 2u);  // 449 > 448 at unity, twice
  EXPECT_EQ(c[0].v, 2u);  // -600
  EXPECT_EQ(c[1].k, 2u);
  // 0.1 / 1e-3 = 100 does not clip; 0.5, -600 do; 0.4 does not.
  EXPECT_EQ(c[1].v, 4u);
  EXPECT_EQ(c[0].stored, stored);
  EXPECT_EQ(c[1].stored, stored);
}

}  // namespace
}  // namespace fp8kv
