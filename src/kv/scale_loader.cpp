#include "kv/scale_loader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/errors.h"
#include "io/fs_util.h"
#include "numerics/scale_check.h"

namespace fp8kv {

namespace {

struct Convention {
  std::string_view suffix;
  ScaleStream stream;
};
// Every KV scale suffix docs/design.md "Checkpoints" lists (after "layers.N.").
constexpr Convention kConventions[] = {
    {"self_attn.k_scale", ScaleStream::k},
    {"self_attn.v_scale", ScaleStream::v},
    {"self_attn.q_scale", ScaleStream::q},
    {"self_attn.attn.k_scale", ScaleStream::k},
    {"self_attn.attn.v_scale", ScaleStream::v},
    {"self_attn.attn.q_scale", ScaleStream::q},
    {"self_attn.k_proj.output_scale", ScaleStream::k},
    {"self_attn.v_proj.output_scale", ScaleStream::v},
    {"self_attn.q_proj.output_scale", ScaleStream::q},
    {"self_attn.k_proj.k_scale", ScaleStream::k},
    {"self_attn.v_proj.v_scale", ScaleStream::v},
    {"self_attn.prob_output_scale", ScaleStream::prob},
    {"self_attn.attn.prob_scale", ScaleStream::prob},
    {"self_attn.prob_scale", ScaleStream::prob},
    {"self_attn.kv_scale", ScaleStream::kv},
    {"self_attn.attn.kv_scale", ScaleStream::kv},
};

std::string fmt_float(float f) { return fmt::format("{:.9g}", f); }

std::string layer_list(const std::vector<int>& layers) {
  // Compact ranges: 0-3,7,9-11.
  std::string s;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += j == i ? std::to_string(layers[i]) : fmt::format("{}-{}", layers[i], layers[j]);
    i = j + 1;
  }
  return s;
}

// Decides, for the stream, how many values the tensor holds and whether the
// shape is acceptable: [] or [1] (per tensor) or [heads] (per head).
void check_shape(const std::string& tensor, const std::vector<int64_t>& shape, int heads,
                 std::string_view heads_what) {
  if (shape.empty()) return;
  if (shape.size() == 1 && (shape[0] == 1 || shape[0] == heads)) return;
  std::string got = "[";
  for (size_t i = 0; i < shape.size(); ++i) got += (i ? ", " : "") + std::to_string(shape[i]);
  got += "]";
  throw InputError(fmt::format("{} has shape {} (expected a scalar [] or [1], or one value per {} [{}])", tensor,
                               got, heads_what, heads));
}

}  // namespace

std::optional<KvScaleName> parse_kv_scale_name(std::string_view name) {
  // <prefix>layers.<N>.<suffix>; the prefix is "" or ends in '.'.
  size_t pos = 0;
  for (;;) {
    const size_t at = name.find("layers.", pos);
    if (at == std::string_view::npos) return std::nullopt;
    pos = at + 1;
    if (at != 0 && name[at - 1] != '.') continue;
    const size_t num_begin = at + 7;
    size_t num_end = num_begin;
    while (num_end < name.size() && name[num_end] >= '0' && name[num_end] <= '9') ++num_end;
    if (num_end == num_begin || num_end >= name.size() || name[num_end] != '.') continue;
    if (num_end - num_begin > 6) continue;  // not a plausible layer index
    const std::string_view suffix = name.substr(num_end + 1);
    for (const auto& c : kConventions) {
      if (suffix != c.suffix) continue;
      KvScaleName r;
      r.prefix = std::string(name.substr(0, at));
      // Vision towers have layers.N.self_attn too; their scales are not ours.
      if (r.prefix.find("vision") != std::string::npos) return std::nullopt;
      std::from_chars(name.data() + num_begin, name.data() + num_end, r.layer);
      r.stream = c.stream;
      r.convention = c.suffix;
      return r;
    }
    return std::nullopt;
  }
}

