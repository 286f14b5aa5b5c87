// ModelConfig: what the forward pass and the KV planner need from an HF
// config.json, for llama, mistral, qwen2, qwen3 and gemma3_text (and the text
// part of gemma3 multimodal configs) and qwen3_5 (Qwen3.5 hybrids: Gated
// DeltaNet + gated full attention, model/config_qwen3_5.h). Parsing mirrors
// transformers' rules.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/config_qwen3_5.h"
#include "model/quant_config.h"

namespace fp8kv {

enum class ModelFamily { llama, mistral, qwen2, qwen3, gemma3, qwen3_5 };
// linear_attention: a Gated DeltaNet layer (qwen3_5): no KV cache, a
// per-sequence state instead.
enum class LayerType { full_attention, sliding_attention, linear_attention };
std::string_view layer_type_name(LayerType t);  // HF vocabulary
std::string_view family_name(ModelFamily f);      // "llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen3_5"

// RoPE parameters for one layer type. `type`: default | linear | llama3 | yarn
// | dynamic (dynamic: accepted, treated as default at lengths <= original).
struct RopeParams {
  std::string type = "default";
  double theta = 10000.0;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> attention_factor;
  std::optional<double> mscale, mscale_all_dim;  // yarn (DeepSeek-style mscale), when given
  bool truncate = true;                           // yarn: round the correction range (transformers default)
  double partial_rotary_factor = 1.0;
};

struct ModelConfig {
  std::string architecture;  // architectures[0]
  std::string model_type;    // "llama", "qwen3", "gemma3_text", ...
  ModelFamily family = ModelFamily::llama;

  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";  // silu | gelu_pytorch_tanh | gelu
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (qwen2: always true)
  bool o_proj_bias = false;     // o_proj bias (llama/qwen3/gemma3: = attention_bias; qwen2/mistral: never)
  bool mlp_bias = false;        // gate/up/down bias (llama: mlp_bias)
  bool qk_norm = false;         // qwen3, gemma3: per-head RMSNorm on q and k

  // One entry per layer; sliding layers use `sliding_window`.
  std::vector<LayerType> layer_types;
  std::optional<int> sliding_window;  // tokens; key j visible from i when i - j < window

  RopeParams rope_full;     // rope for full_attention layers
  RopeParams rope_sliding;  // rope for sliding_attention layers (gemma3: local base)

  // gemma3 specifics
  double query_pre_attn_scalar = 0.0;  // 0: use head_dim
  std::optional<double> attn_logit_softcapping;
  std::optional<double> final_logit_softcapping;
  bool gemma_norm_plus_one = false;     // RMSNorm weight applied as (1 + w) (gemma3, qwen3_5's zero-centred norms)
  bool embed_scale_sqrt_hidden = false; // embeddings * sqrt(hidden)
  bool sandwich_norms = false;          // pre/post attention and ffn norms

  // qwen3_5 specifics (model/config_qwen3_5.h)
  std::optional<GatedDeltaNetConfig> gdn;  // set when some layer is linear_attention
  bool attn_output_gate = false;           // q_proj also writes a per-head output gate (sigmoid)

  std::vector<int> eos_token_ids;
  std::optional<int> bos_token_id;
  std::string torch_dtype;  // as declared ("bfloat16", ...), may be empty
  // FP8 weights (quantization_config / hf_quant_config.json), model/quant_config.h.
  WeightQuantConfig weight_quant;

  int num_sliding_layers() const;
  bool is_linear(int layer) const { return layer_types[layer] == LayerType::linear_attention; }
  // Layers with a KV cache (full or sliding attention).
  int num_attention_layers() const;
  bool is_sliding(int layer) const { return layer_types[layer] == LayerType::sliding_attention; }
  int window_for_layer(int layer) const { return is_sliding(layer) ? *sliding_window : 0; }  // 0 = full
  const RopeParams& rope_for_layer(int layer) const { return is_sliding(layer) ? rope_sliding : rope_full; }
  // Softmax scale: 1/sqrt(head_dim) or 1/sqrt(query_pre_attn_scalar) (gemma3).
  float attention_scale() const;
};

// Parses config.json content. `source` names the file in errors. Throws
// InputError naming the field and what was expected; an unsupported
// architecture names the supported ones.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);
// Loads <dir>/config.json, or the file itself when given a .json path. When
// <dir>/generation_config.json declares eos_token_id, it takes precedence
// (as in transformers' generate).
ModelConfig load_model_config(const std::filesystem::path& dir_or_file);

}  // namespace fp8kv
