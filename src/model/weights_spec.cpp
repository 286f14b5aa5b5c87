#include "model/weights_spec.h"

#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/checkpoint.h"

namespace fp8kv {

WeightNaming default_weight_naming(const ModelConfig& cfg) {
  WeightNaming n;
  if (cfg.architecture == "Gemma3ForConditionalGeneration" || cfg.architecture == "Qwen3_5ForConditionalGeneration")
    n.prefix = "model.language_model.";
  return n;
}

WeightNaming detect_weight_naming(const ModelConfig& cfg, const Checkpoint& ckpt) {
  const WeightNaming candidates[] = {
      default_weight_naming(cfg),
      {"model.", "lm_head.weight"},
      {"model.language_model.", "lm_head.weight"},
      {"language_model.model.", "language_model.lm_head.weight"},
  };
  for (const auto& c : candidates)
    if (ckpt.has(c.prefix + "embed_tokens.weight")) return c;
  return candidates[0];
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c, const WeightNaming& n) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const int64_t q = static_cast<int64_t>(c.num_heads) * D, kv = static_cast<int64_t>(c.num_kv_heads) * D;
  std::vector<TensorSpec> s;
  s.push_back({n.prefix + "embed_tokens.weight", {V, H}});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("{}layers.{}.", n.prefix, l);
    s.push_back({p + "input_layernorm.weight", {H}});
    if (c.is_linear(l)) {  // qwen3_5 Gated DeltaNet layer
      const GatedDeltaNetConfig& g = *c.gdn;
      const std::string a = p + "linear_attn.";
      s.push_back({a + "in_proj_qkv.weight", {g.conv_dim(), H}});
      s.push_back({a + "in_proj_z.weight", {g.value_dim(), H}});
      s.push_back({a + "in_proj_b.weight", {g.num_v_heads, H}});
      s.push_back({a + "in_proj_a.weight", {g.num_v_heads, H}});
      s.push_back({a + "conv1d.weight", {g.conv_dim(), 1, g.conv_kernel}});
      s.push_back({a + "A_log", {g.num_v_heads}});
      s.push_back({a + "dt_bias", {g.num_v_heads}});
      s.push_back({a + "norm.weight", {g.v_head_dim}});
      s.push_back({a + "out_proj.weight", {H, g.value_dim()}});
      s.push_back({p + "post_attention_layernorm.weight", {H}});
      s.push_back({p + "mlp.gate_proj.weight", {I, H}});
      s.push_back({p + "mlp.up_proj.weight", {I, H}});
      s.push_back({p + "mlp.down_proj.weight", {H, I}});
      continue;
    }
    s.push_back({p + "self_attn.q_proj.weight", {c.attn_output_gate ? 2 * q : q, H}});
    s.push_back({p + "self_attn.k_proj.weight", {kv, H}});
    s.push_back({p + "self_attn.v_proj.weight", {kv, H}});
    s.push_back({p + "self_attn.o_proj.weight", {H, q}});
    if (c.attention_bias) {
      s.push_back({p + "self_attn.q_proj.bias", {q}});
      s.push_back({p + "self_attn.k_proj.bias", {kv}});
      s.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.o_proj_bias) s.push_back({p + "self_attn.o_proj.bias", {H}});
    if (c.qk_norm) {
      s.push_back({p + "self_attn.q_norm.weight", {D}});
      s.push_back({p + "self_attn.k_norm.weight", {D}});
    }
    s.push_back({p + "post_attention_layernorm.weight", {H}});
    if (c.sandwich_norms) {
      s.push_back({p + "pre_feedforward_layernorm.weight", {H}});
      s.push_back({p + "post_feedforward_layernorm.weight", {H}});
    }
    s.push_back({p + "mlp.gate_proj.weight", {I, H}});
    s.push_back({p + "mlp.up_proj.weight", {I, H}});
    s.push_back({p + "mlp.down_proj.weight", {H, I}});
    if (c.mlp_bias) {
      s.push_back({p + "mlp.gate_proj.bias", {I}});
      s.push_back({p + "mlp.up_proj.bias", {I}});
      s.push_back({p + "mlp.down_proj.bias", {H}});
    }
  }
  s.push_back({n.prefix + "norm.weight", {H}});
  if (!c.tie_word_embeddings) s.push_back({n.lm_head, {V, H}});
  return s;
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg) {
  return expected_tensors(cfg, default_weight_naming(cfg));
}

std::vector<std::string> expected_tensor_names(const ModelConfig& cfg) {
  std::vector<std::string> out;
  for (auto& t : expected_tensors(cfg)) out.push_back(std::move(t.name));
  return out;
}

bool is_kv_scale_tensor_name(const std::string& name) {
  static const char* kSuffixes[] = {
      ".self_attn.k_scale",          ".self_attn.v_scale",          ".self_attn.q_scale",
      ".self_attn.attn.k_scale",     ".self_attn.attn.v_scale",     ".self_attn.attn.q_scale",
      ".self_attn.k_proj.output_scale", ".self_attn.v_proj.output_scale", ".self_attn.q_proj.output_scale",
      ".self_attn.k_proj.k_scale",   ".self_attn.v_proj.v_scale",   ".self_attn.prob_output_scale",
      ".self_attn.attn.prob_scale",  ".self_attn.kv_scale",         ".self_attn.attn.kv_scale",
      ".self_attn.prob_scale",
  };
  if (name.find(".layers.") == std::string::npos) return false;
  for (const char* s : kSuffixes) {
    const std::string_view suf(s);
    if (name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0) return true;
  }
  return false;
}

bool is_weight_quant_tensor_name(const std::string& name, const WeightQuantConfig& quant) {
  if (!quant.quantized()) return false;
  auto ends = [&](const std::string& suf) {
    return name.size() > suf.size() + 1 && name.compare(name.size() - suf.size(), suf.size(), suf) == 0 &&
           name[name.size() - suf.size() - 1] == '.';
  };
  return ends(quant.scale_suffix) || ends("input_scale");
}

std::vector<std::string> check_weights(const ModelConfig& cfg, const Checkpoint& ckpt, const WeightNaming& naming) {
  const auto specs = expected_tensors(cfg, naming);
  std::set<std::string> expected;
  for (const auto& s : specs) {
    expected.insert(s.name);
    const TensorInfo* t = ckpt.find(s.name);
    if (!t) {
      const std::string hint = cfg.tie_word_embeddings || s.name != naming.lm_head
                                   ? ""
                                   : " (config.json has tie_word_embeddings=false)";
      throw InputError(fmt::format("{}: missing tensor {} expected by {} config{}", ckpt.dir().string(), s.name,
                                   cfg.architecture, hint));
    }
    const std::string file = ckpt.file_of(s.name)->string();
    if (!is_float_dtype(t->dtype))
      throw InputError(fmt::format("{}: tensor {} has dtype {}, expected a floating-point dtype", file, s.name,
                                   dtype_name(t->dtype)));
    if (t->shape != s.shape)
      throw InputError(fmt::format("{}: tensor {} has shape [{}], expected [{}] from config.json", file, s.name,
                                   fmt::join(t->shape, ", "), fmt::join(s.shape, ", ")));
  }
  std::vector<std::string> unexpected;
  for (const auto& name : ckpt.tensor_names())
    if (!expected.count(name) && !is_kv_scale_tensor_name(name) && name != naming.lm_head &&
        !is_weight_quant_tensor_name(name, cfg.weight_quant))
      unexpected.push_back(name);
  return unexpected;
}

}  // namespace fp8kv
