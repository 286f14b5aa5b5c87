// `fp8kv inspect MODEL_DIR [--json] [--check-values]`: what the engine would
// load, and whether it can. Exit 0 when config.json parses, the weights open
// and every tensor the family needs is present with the right shape; exit 2
// with one line naming the file / tensor otherwise. Unexpected tensors are
// warnings. Weight values are not read unless --check-values, which scans
// every floating-point tensor for NaN / inf and names the first one found.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/checkpoint.h"
#include "io/errors.h"
#include "io/value_scan.h"
#include "kv/scale_loader.h"
#include "model/config.h"
#include "model/weights.h"
#include "model/weights_spec.h"
#include "numerics/version.h"

namespace fp8kv::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Tensors of a multimodal checkpoint that the text engine does not use
// (Gemma 3's vision tower and projector; Qwen3.5's vision tower
// model.visual.* and its multi-token-prediction head mtp.*, which
// transformers does not load either).
bool is_non_text_tensor(const std::string& name) {
  for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                        "model.multi_modal_projector.", "model.visual.", "mtp."})
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

struct Summary {
  uint64_t num_parameters = 0;
  std::string weight_dtype;  // safetensors dtype of the weights, or "mixed (A, B)"
  uint64_t weight_bytes = 0;  // the expected tensors as stored, plus fp8 weight scales
  std::vector<std::string> unquantized_modules;  // FP8-weight checkpoints: projections / lm_head stored unquantized
};

Summary summarize(const ModelConfig& cfg, const Checkpoint& ckpt, const WeightNaming& naming) {
  Summary s;
  std::map<std::string, uint64_t> bytes_by_dtype;
  for (const auto& spec : expected_tensors(cfg, naming)) {
    const TensorInfo* t = ckpt.find(spec.name);
    s.num_parameters += static_cast<uint64_t>(t->numel());
    bytes_by_dtype[std::string(dtype_name(t->dtype))] += t->nbytes();
    s.weight_bytes += t->nbytes();
    const bool matrix = spec.shape.size() == 2 && spec.name.find("embed_tokens") == std::string::npos;
    if (cfg.weight_quant.quantized() && matrix && t->dtype != DType::F8_E4M3)
      s.unquantized_modules.push_back(spec.name.substr(0, spec.name.size() - std::string_view(".weight").size()));
  }
  for (const auto& name : ckpt.tensor_names())
    if (is_weight_quant_tensor_name(name, cfg.weight_quant)) s.weight_bytes += ckpt.find(name)->nbytes();
  if (bytes_by_dtype.size() == 1) {
    s.weight_dtype = bytes_by_dtype.begin()->first;
  } else {
    std::string list;
    for (const auto& [d, b] : bytes_by_dtype) list += (list.empty() ? "" : ", ") + d;
    s.weight_dtype = "mixed (" + list + ")";
  }
  return s;
}

// Every floating-point tensor of the checkpoint, in name order; throws
// InputError naming the file, tensor and element of the first NaN / inf.
void check_values(const Checkpoint& ckpt) {
  for (const std::string& name : ckpt.tensor_names()) {
    const TensorInfo* t = ckpt.find(name);
    if (!t || !is_float_dtype(t->dtype)) continue;
    if (const auto bad = first_non_finite(ckpt.view(name))) {
      const fs::path* file = ckpt.file_of(name);
      throw InputError(fmt::format("{}: tensor {} ({}, shape [{}]) has {} at element {} (flat index); weights must be "
                                   "finite",
                                   file ? file->string() : ckpt.dir().string(), name, dtype_name(t->dtype),
                                   fmt::join(t->shape, ", "), bad->what, bad->index));
    }
  }
}

