#include "model/quant_config.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "io/errors.h"
#include "io/fs_util.h"

namespace fp8kv {

namespace {

using json = nlohmann::json;

// compressed-tensors' "re:PATTERN" ignore entries: Python's re.match, i.e. a
// match anchored at the module name's start (not necessarily its end). PCRE2
// (the tokenizer's regex engine) runs them; a pattern that does not compile is
// refused naming it. Returns whether `module` matches.
bool ignore_regex_matches(const std::string& pattern, const std::string& module) {
  int err = 0;
  PCRE2_SIZE off = 0;
  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_ANCHORED, &err, &off,
                    nullptr),
      &pcre2_code_free);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw InputError(fmt::format("quantization_config.ignore: 're:{}' is not a valid regular expression ({} at offset {})",
                                 pattern, reinterpret_cast<const char*>(msg), off));
  }
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code.get(), nullptr), &pcre2_match_data_free);
  const int rc = pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(module.data()), module.size(), 0, 0, md.get(),
                             nullptr);
  if (rc >= 0) return true;
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  throw InputError(fmt::format("quantization_config.ignore: 're:{}' failed on '{}' (PCRE2 error {})", pattern, module, rc));
}

constexpr const char* kSupportedFormats =
    "supported weight quantizations: quant_method fp8 (e4m3, weight_block_size [128, 128] or per-tensor), "
    "compressed-tensors float-quantized (8-bit float weights, strategy tensor, channel or block [128, 128]), "
    "modelopt quant_algo FP8 or FP8_PER_CHANNEL_PER_TOKEN";

struct Field {
  const json& j;
  std::string source;
  std::string path;  // "quantization_config." ...

