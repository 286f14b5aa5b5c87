// Test helpers: tiny configs of every family and an independent, naive,
// dense (non-paged) forward pass written from the Hugging Face modeling code:
// plain loops, double accumulators, K/V rounded through the cache dtype
// exactly where the cache stores them (after k_norm and RoPE; V as projected).
#pragma once
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/kv_ops.h"
#include "engine/engine.h"
#include "kv/kv_scales.h"
#include "model/config.h"
#include "model/weights.h"
#include "numerics/fp8.h"

namespace fp8kv::testing {

inline nlohmann::json tiny_config_json(const std::string& family) {
  using nlohmann::json;
  json j = {{"hidden_size", 64},      {"intermediate_size", 96},     {"num_hidden_layers", 3},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2},  {"vocab_size", 211},
            {"max_position_embeddings", 512}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0},
            {"tie_word_embeddings", false}, {"eos_token_id", 2},     {"bos_token_id", 1}};
  if (family == "llama") {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}};
  } else if (family == "llama_linear") {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  } else if (family == "mistral") {
    j["architectures"] = {"MistralForCausalLM"};
    j["model_type"] = "mistral";
    j["sliding_window"] = 8;
  } else if (family == "qwen2") {
    j["architectures"] = {"Qwen2ForCausalLM"};
    j["model_type"] = "qwen2";
    j["tie_word_embeddings"] = true;
    j["use_sliding_window"] = false;
  } else if (family == "qwen3") {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["model_type"] = "qwen3";
    j["head_dim"] = 32;
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
    j["max_window_layers"] = 1;
    j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  } else if (family == "gemma3") {
    j["architectures"] = {"Gemma3ForCausalLM"};
    j["model_type"] = "gemma3_text";
    j["head_dim"] = 16;
    j["query_pre_attn_scalar"] = 24;
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["tie_word_embeddings"] = true;
    j["sliding_window"] = 8;
    j["rope_theta"] = 1000000.0;
    j["rope_local_base_freq"] = 10000.0;
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
    j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention"};
  } else if (family == "qwen3_5") {  // Gated DeltaNet hybrid: two linear_attention layers, one full
    j["architectures"] = {"Qwen3_5ForCausalLM"};
    j["model_type"] = "qwen3_5_text";
    j["head_dim"] = 16;
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}};
    j["linear_conv_kernel_dim"] = 4;
    j["linear_key_head_dim"] = 8;
    j["linear_value_head_dim"] = 8;
    j["linear_num_key_heads"] = 2;
    j["linear_num_value_heads"] = 4;
    j["layer_types"] = {"linear_attention", "linear_attention", "full_attention"};
  }
  return j;
}

inline ModelConfig tiny_config(const std::string& family) {
  return parse_model_config(tiny_config_json(family), family + " test config");
}

// ---- the naive reference ----

inline std::vector<float> to_f32(const WeightMatrix& m) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = m.bf16 ? bf16_to_f32(static_cast<const uint16_t*>(m.data)[i]) : static_cast<const float*>(m.data)[i];
  return out;
}

// y[r] = sum_c W[r][c] x[c] (+ b[r])
inline std::vector<double> matvec(const WeightMatrix& W, const std::vector<double>& x, const std::vector<float>& b) {
  const std::vector<float> w = to_f32(W);
  std::vector<double> y(static_cast<size_t>(W.rows));
  for (int64_t r = 0; r < W.rows; ++r) {
    double s = 0.0;
    for (int64_t c = 0; c < W.cols; ++c) s += static_cast<double>(w[r * W.cols + c]) * x[c];
    y[r] = s + (b.empty() ? 0.0 : b[r]);
  }
  return y;
}

inline std::vector<double> rms(const std::vector<double>& x, size_t off, size_t n, const std::vector<float>& w,
                               double eps) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  std::vector<double> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = x[off + i] * inv * w[i];
  return y;
}

// Default / linear rope computed in double straight from the definition;
// other rope types use inv_freq from `inv_freq_override`.
inline void apply_rope(std::vector<double>& x, int heads, int D, int pos, const std::vector<double>& inv_freq) {
  const int half = static_cast<int>(inv_freq.size());
  for (int h = 0; h < heads; ++h) {
    double* v = &x[static_cast<size_t>(h) * D];
    for (int i = 0; i < half; ++i) {
      const double a = v[i], b = v[i + half], f = inv_freq[i] * pos;
      v[i] = a * std::cos(f) - b * std::sin(f);
      v[i + half] = b * std::cos(f) + a * std::sin(f);
    }
  }
}