KvScaleNaming parse_kv_scale_naming(std::string_view s) {
  if (s == "hf") return KvScaleNaming::hf;
  if (s == "vllm-runtime") return KvScaleNaming::vllm_runtime;
  throw std::invalid_argument(fmt::format("--naming: unknown value '{}' (expected hf or vllm-runtime)", s));
}

std::string kv_scale_tensor_name(std::string_view prefix, int layer, ScaleStream stream, KvScaleNaming naming) {
  const char* s = stream == ScaleStream::k ? "k" : stream == ScaleStream::v ? "v" : "q";
  if (stream != ScaleStream::k && stream != ScaleStream::v && stream != ScaleStream::q)
    throw std::invalid_argument("kv_scale_tensor_name: only k, v and q scales are written");
  return fmt::format("{}layers.{}.self_attn.{}{}_scale", prefix, layer, naming == KvScaleNaming::vllm_runtime ? "attn." : "",
                     s);
}

void validate_scale_values(const std::string& tensor, const std::vector<float>& values, int heads,
                           std::string_view heads_what, std::vector<std::string>* warnings) {
  if (values.empty()) throw InputError(fmt::format("{} is empty (expected a scalar or one value per {})", tensor, heads_what));
  if (values.size() != 1 && static_cast<int>(values.size()) != heads)
    throw InputError(fmt::format("{} has {} values (expected 1, or one per {}: {})", tensor, values.size(),
                                 heads_what, heads));
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string where = values.size() == 1 ? tensor : fmt::format("{}[{}]", tensor, i);
    if (auto err = scale_value_error(values[i])) throw InputError(fmt::format("{} {}", where, *err));
    if (warnings)
      if (auto w = scale_value_warning(values[i])) warnings->push_back(fmt::format("{} {}", where, *w));
  }
}

namespace {
// One recognised scale tensor into `out` (errors name the tensor; the caller
// adds the file).
void load_one_scale(const Checkpoint& ckpt, const std::string& name, const std::string& file_name,
                    const KvScaleName& parsed, const KvScaleShape& shape, KvScales& out,
                    std::vector<std::string>* warnings) {
  const TensorView view = ckpt.view(name);
  if (!is_float_dtype(view.dtype()) || view.dtype() == DType::F8_E4M3 || view.dtype() == DType::F8_E5M2)
    throw InputError(fmt::format("{} has dtype {} (expected a float dtype: F32, BF16, F16 or F64)", name,
                                 dtype_name(view.dtype())));
  if (parsed.layer < 0 || parsed.layer >= shape.num_layers)
    throw InputError(fmt::format("{} names layer {}, but the model has {} layers (0..{})", name, parsed.layer,
                                 shape.num_layers, shape.num_layers - 1));
  if (!shape.has_kv_cache(parsed.layer))
    throw InputError(fmt::format("{} names layer {}, a linear_attention layer: it has no KV cache, so no KV scale "
                                 "(the model's KV-cache layers: {})",
                                 name, parsed.layer, layer_list(shape.kv_layers())));
  const bool is_q = parsed.stream == ScaleStream::q;
  const bool is_prob = parsed.stream == ScaleStream::prob;
  // prob scales are per tensor (P is shared by all heads).
  const int heads = is_prob ? 1 : is_q ? shape.num_heads : shape.num_kv_heads;
  const std::string_view heads_what = is_prob ? "tensor" : is_q ? "query head" : "KV head";
  check_shape(name, view.shape(), heads, heads_what);
  std::vector<float> values(static_cast<size_t>(view.numel()));
  tensor_to_f32(view, values);
  validate_scale_values(name, values, heads, heads_what, warnings);
  if (is_prob) return;  // validated; P is never quantized by this engine

  LayerKvScales& layer = out.layers[parsed.layer];
  auto assign = [&](StreamScale& s, const char* what) {
    if (s.from_checkpoint) {
      // Two tensors for one stream: fine when they agree, an error otherwise
      // (which one a serving engine would use depends on its load order).
      if (s.values != values)
        throw InputError(fmt::format("{} and {} both give layer {}'s {} scale, with different values", s.source_tensor,
                                     name, parsed.layer, what));
      return;
    }
    s.values = values;
    s.from_checkpoint = true;
    s.source_tensor = name;
    s.source_file = file_name;
  };
  switch (parsed.stream) {
    case ScaleStream::k: assign(layer.k, "k"); break;
    case ScaleStream::v: assign(layer.v, "v"); break;
    case ScaleStream::q: assign(layer.q, "q"); break;
    case ScaleStream::kv:
      assign(layer.k, "k");
      assign(layer.v, "v");
      break;
    case ScaleStream::prob: break;
  }
}
}  // namespace