  [[noreturn]] void fail(const std::string& f, const std::string& what) const {
    throw InputError(fmt::format("{}: field '{}{}': {}", source, path, f, what));
  }
  const json* get(const char* f) const { return j.contains(f) && !j[f].is_null() ? &j[f] : nullptr; }
  std::string str(const char* f, const std::string& def) const {
    const json* v = get(f);
    if (!v) return def;
    if (!v->is_string()) fail(f, fmt::format("expected a string, got {}", v->dump()));
    return v->get<std::string>();
  }
  std::vector<std::string> strings(const char* f) const {
    const json* v = get(f);
    std::vector<std::string> out;
    if (!v) return out;
    if (!v->is_array()) fail(f, fmt::format("expected a list of module names, got {}", v->dump()));
    for (const auto& e : *v) {
      if (!e.is_string()) fail(f, fmt::format("expected a list of module names, got {}", v->dump()));
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  Field sub(const char* f) const {
    const json* v = get(f);
    if (!v || !v->is_object()) fail(f, "expected an object");
    return Field{*v, source, path + f + "."};
  }
};

bool is_block_128(const json& v) {
  return v.is_array() && v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer() && v[0] == 128 &&
         v[1] == 128;
}

// quant_method "fp8" (transformers' FineGrainedFP8 / vLLM's Fp8Config).
WeightQuantConfig parse_fp8(const Field& q) {
  WeightQuantConfig c;
  c.method = WeightQuantMethod::fp8;
  const std::string fmt_ = q.str("fmt", "e4m3");
  if (fmt_ != "e4m3") q.fail("fmt", fmt::format("'{}' is not supported; supported: e4m3", fmt_));
  c.activation_scheme = q.str("activation_scheme", "dynamic");
  if (c.activation_scheme != "dynamic" && c.activation_scheme != "static")
    q.fail("activation_scheme", fmt::format("'{}' is not supported; supported: dynamic, static", c.activation_scheme));
  if (const json* b = q.get("weight_block_size")) {
    if (!is_block_128(*b))
      q.fail("weight_block_size", fmt::format("{} is not supported; supported: [128, 128] (or absent: one scale per "
                                              "tensor)", b->dump()));
    c.granularity = ScaleGranularity::block128;
    c.scale_suffix = "weight_scale_inv";
  } else {
    c.granularity = ScaleGranularity::tensor;
    c.scale_suffix = "weight_scale";
  }
  c.excluded = q.strings("modules_to_not_convert");
  return c;
}

// quant_method "compressed-tensors" (llm-compressor's FP8 / FP8_DYNAMIC / FP8_BLOCK schemes).
WeightQuantConfig parse_compressed_tensors(const Field& q) {
  WeightQuantConfig c;
  const json* groups = q.get("config_groups");
  if (!groups || (groups->is_object() && groups->empty())) return c;  // a KV cache scheme alone
  if (!groups->is_object()) q.fail("config_groups", "expected an object");
  const std::string format = q.str("format", "float-quantized");
  if (format != "float-quantized" && format != "naive-quantized")
    q.fail("format", fmt::format("'{}' is not supported; {}", format, kSupportedFormats));
  if (groups->size() != 1)
    q.fail("config_groups", fmt::format("{} groups; supported: one group (the same scheme for every Linear)",
                                        groups->size()));
  const std::string gname = groups->begin().key();
  const Field g{groups->begin().value(), q.source, q.path + "config_groups." + gname + "."};
  if (!g.j.is_object()) q.fail("config_groups." + gname, "expected an object");
  const auto targets = g.strings("targets");
  if (targets != std::vector<std::string>{"Linear"})
    g.fail("targets", fmt::format("{} is not supported; supported: [\"Linear\"]", json(targets).dump()));
  if (g.str("format", format) != "float-quantized" && g.str("format", format) != "naive-quantized")
    g.fail("format", fmt::format("'{}' is not supported; {}", g.str("format", ""), kSupportedFormats));
  if (g.get("output_activations")) g.fail("output_activations", "output quantization is not supported (expected null)");
  const Field w = g.sub("weights");
  const json* bits = w.get("num_bits");
  const std::string type = w.str("type", "");
  if (!bits || !bits->is_number_integer() || *bits != 8 || type != "float")
    w.fail(bits && bits->is_number_integer() && *bits != 8 ? "num_bits" : "type",
           fmt::format("num_bits {} type '{}' is not supported (int4, int8, NVFP4 and other schemes are refused); {}",
                       bits ? bits->dump() : "null", type, kSupportedFormats));
  if (const json* s = w.get("symmetric"); s && *s != true) w.fail("symmetric", "asymmetric weights are not supported");
  if (const json* d = w.get("dynamic"); d && *d != false) w.fail("dynamic", "dynamic weight scales are not supported");
  const std::string strategy = w.str("strategy", "");
  if (strategy == "tensor") {
    c.granularity = ScaleGranularity::tensor;
  } else if (strategy == "channel") {
    c.granularity = ScaleGranularity::channel;
  } else if (strategy == "block") {
    const json* bs = w.get("block_structure");
    if (!bs || !is_block_128(*bs))
      w.fail("block_structure", fmt::format("{} is not supported; supported: [128, 128]", bs ? bs->dump() : "null"));
    c.granularity = ScaleGranularity::block128;
  } else {
    w.fail("strategy", fmt::format("'{}' is not supported; supported: tensor, channel, block", strategy));
  }
  c.scale_suffix = "weight_scale";
  if (const json* a = g.get("input_activations")) {
    if (!a->is_object()) g.fail("input_activations", "expected an object or null");
    const Field in = g.sub("input_activations");
    const json* ab = in.get("num_bits");
    if (!ab || *ab != 8 || in.str("type", "") != "float")
      in.fail("num_bits", fmt::format("activations num_bits {} type '{}' are not supported; supported: 8-bit float",
                                      ab ? ab->dump() : "null", in.str("type", "")));
    const json* d = in.get("dynamic");
    c.activation_scheme = d && *d == true ? "dynamic" : "static";
  } else {
    c.activation_scheme = "none";
  }
  c.method = WeightQuantMethod::compressed_tensors;
  c.excluded = q.strings("ignore");
  for (const auto& e : c.excluded)
    if (e.rfind("re:", 0) == 0) ignore_regex_matches(e.substr(3), "");  // refused at parse time when it does not compile
  return c;
}

// ModelOpt: {quant_algo, exclude_modules} (hf_quant_config.json's
// "quantization" object, or config.json's quantization_config).
WeightQuantConfig parse_modelopt(const Field& q) {
  WeightQuantConfig c;
  const std::string algo = q.str("quant_algo", "");
  if (algo.empty()) return c;  // a KV cache algorithm alone
  if (algo == "FP8") {
    c.granularity = ScaleGranularity::tensor;
  } else if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    c.granularity = ScaleGranularity::channel;
  } else {
    q.fail("quant_algo", fmt::format("'{}' is not supported; {}", algo, kSupportedFormats));
  }
  c.method = WeightQuantMethod::modelopt;
  c.scale_suffix = "weight_scale";
  c.activation_scheme = algo == "FP8" ? "static" : "dynamic";
  c.excluded = q.strings("exclude_modules");
  return c;
}

WeightQuantConfig parse_quantization_config(const Field& q) {
  if (!q.j.is_object()) throw InputError(fmt::format("{}: field '{}': expected an object", q.source, q.path));
  const std::string method = q.str("quant_method", "");
  if (method == "fp8") return parse_fp8(q);
  if (method == "compressed-tensors") return parse_compressed_tensors(q);
  if (method == "modelopt" || (method.empty() && q.get("quant_algo"))) return parse_modelopt(q);
  if (method.empty()) {
    // Only a KV cache scheme (what `fp8kv inject` reads, or a bare kv_cache_scheme).
    if (q.get("config_groups")) return parse_compressed_tensors(q);
    return {};
  }
  q.fail("quant_method", fmt::format("'{}' is not supported; {}", method, kSupportedFormats));
}

bool fnmatch_glob(const char* p, const char* s) {
  for (; *p; ++p, ++s) {
    if (*p == '*') {
      for (const char* t = s;; ++t) {
        if (fnmatch_glob(p + 1, t)) return true;
        if (!*t) return false;
      }
    }
    if (!*s || (*p != '?' && *p != *s)) return false;
  }
  return !*s;
}

}  // namespace

