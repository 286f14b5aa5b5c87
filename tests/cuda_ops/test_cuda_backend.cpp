// CudaBackend through the Backend interface, stage by stage against the CPU
// reference ops (llm.c / yalm style: each stage's CPU reference is fed the
// GPU's own input, so errors do not compound and every bound is the op's own,
// derived as in test_ops.cpp and docs/cuda.md). Two steps on a two-layer
// model (one full, one sliding layer): prefill chunks of two sequences, then
// two decodes batched with a new prefill. Checks that the KV codes equal the
// CPU store's bytes, that the observer sees the GPU's Q/K/V, and that
// decode and prefill attention (split by the backend) match
// paged_attention_cpu on the same cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>

#include "backend/cpu/kv_ops.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend.h"
#include "../cuda/pth_bound.h"
#include "cuda_ops_util.h"
#include "io/errors.h"
#include "kv/kv_cache_manager.h"
#include "kv/planner.h"
#include "model/weights.h"

namespace fp8kv {
namespace {

using namespace cudaops_test;

ModelConfig test_config(const std::string& family) {
  nlohmann::json j = {{"hidden_size", 128},       {"intermediate_size", 192},     {"num_hidden_layers", 2},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2},     {"vocab_size", 300},
                      {"max_position_embeddings", 1024}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0},
                      {"head_dim", 64},           {"eos_token_id", 2},            {"bos_token_id", 1}};
  if (family == "qwen3") {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["model_type"] = "qwen3";
    j["tie_word_embeddings"] = false;
    j["use_sliding_window"] = true;
    j["sliding_window"] = 24;
    j["max_window_layers"] = 1;
    j["layer_types"] = {"full_attention", "sliding_attention"};
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 256}};
  } else {
    j["architectures"] = {"Gemma3ForCausalLM"};
    j["model_type"] = "gemma3_text";
    j["query_pre_attn_scalar"] = 48;
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["tie_word_embeddings"] = true;
    j["sliding_window"] = 24;
    j["rope_theta"] = 1000000.0;
    j["rope_local_base_freq"] = 10000.0;
    j["final_logit_softcapping"] = 30.0;
    j["attn_logit_softcapping"] = 50.0;
    j["layer_types"] = {"sliding_attention", "full_attention"};
  }
  return parse_model_config(j, family + " cuda backend test config");
}

std::vector<float> dl(Backend& be, const Tensor& t) {
  if (t.dtype != ScalarType::f32) throw std::logic_error("dl: f32 only");
  std::vector<float> h(static_cast<size_t>(t.numel()));
  be.download(h.data(), t.data, t.bytes());
  return h;
}

// Records what the observer is handed.
struct Recorder : StoreObserver {
  std::vector<float> q, k, v;
  int calls = 0;
  void observe(int, const float* qp, int hq, const float* kp, const float* vp, int hkv, int d, int t) override {
    q.assign(qp, qp + static_cast<size_t>(t) * hq * d);
    k.assign(kp, kp + static_cast<size_t>(t) * hkv * d);
    v.assign(vp, vp + static_cast<size_t>(t) * hkv * d);
    ++calls;
  }
};

// |gpu - cpu| <= 2 (K + 2) u sum|x w| (+|b|): bf16-exact inputs both sides (test_ops.cpp).
void expect_linear(const std::vector<float>& xb, const std::vector<float>& w, const std::vector<float>& bias, int T,
                   int N, int K, const std::vector<float>& y, const char* what) {
  std::vector<float> ref(static_cast<size_t>(T) * N);
  linear_cpu(xb.data(), T, MatrixRef{w.data(), WeightType::f32, N, K}, bias.empty() ? nullptr : bias.data(), ref.data());
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double mag = bias.empty() ? 0.0 : std::fabs(bias[n]);
      for (int k = 0; k < K; ++k) mag += std::fabs(static_cast<double>(xb[t * K + k]) * w[static_cast<size_t>(n) * K + k]);
      ASSERT_LE(std::fabs(y[t * N + n] - ref[t * N + n]), 2.0 * (K + 2) * kU32 * mag + 1e-30)
          << what << " t=" << t << " n=" << n;
    }
}

std::vector<float> round_rows_bf16(std::vector<float> x) {
  for (auto& v : x) v = round_bf16(v);
  return x;
}