void validate_kv_scales(const KvScales& scales, const KvScaleShape& shape) {
  if (static_cast<int>(scales.layers.size()) != shape.num_layers)
    throw InputError(fmt::format("KV scales: {} layers, the model has {}", scales.layers.size(), shape.num_layers));
  for (int l = 0; l < shape.num_layers; ++l) {
    auto check = [&](const StreamScale& sc, const char* what, int heads, std::string_view heads_what) {
      const std::string tensor =
          sc.source_tensor.empty() ? fmt::format("KV scales: layer {} {}_scale", l, what) : sc.source_tensor;
      try {
        validate_scale_values(tensor, sc.values, heads, heads_what);
      } catch (const InputError& e) {
        if (sc.source_file.empty()) throw;
        throw InputError(fmt::format("{}: {}", sc.source_file, e.what()));
      }
    };
    const LayerKvScales& s = scales.layers[static_cast<size_t>(l)];
    check(s.k, "k", shape.num_kv_heads, "KV head");
    check(s.v, "v", shape.num_kv_heads, "KV head");
    check(s.q, "q", shape.num_heads, "query head");
  }
}

KvScales load_kv_scales(const Checkpoint& ckpt, const KvScaleShape& shape, std::vector<std::string>* warnings) {
  KvScales out = KvScales::unity(shape.num_layers);
  for (const std::string& name : ckpt.tensor_names()) {
    const auto parsed = parse_kv_scale_name(name);
    if (!parsed) continue;
    const std::filesystem::path* file = ckpt.file_of(name);
    const std::string file_name = file ? file->string() : ckpt.dir().string();
    try {
      load_one_scale(ckpt, name, file_name, *parsed, shape, out, warnings);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", file_name, e.what()));
    }
  }
  return out;
}

int KvScaleShape::num_kv_layers() const {
  return kv_cache.empty() ? num_layers : static_cast<int>(std::count(kv_cache.begin(), kv_cache.end(), true));
}

std::vector<int> KvScaleShape::kv_layers() const {
  std::vector<int> out;
  for (int l = 0; l < num_layers; ++l)
    if (has_kv_cache(l)) out.push_back(l);
  return out;
}

KvScaleShape kv_scale_shape(const ModelConfig& cfg) {
  KvScaleShape s{cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, {}};
  // (Hand-made test configs may leave layer_types empty: every layer attends.)
  if (static_cast<int>(cfg.layer_types.size()) == cfg.num_layers && cfg.num_attention_layers() < cfg.num_layers) {
    s.kv_cache.resize(static_cast<size_t>(cfg.num_layers));
    for (int l = 0; l < cfg.num_layers; ++l) s.kv_cache[static_cast<size_t>(l)] = !cfg.is_linear(l);
  }
  return s;
}

KvScaleCoverage kv_scale_coverage(const KvScales& scales) {
  return kv_scale_coverage(scales, KvScaleShape{static_cast<int>(scales.layers.size()), 0, 0, {}});
}

