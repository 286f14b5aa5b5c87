// Qwen3.5 text-config fields, as transformers' Qwen3_5TextConfig reads them
// (defaults: linear_conv_kernel_dim 4, linear_key_head_dim 128,
// linear_value_head_dim 128, linear_num_key_heads 16, linear_num_value_heads
// 32, full_attention_interval 4, partial_rotary_factor 0.25).
#include "model/config_qwen3_5.h"

#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/errors.h"
#include "model/config.h"

namespace fp8kv {

namespace {

using nlohmann::json;

struct Fields {
  const json& j;
  const std::string& source;
  const std::string& prefix;

  [[noreturn]] void fail(const std::string& f, const std::string& what) const {
    throw InputError(fmt::format("{}: field '{}{}': {}", source, prefix, f, what));
  }
  const json* get(const char* f) const { return j.contains(f) && !j[f].is_null() ? &j[f] : nullptr; }
  int positive(const char* f, int def) const {
    const json* v = get(f);
    if (!v) return def;
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > std::numeric_limits<int>::max())
      fail(f, fmt::format("expected a positive integer <= 2^31 - 1, got {}", v->dump()));
    return static_cast<int>(v->get<int64_t>());
  }
};

}  // namespace

bool is_qwen3_5_moe_model_type(const std::string& t) { return t == "qwen3_5_moe" || t == "qwen3_5_moe_text"; }

void parse_qwen3_5_text_fields(const json& j, const std::string& source, const std::string& prefix, ModelConfig& c) {
  const Fields r{j, source, prefix};
  const int L = c.num_layers;

  // ---- layer types: layer_types, else full_attention_interval (every n-th layer is full attention)
  c.layer_types.assign(L, LayerType::linear_attention);
  if (const json* v = r.get("layer_types")) {
    if (!v->is_array()) r.fail("layer_types", "expected a list of 'linear_attention' / 'full_attention'");
    if (static_cast<int64_t>(v->size()) != L)
      r.fail("layer_types", fmt::format("has {} entries, expected num_hidden_layers = {}", v->size(), L));
    for (int i = 0; i < L; ++i) {
      const json& x = (*v)[static_cast<size_t>(i)];
      if (x == "linear_attention") c.layer_types[i] = LayerType::linear_attention;
      else if (x == "full_attention") c.layer_types[i] = LayerType::full_attention;
      else r.fail("layer_types", fmt::format("entry {} is {} (expected linear_attention or full_attention)", i, x.dump()));
    }
  } else {
    const int interval = r.positive("full_attention_interval", 4);
    for (int i = 0; i < L; ++i)
      if ((i + 1) % interval == 0) c.layer_types[i] = LayerType::full_attention;
  }
  c.sliding_window.reset();

  // ---- Gated DeltaNet shape
  GatedDeltaNetConfig g;
  g.conv_kernel = r.positive("linear_conv_kernel_dim", 4);
  g.num_k_heads = r.positive("linear_num_key_heads", 16);
  g.num_v_heads = r.positive("linear_num_value_heads", 32);
  g.k_head_dim = r.positive("linear_key_head_dim", 128);
  g.v_head_dim = r.positive("linear_value_head_dim", 128);
  if (g.num_v_heads % g.num_k_heads != 0)
    r.fail("linear_num_value_heads", fmt::format("{} is not a multiple of linear_num_key_heads = {}", g.num_v_heads,
                                                 g.num_k_heads));
  if (g.conv_dim() > std::numeric_limits<int>::max())
    r.fail("linear_num_value_heads", "the conv channels (2 x key heads x key dim + value heads x value dim) exceed 2^31 - 1");
  if (c.num_attention_layers() < L) c.gdn = g;

  // ---- gated full attention: q_proj writes [query | gate] per head
  const json* gate = r.get("attn_output_gate");
  if (gate && !gate->is_boolean()) r.fail("attn_output_gate", fmt::format("expected true or false, got {}", gate->dump()));
  c.attn_output_gate = gate ? gate->get<bool>() : true;
  if (c.attention_bias)
    r.fail("attention_bias", "true is not supported for qwen3_5 (its checkpoints have no attention biases)");

  // ---- partial rotary: the rope dict's value wins, then the top-level field, then 0.25
  double partial = 0.25;
  bool in_rope_dict = false;
  for (const char* rf : {"rope_parameters", "rope_scaling"})
    if (const json* d = r.get(rf); d && d->is_object() && d->contains("partial_rotary_factor")) in_rope_dict = true;
  if (!in_rope_dict) {
    if (const json* v = r.get("partial_rotary_factor")) {
      if (!v->is_number() || !(v->get<double>() > 0) || v->get<double>() > 1)
        r.fail("partial_rotary_factor", fmt::format("expected a number in (0, 1], got {}", v->dump()));
      partial = v->get<double>();
    }
    c.rope_full.partial_rotary_factor = c.rope_sliding.partial_rotary_factor = partial;
  }
  const double rot = c.head_dim * c.rope_full.partial_rotary_factor;
  if (rot < 2 || static_cast<int>(rot) % 2 != 0)
    r.fail("partial_rotary_factor", fmt::format("head_dim {} x {} = {} rotary dims (expected an even number >= 2)",
                                                c.head_dim, c.rope_full.partial_rotary_factor, rot));
  c.gemma_norm_plus_one = true;  // Qwen3_5RMSNorm: x * (1 + w), the norms zero-centred
}

}  // namespace fp8kv
