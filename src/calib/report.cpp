#include "calib/report.h"

#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/errors.h"
#include "numerics/scale_check.h"
#include "numerics/version.h"

namespace fp8kv {

namespace {

nlohmann::json values_json(const std::vector<float>& v, bool per_head) {
  if (!per_head) return json_f32(v.empty() ? 0.0f : v[0]);
  nlohmann::json a = nlohmann::json::array();
  for (float f : v) a.push_back(json_f32(f));
  return a;
}

std::vector<float> scales_for(const std::vector<float>& amax, const ScaleRule& rule, KvDtype target) {
  std::vector<float> s;
  s.reserve(amax.size());
  for (float a : amax) s.push_back(rule.scale_for(a, target));
  return s;
}

}  // namespace

nlohmann::json CalibrationReport::to_json() const {
  nlohmann::json j;
  j["fp8kv_version"] = version_string();
  j["status"] = complete ? "complete" : "failed";
  if (!complete) j["reason"] = reason;
  j["model"] = model;
  j["rule"] = rule.name();
  j["target"] = std::string(kv_dtype_name(target));
  j["per_head"] = per_head;
  j["tokens_observed"] = tokens_observed;
  j["corpus"] = corpus;
  j["context"] = context;
  if (!model_identity.is_null()) j["model_identity"] = model_identity;
  nlohmann::json layers_j = nlohmann::json::array();
  for (const auto& l : layers) {
    nlohmann::json e;
    e["layer"] = l.layer;
    e["q_amax"] = values_json(l.q_amax, per_head);
    e["k_amax"] = values_json(l.k_amax, per_head);
    e["v_amax"] = values_json(l.v_amax, per_head);
    e["q_p9999"] = json_f32(l.q_p9999);
    e["k_p9999"] = json_f32(l.k_p9999);
    e["v_p9999"] = json_f32(l.v_p9999);
    e["q_scale"] = values_json(l.q_scale, per_head);
    e["k_scale"] = values_json(l.k_scale, per_head);
    e["v_scale"] = values_json(l.v_scale, per_head);
    e["observations"] = l.observations;
    layers_j.push_back(std::move(e));
  }
  j["layers"] = std::move(layers_j);
  return j;
}

CalibrationReport build_report(const CalibrationObserver& obs, const ScaleRule& rule, KvDtype target, bool per_head) {
  CalibrationReport r;
  r.rule = rule;
  r.target = target;
  r.per_head = per_head;
  std::vector<std::string> problems;
  std::vector<int> unobserved;
  int kv_layers = 0;
  for (int l = 0; l < obs.num_layers(); ++l) {
    if (!obs.has_kv_cache(l)) continue;  // linear_attention: no KV cache, no entry (docs/kv_scales.md)
    ++kv_layers;
    const LayerStats& s = obs.layer(l);
    if (s.tokens == 0) {
      unobserved.push_back(l);
      continue;
    }
    for (const auto& [name, st] : {std::pair<const char*, const StreamStats*>{"Q", &s.q}, {"K", &s.k}, {"V", &s.v}})
      if (st->nonfinite)
        problems.push_back(fmt::format("layer {} {}: {} non-finite value(s) at the store point", l, name, st->nonfinite));
    LayerCalibration c;
    c.layer = l;
    c.observations = s.tokens;
    auto pick = [&](const StreamStats& st) {
      return per_head ? st.head_amax : std::vector<float>{st.amax()};
    };
    c.q_amax = pick(s.q);
    c.k_amax = pick(s.k);
    c.v_amax = pick(s.v);
    c.q_p9999 = s.q.percentile(0.9999);
    c.k_p9999 = s.k.percentile(0.9999);
    c.v_p9999 = s.v.percentile(0.9999);
    if (c.q_amax.empty()) c.q_amax = {0.0f};  // engine did not pass Q (never in practice)
    c.q_scale = scales_for(c.q_amax, rule, target);
    c.k_scale = scales_for(c.k_amax, rule, target);
    c.v_scale = scales_for(c.v_amax, rule, target);
    r.layers.push_back(std::move(c));
    r.tokens_observed = std::max(r.tokens_observed, s.tokens);
  }
  if (kv_layers == 0) {
    r.reason = "the model has no layer with a KV cache";
  } else if (r.tokens_observed == 0) {
    r.reason = "no token was observed (empty corpus?)";
  } else if (!unobserved.empty()) {
    std::string list;
    for (int l : unobserved) list += fmt::format("{}{}", list.empty() ? "" : ",", l);
    r.reason = fmt::format("layer(s) {} were never observed", list);
  } else if (!problems.empty()) {
    r.reason = problems.size() > 1 ? fmt::format("{} (and {} more)", problems[0], problems.size() - 1) : problems[0];
  }
  r.complete = r.reason.empty();
  return r;
}

namespace {

std::vector<float> read_scale(const nlohmann::json& e, const std::string& where, const char* field, int heads,
                              const char* heads_what, std::vector<std::string>* warnings) {
  if (!e.contains(field)) throw InputError(fmt::format("{}: missing field {}", where, field));
  const auto& v = e[field];
  std::vector<const nlohmann::json*> items;
  if (v.is_array()) {
    for (const auto& x : v) items.push_back(&x);
    if (static_cast<int>(items.size()) != heads && items.size() != 1)
      throw InputError(fmt::format("{}.{} has {} values (expected a number, or one per {}: {})", where, field,
                                   items.size(), heads_what, heads));
  } else {
    items.push_back(&v);
  }
  std::vector<float> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& x = *items[i];
    const std::string at = v.is_array() ? fmt::format("{}.{}[{}]", where, field, i) : fmt::format("{}.{}", where, field);
    if (!x.is_number())
      throw InputError(fmt::format("{} is {} (expected a finite number > 0)", at, x.is_null() ? "null" : x.type_name()));
    const double d = x.get<double>();
    if (!std::isfinite(d)) throw InputError(fmt::format("{} is not finite (a KV scale must be finite and > 0)", at));
    if (d <= 0.0) throw InputError(fmt::format("{} is {} (a KV scale must be finite and > 0)", at, d));
    const float f = static_cast<float>(d);
    if (!std::isfinite(f)) throw InputError(fmt::format("{} = {} overflows float32", at, d));
    if (f <= 0.0f) throw InputError(fmt::format("{} = {} underflows float32 to 0", at, d));
    if (auto err = scale_value_error(f)) throw InputError(fmt::format("{} {}", at, *err));
    if (auto warn = scale_value_warning(f)) warnings->push_back(fmt::format("{} {}", at, *warn));
    out.push_back(f);
  }
  return out;
}

}  // namespace

