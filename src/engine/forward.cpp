#include "engine/forward.h"

#include <cmath>
#include <stdexcept>

#include "io/errors.h"

namespace fp8kv {

MatrixRef matrix_ref(const WeightMatrix& m) {
  return MatrixRef{m.data, m.bf16 ? WeightType::bf16 : WeightType::f32, m.rows, m.cols};
}

namespace {
Activation activation_for(const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_tanh" || name == "gelu_new") return Activation::gelu_tanh;
  if (name == "gelu") return Activation::gelu;
  throw InputError("hidden_act '" + name + "' is not supported (silu, gelu_pytorch_tanh, gelu)");
}
const float* opt(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }
}  // namespace

ForwardPass::ForwardPass(const ModelConfig& cfg, std::shared_ptr<const ModelWeights> weights)
    : cfg_(cfg),
      w_(std::move(weights)),
      act_(activation_for(cfg.hidden_act)),
      rope_full_(cfg.rope_full, cfg.head_dim, cfg.max_position_embeddings),
      rope_sliding_(cfg.rope_sliding, cfg.head_dim, cfg.max_position_embeddings) {
  if (static_cast<int>(w_->layers.size()) != cfg.num_layers) throw std::logic_error("ForwardPass: layer count mismatch");
}

void ForwardPass::norm(const std::vector<float>& w, const float* x, float* y, int T) const {
  rmsnorm_cpu(x, T, cfg_.hidden_size, w.data(), static_cast<float>(cfg_.rms_norm_eps), y);
}

void ForwardPass::store_and_observe(int layer, Step& st) {
  // The single point where Q/K/V of a layer are observed and K/V written.
  const int Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  if (st.observer) st.observer->observe(layer, q_.data(), Hq, k_.data(), v_.data(), Hkv, D, st.T);
  KvCacheManager& kv = *st.kv;
  const int group = kv.group_of_layer(layer);
  slots_.resize(st.T);
  int t = 0;
  for (const auto& s : st.seqs)
    for (int i = 0; i < s.num_tokens; ++i, ++t) slots_[t] = kv.slot(s.kv_seq, group, s.start_pos + i);
  const LayerKvScales& sc = st.scales->layers[layer];
  store_kv_cpu(kv.layout(), kv.k_cache(layer), kv.v_cache(layer), k_.data(), v_.data(), slots_.data(), st.T,
               sc.k.ref(), sc.v.ref());
}

void ForwardPass::attention(int layer, const float* x, float* out, Step& st) {
  const LayerWeights& L = w_->layers[layer];
  const int T = st.T, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  q_.resize(static_cast<size_t>(T) * Hq * D);
  k_.resize(static_cast<size_t>(T) * Hkv * D);
  v_.resize(static_cast<size_t>(T) * Hkv * D);
  attn_.resize(static_cast<size_t>(T) * Hq * D);
  linear_cpu(x, T, matrix_ref(L.q_proj), opt(L.q_bias), q_.data());
  linear_cpu(x, T, matrix_ref(L.k_proj), opt(L.k_bias), k_.data());
  linear_cpu(x, T, matrix_ref(L.v_proj), opt(L.v_bias), v_.data());
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  if (!L.q_norm.empty()) rmsnorm_cpu(q_.data(), static_cast<int64_t>(T) * Hq, D, L.q_norm.data(), eps, q_.data());
  if (!L.k_norm.empty()) rmsnorm_cpu(k_.data(), static_cast<int64_t>(T) * Hkv, D, L.k_norm.data(), eps, k_.data());
  const bool sliding = cfg_.is_sliding(layer);
  const RopeTable& rope = sliding ? rope_sliding_ : rope_full_;
  const float* c = sliding ? cos_sliding_.data() : cos_full_.data();
  const float* s = sliding ? sin_sliding_.data() : sin_full_.data();
  rope_cpu(q_.data(), T, Hq, D, rope.rot_dim(), c, s);
  rope_cpu(k_.data(), T, Hkv, D, rope.rot_dim(), c, s);

  store_and_observe(layer, st);

  KvCacheManager& kv = *st.kv;
  const int group = kv.group_of_layer(layer);
  const LayerKvScales& sc = st.scales->layers[layer];
  PagedAttentionArgs a;
  a.layout = kv.layout();
  a.k_cache = kv.k_cache(layer);
  a.v_cache = kv.v_cache(layer);
  a.window = cfg_.window_for_layer(layer);
  a.softmax_scale = cfg_.attention_scale();
  a.logit_softcap = cfg_.attn_logit_softcapping ? static_cast<float>(*cfg_.attn_logit_softcapping) : 0.0f;
  a.k_scale = sc.k.ref();
  a.v_scale = sc.v.ref();
  int t0 = 0;
  for (const auto& sq : st.seqs) {
    a.block_table = kv.block_table(sq.kv_seq, group).data();
    a.context_len = sq.start_pos + sq.num_tokens;
    paged_attention_cpu(a, q_.data() + static_cast<size_t>(t0) * Hq * D, pos_.data() + t0, sq.num_tokens, Hq,
                        attn_.data() + static_cast<size_t>(t0) * Hq * D);
    t0 += sq.num_tokens;
  }
  linear_cpu(attn_.data(), T, matrix_ref(L.o_proj), opt(L.o_bias), out);
}

void ForwardPass::mlp(int layer, const float* x, float* out, int T) {
  const LayerWeights& L = w_->layers[layer];
  const int64_t I = cfg_.intermediate_size;
  gate_.resize(static_cast<size_t>(T * I));
  up_.resize(static_cast<size_t>(T * I));
  linear_cpu(x, T, matrix_ref(L.gate_proj), opt(L.gate_bias), gate_.data());
  linear_cpu(x, T, matrix_ref(L.up_proj), opt(L.up_bias), up_.data());
  gated_act_cpu(act_, gate_.data(), up_.data(), gate_.data(), T * I);
  linear_cpu(gate_.data(), T, matrix_ref(L.down_proj), opt(L.down_bias), out);
}

void ForwardPass::run(std::span<const int> tokens, std::span<const ForwardSeq> seqs, KvCacheManager& kv,
                      const KvScales& scales, StoreObserver* observer) {
  const int T = static_cast<int>(tokens.size());
  int total = 0;
  for (const auto& s : seqs) total += s.num_tokens;
  if (total != T) throw std::logic_error("ForwardPass::run: token count does not match the sequences");
  if (static_cast<int>(scales.layers.size()) != cfg_.num_layers) throw std::logic_error("ForwardPass::run: scales");
  const size_t H = cfg_.hidden_size;
  h_.resize(T * H);
  x_.resize(T * H);
  tmp_.resize(T * H);
  pos_.resize(T);
  int t = 0;
  for (const auto& s : seqs)
    for (int i = 0; i < s.num_tokens; ++i) pos_[t++] = s.start_pos + i;
  const int hf = rope_full_.rot_dim() / 2, hs = rope_sliding_.rot_dim() / 2;
  cos_full_.resize(static_cast<size_t>(T) * hf);
  sin_full_.resize(static_cast<size_t>(T) * hf);
  rope_full_.fill(pos_.data(), T, cos_full_.data(), sin_full_.data());
  if (cfg_.num_sliding_layers() > 0) {
    cos_sliding_.resize(static_cast<size_t>(T) * hs);
    sin_sliding_.resize(static_cast<size_t>(T) * hs);
    rope_sliding_.fill(pos_.data(), T, cos_sliding_.data(), sin_sliding_.data());
  }

  embedding_cpu(matrix_ref(w_->embed), tokens.data(), T, w_->embed_scale, h_.data());
  Step st;
  st.T = T;
  st.seqs = seqs;
  st.kv = &kv;
  st.scales = &scales;
  st.observer = observer;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    if (cfg_.sandwich_norms)
      gemma3_layer(l, st);
    else
      llama_layer(l, st);
  }
  norm(w_->final_norm, h_.data(), h_.data(), T);
}

void ForwardPass::logits(const float* hidden_rows, int n, float* out) const {
  linear_cpu(hidden_rows, n, matrix_ref(w_->output()), nullptr, out);
  if (cfg_.final_logit_softcapping) {
    const float cap = static_cast<float>(*cfg_.final_logit_softcapping);
    const int64_t count = static_cast<int64_t>(n) * cfg_.vocab_size;
    for (int64_t i = 0; i < count; ++i) out[i] = std::tanh(out[i] / cap) * cap;
  }
}

}  // namespace fp8kv