KvScaleCoverage kv_scale_coverage(const KvScales& scales, const KvScaleShape& shape) {
  KvScaleCoverage c;
  for (int i = 0; i < static_cast<int>(scales.layers.size()); ++i) {
    if (i < shape.num_layers && !shape.has_kv_cache(i)) continue;
    ++c.quantized_layers;
    const auto& l = scales.layers[i];
    if (!l.k.from_checkpoint) c.k_missing.push_back(i);
    if (!l.v.from_checkpoint) c.v_missing.push_back(i);
    if (!l.q.from_checkpoint) c.q_missing.push_back(i);
  }
  return c;
}


std::optional<std::string> kv_scale_coverage_warning(const KvScaleCoverage& cov, KvDtype cache_dtype) {
  if (!kv_dtype_per_tensor_scaled(cache_dtype) || cov.v_missing.empty()) return std::nullopt;
  return fmt::format(
      "fp8 KV cache ({}): the checkpoint provides v_scale for {} of {} quantized layers; {} layer(s) run at "
      "v_scale 1.0 (layers {}). V is not normalized, so |V| beyond {} clips at the fp8 maximum in those layers "
      "(measured to cost accuracy on long derivations); calibrate with `fp8kv calibrate` and `fp8kv inject`",
      kv_dtype_name(cache_dtype), cov.v_present(), cov.quantized_layers, cov.v_missing.size(),
      layer_list(cov.v_missing), fmt_float(kv_dtype_max(cache_dtype)));
}

KvScales load_kv_scales_for_run(const Checkpoint& ckpt, const KvScaleShape& shape, KvDtype cache_dtype) {
  std::vector<std::string> warnings;
  KvScales s = load_kv_scales(ckpt, shape, &warnings);
  if (kv_dtype_per_token_head(cache_dtype)) {
    const KvScaleCoverage cov = kv_scale_coverage(s, shape);
    if (cov.k_present() + cov.v_present() + cov.q_present() > 0)
      std::fprintf(stderr, "note: %s KV cache: the checkpoint's KV scales (%d layer(s)) are ignored; each token's K and V "
                   "heads are scaled when stored\n", std::string(kv_dtype_name(cache_dtype)).c_str(),
                   std::max({cov.k_present(), cov.v_present(), cov.q_present()}));
    return KvScales::unity(shape.num_layers);
  }
  for (const auto& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (auto w = kv_scale_coverage_warning(kv_scale_coverage(s, shape), cache_dtype))
    std::fprintf(stderr, "warning: %s\n", w->c_str());
  return s;
}

namespace {
bool is_fp8_algo(const nlohmann::json& j) {
  if (!j.is_string()) return false;
  std::string s = j.get<std::string>();
  for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s == "FP8";
}
}  // namespace

bool checkpoint_declares_fp8_kv(const std::filesystem::path& model_dir) {
  std::error_code ec;
  const auto cfg_path = model_dir / "config.json";
  if (std::filesystem::is_regular_file(cfg_path, ec)) {
    const auto j = read_json_file(cfg_path);
    if (j.is_object() && j.contains("quantization_config") && j["quantization_config"].is_object()) {
      const auto& q = j["quantization_config"];
      if (q.contains("kv_cache_scheme") && q["kv_cache_scheme"].is_object()) return true;
      if (q.contains("kv_cache_quant_algo") && is_fp8_algo(q["kv_cache_quant_algo"])) return true;
    }
  }
  const auto hfq = model_dir / "hf_quant_config.json";
  if (std::filesystem::is_regular_file(hfq, ec)) {
    const auto j = read_json_file(hfq);
    if (j.is_object()) {
      if (j.contains("quantization") && j["quantization"].is_object() && j["quantization"].contains("kv_cache_quant_algo") &&
          is_fp8_algo(j["quantization"]["kv_cache_quant_algo"]))
        return true;
      if (j.contains("kv_cache_quant_algo") && is_fp8_algo(j["kv_cache_quant_algo"])) return true;
    }
  }
  return false;
}

}  // namespace fp8kv
