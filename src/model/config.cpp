// HF config.json -> ModelConfig. Defaults and derived fields mirror
// transformers' configuration classes (LlamaConfig, MistralConfig,
// Qwen2Config, Qwen3Config, Gemma3TextConfig), because save_pretrained drops
// values equal to the class default (nested text_config especially).
#include "model/config.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/errors.h"
#include "io/fs_util.h"

namespace fp8kv {

using nlohmann::json;

std::string_view layer_type_name(LayerType t) {
  switch (t) {
    case LayerType::full_attention: return "full_attention";
    case LayerType::sliding_attention: return "sliding_attention";
    case LayerType::linear_attention: return "linear_attention";
  }
  return "?";
}

std::string_view family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::llama: return "llama";
    case ModelFamily::mistral: return "mistral";
    case ModelFamily::qwen2: return "qwen2";
    case ModelFamily::qwen3: return "qwen3";
    case ModelFamily::gemma3: return "gemma3";
    case ModelFamily::qwen3_5: return "qwen3_5";
  }
  return "?";
}

int ModelConfig::num_sliding_layers() const {
  int n = 0;
  for (auto t : layer_types) n += t == LayerType::sliding_attention;
  return n;
}

int ModelConfig::num_attention_layers() const {
  int n = 0;
  for (auto t : layer_types) n += t != LayerType::linear_attention;
  return n;
}

float ModelConfig::attention_scale() const {
  const double d = query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(head_dim);
  return static_cast<float>(1.0 / std::sqrt(d));
}

namespace {

constexpr const char* kSupported =
    "supported: LlamaForCausalLM (llama), MistralForCausalLM (mistral), Qwen2ForCausalLM (qwen2), "
    "Qwen3ForCausalLM (qwen3), Gemma3ForCausalLM (gemma3_text), Gemma3ForConditionalGeneration (gemma3, text part), "
    "Qwen3_5ForCausalLM (qwen3_5_text), Qwen3_5ForConditionalGeneration (qwen3_5, text part)";

struct Reader {
  const json& j;
  std::string source;  // file name
  std::string prefix;  // "" or "text_config."

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw InputError(fmt::format("{}: field '{}{}': {}", source, prefix, field, what));
  }
  bool has(const char* f) const { return j.contains(f) && !j[f].is_null(); }
  const json* get(const char* f) const { return has(f) ? &j[f] : nullptr; }

  int64_t integer(const char* f, int64_t def) const {
    const json* v = get(f);
    if (!v) return def;
    if (v->is_number_integer()) return v->get<int64_t>();
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    }
    fail(f, fmt::format("expected an integer (at most 2^53 in magnitude when written as a float), got {}", v->dump()));
  }
  int positive(const char* f, int64_t def) const {
    const int64_t v = integer(f, def);
    // Fields are stored as int: the upper bound is 2^31 - 1, and the message says so.
    if (v <= 0 || v > std::numeric_limits<int>::max())
      fail(f, fmt::format("expected a positive integer <= {} (2^31 - 1), got {}", std::numeric_limits<int>::max(), v));
    return static_cast<int>(v);
  }
  int required_positive(const char* f) const {
    if (!has(f)) fail(f, "missing (expected a positive integer)");
    return positive(f, 0);
  }
  double number(const char* f, double def) const {
    const json* v = get(f);
    if (!v) return def;
    if (!v->is_number()) fail(f, fmt::format("expected a number, got {}", v->dump()));
    const double d = v->get<double>();
    if (!std::isfinite(d)) fail(f, "expected a finite number");
    return d;
  }
  std::optional<double> opt_number(const char* f) const {
    if (!has(f)) return std::nullopt;
    return number(f, 0.0);
  }
  bool boolean(const char* f, bool def) const {
    const json* v = get(f);
    if (!v) return def;
    if (!v->is_boolean()) fail(f, fmt::format("expected true or false, got {}", v->dump()));
    return v->get<bool>();
  }
  std::string string(const char* f, const std::string& def) const {
    const json* v = get(f);
    if (!v) return def;
    if (!v->is_string()) fail(f, fmt::format("expected a string, got {}", v->dump()));
    return v->get<std::string>();
  }
};

