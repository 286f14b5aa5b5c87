#include "bench/traffic.h"

#include <algorithm>

#include "kv/planner.h"
#include "kv/state_plan.h"

namespace fp8kv::bench {

uint64_t streamed_weight_params(const ModelConfig& c) {
  // Every parameter of the model (kv/planner.h; gated q_proj and Gated
  // DeltaNet layers included) but the untied input embedding, which is
  // gathered row by row. A tied table is read whole as the LM head.
  const uint64_t table = static_cast<uint64_t>(c.vocab_size) * static_cast<uint64_t>(c.hidden_size);
  return estimate_parameters(c) - (c.tie_word_embeddings ? 0 : table);
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
    if (c.gdn && c.is_linear(l)) continue;  // no KV cache (decode_state_bytes)
    const int w = c.window_for_layer(l);
    for (int ctx : contexts) tokens += static_cast<uint64_t>(w > 0 ? std::min(ctx, w) : ctx);
  }
  return tokens * per_token;
}

uint64_t decode_state_bytes(const ModelConfig& c, int batch, StateDtype conv_dtype, StateDtype ssm_dtype) {
  if (!c.gdn || batch <= 0) return 0;
  const StatePlan p = plan_state(c, batch, 1, conv_dtype, ssm_dtype);
  return 2 * p.pool_bytes();  // each state read and written once per step
}

}  // namespace fp8kv::bench
