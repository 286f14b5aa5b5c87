#include "bench/traffic.h"

#include <algorithm>

#include "kv/planner.h"

namespace fp8kv::bench {

uint64_t streamed_weight_params(const ModelConfig& c) {
  const uint64_t h = c.hidden_size, q = static_cast<uint64_t>(c.num_heads) * c.head_dim,
                 kv = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim, inter = c.intermediate_size;
  uint64_t layer = h * q + 2 * h * kv + q * h  // q, k, v, o projections
                   + 3 * h * inter             // gate, up, down
                   + 2 * h;                    // input / post-attention norms
  if (c.attention_bias) layer += q + 2 * kv;
  if (c.o_proj_bias) layer += h;
  if (c.mlp_bias) layer += 2 * inter + h;
  if (c.qk_norm) layer += 2 * static_cast<uint64_t>(c.head_dim);
  if (c.sandwich_norms) layer += 2 * h;
  return layer * c.num_layers + h                     // final norm
         + static_cast<uint64_t>(c.vocab_size) * h;  // LM head (tied or not: read whole)
}

uint64_t decode_weight_bytes(const ModelConfig& c, int batch, int weight_elem_bytes) {
  const uint64_t rows = static_cast<uint64_t>(std::max(batch, 0)) * c.hidden_size;
  return (streamed_weight_params(c) + rows) * static_cast<uint64_t>(weight_elem_bytes) -
         fp8_projection_savings(c, static_cast<uint64_t>(weight_elem_bytes));
}

uint64_t decode_kv_bytes(const ModelConfig& c, KvDtype d, std::span<const int> contexts) {
  // Per-token-head dtypes also read each (token, KV head)'s f32 K and V scale.
  const uint64_t per_token = 2ull * c.num_kv_heads *
                             (static_cast<uint64_t>(c.head_dim) * kv_dtype_bytes(d) + (kv_dtype_per_token_head(d) ? 4 : 0));
  uint64_t tokens = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const int w = c.window_for_layer(l);
    for (int ctx : contexts) tokens += static_cast<uint64_t>(w > 0 ? std::min(ctx, w) : ctx);
  }
  return tokens * per_token;
}

}  // namespace fp8kv::bench