// One rope dict (legacy rope_scaling or one rope_parameters entry).
// `max_position_embeddings`: the model's, to check that a length-scaling
// factor leaves a context of at least one token.
RopeParams parse_rope_dict(const json& d, double default_theta, const Reader& parent, const std::string& field,
                           int max_position_embeddings) {
  Reader r{d, parent.source, parent.prefix + field + "."};
  if (!d.is_object()) parent.fail(field, fmt::format("expected an object, got {}", d.dump()));
  RopeParams p;
  // "type" is the legacy spelling of "rope_type".
  p.type = r.string("rope_type", r.string("type", "default"));
  if (p.type == "default" || p.type == "linear" || p.type == "dynamic" || p.type == "llama3" || p.type == "yarn") {
  } else {
    r.fail("rope_type", fmt::format("unsupported rope type '{}' (supported: default, linear, dynamic, llama3, yarn)",
                                    p.type));
  }
  p.theta = r.number("rope_theta", default_theta);
  if (p.theta <= 0) r.fail("rope_theta", "expected a positive number");
  p.factor = r.number("factor", 1.0);
  if (p.type != "default") {
    if (!r.has("factor")) r.fail("factor", fmt::format("required for rope type '{}'", p.type));
    if (p.factor <= 0) r.fail("factor", fmt::format("expected a positive number, got {}", p.factor));
  }
  p.partial_rotary_factor = r.number("partial_rotary_factor", 1.0);
  if (p.partial_rotary_factor <= 0 || p.partial_rotary_factor > 1)
    r.fail("partial_rotary_factor", "expected a number in (0, 1]");
  if (p.type == "llama3") {
    for (const char* f : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!r.has(f)) r.fail(f, "required for rope type 'llama3'");
    p.low_freq_factor = r.number("low_freq_factor", 1.0);
    p.high_freq_factor = r.number("high_freq_factor", 4.0);
    if (p.high_freq_factor <= p.low_freq_factor)
      r.fail("high_freq_factor", "must be greater than low_freq_factor");
  }
  if (r.has("original_max_position_embeddings"))
    p.original_max_position_embeddings = r.positive("original_max_position_embeddings", 1);
  if (p.type == "yarn") {
    p.beta_fast = r.number("beta_fast", 32.0);
    p.beta_slow = r.number("beta_slow", 1.0);
    p.attention_factor = r.opt_number("attention_factor");
    p.mscale = r.opt_number("mscale");
    p.mscale_all_dim = r.opt_number("mscale_all_dim");
    p.truncate = r.boolean("truncate", true);
  }
  // linear, dynamic and yarn scale the usable context by `factor` (vLLM's
  // derived max length); a factor that shrinks it below one token is a broken
  // config, not "no max_position_embeddings" later on.
  if (p.type == "linear" || p.type == "dynamic" || p.type == "yarn") {
    const int base = p.type == "yarn" && p.original_max_position_embeddings > 0 ? p.original_max_position_embeddings
                                                                               : max_position_embeddings;
    if (base > 0 && static_cast<double>(base) * p.factor < 1.0)
      r.fail("factor", fmt::format("{} scales the context of {} positions to less than one token (expected a "
                                   "number >= 1; transformers warns below 1)",
                                   p.factor, base));
  }
  return p;
}

std::vector<int> parse_token_ids(const Reader& r, const char* f) {
  std::vector<int> out;
  const json* v = r.get(f);
  if (!v) return out;
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > std::numeric_limits<int>::max())
      r.fail(f, fmt::format("expected a token id (an integer in [0, {}]) or a list of token ids, got {}",
                            std::numeric_limits<int>::max(), v->dump()));
    out.push_back(static_cast<int>(x.get<int64_t>()));
  };
  if (v->is_array()) {
    for (const auto& x : *v) one(x);
  } else {
    one(*v);
  }
  return out;
}

struct FamilyDefaults {
  int vocab_size, hidden_size, intermediate_size, num_layers, num_heads;
  std::optional<int> num_kv_heads;  // nullopt: = num_heads
  std::optional<int> head_dim;      // nullopt: hidden / heads
  int max_position_embeddings;
  double rope_theta;
  bool tie;
  std::optional<int> bos, eos;
};