inline std::vector<double> reference_inv_freq(const RopeParams& p, int D) {
  std::vector<double> f(D / 2);
  for (int i = 0; i < D / 2; ++i) {
    f[i] = 1.0 / std::pow(p.theta, 2.0 * i / D);
    if (p.type == "linear") f[i] /= p.factor;
    if (p.type == "llama3") {
      const double old = p.original_max_position_embeddings, lw = old / p.low_freq_factor,
                   hw = old / p.high_freq_factor, wl = 2 * M_PI / f[i];
      if (wl > lw) {
        f[i] /= p.factor;
      } else if (wl >= hw) {
        const double sm = (old / wl - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
        f[i] = (1 - sm) * f[i] / p.factor + sm * f[i];
      }
    }
  }
  return f;
}

inline double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// K/V as the engine computed them before quantization (recorded by a
// StoreObserver): [layer][pos][Hkv*D].
struct RecordedKv {
  std::vector<std::vector<std::vector<float>>> k, v;
};
struct RefStats {
  int64_t elements = 0;
  int64_t mismatched = 0;  // pre-rounding values differing beyond tolerance (a bug)
  int64_t flips = 0;       // within tolerance but rounded to different cache values
  double worst_rel = 0.0;
};

// Rounds the reference's K/V element `x` as the cache does. When the engine's
// own pre-rounding value `e` (within fp32 tolerance of x) rounds to another
// cache value, x sat on a rounding boundary: take the engine's rounding so
// the comparison stays tight, and count it.
inline double round_like_cache(double x, const float* e, float scale, KvDtype d, RefStats* st) {
  const double r = roundtrip(static_cast<float>(x), scale, d);
  if (!e) return r;
  ++st->elements;
  const double diff = std::abs(x - *e), lim = 1e-5 + 1e-4 * std::abs(x);
  st->worst_rel = std::max(st->worst_rel, diff / (1e-5 + std::abs(x)));
  if (diff > lim) {
    ++st->mismatched;
    return r;
  }
  const double re = roundtrip(*e, scale, d);
  if (re != r) ++st->flips;
  return re;
}

// Logits [n][V] for a whole sequence, one token at a time, with a dense KV
// history holding what the cache would return: roundtrip(x, scale, dtype)
// elementwise (bf16 ignores the scale; the per-token-head dtypes take each
// head's scale by per_token_head_scale). `quantize_kv` false: exact fp32 K/V.
inline std::vector<std::vector<double>> reference_logits(const ModelConfig& c, const ModelWeights& w,
                                                         const std::vector<int>& tokens, KvDtype dtype,
                                                         const KvScales& scales, bool quantize_kv = true,
                                                         const RecordedKv* engine_kv = nullptr,
                                                         RefStats* stats = nullptr) {
  RefStats dummy;
  if (!stats) stats = &dummy;
  const int H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads, L = c.num_layers;
  const double eps = c.rms_norm_eps;
  std::vector<std::vector<std::vector<double>>> K(L), V(L);  // [layer][pos][Hkv*D]
  std::vector<std::vector<double>> out;
  const std::vector<float> E = to_f32(w.embed);
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    std::vector<double> h(H);
    for (int i = 0; i < H; ++i) h[i] = E[static_cast<size_t>(tokens[pos]) * H + i] * static_cast<double>(w.embed_scale);
    for (int l = 0; l < L; ++l) {
      const LayerWeights& lw = w.layers[l];
      const auto x = rms(h, 0, H, lw.input_norm, eps);
      auto q = matvec(lw.q_proj, x, lw.q_bias);
      auto k = matvec(lw.k_proj, x, lw.k_bias);
      auto v = matvec(lw.v_proj, x, lw.v_bias);
      if (!lw.q_norm.empty()) {
        for (int hh = 0; hh < Hq; ++hh) {
          auto y = rms(q, static_cast<size_t>(hh) * D, D, lw.q_norm, eps);
          std::copy(y.begin(), y.end(), q.begin() + static_cast<size_t>(hh) * D);
        }
        for (int hh = 0; hh < Hkv; ++hh) {
          auto y = rms(k, static_cast<size_t>(hh) * D, D, lw.k_norm, eps);
          std::copy(y.begin(), y.end(), k.begin() + static_cast<size_t>(hh) * D);
        }
      }
      const auto inv = reference_inv_freq(c.rope_for_layer(l), D);
      apply_rope(q, Hq, D, static_cast<int>(pos), inv);
      apply_rope(k, Hkv, D, static_cast<int>(pos), inv);
      if (quantize_kv) {
        for (int hh = 0; hh < Hkv; ++hh) {
          float ks = scales.layers[l].k.at(hh), vs = scales.layers[l].v.at(hh);
          if (kv_dtype_per_token_head(dtype)) {
            // The store's rule on this head's values: the engine's pre-rounding
            // values where recorded (the same scale bits), else the reference's.
            std::vector<float> kh(D), vh(D);
            for (int d = 0; d < D; ++d) {
              const size_t i = static_cast<size_t>(hh) * D + d;
              kh[d] = engine_kv ? engine_kv->k[l][pos][i] : static_cast<float>(k[i]);
              vh[d] = engine_kv ? engine_kv->v[l][pos][i] : static_cast<float>(v[i]);
            }
            ks = per_token_head_scale(kh, dtype);
            vs = per_token_head_scale(vh, dtype);
          }
          for (int d = 0; d < D; ++d) {
            const size_t i = static_cast<size_t>(hh) * D + d;
            const float* ek = engine_kv ? &engine_kv->k[l][pos][i] : nullptr;
            const float* ev = engine_kv ? &engine_kv->v[l][pos][i] : nullptr;
            k[i] = round_like_cache(k[i], ek, ks, dtype, stats);
            v[i] = round_like_cache(v[i], ev, vs, dtype, stats);
          }
        }
      }
      K[l].push_back(k);
      V[l].push_back(v);
      const int window = c.window_for_layer(l);
      const double scale = c.attention_scale();
      std::vector<double> attn(static_cast<size_t>(Hq) * D, 0.0);
      for (int hh = 0; hh < Hq; ++hh) {
        const int kvh = hh / (Hq / Hkv);
        std::vector<double> s;
        std::vector<size_t> js;
        for (size_t j = 0; j <= pos; ++j) {
          if (window > 0 && static_cast<int>(pos - j) >= window) continue;
          double dot = 0.0;
          for (int d = 0; d < D; ++d) dot += q[static_cast<size_t>(hh) * D + d] * K[l][j][static_cast<size_t>(kvh) * D + d];
          dot *= scale;
          if (c.attn_logit_softcapping) dot = *c.attn_logit_softcapping * std::tanh(dot / *c.attn_logit_softcapping);
          s.push_back(dot);
          js.push_back(j);
        }
        double m = -INFINITY, sum = 0.0;
        for (double e : s) m = std::max(m, e);
        for (double& e : s) sum += (e = std::exp(e - m));
        for (size_t t = 0; t < js.size(); ++t)
          for (int d = 0; d < D; ++d)
            attn[static_cast<size_t>(hh) * D + d] += s[t] / sum * V[l][js[t]][static_cast<size_t>(kvh) * D + d];
      }
      auto o = matvec(lw.o_proj, attn, lw.o_bias);
      if (c.sandwich_norms) o = rms(o, 0, H, lw.post_attention_norm, eps);
      for (int i = 0; i < H; ++i) h[i] += o[i];
      const auto x2 = rms(h, 0, H, c.sandwich_norms ? lw.pre_ffn_norm : lw.post_attention_norm, eps);
      auto g = matvec(lw.gate_proj, x2, lw.gate_bias);
      const auto u = matvec(lw.up_proj, x2, lw.up_bias);
      for (size_t i = 0; i < g.size(); ++i)
        g[i] = (c.hidden_act == "silu" ? g[i] / (1.0 + std::exp(-g[i])) : gelu_tanh(g[i])) * u[i];
      auto m = matvec(lw.down_proj, g, lw.down_bias);
      if (c.sandwich_norms) m = rms(m, 0, H, lw.post_ffn_norm, eps);
      for (int i = 0; i < H; ++i) h[i] += m[i];
    }
    const auto hn = rms(h, 0, H, w.final_norm, eps);
    auto logits = matvec(w.output(), hn, {});
    if (c.final_logit_softcapping)
      for (auto& z : logits) z = std::tanh(z / *c.final_logit_softcapping) * *c.final_logit_softcapping;
    out.push_back(std::move(logits));
  }
  return out;
}