ReportScales parse_report_for_inject(const nlohmann::json& j, const std::string& source, const KvScaleShape& shape) {
  if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object (a calibration report)", source));
  if (!j.contains("status") || !j["status"].is_string())
    throw InputError(fmt::format("{}: missing field status (not a calibration report?)", source));
  const std::string status = j["status"].get<std::string>();
  if (status != "complete") {
    std::string reason;
    if (j.contains("reason") && j["reason"].is_string()) reason = fmt::format(": {}", j["reason"].get<std::string>());
    throw InputError(fmt::format("{}: status is '{}'{}; inject needs a complete calibration report", source, status, reason));
  }
  ReportScales r;
  if (j.contains("target")) {
    if (!j["target"].is_string()) throw InputError(fmt::format("{}: target must be a string", source));
    try {
      r.target = parse_kv_dtype(j["target"].get<std::string>());
    } catch (const std::invalid_argument& e) {
      throw InputError(fmt::format("{}: target: {}", source, e.what()));
    }
    if (!kv_dtype_per_tensor_scaled(r.target))
      throw InputError(fmt::format("{}: target must be fp8_e4m3 or fp8_e5m2", source));
  }
  if (j.contains("rule") && j["rule"].is_string()) r.rule = j["rule"].get<std::string>();
  if (!j.contains("layers") || !j["layers"].is_array())
    throw InputError(fmt::format("{}: missing array layers", source));
  const auto& layers = j["layers"];
  // One entry per layer with a KV cache, none for a linear_attention layer
  // (docs/design.md "KV scales of hybrid models").
  const int kv_layers = shape.num_kv_layers();
  const bool hybrid = kv_layers < shape.num_layers;
  for (size_t i = 0; i < layers.size(); ++i) {  // an entry for a layer without a KV cache: named first
    const auto& e = layers[i];
    if (!e.is_object() || !e.contains("layer") || !e["layer"].is_number_integer()) continue;
    const int64_t l = e["layer"].get<int64_t>();
    if (l >= 0 && l < shape.num_layers && !shape.has_kv_cache(static_cast<int>(l)))
      throw InputError(fmt::format("{}: layers[{}]: layer {} is a linear_attention layer: it has no KV cache, so a "
                                   "report has no entry for it (the model's KV-cache layers: {})",
                                   source, i, l, fmt::join(shape.kv_layers(), ",")));
  }
  if (static_cast<int>(layers.size()) != kv_layers)
    throw InputError(fmt::format("{}: {} layer entries, but the model has {} layers{}", source, layers.size(),
                                 hybrid ? kv_layers : shape.num_layers, hybrid ? " with a KV cache" : ""));
  r.scales = KvScales::unity(shape.num_layers);
  std::vector<bool> seen(static_cast<size_t>(shape.num_layers), false);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& e = layers[i];
    const std::string where = fmt::format("{}: layers[{}]", source, i);
    if (!e.is_object() || !e.contains("layer") || !e["layer"].is_number_integer())
      throw InputError(fmt::format("{}: missing integer field layer", where));
    const int64_t l = e["layer"].get<int64_t>();
    if (l < 0 || l >= shape.num_layers)
      throw InputError(fmt::format("{}: layer {} is out of range (the model has {} layers)", where, l, shape.num_layers));
    if (seen[static_cast<size_t>(l)]) throw InputError(fmt::format("{}: layer {} appears twice", where, l));
    seen[static_cast<size_t>(l)] = true;
    const std::string lw = fmt::format("{} (layer {})", where, l);
    auto& dst = r.scales.layers[static_cast<size_t>(l)];
    dst.k.values = read_scale(e, lw, "k_scale", shape.num_kv_heads, "KV head", &r.warnings);
    dst.v.values = read_scale(e, lw, "v_scale", shape.num_kv_heads, "KV head", &r.warnings);
    dst.q.values = read_scale(e, lw, "q_scale", shape.num_heads, "query head", &r.warnings);
  }
  return r;
}

