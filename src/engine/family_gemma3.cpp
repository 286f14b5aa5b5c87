// Gemma 3 decoder layer: sandwich norms around attention and MLP. The other
// Gemma specifics are applied where they belong: (1 + w) RMSNorm weights at
// load (weights.cpp), sqrt(hidden) embedding scale rounded to the embedding
// dtype (weights.cpp), query_pre_attn_scalar (config attention_scale),
// gelu_tanh (hidden_act), local/global rope bases (config rope_sliding/full).
#include "engine/forward.h"

namespace fp8kv {

void ForwardPass::gemma3_layer(int layer, Step& st) {
  const LayerWeights& L = w_->layers[layer];
  const int64_t n = static_cast<int64_t>(st.T) * cfg_.hidden_size;
  norm(L.input_norm, h_.data(), x_.data(), st.T);
  attention(layer, x_.data(), tmp_.data(), st);
  norm(L.post_attention_norm, tmp_.data(), tmp_.data(), st.T);
  add_inplace_cpu(h_.data(), tmp_.data(), n);
  norm(L.pre_ffn_norm, h_.data(), x_.data(), st.T);
  mlp(layer, x_.data(), tmp_.data(), st.T);
  norm(L.post_ffn_norm, tmp_.data(), tmp_.data(), st.T);
  add_inplace_cpu(h_.data(), tmp_.data(), n);
}

}  // namespace fp8kv