// Records what the engine stores, per layer in call order (one sequence).
class KvRecorder : public StoreObserver {
 public:
  explicit KvRecorder(int layers) { rec.k.resize(layers); rec.v.resize(layers); }
  void observe(int layer, const float*, int, const float* k, const float* v, int hkv, int d, int n) override {
    for (int t = 0; t < n; ++t) {
      rec.k[layer].emplace_back(k + static_cast<size_t>(t) * hkv * d, k + static_cast<size_t>(t + 1) * hkv * d);
      rec.v[layer].emplace_back(v + static_cast<size_t>(t) * hkv * d, v + static_cast<size_t>(t + 1) * hkv * d);
    }
  }
  RecordedKv rec;
};

inline std::vector<double> log_softmax(const std::vector<double>& z) {
  double m = -INFINITY, s = 0.0;
  for (double x : z) m = std::max(m, x);
  for (double x : z) s += std::exp(x - m);
  std::vector<double> r(z.size());
  for (size_t i = 0; i < z.size(); ++i) r[i] = z[i] - m - std::log(s);
  return r;
}

// Per-head KV scales that differ per head (a mis-sharded or mis-indexed
// scale shows): k 0.05 + 0.02 h, v 0.03 + 0.01 h for KV head h.
inline KvScales per_head_kv_scales(const ModelConfig& c) {
  KvScales s = KvScales::unity(c.num_layers);
  for (auto& l : s.layers) {
    l.k.values.clear();
    l.v.values.clear();
    for (int h = 0; h < c.num_kv_heads; ++h) {
      l.k.values.push_back(0.05f + 0.02f * static_cast<float>(h));
      l.v.values.push_back(0.03f + 0.01f * static_cast<float>(h));
    }
  }
  return s;
}

