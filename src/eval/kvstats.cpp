#include "eval/kvstats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>

#include "io/errors.h"
#include "io/text_table.h"

namespace fp8kv::eval {

namespace {
constexpr const char* kStreams[3] = {"q", "k", "v"};

const StreamScale& stream_scale(const LayerKvScales& l, int s) { return s == 0 ? l.q : s == 1 ? l.k : l.v; }

double require_finite(double x, const std::string& what) {
  if (!std::isfinite(x)) throw std::runtime_error("eval kvstats: non-finite " + what);
  return x;
}

nlohmann::json stream_json(const KvStreamStats& s, const std::string& what) {
  return {{"amax", require_finite(s.range.amax(), what + " amax")},
          {"p9999", require_finite(s.range.percentile(0.9999), what + " p99.99")},
          {"clip_frac", s.quant.clip_frac()},
          {"flush_frac", s.quant.flush_frac()},
          {"rt_err", require_finite(s.quant.rt_rel_err(), what + " rt_err")},
          {"count", s.quant.count},
          {"clipped", s.quant.clipped},
          {"flushed", s.quant.flushed},
          {"nonfinite", s.quant.nonfinite}};
}

// Per-token-head targets: the scale range of K and V (Q: null, not stored).
void add_scale_range(nlohmann::json& j, const KvStreamStats& s, bool pth) {
  if (!pth) return;
  if (s.scales == 0) {
    j["scale_min"] = j["scale_max"] = nullptr;
    return;
  }
  j["scale_min"] = s.scale_min;
  j["scale_max"] = s.scale_max;
  j["scales_at_floor"] = s.scales_at_floor;
}
}  // namespace

void KvStreamStats::merge(const KvStreamStats& o) {
  quant.merge(o.quant);
  scale_min = std::min(scale_min, o.scale_min);
  scale_max = std::max(scale_max, o.scale_max);
  scales += o.scales;
  scales_at_floor += o.scales_at_floor;
  if (o.range.hist.empty()) return;
  if (range.hist.empty()) {
    range = o.range;
    return;
  }
  for (size_t b = 0; b < range.hist.size(); ++b) range.hist[b] += o.range.hist[b];
  range.values += o.range.values;
  range.nonfinite += o.range.nonfinite;
  // Pooled amax is one value: keep it as a single "head" (heads may differ per layer).
  const float m = std::max(range.amax(), o.range.amax());
  range.head_amax.assign(1, m);
}

KvStatsObserver::KvStatsObserver(KvScales scales, KvDtype target)
    : scales_(std::move(scales)), target_(target), layers_(scales_.layers.size()), tokens_(scales_.layers.size(), 0) {
  if (target == KvDtype::bf16)
    throw InputError("--target: expected fp8_e4m3, fp8_e5m2, fp8_per_token_head or int8_per_token_head");
}

void KvStatsObserver::observe(int layer, const float* q, int num_q_heads, const float* k, const float* v,
                              int num_kv_heads, int head_dim, int num_tokens) {
  if (layer < 0 || layer >= num_layers())
    throw std::out_of_range(fmt::format("kvstats observer: layer {} of {}", layer, num_layers()));
  if (num_tokens <= 0) return;
  const float* ptr[3] = {q, k, v};
  const int heads[3] = {num_q_heads, num_kv_heads, num_kv_heads};
  for (int s = 0; s < 3; ++s) {
    if (!ptr[s]) continue;
    KvStreamStats& st = layers_[static_cast<size_t>(layer)][static_cast<size_t>(s)];
    st.range.add(ptr[s], num_tokens, heads[s], head_dim);
    if (kv_dtype_per_token_head(target_)) {
      if (s == 0) continue;  // Q is not stored
      for (int t = 0; t < num_tokens; ++t)
        for (int h = 0; h < heads[s]; ++h) {
          const std::span<const float> x(ptr[s] + (static_cast<size_t>(t) * heads[s] + h) * head_dim,
                                         static_cast<size_t>(head_dim));
          const float sc = per_token_head_scale(x, target_);
          st.quant.add(x, sc, target_);
          st.scale_min = std::min(st.scale_min, sc);
          st.scale_max = std::max(st.scale_max, sc);
          ++st.scales;
          if (sc == FLT_MIN) ++st.scales_at_floor;
        }
      continue;
    }
    const StreamScale& sc = stream_scale(scales_.layers[static_cast<size_t>(layer)], s);
    if (sc.values.size() != 1 && static_cast<int>(sc.values.size()) != heads[s])
      throw std::invalid_argument(fmt::format("kvstats: layer {} {} scale has {} values for {} heads", layer,
                                              kStreams[s], sc.values.size(), heads[s]));
    for (int t = 0; t < num_tokens; ++t)
      for (int h = 0; h < heads[s]; ++h)
        st.quant.add(std::span<const float>(ptr[s] + (static_cast<size_t>(t) * heads[s] + h) * head_dim,
                                            static_cast<size_t>(head_dim)),
                     sc.at(h), target_);
  }
  tokens_[static_cast<size_t>(layer)] += static_cast<uint64_t>(num_tokens);
}

nlohmann::json KvStatsObserver::to_json(const ModelConfig& cfg) const {
  nlohmann::json layers = nlohmann::json::array(), pooled = nlohmann::json::array();
  for (auto type : {LayerType::sliding_attention, LayerType::full_attention}) {
    for (int s = 0; s < 3; ++s) {
      KvStreamStats pool;
      int nl = 0;
      for (int l = 0; l < num_layers(); ++l) {
        if (cfg.layer_types[static_cast<size_t>(l)] != type) continue;
        pool.merge(layers_[static_cast<size_t>(l)][static_cast<size_t>(s)]);
        ++nl;
      }
      if (nl == 0) continue;
      auto j = stream_json(pool, fmt::format("pooled {} {}", layer_type_name(type), kStreams[s]));
      j["type"] = std::string(layer_type_name(type));
      j["stream"] = kStreams[s];
      j["num_layers"] = nl;
      // Worst single layer, as the seed's table reports it.
      double worst = 0.0;
      for (int l = 0; l < num_layers(); ++l)
        if (cfg.layer_types[static_cast<size_t>(l)] == type)
          worst = std::max(worst, layers_[static_cast<size_t>(l)][static_cast<size_t>(s)].quant.clip_frac());
      j["clip_frac_worst_layer"] = worst;
      add_scale_range(j, pool, kv_dtype_per_token_head(target_));
      pooled.push_back(j);
    }
  }
  for (int l = 0; l < num_layers(); ++l) {
    // A linear_attention layer has no KV cache, nothing stored, no row
    // (docs/design.md "KV scales of hybrid models").
    if (static_cast<size_t>(l) < cfg.layer_types.size() && cfg.is_linear(l)) continue;
    for (int s = 0; s < 3; ++s) {
      const auto& st = layers_[static_cast<size_t>(l)][static_cast<size_t>(s)];
      auto j = stream_json(st, fmt::format("layer {} {}", l, kStreams[s]));
      j["layer"] = l;
      j["type"] = std::string(layer_type_name(cfg.layer_types[static_cast<size_t>(l)]));
      j["stream"] = kStreams[s];
      if (kv_dtype_per_token_head(target_)) add_scale_range(j, st, true);
      else j["scale"] = stream_scale(scales_.layers[static_cast<size_t>(l)], s).values;
      layers.push_back(j);
    }
  }
  return {{"target", std::string(kv_dtype_name(target_))}, {"layers", layers}, {"pooled", pooled}};
}

std::string KvStatsObserver::table(const ModelConfig& cfg) const {
  const auto j = to_json(cfg);
  using A = TextTable::Align;
  const bool pth = kv_dtype_per_token_head(target_);
  std::vector<TextTable::Column> cols = {{"layer", 6, A::left}, {"type", 18, A::left}, {"stream", 6, A::left},
                                         {"amax", 11}, {"p99.99", 11}, {"clip", 10}, {"flush", 10}, {"rt_err", 9}};
  if (pth) {
    cols.push_back({"scale min", 11});
    cols.push_back({"scale max", 11});
  }
  TextTable t(cols);
  auto row = [&](const std::string& layer, const nlohmann::json& r) {
    std::vector<std::string> cells = {
        layer, r["type"].get<std::string>(), r["stream"].get<std::string>(),
        fmt::format("{:.4g}", r["amax"].get<double>()), fmt::format("{:.4g}", r["p9999"].get<double>()),
        fmt::format("{:.3g}", r["clip_frac"].get<double>()), fmt::format("{:.3g}", r["flush_frac"].get<double>()),
        fmt::format("{:.3f}%", 100.0 * r["rt_err"].get<double>())};
    if (pth) {
      const bool has = !r["scale_min"].is_null();
      cells.push_back(has ? fmt::format("{:.4g}", r["scale_min"].get<double>()) : "-");
      cells.push_back(has ? fmt::format("{:.4g}", r["scale_max"].get<double>()) : "-");
    }
    t.add_row(cells);
  };
  for (const auto& r : j["layers"]) row(std::to_string(r["layer"].get<int>()), r);
  for (const auto& r : j["pooled"]) row("pool", r);
  return t.str();
}

KvScales kvstats_scales(const std::string& spec, int num_layers, const KvScales* checkpoint_scales) {
  if (spec == "unity") return KvScales::unity(num_layers);
  if (spec == "checkpoint") {
    if (!checkpoint_scales) throw InputError("--scales checkpoint: no checkpoint scales available");
    return *checkpoint_scales;
  }
  size_t used = 0;
  float v = 0.0f;
  try {
    v = std::stof(spec, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != spec.size() || spec.empty() || !std::isfinite(v) || !(v > 0.0f))
    throw InputError(fmt::format("--scales '{}': expected unity, checkpoint or a finite number > 0", spec));
  KvScales s = KvScales::unity(num_layers);
  for (auto& l : s.layers) l.q.values = l.k.values = l.v.values = {v};
  return s;
}

}  // namespace fp8kv::eval
