// Pre-norm decoder layer: Llama, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).
// The differences among these families live in the weights (biases, q/k
// norms) and the config (rope, sliding windows), not in the layer recipe.
#include "engine/forward.h"

namespace fp8kv {

void ForwardPass::llama_layer(int layer, Step& st) {
  const LayerWeights& L = w_->layers[layer];
  const int64_t n = static_cast<int64_t>(st.T) * cfg_.hidden_size;
  norm(L.input_norm, h_.data(), x_.data(), st.T);
  attention(layer, x_.data(), tmp_.data(), st);
  add_inplace_cpu(h_.data(), tmp_.data(), n);
  norm(L.post_attention_norm, h_.data(), x_.data(), st.T);  // HF name for the pre-MLP norm
  mlp(layer, x_.data(), tmp_.data(), st.T);
  add_inplace_cpu(h_.data(), tmp_.data(), n);
}

}  // namespace fp8kv
