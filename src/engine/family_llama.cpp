// Pre-norm decoder layer: Llama, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).
// The differences among these families live in the weights (biases, q/k
// norms) and the config (rope, sliding windows), not in the layer recipe.
//   x = norm(h); h += attn(x); x = norm(h); h += mlp(x)
// Each residual add is fused with the norm that follows it (add_rmsnorm):
// the MLP output joins h at the next layer's first norm (or the final norm).
#include "engine/forward.h"

namespace fp8kv {

void ForwardPass::llama_layer(int layer, Step& st) {
  const BackendLayerWeights& L = w_.layers[layer];
  residual_norm(layer, L.input_norm, st);
  attention(layer, st);
  be_.add_rmsnorm(st.h, st.tmp, L.post_attention_norm, eps_, st.x);  // HF name for the pre-MLP norm
  mlp(layer, st);
}

}  // namespace fp8kv
