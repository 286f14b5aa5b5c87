// Qwen3.5 decoder layer (transformers' Qwen3_5DecoderLayer): pre-norm, with
// one of two token mixers, then a dense SwiGLU MLP.
//   x = norm(h); h += mixer(x); x = norm(h); h += mlp(x)
// linear_attention layers mix with a Gated DeltaNet (Backend::
// gated_delta_net: the conv and recurrent states live in the state pool,
// kv/state_plan.h); full_attention layers with gated attention: q_proj
// writes each head's query and an output gate, the attention output is
// multiplied by sigmoid(gate) before o_proj; q/k get per-head RMSNorms and
// partial RoPE (rope_full.partial_rotary_factor). The norms are zero-centred
// (1 + w, applied at load: gemma_norm_plus_one), except the Gated DeltaNet's
// gated norm (a plain weight). With fused projections (Backend::
// fuses_projections) the MLP is gate|up fused, a full_attention layer's
// q|k|v one GEMM whose gates stay in its output (mul_sigmoid_qkv_gate), and
// each residual norm is told the GEMMs reading its output
// (Backend::add_rmsnorm_for).
#include <array>

#include "engine/forward.h"

namespace fp8kv {

const Tensor& ForwardPass::gated_delta_net(int layer, Step& st) {
  const BackendLayerWeights& L = w_.layers[layer];
  be_.linear(st.x, L.in_proj_qkv, Tensor{}, st.lin_qkv);
  be_.linear(st.x, L.in_proj_z, Tensor{}, st.lin_z);
  be_.linear(st.x, L.in_proj_b, Tensor{}, st.lin_b);
  be_.linear(st.x, L.in_proj_a, Tensor{}, st.lin_a);
  be_.gated_delta_net(*st.batch, layer, L, st.lin_qkv, st.lin_z, st.lin_b, st.lin_a, eps_, st.lin_out);
  return st.lin_out;
}

const Tensor& ForwardPass::gated_attention(int layer, Step& st) {
  const BackendLayerWeights& L = w_.layers[layer];
  if (!cfg_.attn_output_gate) {
    attention_core(layer, st);
    return st.attn;
  }
  if (fused_) {  // attention_core's one q|k|v GEMM and prep; the gates stay in qkv
    attention_core(layer, st);
    be_.mul_sigmoid_qkv_gate(st.attn, st.qkv, cfg_.head_dim, st.attn_gate);  // bf16: o_proj's input
    return st.attn_gate;
  }
  be_.linear(st.x, L.q_proj, L.q_bias, st.q_gate);
  be_.split_q_gate(st.q_gate, cfg_.head_dim, st.q, st.attn_gate);
  be_.linear(st.x, L.k_proj, L.k_bias, st.k);
  be_.linear(st.x, L.v_proj, L.v_bias, st.v);
  be_.head_rmsnorm(st.q, cfg_.head_dim, L.q_norm, eps_);
  be_.head_rmsnorm(st.k, cfg_.head_dim, L.k_norm, eps_);
  be_.rope(layer, st.q, st.k);
  be_.store_kv(*st.batch, layer, st.q, st.k, st.v);
  be_.attention(*st.batch, layer, st.q, st.attn);
  be_.mul_sigmoid(st.attn, st.attn_gate);
  return st.attn;
}

void ForwardPass::qwen3_5_layer(int layer, Step& st) {
  const BackendLayerWeights& L = w_.layers[layer];
  if (layer == 0) be_.rmsnorm(st.h, L.input_norm, eps_, st.x);  // later layers: the previous down_proj's op
  const bool linear = cfg_.is_linear(layer);
  const Tensor& mixed = linear ? gated_delta_net(layer, st) : gated_attention(layer, st);
  // With fused gate|up the pre-MLP norm knows its reader (Backend::
  // add_rmsnorm_for); the input norms feed several GEMMs (q/k/v or the
  // four Gated DeltaNet projections).
  be_.linear_add_rmsnorm(mixed, linear ? L.out_proj : L.o_proj, linear ? Tensor{} : L.o_bias, st.tmp, st.h,
                         L.post_attention_norm, eps_, st.x,
                         std::span<const Tensor>(&L.gate_up_proj, fused_mlp_ ? 1 : 0));
  if (layer + 1 == cfg_.num_layers) {
    mlp_add_rmsnorm(layer, w_.final_norm, st.h, st, {});
    return;
  }
  // The next layer's input norm feeds its projections: the four Gated
  // DeltaNet ones, or q, k and v (bf16 x with fused gate|up, as above).
  const BackendLayerWeights& N = w_.layers[layer + 1];
  std::array<Tensor, 4> next{};
  size_t n = 0;
  if (fused_mlp_) {
    if (cfg_.is_linear(layer + 1)) {
      next = {N.in_proj_qkv, N.in_proj_z, N.in_proj_b, N.in_proj_a};
      n = 4;
    } else if (fused_) {
      next = {N.qkv_proj, Tensor{}, Tensor{}, Tensor{}};
      n = 1;
    } else {
      next = {N.q_proj, N.k_proj, N.v_proj, Tensor{}};
      n = 3;
    }
  }
  mlp_add_rmsnorm(layer, N.input_norm, st.x, st, std::span<const Tensor>(next.data(), n));
}

}  // namespace fp8kv
