// Pre-norm decoder layer: Llama, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).
// The differences among these families live in the weights (biases, q/k
// norms) and the config (rope, sliding windows), not in the layer recipe.
//   x = norm(h); h += attn(x); x = norm(h); h += mlp(x)
// Each residual projection (o_proj, down_proj) is one op with the residual
// add and the norm that follow it (Backend::linear_add_rmsnorm: linear,
// all_reduce, add_rmsnorm unless the backend fuses them; with fused
// projections the down projection is the last GEMM of
// Backend::linear_gated_act_linear, then all_reduce and add_rmsnorm): the
// MLP output joins h at the next layer's first norm, or the final norm (in
// place) after the last layer. With fused projections each norm in front
// of a GEMM is Backend::add_rmsnorm_for, told the GEMM's weight.
#include "engine/forward.h"

namespace fp8kv {

void ForwardPass::llama_layer(int layer, Step& st) {
  const BackendLayerWeights& L = w_.layers[layer];
  if (layer == 0) be_.rmsnorm(st.h, L.input_norm, eps_, st.x);  // later layers: the previous down_proj's op
  attention_core(layer, st);
  // post_attention_norm: HF name for the pre-MLP norm. Fused projections:
  // the norm knows its reader, the gate|up GEMM (Backend::add_rmsnorm_for).
  be_.linear_add_rmsnorm(st.attn, L.o_proj, L.o_bias, st.tmp, st.h, L.post_attention_norm, eps_, st.x,
                         std::span<const Tensor>(&L.gate_up_proj, fused_mlp_ ? 1 : 0));
  const bool last = layer + 1 == cfg_.num_layers;
  if (last) {
    mlp_add_rmsnorm(layer, w_.final_norm, st.h, st, {});
    return;
  }
  const BackendLayerWeights& N = w_.layers[layer + 1];
  mlp_add_rmsnorm(layer, N.input_norm, st.x, st, std::span<const Tensor>(&N.qkv_proj, fused_ ? 1 : 0));
}

}  // namespace fp8kv