FamilyDefaults defaults_for(ModelFamily f) {
  switch (f) {
    case ModelFamily::llama: return {32000, 4096, 11008, 32, 32, std::nullopt, std::nullopt, 2048, 10000.0, false, 1, 2};
    case ModelFamily::mistral: return {32000, 4096, 14336, 32, 32, 8, std::nullopt, 4096 * 32, 10000.0, false, 1, 2};
    case ModelFamily::qwen2: return {151936, 4096, 22016, 32, 32, 32, std::nullopt, 32768, 10000.0, false, std::nullopt, std::nullopt};
    case ModelFamily::qwen3: return {151936, 4096, 22016, 32, 32, 32, 128, 32768, 10000.0, false, std::nullopt, std::nullopt};
    case ModelFamily::gemma3: return {262208, 2304, 9216, 26, 8, 4, 256, 131072, 1000000.0, true, 2, 1};
    case ModelFamily::qwen3_5: return {248320, 4096, 12288, 32, 16, 4, 256, 32768, 10000.0, false, std::nullopt, std::nullopt};
  }
  return {};
}

std::vector<LayerType> parse_layer_types(const Reader& r, int num_layers) {
  const json* v = r.get("layer_types");
  if (!v->is_array()) r.fail("layer_types", "expected a list of 'full_attention' / 'sliding_attention'");
  if (static_cast<int64_t>(v->size()) != num_layers)
    r.fail("layer_types", fmt::format("has {} entries, expected num_hidden_layers = {}", v->size(), num_layers));
  std::vector<LayerType> out;
  for (const auto& x : *v) {
    if (x == "full_attention") out.push_back(LayerType::full_attention);
    else if (x == "sliding_attention") out.push_back(LayerType::sliding_attention);
    else r.fail("layer_types", fmt::format("unknown layer type {} (expected full_attention or sliding_attention)", x.dump()));
  }
  return out;
}

