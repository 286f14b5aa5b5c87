// Gemma 3 decoder layer: sandwich norms around attention and MLP. The other
// Gemma specifics are applied where they belong: (1 + w) RMSNorm weights at
// load (weights.cpp), sqrt(hidden) embedding scale rounded to the embedding
// dtype (weights.cpp), query_pre_attn_scalar (config attention_scale),
// gelu_tanh (hidden_act), local/global rope bases (config rope_sliding/full).
//   x = norm(h); h += norm(attn(x)); x = norm(h); h += norm(mlp(x))
// The last residual add is fused with the next layer's first norm. The
// post-attention / post-feedforward norms sit between each projection and
// its residual add, so this recipe keeps the unfused ops (linear, rmsnorm,
// add_rmsnorm), not Backend::linear_add_rmsnorm.
#include "engine/forward.h"

namespace fp8kv {

void ForwardPass::gemma3_layer(int layer, Step& st) {
  const BackendLayerWeights& L = w_.layers[layer];
  residual_norm(layer, L.input_norm, st);
  attention(layer, st);
  be_.rmsnorm(st.tmp, L.post_attention_norm, eps_, st.tmp);
  be_.add_rmsnorm(st.h, st.tmp, L.pre_ffn_norm, eps_, st.x);
  mlp(layer, st);
  be_.rmsnorm(st.tmp, L.post_ffn_norm, eps_, st.tmp);
}

}  // namespace fp8kv