std::string_view weight_quant_method_name(WeightQuantMethod m) {
  switch (m) {
    case WeightQuantMethod::none: return "none";
    case WeightQuantMethod::fp8: return "fp8";
    case WeightQuantMethod::compressed_tensors: return "compressed-tensors";
    case WeightQuantMethod::modelopt: return "modelopt";
  }
  return "?";
}

bool WeightQuantConfig::is_excluded(const std::string& module) const {
  if (!quantized()) return true;
  for (const auto& e : excluded) {
    switch (method) {
      case WeightQuantMethod::none: return true;
      case WeightQuantMethod::fp8:
        if (module.find(e) != std::string::npos) return true;
        break;
      case WeightQuantMethod::compressed_tensors:
        if (e.rfind("re:", 0) == 0) {
          if (ignore_regex_matches(e.substr(3), module)) return true;
        } else if (module == e) {
          return true;
        }
        break;
      case WeightQuantMethod::modelopt:
        if (fnmatch_glob(e.c_str(), module.c_str())) return true;
        break;
    }
  }
  return false;
}

std::string WeightQuantConfig::excluded_field() const {
  switch (method) {
    case WeightQuantMethod::fp8: return "modules_to_not_convert";
    case WeightQuantMethod::compressed_tensors: return "ignore";
    case WeightQuantMethod::modelopt: return "exclude_modules";
    case WeightQuantMethod::none: break;
  }
  return "";
}

std::string WeightQuantConfig::describe() const {
  if (!quantized()) return "unquantized weights";
  return fmt::format("fp8 e4m3 weights, {} scales ({}), activations {} in the checkpoint, quant_method {} ({} {})",
                     scale_granularity_name(granularity), scale_suffix, activation_scheme,
                     weight_quant_method_name(method), source, field);
}

WeightQuantConfig parse_weight_quant_config(const json& config, const std::string& config_source,
                                            const json* hf_quant, const std::string& hf_quant_source) {
  WeightQuantConfig c;
  if (config.is_object() && config.contains("quantization_config") && !config["quantization_config"].is_null()) {
    c = parse_quantization_config(Field{config["quantization_config"], config_source, "quantization_config."});
    c.source = config_source;
    c.field = "quantization_config";
  }
  if (!c.quantized() && hf_quant && hf_quant->is_object()) {
    const bool nested = hf_quant->contains("quantization") && (*hf_quant)["quantization"].is_object();
    const Field q{nested ? (*hf_quant)["quantization"] : *hf_quant, hf_quant_source, nested ? "quantization." : ""};
    c = parse_modelopt(q);
    c.source = hf_quant_source;
    c.field = nested ? "quantization" : "(top level)";
  }
  return c;
}

WeightQuantConfig load_weight_quant_config(const std::filesystem::path& dir, const json& config,
                                           const std::string& config_source) {
  const auto hfq = dir / "hf_quant_config.json";
  if (!optional_file(hfq)) return parse_weight_quant_config(config, config_source);
  const json h = read_json_object(hfq);
  return parse_weight_quant_config(config, config_source, &h, hfq.string());
}

}  // namespace fp8kv