// Parses the text model fields of `j` (the top level, or gemma3's text_config).
void parse_text_config(const Reader& r, ModelConfig& c) {
  const FamilyDefaults d = defaults_for(c.family);
  c.vocab_size = r.positive("vocab_size", d.vocab_size);
  c.hidden_size = r.positive("hidden_size", d.hidden_size);
  c.intermediate_size = r.positive("intermediate_size", d.intermediate_size);
  c.num_layers = r.positive("num_hidden_layers", d.num_layers);
  // Per-layer tables (layer types, KV scales, pages per layer) are sized by
  // this count before any weight is read: refuse an absurd count here, not
  // by running out of memory (docs/robustness.md "Sizes").
  constexpr int kMaxNumLayers = 1 << 16;
  if (c.num_layers > kMaxNumLayers)
    r.fail("num_hidden_layers", fmt::format("{} is above fp8kv's limit of {} (2^16) layers (the deepest released "
                                            "models have about 200; per-layer tables are sized by this count)",
                                            c.num_layers, kMaxNumLayers));
  c.num_heads = r.positive("num_attention_heads", d.num_heads);
  c.num_kv_heads = r.positive("num_key_value_heads", d.num_kv_heads.value_or(c.num_heads));
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_key_value_heads", fmt::format("{} does not divide num_attention_heads = {}", c.num_kv_heads, c.num_heads));
  if (!r.has("head_dim") && !d.head_dim && c.hidden_size % c.num_heads != 0)
    r.fail("head_dim", fmt::format("missing, and hidden_size {} is not divisible by num_attention_heads {}",
                                   c.hidden_size, c.num_heads));
  c.head_dim = r.positive("head_dim", d.head_dim.value_or(c.hidden_size / c.num_heads));
  if (c.head_dim % 2 != 0) {
    if (r.has("head_dim") || d.head_dim) r.fail("head_dim", fmt::format("must be even for RoPE, got {}", c.head_dim));
    // Derived: name what it came from (a null or missing num_attention_heads
    // takes the family default, which the user may not expect).
    r.fail("head_dim", fmt::format("missing, and hidden_size {} / num_attention_heads {} = {} is odd (RoPE needs an "
                                   "even head_dim; a missing or null num_attention_heads is the family default)",
                                   c.hidden_size, c.num_heads, c.head_dim));
  }
  c.max_position_embeddings = r.positive("max_position_embeddings", d.max_position_embeddings);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  if (c.rms_norm_eps <= 0) r.fail("rms_norm_eps", "expected a positive number");

  const bool gemma = c.family == ModelFamily::gemma3;
  c.hidden_act = gemma ? r.string("hidden_activation", r.string("hidden_act", "gelu_pytorch_tanh"))
                       : r.string("hidden_act", "silu");
  if (c.hidden_act != "silu" && c.hidden_act != "gelu_pytorch_tanh" && c.hidden_act != "gelu")
    r.fail(gemma ? "hidden_activation" : "hidden_act",
           fmt::format("unsupported activation '{}' (supported: silu, gelu_pytorch_tanh, gelu)", c.hidden_act));

  switch (c.family) {
    case ModelFamily::llama:
      c.attention_bias = c.o_proj_bias = r.boolean("attention_bias", false);
      c.mlp_bias = r.boolean("mlp_bias", false);
      break;
    case ModelFamily::mistral:
      break;  // MistralAttention has no biases
    case ModelFamily::qwen2:
      c.attention_bias = true;  // Qwen2Attention: q/k/v always biased, o_proj never
      break;
    case ModelFamily::qwen3:
    case ModelFamily::gemma3:
    case ModelFamily::qwen3_5:
      c.attention_bias = c.o_proj_bias = r.boolean("attention_bias", false);
      break;
  }
  c.qk_norm = c.family == ModelFamily::qwen3 || c.family == ModelFamily::qwen3_5 || gemma;

  // ---- layer types and sliding window
  const int L = c.num_layers;
  c.layer_types.assign(L, LayerType::full_attention);
  c.sliding_window.reset();
  auto window_or = [&](int def) -> std::optional<int> {
    const json* v = r.get("sliding_window");
    if (r.j.contains("sliding_window") && r.j["sliding_window"].is_null()) return std::nullopt;
    if (!v) return def;
    return r.positive("sliding_window", def);
  };
  switch (c.family) {
    case ModelFamily::llama:
      break;  // no sliding window
    case ModelFamily::qwen3_5:
      break;  // layer types: parse_qwen3_5_text_fields (linear / full, no sliding window)
    case ModelFamily::mistral:
      // MistralConfig: sliding_window defaults to 4096; when set it applies to every layer.
      c.sliding_window = window_or(4096);
      if (c.sliding_window) c.layer_types.assign(L, LayerType::sliding_attention);
      break;
    case ModelFamily::qwen2:
    case ModelFamily::qwen3: {
      // transformers: sliding_window = sliding_window if use_sliding_window else None;
      // layer_types (when absent) slide from max_window_layers on; a layer typed
      // sliding_attention only slides when sliding_window is set.
      const bool use = r.boolean("use_sliding_window", false);
      const std::optional<int> w = window_or(4096);
      if (use && w) c.sliding_window = w;
      std::vector<LayerType> types;
      if (r.has("layer_types")) {
        types = parse_layer_types(r, L);
      } else {
        const int64_t mwl = r.integer("max_window_layers", 28);
        for (int i = 0; i < L; ++i)
          types.push_back(c.sliding_window && i >= mwl ? LayerType::sliding_attention : LayerType::full_attention);
      }
      if (c.sliding_window) c.layer_types = types;
      break;
    }
    case ModelFamily::gemma3: {
      c.sliding_window = window_or(4096);
      if (r.has("layer_types")) {
        c.layer_types = parse_layer_types(r, L);
      } else {
        const int pattern = r.positive("sliding_window_pattern", 6);
        for (int i = 0; i < L; ++i)
          c.layer_types[i] = (i + 1) % pattern != 0 ? LayerType::sliding_attention : LayerType::full_attention;
      }
      // transformers: sliding layers take config.sliding_window; null means
      // no window, i.e. they attend like full layers.
      if (!c.sliding_window) c.layer_types.assign(L, LayerType::full_attention);
      if (r.boolean("use_bidirectional_attention", false))
        r.fail("use_bidirectional_attention", "bidirectional (embedding) Gemma3 models are not supported");
      break;
    }
  }
  if (c.num_sliding_layers() == 0) c.sliding_window.reset();

  // ---- rope
  const double theta = r.number("rope_theta", d.rope_theta);
  const double local_theta = r.number("rope_local_base_freq", 10000.0);
  // Checked here, not only in parse_rope_dict: without rope_scaling /
  // rope_parameters the value is used as it is (fuzz_config found a
  // negative rope_theta accepted that way; docs/fuzzing.md).
  if (!(theta > 0) || !std::isfinite(theta)) r.fail("rope_theta", "expected a positive number");
  if (!(local_theta > 0) || !std::isfinite(local_theta)) r.fail("rope_local_base_freq", "expected a positive number");
  const json* rp = r.get("rope_parameters");
  const json* rs = r.get("rope_scaling");
  if (rp) {
    if (!rp->is_object()) r.fail("rope_parameters", "expected an object");
    const bool per_type = rp->contains("full_attention") || rp->contains("sliding_attention");
    if (per_type) {
      c.rope_full = rp->contains("full_attention") ? parse_rope_dict((*rp)["full_attention"], theta, r,
                                                                     "rope_parameters.full_attention", c.max_position_embeddings)
                                                   : RopeParams{.theta = theta};
      c.rope_sliding = rp->contains("sliding_attention")
                           ? parse_rope_dict((*rp)["sliding_attention"], gemma ? local_theta : theta, r,
                                             "rope_parameters.sliding_attention", c.max_position_embeddings)
                           : (gemma ? RopeParams{.theta = local_theta} : c.rope_full);
    } else {
      c.rope_full = parse_rope_dict(*rp, theta, r, "rope_parameters", c.max_position_embeddings);
      c.rope_sliding = gemma ? RopeParams{.theta = local_theta} : c.rope_full;
    }
  } else {
    c.rope_full = rs ? parse_rope_dict(*rs, theta, r, "rope_scaling", c.max_position_embeddings) : RopeParams{.theta = theta};
    // Gemma3: local (sliding) layers use rope_local_base_freq and no scaling.
    c.rope_sliding = gemma ? RopeParams{.theta = local_theta} : c.rope_full;
  }
  if (c.rope_full.type == "llama3" && c.rope_full.original_max_position_embeddings == 0)
    r.fail("rope_scaling", "llama3 rope needs original_max_position_embeddings");

  // ---- gemma3 specifics
  if (gemma) {
    c.query_pre_attn_scalar = r.number("query_pre_attn_scalar", 256.0);
    if (c.query_pre_attn_scalar <= 0) r.fail("query_pre_attn_scalar", "expected a positive number");
    c.attn_logit_softcapping = r.opt_number("attn_logit_softcapping");
    c.final_logit_softcapping = r.opt_number("final_logit_softcapping");
    if (c.attn_logit_softcapping && *c.attn_logit_softcapping <= 0)
      r.fail("attn_logit_softcapping", "expected a positive number or null");
    if (c.final_logit_softcapping && *c.final_logit_softcapping <= 0)
      r.fail("final_logit_softcapping", "expected a positive number or null");
    c.gemma_norm_plus_one = true;
    c.embed_scale_sqrt_hidden = true;
    c.sandwich_norms = true;
  }
  if (c.family == ModelFamily::qwen3_5) parse_qwen3_5_text_fields(r.j, r.source, r.prefix, c);
}

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object", source));
  Reader top{j, source, ""};
  ModelConfig c;
  if (const json* a = top.get("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      top.fail("architectures", "expected a non-empty list of strings");
    c.architecture = (*a)[0].get<std::string>();
  }
  if (!top.has("model_type")) top.fail("model_type", std::string("missing; ") + kSupported);
  c.model_type = top.string("model_type", "");
  if (is_qwen3_5_moe_model_type(c.model_type))
    top.fail("model_type", fmt::format("'{}' (the Qwen3.5 mixture-of-experts variant) is not supported yet; the "
                                       "dense Qwen3.5 (qwen3_5, qwen3_5_text) is",
                                       c.model_type));

  struct Arch {
    const char* model_type;
    ModelFamily family;
    const char* architecture;
  };
  static const Arch kArchs[] = {
      {"llama", ModelFamily::llama, "LlamaForCausalLM"},
      {"mistral", ModelFamily::mistral, "MistralForCausalLM"},
      {"qwen2", ModelFamily::qwen2, "Qwen2ForCausalLM"},
      {"qwen3", ModelFamily::qwen3, "Qwen3ForCausalLM"},
      {"gemma3_text", ModelFamily::gemma3, "Gemma3ForCausalLM"},
      {"gemma3", ModelFamily::gemma3, "Gemma3ForConditionalGeneration"},
      {"qwen3_5_text", ModelFamily::qwen3_5, "Qwen3_5ForCausalLM"},
      {"qwen3_5", ModelFamily::qwen3_5, "Qwen3_5ForConditionalGeneration"},
  };
  const Arch* arch = nullptr;
  for (const auto& a : kArchs)
    if (c.model_type == a.model_type) arch = &a;
  if (!arch) top.fail("model_type", fmt::format("unsupported model type '{}'; {}", c.model_type, kSupported));
  // Gemma3ForCausalLM may also carry a multimodal config (model_type gemma3);
  // qwen3_5 (Qwen3_5ForConditionalGeneration) keeps its text model in
  // text_config (the vision tower is not loaded).
  const bool multimodal = c.model_type == "gemma3" || c.model_type == "qwen3_5";
  if (c.architecture.empty()) c.architecture = arch->architecture;
  const bool arch_ok = c.architecture == arch->architecture ||
                       (c.model_type == "gemma3" && c.architecture == "Gemma3ForCausalLM");
  if (!arch_ok)
    top.fail("architectures", fmt::format("unsupported architecture '{}' for model_type '{}'; {}", c.architecture,
                                          c.model_type, kSupported));
  c.family = arch->family;

  if (multimodal) {
    const json* tc = top.get("text_config");
    const json empty = json::object();
    if (tc && !tc->is_object()) top.fail("text_config", "expected an object");
    Reader text{tc ? *tc : empty, source, "text_config."};
    parse_text_config(text, c);
    const FamilyDefaults d = defaults_for(c.family);
    c.tie_word_embeddings = top.boolean("tie_word_embeddings", text.boolean("tie_word_embeddings", d.tie));
    c.eos_token_ids = top.has("eos_token_id") ? parse_token_ids(top, "eos_token_id") : parse_token_ids(text, "eos_token_id");
    if (c.eos_token_ids.empty() && d.eos) c.eos_token_ids = {*d.eos};
    const Reader& br = top.has("bos_token_id") ? top : text;
    const auto bos = parse_token_ids(br, "bos_token_id");
    c.bos_token_id = bos.empty() ? d.bos : std::optional<int>(bos[0]);
    c.torch_dtype = top.string("torch_dtype", top.string("dtype", text.string("torch_dtype", text.string("dtype", ""))));
  } else {
    parse_text_config(top, c);
    const FamilyDefaults d = defaults_for(c.family);
    c.tie_word_embeddings = top.boolean("tie_word_embeddings", d.tie);
    c.eos_token_ids = parse_token_ids(top, "eos_token_id");
    if (!top.has("eos_token_id") && d.eos) c.eos_token_ids = {*d.eos};
    const auto bos = parse_token_ids(top, "bos_token_id");
    if (bos.size() > 1) top.fail("bos_token_id", "expected a single token id");
    c.bos_token_id = bos.empty() ? (top.has("bos_token_id") ? std::nullopt : d.bos) : std::optional<int>(bos[0]);
    c.torch_dtype = top.string("torch_dtype", top.string("dtype", ""));
  }
  c.weight_quant = parse_weight_quant_config(j, source);
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& dir_or_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool is_dir = fs::is_directory(dir_or_file, ec);
  const fs::path file = is_dir ? dir_or_file / "config.json" : dir_or_file;
  // Missing or a broken link: say which (a FIFO or a device is refused by read_file).
  if (const std::string kind = path_kind(file); kind == "missing" || kind.find("symlink") != std::string::npos)
    throw InputError(fmt::format("{}: {} (expected a model directory or a HF config.json)", file.string(),
                                 kind == "missing" ? "not found" : "is " + kind));
  const json j = read_json_file(file);
  ModelConfig c = parse_model_config(j, file.string());
  c.weight_quant = load_weight_quant_config(file.parent_path(), j, file.string());  // + hf_quant_config.json
  const fs::path gen = file.parent_path() / "generation_config.json";
  if (optional_file(gen)) {  // present but a FIFO or a directory: refused, not skipped
    const json g = read_json_object(gen);
    Reader gr{g, gen.string(), ""};
    if (gr.has("eos_token_id")) c.eos_token_ids = parse_token_ids(gr, "eos_token_id");
  }
  return c;
}

}  // namespace fp8kv