nlohmann::json model_identity(const ModelConfig& c) {
  return nlohmann::json{{"architecture", c.architecture},
                        {"model_type", c.model_type},
                        {"num_hidden_layers", c.num_layers},
                        {"hidden_size", c.hidden_size},
                        {"num_attention_heads", c.num_heads},
                        {"num_key_value_heads", c.num_kv_heads},
                        {"head_dim", c.head_dim},
                        {"vocab_size", c.vocab_size}};
}

bool check_model_identity(const nlohmann::json& report, const std::string& source, const ModelConfig& c,
                          const std::string& model) {
  if (!report.is_object() || !report.contains("model_identity")) return false;
  const auto& got = report["model_identity"];
  if (!got.is_object()) throw InputError(fmt::format("{}: model_identity must be an object", source));
  const nlohmann::json want = model_identity(c);
  for (const auto& [k, v] : want.items()) {
    if (!got.contains(k)) throw InputError(fmt::format("{}: model_identity lacks field {}", source, k));
    if (got[k] != v)
      throw InputError(fmt::format("{}: made for another model: model_identity.{} is {} in the report, {} in {} "
                                   "(calibrate this model, or give its own report)",
                                   source, k, got[k].dump(), v.dump(), model));
  }
  return true;
}

}  // namespace fp8kv
