#include "engine/forward.h"

#include <limits>
#include <stdexcept>
#include <vector>

#include "backend/common/rank_failure.h"
#include "io/errors.h"

namespace fp8kv {

Activation activation_for(const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_tanh" || name == "gelu_new") return Activation::gelu_tanh;
  if (name == "gelu") return Activation::gelu;
  throw InputError("hidden_act '" + name + "' is not supported (silu, gelu_pytorch_tanh, gelu)");
}

RunState::RunState(Backend& be, const ModelConfig& cfg, int max_t, int max_rows, bool fused_mlp, bool fused_qkv)
    : max_tokens(max_t), max_logits_rows(max_rows) {
  const size_t T = static_cast<size_t>(max_t), a = scalar_type_bytes(be.activation_dtype());
  const size_t H = cfg.hidden_size, Q = static_cast<size_t>(cfg.num_heads) * cfg.head_dim,
               KV = static_cast<size_t>(cfg.num_kv_heads) * cfg.head_dim, I = cfg.intermediate_size;
  h = be.alloc(T * H * 4);
  x = be.alloc(T * H * a);
  tmp = be.alloc(T * H * a);
  q = be.alloc(T * Q * a);
  k = be.alloc(T * KV * a);
  v = be.alloc(T * KV * a);
  attn = be.alloc(T * Q * a);
  gate = be.alloc(T * I * a * (fused_mlp ? 2 : 1));
  // Fused: the down GEMM's input, bf16.
  up = be.alloc(T * I * (fused_mlp ? scalar_type_bytes(ScalarType::bf16) : a));
  // A gated q projection (attn_output_gate) writes each head's gate beside its query.
  if (fused_qkv) qkv = be.alloc(T * ((cfg.attn_output_gate ? 2 : 1) * Q + 2 * KV) * a);
  if (cfg.gdn) {
    const size_t C = static_cast<size_t>(cfg.gdn->conv_dim()), VD = static_cast<size_t>(cfg.gdn->value_dim()),
                 Hv = static_cast<size_t>(cfg.gdn->num_v_heads);
    lin_qkv = be.alloc(T * C * a);
    lin_z = be.alloc(T * VD * a);
    lin_b = be.alloc(T * Hv * a);
    lin_a = be.alloc(T * Hv * a);
    lin_out = be.alloc(T * VD * (fused_mlp ? scalar_type_bytes(ScalarType::bf16) : a));  // fused: out_proj's bf16 input
  }
  if (cfg.attn_output_gate && fused_qkv) {  // the gates stay in qkv; attn_gate is o_proj's bf16 input
    attn_gate = be.alloc(T * Q * scalar_type_bytes(ScalarType::bf16));
  } else if (cfg.attn_output_gate) {
    q_gate = be.alloc(T * 2 * Q * a);
    attn_gate = be.alloc(T * Q * a);
  }
  logits = be.alloc(static_cast<size_t>(max_rows) * cfg.vocab_size * 4);
}

ForwardPass::ForwardPass(const ModelConfig& cfg, Backend& backend, const BackendWeights& weights)
    : cfg_(cfg),
      be_(backend),
      w_(weights),
      act_(activation_for(cfg.hidden_act)),
      eps_(static_cast<float>(cfg.rms_norm_eps)) {
  if (static_cast<int>(w_.layers.size()) != cfg.num_layers) throw std::logic_error("ForwardPass: layer count mismatch");
  fused_mlp_ = be_.fuses_projections() && !w_.layers.empty();
  for (const BackendLayerWeights& L : w_.layers) fused_mlp_ = fused_mlp_ && !L.gate_up_proj.empty();
  // q|k|v fused on every attention layer (a Qwen3.5 linear_attention layer
  // has none; its gated q projection keeps the gates in qkv).
  fused_ = fused_mlp_;
  for (int l = 0; l < cfg.num_layers; ++l) fused_ = fused_ && (cfg.is_linear(l) || !w_.layers[l].qkv_proj.empty());
}

Tensor ForwardPass::hidden(const RunState& rs, const ModelConfig& cfg, int T) {
  return rs.h.view(ScalarType::f32, T, cfg.hidden_size);
}

void ForwardPass::residual_norm(int layer, const Tensor& w, Step& st) {
  if (layer == 0)
    be_.rmsnorm(st.h, w, eps_, st.x);
  else
    be_.add_rmsnorm(st.h, st.tmp, w, eps_, st.x);
}

void ForwardPass::attention_core(int layer, Step& st) {
  const BackendLayerWeights& L = w_.layers[layer];
  if (fused_) {  // one GEMM, then norms + RoPE + split (+ the KV store) in one op
    be_.linear_qkv_split_store(*st.batch, layer, st.x, L.qkv_proj, L.qkv_bias, st.qkv, L.q_norm, L.k_norm, eps_,
                               st.q, st.k, st.v);
    be_.attention(*st.batch, layer, st.q, st.attn);
    return;
  }
  be_.linear(st.x, L.q_proj, L.q_bias, st.q);
  be_.linear(st.x, L.k_proj, L.k_bias, st.k);
  be_.linear(st.x, L.v_proj, L.v_bias, st.v);
  if (!L.q_norm.empty()) be_.head_rmsnorm(st.q, cfg_.head_dim, L.q_norm, eps_);
  if (!L.k_norm.empty()) be_.head_rmsnorm(st.k, cfg_.head_dim, L.k_norm, eps_);
  be_.rope(layer, st.q, st.k);
  be_.store_kv(*st.batch, layer, st.q, st.k, st.v);
  be_.attention(*st.batch, layer, st.q, st.attn);
}

void ForwardPass::attention(int layer, Step& st) {
  attention_core(layer, st);
  be_.linear(st.attn, w_.layers[layer].o_proj, w_.layers[layer].o_bias, st.tmp);
  be_.all_reduce(st.tmp);  // row-parallel o_proj: sum the ranks' partials (no-op on one rank)
}

const Tensor& ForwardPass::mlp_core(int layer, Step& st) {
  const BackendLayerWeights& L = w_.layers[layer];
  be_.linear(st.x, L.gate_proj, L.gate_bias, st.gate);
  be_.linear(st.x, L.up_proj, L.up_bias, st.up);
  be_.gated_act(act_, st.gate, st.up, st.gate);
  return st.gate;
}

void ForwardPass::mlp_down(int layer, Step& st) {
  const BackendLayerWeights& L = w_.layers[layer];
  if (fused_mlp_)  // gate|up in one GEMM, the activation, the down GEMM: one op (the backend may hand the
               // activation to the down GEMM in its own form: CUDA's W8A8 codes)
    be_.linear_gated_act_linear(act_, st.x, L.gate_up_proj, L.gate_up_bias, st.gate_up, st.act_bf16, L.down_proj,
                                L.down_bias, st.tmp);
  else
    be_.linear(mlp_core(layer, st), L.down_proj, L.down_bias, st.tmp);
}

void ForwardPass::mlp(int layer, Step& st) {
  mlp_down(layer, st);
  be_.all_reduce(st.tmp);  // row-parallel down_proj
}

void ForwardPass::mlp_add_rmsnorm(int layer, const Tensor& norm_w, Tensor& y, Step& st,
                                  std::span<const Tensor> next_ws) {
  if (fused_mlp_) {  // linear_add_rmsnorm's ops (linear, all_reduce, add_rmsnorm) with the fused MLP's linear
    mlp(layer, st);
    be_.add_rmsnorm_for(st.h, st.tmp, norm_w, eps_, y, next_ws);
    return;
  }
  const BackendLayerWeights& L = w_.layers[layer];
  be_.linear_add_rmsnorm(mlp_core(layer, st), L.down_proj, L.down_bias, st.tmp, st.h, norm_w, eps_, y);
}

void ForwardPass::run(const StepBatch& b, RunState& rs) {
  const int T = b.num_tokens;
  if (T < 1 || T > rs.max_tokens)
    throw std::logic_error("ForwardPass::run: " + std::to_string(T) + " tokens, RunState holds " +
                           std::to_string(rs.max_tokens));
  const ScalarType a = be_.activation_dtype();
  const int64_t H = cfg_.hidden_size, Q = static_cast<int64_t>(cfg_.num_heads) * cfg_.head_dim,
                KV = static_cast<int64_t>(cfg_.num_kv_heads) * cfg_.head_dim, I = cfg_.intermediate_size;
  Step st;
  st.batch = &b;
  st.T = T;
  st.h = rs.h.view(ScalarType::f32, T, H);
  st.x = rs.x.view(a, T, H);
  st.tmp = rs.tmp.view(a, T, H);
  st.q = rs.q.view(a, T, Q);
  st.k = rs.k.view(a, T, KV);
  st.v = rs.v.view(a, T, KV);
  st.attn = rs.attn.view(a, T, Q);
  // GEMM-only inputs written as bf16 by the op producing them (norm,
  // attention, activation): no separate conversion before each GEMM (the
  // CUDA W8A8 GEMM quantizes them to e4m3 from bf16).
  const ScalarType gin = ScalarType::bf16;
  if (fused_) {
    // A gated q projection: attention writes act, mul_sigmoid_qkv_gate the
    // bf16 o_proj input (attn_gate); the gates stay in qkv.
    st.attn = rs.attn.view(cfg_.attn_output_gate ? a : gin, T, Q);
    st.qkv = rs.qkv.view(a, T, (cfg_.attn_output_gate ? 2 : 1) * Q + 2 * KV);
  }
  if (fused_mlp_) {
    st.x = rs.x.view(gin, T, H);
    st.gate_up = rs.gate.view(a, T, 2 * I);
    st.act_bf16 = rs.up.view(gin, T, I);
  } else {
    st.gate = rs.gate.view(a, T, I);
    st.up = rs.up.view(a, T, I);
  }

  if (cfg_.gdn) {
    const int64_t C = cfg_.gdn->conv_dim(), VD = cfg_.gdn->value_dim(), Hv = cfg_.gdn->num_v_heads;
    st.lin_qkv = rs.lin_qkv.view(a, T, C);
    st.lin_z = rs.lin_z.view(a, T, VD);
    st.lin_b = rs.lin_b.view(a, T, Hv);
    st.lin_a = rs.lin_a.view(a, T, Hv);
    st.lin_out = rs.lin_out.view(fused_mlp_ ? gin : a, T, VD);  // fused: out_proj's bf16 input
  }
  if (cfg_.attn_output_gate && fused_) {
    st.attn_gate = rs.attn_gate.view(gin, T, Q);
  } else if (cfg_.attn_output_gate) {
    st.q_gate = rs.q_gate.view(a, T, 2 * Q);
    st.attn_gate = rs.attn_gate.view(a, T, Q);
  }

  be_.embedding(w_.embed, w_.embed_scale, st.h);
  check_stage(kStageEmbedding, st.h);
  const int n = cfg_.num_layers;
  for (int l = 0; l < n; ++l) {
    try {
      if (cfg_.family == ModelFamily::qwen3_5)
        qwen3_5_layer(l, st);
      else if (cfg_.sandwich_norms)
        gemma3_layer(l, st);
      else
        llama_layer(l, st);
    } catch (const RankFailure& e) {
      throw e.at_layer(l);  // the watchdog's line names the layer (docs/tp.md)
    }
    // The layer's output: pre-norm families have added it to h (after the
    // last layer h is also final-normed, in place: if the MLP output tmp is
    // finite there, the final norm overflowed); Gemma 3 adds its MLP output
    // tmp at the next norm.
    if (check_stages_) {
      if (cfg_.sandwich_norms)
        check_stage(l, st.h, st.tmp);
      else if (l + 1 < n)
        check_stage(l, st.h);
      else {
        check_stage(l, st.tmp);
        check_stage(n, st.h);
      }
    }
  }
  // Gemma 3: the last layer's MLP output joins the residual stream, then the
  // final norm (in place). Pre-norm families did this in llama_layer.
  if (cfg_.sandwich_norms) {
    be_.add_rmsnorm(st.h, st.tmp, w_.final_norm, eps_, st.h);
    check_stage(n, st.h);
  }
}

void ForwardPass::check_stage(int stage, const Tensor& t, const Tensor& t2) {
  if (!check_stages_ || first_nonfinite_stage_ != kNoStage) return;
  for (const Tensor* x : {&t, &t2}) {
    if (x->empty()) continue;
    std::vector<uint16_t> raw(x->bytes() / 2);
    be_.download(raw.data(), x->data, x->bytes());
    bool bad = false;
    if (x->dtype == ScalarType::f32) {
      for (size_t i = 0; i + 1 < raw.size() && !bad; i += 2) bad = (raw[i + 1] & 0x7f80) == 0x7f80;  // little-endian f32: high half
    } else if (x->dtype == ScalarType::bf16) {
      for (size_t i = 0; i < raw.size() && !bad; ++i) bad = (raw[i] & 0x7f80) == 0x7f80;
    } else if (x->dtype == ScalarType::f16) {
      for (size_t i = 0; i < raw.size() && !bad; ++i) bad = (raw[i] & 0x7c00) == 0x7c00;
    }
    if (bad) {
      first_nonfinite_stage_ = stage;
      return;
    }
  }
}

}  // namespace fp8kv
