// Qwen3.5 (transformers models/qwen3_5): a hybrid of Gated DeltaNet layers
// (linear attention with a per-sequence state) and gated full-attention
// layers. What ModelConfig needs beyond the llama-style fields, and the
// parser of those fields (called by parse_model_config for model_type
// qwen3_5_text, and for the text_config of qwen3_5).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace fp8kv {

struct ModelConfig;

// One Gated DeltaNet layer's shape (Qwen3_5TextConfig's linear_* fields).
// Hk = num_k_heads, Hv = num_v_heads (a multiple of Hk: q/k head h serves
// value heads [h*Hv/Hk, (h+1)*Hv/Hk)), Dk / Dv the head dims, K the kernel.
struct GatedDeltaNetConfig {
  int conv_kernel = 4;    // linear_conv_kernel_dim
  int num_k_heads = 16;   // linear_num_key_heads
  int num_v_heads = 32;   // linear_num_value_heads
  int k_head_dim = 128;   // linear_key_head_dim
  int v_head_dim = 128;   // linear_value_head_dim

  int64_t key_dim() const { return static_cast<int64_t>(num_k_heads) * k_head_dim; }
  int64_t value_dim() const { return static_cast<int64_t>(num_v_heads) * v_head_dim; }
  // Channels of the depthwise conv: q | k | v, as in_proj_qkv writes them.
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// Reads the Qwen3.5-specific fields of the text config `j` into `c` (after
// the shared llama-style fields): layer_types (linear_attention /
// full_attention) or full_attention_interval, the linear_* fields,
// partial_rotary_factor (rope dict, then the top level, default 0.25),
// attn_output_gate. `field_prefix` ("" or "text_config.") names fields in
// errors. Throws InputError naming the field.
void parse_qwen3_5_text_fields(const nlohmann::json& j, const std::string& source, const std::string& field_prefix,
                               ModelConfig& c);

// model_type values of the Qwen3.5 MoE variant, refused by name (exit 2).
bool is_qwen3_5_moe_model_type(const std::string& model_type);

}  // namespace fp8kv