std::vector<float> matrix_f32(const WeightMatrix& m) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  matrix_rows_to_f32(MatrixRef{m.data, m.bf16 ? WeightType::bf16 : WeightType::f32, m.rows, m.cols}, 0, m.rows,
                     out.data());
  for (auto& v : out) v = round_bf16(v);  // what the backend uploaded
  return out;
}

struct SeqSpan {
  int start = 0, n = 0;
};

class CudaBackendVsCpu : public ::testing::TestWithParam<std::tuple<std::string, KvDtype>> {};

TEST_P(CudaBackendVsCpu, TwoStepsStageByStage) {
  FP8KV_NEED_GPU();
  const auto [family, dtype] = GetParam();
  const ModelConfig cfg = test_config(family);
  const int H = cfg.hidden_size, Hq = cfg.num_heads, Hkv = cfg.num_kv_heads, D = cfg.head_dim,
            I = cfg.intermediate_size, V = cfg.vocab_size;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  auto w = ModelWeights::random(cfg, 4321, 0.1f, /*bf16=*/true);
  CudaBackend be(cfg, BackendOptions{});
  const BackendWeights bw = be.upload_weights(w);

  KvPlanSettings ps;
  ps.kv_memory_bytes = 4u << 20;
  ps.max_model_len = 256;
  ps.max_num_seqs = 4;
  ps.max_num_batched_tokens = 64;
  ps.block_size = 16;
  ps.dtype = dtype;
  const KvPlan plan = plan_kv_cache(cfg, ps);
  const KvCacheLayout L = kv_layout(plan);
  be.allocate_kv(plan, L);
  KvScales scales = KvScales::unity(cfg.num_layers);
  if (kv_dtype_per_tensor_scaled(dtype)) {
    for (int l = 0; l < cfg.num_layers; ++l) {  // per-head K scales, a per-tensor V scale
      scales.layers[l].k.values = {0.004f + 0.001f * l, 0.006f};
      scales.layers[l].v.values = {0.003f};
    }
  }
  be.set_kv_scales(scales);
  Recorder rec;
  be.set_store_observer(&rec);
  const int G = static_cast<int>(plan.groups.size());

  // Host mirror of every layer's K/V cache, written by store_kv_cpu.
  std::vector<std::vector<uint8_t>> mk(cfg.num_layers, std::vector<uint8_t>(L.cache_bytes(), 0)), mv = mk;
  // Per-token-head dtypes: the mirror of the scale arrays beside the caches.
  const bool pth = kv_dtype_per_token_head(dtype);
  std::vector<std::vector<float>> mks(cfg.num_layers, std::vector<float>(L.scale_bytes() / 4, 0.0f)), mvs = mks;
  // Pages: each (group, sequence) gets its own shuffled pages.
  std::mt19937_64 rng(test_seed());
  std::vector<int32_t> pool(L.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  const int B = 4;  // pages per sequence (<= 64 tokens)
  auto page = [&](int g, int s, int j) { return pool[(g * 4 + s) * B + j]; };
  std::uniform_int_distribution<int> tok(3, V - 1);

  const std::vector<std::vector<SeqSpan>> steps = {{{0, 37}, {0, 20}}, {{37, 1}, {20, 1}, {0, 5}}};
  const std::vector<int> num_decodes = {0, 2};
  const std::vector<std::vector<int>> seq_ids = {{0, 1}, {0, 1, 2}};

  for (size_t st = 0; st < steps.size(); ++st) {
    SCOPED_TRACE(::testing::Message() << family << " " << kv_dtype_name(dtype) << " step " << st);
    StepBatch b;
    b.num_seqs = static_cast<int>(steps[st].size());
    b.num_decodes = num_decodes[st];
    b.num_groups = G;
    b.max_blocks_per_seq = B;
    b.query_start = {0};
    b.slot_mapping.assign(G, {});
    b.block_tables.assign(G, std::vector<int32_t>(static_cast<size_t>(b.num_seqs) * B, -1));
    for (int s = 0; s < b.num_seqs; ++s) {
      const SeqSpan q = steps[st][s];
      const int sid = seq_ids[st][s];
      for (int i = 0; i < q.n; ++i) {
        b.token_ids.push_back(tok(rng));
        b.positions.push_back(q.start + i);
        for (int g = 0; g < G; ++g) {
          const int p = q.start + i;
          b.slot_mapping[g].push_back(static_cast<int64_t>(page(g, sid, p / 16)) * 16 + p % 16);
        }
      }
      b.query_start.push_back(b.query_start.back() + q.n);
      b.context_lens.push_back(q.start + q.n);
      b.is_decode.push_back(s < b.num_decodes ? 1 : 0);
      b.max_query_len = std::max(b.max_query_len, q.n);
      b.max_context_len = std::max(b.max_context_len, q.start + q.n);
      for (int g = 0; g < G; ++g)
        for (int j = 0; j * 16 < q.start + q.n; ++j) b.block_tables[g][s * B + j] = page(g, sid, j);
    }
    const int T = b.num_tokens = static_cast<int>(b.token_ids.size());
    be.begin_step(b);

    auto buf = [&](int64_t cols) { return be.alloc(static_cast<size_t>(T) * cols * 4); };
    DeviceBuffer hb = buf(H), xb = buf(H), tmpb = buf(H), qb = buf(Hq * D), kb = buf(Hkv * D), vb = buf(Hkv * D),
                 ab = buf(Hq * D), gb = buf(I), ub = buf(I);
    Tensor h = hb.view(ScalarType::f32, T, H), x = xb.view(ScalarType::f32, T, H), tmp = tmpb.view(ScalarType::f32, T, H),
           q = qb.view(ScalarType::f32, T, Hq * D), k = kb.view(ScalarType::f32, T, Hkv * D),
           v = vb.view(ScalarType::f32, T, Hkv * D), attn = ab.view(ScalarType::f32, T, Hq * D),
           gate = gb.view(ScalarType::f32, T, I), up = ub.view(ScalarType::f32, T, I);

    // Embedding: exact.
    be.embedding(bw.embed, bw.embed_scale, h);
    {
      std::vector<float> ref(static_cast<size_t>(T) * H);
      std::vector<int> ids(b.token_ids.begin(), b.token_ids.end());
      embedding_cpu(MatrixRef{w->embed.data, WeightType::bf16, w->embed.rows, w->embed.cols}, ids.data(), T,
                    w->embed_scale, ref.data());
      ASSERT_EQ(dl(be, h), ref);
    }
    for (int l = 0; l < cfg.num_layers; ++l) {
      SCOPED_TRACE(::testing::Message() << "layer " << l);
      const LayerWeights& LW = w->layers[l];
      const BackendLayerWeights& BL = bw.layers[l];
      // Norm (the first layer: rmsnorm; later: residual + norm).
      const auto h_before = dl(be, h);
      const auto tmp_before = dl(be, tmp);
      if (l == 0) be.rmsnorm(h, BL.input_norm, eps, x);
      else be.add_rmsnorm(h, tmp, BL.input_norm, eps, x);
      {
        std::vector<float> hs = h_before;
        if (l > 0)
          for (size_t i = 0; i < hs.size(); ++i) hs[i] += tmp_before[i];
        ASSERT_EQ(dl(be, h), hs);
        std::vector<float> ref(hs.size());
        rmsnorm_cpu(hs.data(), T, H, LW.input_norm.data(), eps, ref.data());
        const auto xg = dl(be, x);
        for (size_t i = 0; i < ref.size(); ++i)
          ASSERT_LE(std::fabs(xg[i] - ref[i]), std::fabs(ref[i]) * 2.0 * (H + 8) * kU32 + 1e-37) << "norm " << i;
      }
      // Projections.
      const auto xr = round_rows_bf16(dl(be, x));
      be.linear(x, BL.q_proj, BL.q_bias, q);
      be.linear(x, BL.k_proj, BL.k_bias, k);
      be.linear(x, BL.v_proj, BL.v_bias, v);
      expect_linear(xr, matrix_f32(LW.q_proj), LW.q_bias, T, Hq * D, H, dl(be, q), "q_proj");
      expect_linear(xr, matrix_f32(LW.k_proj), LW.k_bias, T, Hkv * D, H, dl(be, k), "k_proj");
      expect_linear(xr, matrix_f32(LW.v_proj), LW.v_bias, T, Hkv * D, H, dl(be, v), "v_proj");
      // QK-norm + RoPE (bound: test_ops.cpp check_qkv).
      {
        auto qh = dl(be, q), kh = dl(be, k);
        if (!BL.q_norm.empty()) be.head_rmsnorm(q, D, BL.q_norm, eps);
        if (!BL.k_norm.empty()) be.head_rmsnorm(k, D, BL.k_norm, eps);
        be.rope(l, q, k);
        if (!LW.q_norm.empty()) rmsnorm_cpu(qh.data(), static_cast<int64_t>(T) * Hq, D, LW.q_norm.data(), eps, qh.data());
        if (!LW.k_norm.empty()) rmsnorm_cpu(kh.data(), static_cast<int64_t>(T) * Hkv, D, LW.k_norm.data(), eps, kh.data());
        auto head_max = [&](const std::vector<float>& a, size_t hidx) {
          float m = 0;
          for (int d = 0; d < D; ++d) m = std::max(m, std::fabs(a[hidx * D + d]));
          return m;
        };
        std::vector<float> qs(static_cast<size_t>(T) * Hq), ks(static_cast<size_t>(T) * Hkv);
        for (size_t i = 0; i < qs.size(); ++i) qs[i] = head_max(qh, i);
        for (size_t i = 0; i < ks.size(); ++i) ks[i] = head_max(kh, i);
        const RopeTable rt(cfg.rope_for_layer(l), D, cfg.max_position_embeddings);
        std::vector<float> c(static_cast<size_t>(T) * rt.rot_dim() / 2), s(c.size());
        rt.fill(b.positions.data(), T, c.data(), s.data());
        rope_cpu(qh.data(), T, Hq, D, rt.rot_dim(), c.data(), s.data());
        rope_cpu(kh.data(), T, Hkv, D, rt.rot_dim(), c.data(), s.data());
        const double rel = 2.0 * (D + 16) * 0x1.0p-23 * std::max(1.0f, rt.attention_factor());
        const auto qg = dl(be, q), kg = dl(be, k);
        for (size_t i = 0; i < qg.size(); ++i) ASSERT_LE(std::fabs(qg[i] - qh[i]), rel * qs[i / D]) << "q rope " << i;
        for (size_t i = 0; i < kg.size(); ++i) ASSERT_LE(std::fabs(kg[i] - kh[i]), rel * ks[i / D]) << "k rope " << i;
      }
      // Store: the observer sees the GPU's Q/K/V; the codes equal the CPU store's bytes.
      const auto qg = dl(be, q), kg = dl(be, k), vg = dl(be, v);
      rec.calls = 0;
      be.store_kv(b, l, q, k, v);
      ASSERT_EQ(rec.calls, 1);
      ASSERT_EQ(rec.q, qg);
      ASSERT_EQ(rec.k, kg);
      ASSERT_EQ(rec.v, vg);
      const int g = be.kv_group_of_layer(l);
      const LayerKvScales& sc = scales.layers[l];
      store_kv_cpu(L, mk[l].data(), mv[l].data(), kg.data(), vg.data(), b.slot_mapping[g].data(), T, sc.k.ref(),
                   sc.v.ref(), pth ? mks[l].data() : nullptr, pth ? mvs[l].data() : nullptr);
      {
        const KvLayerStorage ks = be.kv_layer(l);
        std::vector<uint8_t> dk(L.cache_bytes()), dv(L.cache_bytes());
        be.download(dk.data(), ks.k_cache, dk.size());
        be.download(dv.data(), ks.v_cache, dv.size());
        // Other layers of the group slot share no pages with this one's writes
        // only when they are the same layer; compare this layer's written slots.
        for (int64_t slot : b.slot_mapping[g])
          for (int hh = 0; hh < Hkv; ++hh) {
            const size_t off = static_cast<size_t>(L.slot_offset(slot, hh)) * L.elem_bytes();
            ASSERT_EQ(0, std::memcmp(dk.data() + off, mk[l].data() + off, D * L.elem_bytes())) << "K slot " << slot;
            ASSERT_EQ(0, std::memcmp(dv.data() + off, mv[l].data() + off, D * L.elem_bytes())) << "V slot " << slot;
          }
        mk[l] = dk;  // the device cache is now the reference cache
        mv[l] = dv;
        if (pth) {
          ASSERT_NE(ks.k_scale, nullptr);
          ASSERT_NE(ks.v_scale, nullptr);
          std::vector<float> dks(mks[l].size()), dvs(mvs[l].size());
          be.download(dks.data(), ks.k_scale, dks.size() * 4);
          be.download(dvs.data(), ks.v_scale, dvs.size() * 4);
          for (int64_t slot : b.slot_mapping[g])
            for (int hh = 0; hh < Hkv; ++hh) {
              const size_t i = static_cast<size_t>(L.scale_offset(slot, hh));
              ASSERT_EQ(0, std::memcmp(&dks[i], &mks[l][i], 4)) << "K scale slot " << slot << " head " << hh;
              ASSERT_EQ(0, std::memcmp(&dvs[i], &mvs[l][i], 4)) << "V scale slot " << slot << " head " << hh;
            }
          mks[l] = dks;
          mvs[l] = dvs;
        }
      }
      // Attention: decodes and prefill chunks in one call, vs paged_attention_cpu.
      be.attention(b, l, q, attn);
      {
        const auto og = dl(be, attn);
        PagedAttentionArgs a;
        a.layout = L;
        a.k_cache = mk[l].data();
        a.v_cache = mv[l].data();
        a.window = cfg.window_for_layer(l);
        a.softmax_scale = cfg.attention_scale();
        a.logit_softcap = cfg.attn_logit_softcapping ? static_cast<float>(*cfg.attn_logit_softcapping) : 0.0f;
        a.k_scale = sc.k.ref();
        a.v_scale = sc.v.ref();
        a.k_scale_pth = pth ? mks[l].data() : nullptr;
        a.v_scale_pth = pth ? mvs[l].data() : nullptr;
        std::vector<float> ref(og.size());
        for (int s = 0; s < b.num_seqs; ++s) {
          const int t0 = b.query_start[s], n = b.query_len(s);
          a.block_table = b.block_table(g, s);
          a.context_len = b.context_lens[s];
          paged_attention_cpu(a, qg.data() + static_cast<size_t>(t0) * Hq * D, b.positions.data() + t0, n, Hq,
                              ref.data() + static_cast<size_t>(t0) * Hq * D);
          // Bound (docs/cuda.md): v_scale Vmax (u + expm1(2 u Smax) + 1e-5) + 1e-6 per (query, head).
          const bool fp8 = kv_dtype_is_fp8(dtype);
          const double u = dtype != KvDtype::bf16 ? 1.0 / 2048 : 1.0 / 256;
          for (int i = 0; i < n; ++i) {
            const int pos = b.positions[t0 + i];
            const int first = a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
            for (int hh = 0; hh < Hq; ++hh) {
              const int kvh = hh / (Hq / Hkv);
              const float* qv = qg.data() + (static_cast<size_t>(t0 + i) * Hq + hh) * D;
              if (pth) {  // docs/cuda.md "Tolerance", per-token-head
                const double tol = cudatest::pth_attention_bound(
                    pos - first + 1, D, qv, a.softmax_scale, a.logit_softcap, u,
                    [&](int jj, float* kq, float* vq, float& ksj, float& vsj) {
                      const int j = first + jj;
                      const int64_t slot = static_cast<int64_t>(a.block_table[j / 16]) * 16 + j % 16;
                      const int64_t off = L.slot_offset(slot, kvh);
                      for (int d = 0; d < D; ++d) {
                        kq[d] = load_cache_elem(L, mk[l].data(), off + d);
                        vq[d] = load_cache_elem(L, mv[l].data(), off + d);
                      }
                      ksj = mks[l][L.scale_offset(slot, kvh)];
                      vsj = mvs[l][L.scale_offset(slot, kvh)];
                    });
                for (int d = 0; d < D; ++d) {
                  const size_t idx = (static_cast<size_t>(t0 + i) * Hq + hh) * D + d;
                  ASSERT_LE(std::fabs(og[idx] - ref[idx]), tol)
                      << "attention seq " << s << " query " << i << " head " << hh << " d " << d;
                }
                continue;
              }
              double smax = 0, vmax = 0;
              for (int j = first; j <= pos; ++j) {
                const int64_t slot = static_cast<int64_t>(a.block_table[j / 16]) * 16 + j % 16;
                const int64_t off = L.slot_offset(slot, kvh);
                double acc = 0;
                for (int d = 0; d < D; ++d) {
                  acc += std::fabs(qv[d]) * std::fabs(load_cache_elem(L, mk[l].data(), off + d));
                  vmax = std::max<double>(vmax, std::fabs(load_cache_elem(L, mv[l].data(), off + d)));
                }
                smax = std::max(smax, acc * a.softmax_scale * (fp8 ? a.k_scale.at(kvh) : 1.0f));
              }
              const double tol = (fp8 ? a.v_scale.at(kvh) : 1.0) * vmax * (u + std::expm1(2 * u * smax) + 1e-5) + 1e-6;
              for (int d = 0; d < D; ++d) {
                const size_t idx = (static_cast<size_t>(t0 + i) * Hq + hh) * D + d;
                ASSERT_LE(std::fabs(og[idx] - ref[idx]), tol)
                    << "attention seq " << s << " query " << i << " head " << hh << " d " << d;
              }
            }
          }
        }
      }
      // o_proj, then (gemma) the post-attention norm, residual + pre-MLP norm, MLP.
      const auto ar = round_rows_bf16(dl(be, attn));
      be.linear(attn, BL.o_proj, BL.o_bias, tmp);
      expect_linear(ar, matrix_f32(LW.o_proj), LW.o_bias, T, H, Hq * D, dl(be, tmp), "o_proj");
      if (cfg.sandwich_norms) be.rmsnorm(tmp, BL.post_attention_norm, eps, tmp);
      be.add_rmsnorm(h, tmp, cfg.sandwich_norms ? BL.pre_ffn_norm : BL.post_attention_norm, eps, x);
      const auto xr2 = round_rows_bf16(dl(be, x));
      be.linear(x, BL.gate_proj, BL.gate_bias, gate);
      be.linear(x, BL.up_proj, BL.up_bias, up);
      expect_linear(xr2, matrix_f32(LW.gate_proj), LW.gate_bias, T, I, H, dl(be, gate), "gate_proj");
      expect_linear(xr2, matrix_f32(LW.up_proj), LW.up_bias, T, I, H, dl(be, up), "up_proj");
      {
        const auto gh = dl(be, gate), uh = dl(be, up);
        const Activation act = cfg.hidden_act == "silu" ? Activation::silu : Activation::gelu_tanh;
        be.gated_act(act, gate, up, gate);
        std::vector<float> ref(gh.size());
        gated_act_cpu(act, gh.data(), uh.data(), ref.data(), static_cast<int64_t>(gh.size()));
        const auto og = dl(be, gate);
        for (size_t i = 0; i < og.size(); ++i) {  // bound of test_ops.cpp GatedActivationsMatchCpu, less bf16
          const double ag = std::fabs(gh[i]);
          ASSERT_LE(std::fabs(og[i] - ref[i]),
                    0x1.0p-20 * (std::fabs(ref[i]) + ag * std::fabs(uh[i]) * (1 + ag + 0.05 * ag * ag * ag)))
              << "gated_act " << i;
        }
      }
      const auto gr = round_rows_bf16(dl(be, gate));
      be.linear(gate, BL.down_proj, BL.down_bias, tmp);
      expect_linear(gr, matrix_f32(LW.down_proj), LW.down_bias, T, H, I, dl(be, tmp), "down_proj");
      if (cfg.sandwich_norms) be.rmsnorm(tmp, BL.post_ffn_norm, eps, tmp);
    }
    // Final norm in place (y aliases h), logits of chosen rows, softcap, greedy sampling.
    be.add_rmsnorm(h, tmp, bw.final_norm, eps, h);
    const auto hf = dl(be, h);
    std::vector<int32_t> rows;
    for (int s = 0; s < b.num_seqs; ++s) rows.push_back(b.query_start[s + 1] - 1);
    const int n = static_cast<int>(rows.size());
    DeviceBuffer lb = be.alloc(static_cast<size_t>(n) * V * 4);
    Tensor lt = lb.view(ScalarType::f32, n, V);
    be.logits(h, rows, bw.output, lt);
    const auto lg = dl(be, lt);
    std::vector<float> hr;
    for (int r : rows) hr.insert(hr.end(), hf.begin() + static_cast<size_t>(r) * H, hf.begin() + static_cast<size_t>(r + 1) * H);
    hr = round_rows_bf16(hr);
    const auto wo = matrix_f32(w->output());
    std::vector<float> ref(static_cast<size_t>(n) * V);
    linear_cpu(hr.data(), n, MatrixRef{wo.data(), WeightType::f32, V, H}, nullptr, ref.data());
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < V; ++c) {
        double mag = 0;
        for (int kk = 0; kk < H; ++kk) mag += std::fabs(static_cast<double>(hr[r * H + kk]) * wo[static_cast<size_t>(c) * H + kk]);
        double e = ref[r * V + c], tol = 2.0 * (H + 2) * kU32 * mag + 1e-30;
        if (cfg.final_logit_softcapping) {  // tanh is 1-Lipschitz: the error does not grow; + tanh's 2 ulp
          const double cap = *cfg.final_logit_softcapping;
          e = std::tanh(e / cap) * cap;
          tol += cap * 0x1.0p-21;
        }
        ASSERT_LE(std::fabs(lg[r * V + c] - e), tol) << "logits row " << r << " col " << c;
      }
    std::vector<RowSampling> sp(n);
    std::vector<int32_t> ids(n);
    be.sample(lt, sp, ids);
    for (int r = 0; r < n; ++r) {
      const float* row = lg.data() + static_cast<size_t>(r) * V;
      EXPECT_EQ(ids[r], static_cast<int32_t>(std::max_element(row, row + V) - row)) << "greedy row " << r;
    }
    // Sampling inside the step (what a decode graph captures): the same
    // logits bits and the same ids as logits() + sample(), greedy and seeded.
    {
      StepBatch b2 = b;
      b2.sample_rows = rows;
      b2.sample_params.assign(n, RowSampling{});
      for (int r = 1; r < n; r += 2) b2.sample_params[r] = RowSampling{0.8f, 0.9f, 40, 1234u + r, 7u};
      be.begin_step(b2);
      DeviceBuffer lb2 = be.alloc(static_cast<size_t>(n) * V * 4);
      Tensor lt2 = lb2.view(ScalarType::f32, n, V);
      be.sample_step(h, bw.output, lt2);
      std::vector<int32_t> ids2(n), ids3(n);
      be.step_sampled_ids(ids2);
      const auto lg2 = dl(be, lt2);
      ASSERT_EQ(0, std::memcmp(lg2.data(), lg.data(), lg.size() * sizeof(float))) << "sample_step logits";
      be.sample(lt, b2.sample_params, ids3);
      EXPECT_EQ(ids2, ids3) << "sample_step ids";
      for (int r = 0; r < n; r += 2) EXPECT_EQ(ids2[r], ids[r]) << "greedy row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaBackendVsCpu,
                         ::testing::Combine(::testing::Values("qwen3", "gemma3"),
                                            ::testing::Values(KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e4m3_pth,
                                                              KvDtype::int8_pth)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::string(kv_dtype_name(std::get<1>(info.param)));
                         });

TEST(CudaBackendRefusals, NoGpuOrBadShapeIsAnInputError) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 96},
                      {"intermediate_size", 128}, {"num_hidden_layers", 1}, {"num_attention_heads", 3},
                      {"num_key_value_heads", 1}, {"vocab_size", 50}, {"max_position_embeddings", 64}};
  const ModelConfig cfg = parse_model_config(j, "head_dim 32 config");  // head_dim 96 / 3 = 32
  try {
    CudaBackend be(cfg, BackendOptions{});
    FAIL() << "head_dim 32 was accepted";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    if (cuda::cuda_device_available()) EXPECT_NE(msg.find("head_dim 32"), std::string::npos) << msg;
    else EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
  }
}

TEST(CudaBackendRefusals, BlockSizeNotMultipleOf16) {
  FP8KV_NEED_GPU();
  const ModelConfig cfg = test_config("qwen3");
  CudaBackend be(cfg, BackendOptions{});
  KvPlanSettings ps;
  ps.kv_memory_bytes = 1u << 20;
  ps.max_model_len = 64;
  ps.block_size = 8;
  const KvPlan plan = plan_kv_cache(cfg, ps);
  KvCacheLayout L;
  L.num_blocks = static_cast<int>(plan.num_blocks);
  L.block_size = 8;
  L.num_kv_heads = cfg.num_kv_heads;
  L.head_dim = cfg.head_dim;
  try {
    be.allocate_kv(plan, L);
    FAIL() << "block size 8 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("block size 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp8kv