// The engine tests' small paged setup: blocks of 4 tokens, max_model_len 96.
inline EngineOptions small_paged_options(const std::string& dtype, uint64_t kv_memory_bytes,
                                         int max_num_batched_tokens) {
  EngineOptions o;
  o.kv_cache_dtype = dtype;
  o.block_size = 4;
  o.max_model_len = 96;
  o.kv_memory_bytes = kv_memory_bytes;
  o.max_num_batched_tokens = max_num_batched_tokens;
  return o;
}

// The logits rows of scoring toks (chunk: ScoreOptions::chunk_size).
inline std::vector<std::vector<float>> logits_of(Engine& e, const std::vector<int>& toks, int chunk) {
  std::vector<std::vector<float>> rows;
  ScoreOptions o;
  o.chunk_size = chunk;
  e.score(toks, o, [&](int, std::span<const float> l) { rows.emplace_back(l.begin(), l.end()); });
  return rows;
}

// Engine::create, and per_head_kv_scales for an fp8 cache.
inline std::unique_ptr<Engine> create_engine(const ModelConfig& cfg, std::shared_ptr<const ModelWeights> w,
                                             const EngineOptions& o) {
  auto e = Engine::create(cfg, std::move(w), o);
  if (kv_dtype_is_fp8(e->kv_dtype())) e->set_kv_scales(per_head_kv_scales(cfg));
  return e;
}

// Greedy generation (n tokens, EOS ignored) gives the same tokens at
// tensor-parallel sizes 2 and 4 as at 1; make(tp) builds the engine.
inline void expect_greedy_same_at_tp(const std::function<std::unique_ptr<Engine>(int tp)>& make,
                                     const std::vector<int>& prompt, int n = 20) {
  GenerateOptions g;
  g.max_tokens = n;
  g.stop_at_eos = false;
  const auto ref = make(1)->generate(prompt, g).tokens;
  ASSERT_EQ(ref.size(), static_cast<size_t>(n));
  for (int tp : {2, 4}) EXPECT_EQ(make(tp)->generate(prompt, g).tokens, ref) << "tp " << tp;
}

}  // namespace fp8kv::testing