int run_inspect(const std::string& model_dir, bool json_out, bool values) {
  const fs::path dir(model_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(fmt::format("{}: not a directory (expected a model directory)", model_dir));
  const ModelConfig cfg = load_model_config(dir);
  const std::shared_ptr<const Checkpoint> ckpt = Checkpoint::open(dir);
  const WeightNaming naming = detect_weight_naming(cfg, *ckpt);
  const auto unexpected_all = check_weights(cfg, *ckpt, naming);
  // FP8 weights and their scales, checked by the engine's own binder (dtype,
  // scale presence, shape, finite and > 0): inspect refuses what load would.
  if (cfg.weight_quant.quantized()) ModelWeights::load(ckpt, cfg, /*check_memory=*/false);

  std::vector<std::string> warnings;
  std::vector<std::string> unexpected;
  int non_text = 0;
  for (const auto& n : unexpected_all) {
    if ((cfg.architecture == "Gemma3ForConditionalGeneration" || cfg.family == ModelFamily::qwen3_5) &&
        is_non_text_tensor(n))
      ++non_text;
    else unexpected.push_back(n);
  }
  if (!unexpected.empty()) {
    std::string list;
    for (size_t i = 0; i < unexpected.size() && i < 8; ++i) list += (i ? ", " : "") + unexpected[i];
    if (unexpected.size() > 8) list += fmt::format(", ... ({} more)", unexpected.size() - 8);
    warnings.push_back(fmt::format("{} unexpected tensor(s) not used by {}: {}", unexpected.size(),
                                   cfg.architecture, list));
  }

  // KV scales present in the checkpoint (validated: malformed scales are bad input).
  // Only layers with a KV cache take scales (a linear_attention layer has none;
  // docs/design.md "KV scales of hybrid models"): they alone are listed and counted.
  const KvScaleShape kv_shape = kv_scale_shape(cfg);
  const KvScales scales = load_kv_scales(*ckpt, kv_shape, &warnings);
  if (values) check_values(*ckpt);
  const KvScaleCoverage cov = kv_scale_coverage(scales, kv_shape);
  const bool declares_fp8 = checkpoint_declares_fp8_kv(dir);
  if (auto w = kv_scale_coverage_warning(cov, KvDtype::fp8_e4m3); w && (declares_fp8 || cov.k_present() + cov.v_present() > 0))
    warnings.push_back(*w);

  const Summary sum = summarize(cfg, *ckpt, naming);
  // K + V, every attention layer, one token.
  const uint64_t kv_elems = 2ull * static_cast<uint64_t>(cfg.num_attention_layers()) * cfg.num_kv_heads * cfg.head_dim;
  std::vector<std::string> layer_types;
  for (auto t : cfg.layer_types) layer_types.emplace_back(layer_type_name(t));

  for (const auto& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());

  if (json_out) {
    json j;
    j["model"] = model_dir;
    j["architecture"] = cfg.architecture;
    j["model_type"] = cfg.model_type;
    j["family"] = std::string(family_name(cfg.family));
    j["num_layers"] = cfg.num_layers;
    j["layer_types"] = layer_types;
    j["sliding_window"] = cfg.sliding_window ? json(*cfg.sliding_window) : json(nullptr);
    j["hidden_size"] = cfg.hidden_size;
    j["intermediate_size"] = cfg.intermediate_size;
    j["num_heads"] = cfg.num_heads;
    j["num_kv_heads"] = cfg.num_kv_heads;
    j["head_dim"] = cfg.head_dim;
    j["vocab_size"] = cfg.vocab_size;
    j["max_position_embeddings"] = cfg.max_position_embeddings;
    j["tie_word_embeddings"] = cfg.tie_word_embeddings;
    j["weight_dtype"] = sum.weight_dtype;
    j["num_parameters"] = sum.num_parameters;
    j["weight_bytes"] = sum.weight_bytes;
    const WeightQuantConfig& q = cfg.weight_quant;
    j["weight_format"] = q.quantized() ? json{{"quantization", "fp8_e4m3"},
                                             {"quant_method", std::string(weight_quant_method_name(q.method))},
                                             {"scale_granularity", std::string(scale_granularity_name(q.granularity))},
                                             {"scale_tensor", q.scale_suffix},
                                             {"activation_scheme", q.activation_scheme},
                                             {"excluded_modules", q.excluded},
                                             {"excluded_field", q.excluded_field()},
                                             {"unquantized_modules", sum.unquantized_modules},
                                             {"declared_in", q.source + " " + q.field}}
                                       : json{{"quantization", "none"}};
    j["kv_bytes_per_token"] = {{"bf16", kv_elems * 2}, {"fp8_e4m3", kv_elems}, {"fp8_e5m2", kv_elems}};
    j["weight_files"] = json::array();
    for (const auto& f : ckpt->files()) j["weight_files"].push_back(f.filename().string());
    // Per layer: the scale from the checkpoint (number, or array per head), null when absent.
    auto scale_json = [](const StreamScale& s) -> json {
      if (!s.from_checkpoint) return nullptr;
      if (s.values.size() == 1) return static_cast<double>(s.values[0]);
      json a = json::array();
      for (float v : s.values) a.push_back(static_cast<double>(v));
      return a;
    };
    j["kv_scales"] = json::array();
    for (const int l : kv_shape.kv_layers())
      j["kv_scales"].push_back({{"layer", l},
                                {"k_scale", scale_json(scales.layers[l].k)},
                                {"v_scale", scale_json(scales.layers[l].v)},
                                {"q_scale", scale_json(scales.layers[l].q)}});
    j["kv_scale_coverage"] = {{"declares_fp8_kv", declares_fp8},
                              {"quantized_layers", cov.quantized_layers},
                              {"k_scale_layers", cov.k_present()},
                              {"v_scale_layers", cov.v_present()},
                              {"q_scale_layers", cov.q_present()},
                              {"v_scale_missing_layers", cov.v_missing}};
    j["unexpected_tensors"] = unexpected;
    j["warnings"] = warnings;
    j["values_checked"] = values;
    j["fp8kv_version"] = version_string();
    // Tensor names come from the file: never let invalid UTF-8 abort the output.
    std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }

  std::string out;
  out += fmt::format("model:            {}\n", model_dir);
  out += fmt::format("architecture:     {} (model_type {})\n", cfg.architecture, cfg.model_type);
  const int num_linear = cfg.num_layers - cfg.num_attention_layers();
  out += fmt::format("layers:           {} ({} full, {} sliding{}{})\n", cfg.num_layers,
                     cfg.num_attention_layers() - cfg.num_sliding_layers(), cfg.num_sliding_layers(),
                     num_linear ? fmt::format(", {} linear_attention (no KV cache)", num_linear) : std::string(),
                     cfg.sliding_window ? fmt::format(", window {}", *cfg.sliding_window) : std::string());
  out += fmt::format("hidden / ffn:     {} / {}\n", cfg.hidden_size, cfg.intermediate_size);
  out += fmt::format("heads:            {} query, {} kv, head_dim {}\n", cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
  out += fmt::format("vocab:            {}{}\n", cfg.vocab_size, cfg.tie_word_embeddings ? " (tied embeddings)" : "");
  out += fmt::format("weights:          {} parameters, {}, {} bytes, {} file(s)\n", sum.num_parameters,
                     sum.weight_dtype, sum.weight_bytes, ckpt->files().size());
  if (cfg.weight_quant.quantized()) {
    const WeightQuantConfig& q = cfg.weight_quant;
    out += fmt::format("weight format:    fp8 e4m3, {} scales ({}), quant_method {}, activations {} ({} {})\n",
                       scale_granularity_name(q.granularity), q.scale_suffix, weight_quant_method_name(q.method),
                       q.activation_scheme, q.source, q.field);
    out += fmt::format("excluded:         {} [{}]; unquantized: {}\n", q.excluded_field(), fmt::join(q.excluded, ", "),
                       sum.unquantized_modules.empty() ? std::string("none")
                                                       : fmt::format("{}", fmt::join(sum.unquantized_modules, ", ")));
  }
  out += fmt::format("KV bytes / token: bf16 {}, fp8_e4m3 {}, fp8_e5m2 {}\n", kv_elems * 2, kv_elems, kv_elems);
  out += fmt::format("KV scales:        k {}/{}, v {}/{}, q {}/{} layers{}\n", cov.k_present(), cov.quantized_layers,
                     cov.v_present(), cov.quantized_layers, cov.q_present(), cov.quantized_layers,
                     declares_fp8 ? " (checkpoint declares an fp8 KV cache)" : "");
  if (cov.k_present() + cov.v_present() + cov.q_present() > 0) {
    auto fmt_scale = [](const StreamScale& s) -> std::string {
      if (!s.from_checkpoint) return "null";
      if (s.values.size() == 1) return fmt::format("{:.9g}", s.values[0]);
      std::string r = "[";
      for (size_t i = 0; i < s.values.size(); ++i) r += fmt::format("{}{:.9g}", i ? ", " : "", s.values[i]);
      return r + "]";
    };
    for (const int l : kv_shape.kv_layers())
      out += fmt::format("  layer {:>3}:       k {}  v {}  q {}\n", l, fmt_scale(scales.layers[l].k),
                         fmt_scale(scales.layers[l].v), fmt_scale(scales.layers[l].q));
  }
  if (non_text)
    out += fmt::format("non-text tensors: {} (vision tower / projector{}, not loaded: the text model only)\n", non_text,
                       cfg.family == ModelFamily::qwen3_5 ? " / MTP head" : "");
  out += values ? "values:           every floating-point tensor scanned: no NaN or inf\n"
                : "values:           not scanned (names, dtypes and shapes only; --check-values scans for NaN/inf)\n";
  out += fmt::format("fp8kv:            {}\n", version_string());
  std::fputs(out.c_str(), stdout);
  return 0;
}

const Registrar reg_inspect([](CLI::App& app) {
  auto* sub = app.add_subcommand("inspect", "Show a model's architecture, layer types, KV size; check it loads");
  auto dir = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  auto values = std::make_shared<bool>(false);
  sub->add_option("MODEL_DIR", *dir, "Hugging Face checkpoint directory")->required();
  sub->add_flag("--json", *json_out, "Print JSON");
  sub->add_flag("--check-values", *values, "Scan every floating-point tensor for NaN / inf (reads all weights)");
  set_action(sub, [dir, json_out, values] { return run_inspect(*dir, *json_out, *values); });
});

}  // namespace
}  // namespace fp8kv::cli
