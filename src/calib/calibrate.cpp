#include "calib/calibrate.h"

#include <algorithm>

#include <fmt/format.h>

#include "io/errors.h"
#include "io/text_table.h"

namespace fp8kv {

CalibrationReport calibrate(Engine& engine, const std::vector<std::vector<int>>& chunks, const CalibrateOptions& o,
                            const CalibrateProgress& progress) {
  if (engine.kv_dtype() != KvDtype::bf16)
    throw InputError(fmt::format("calibrate: the engine runs a {} cache; calibration observes a bf16 cache",
                                 kv_dtype_name(engine.kv_dtype())));
  // Only the layers with a KV cache are stored to, hence observed (a
  // linear_attention layer has none: docs/design.md "KV scales of hybrid models").
  CalibrationObserver obs(engine.config().num_layers, kv_scale_shape(engine.config()).kv_cache);
  uint64_t total = 0, done = 0;
  for (const auto& c : chunks) total += c.size();
  engine.set_store_observer(&obs);
  try {
    for (const auto& c : chunks) {
      if (c.empty()) continue;
      engine.score(c);
      done += c.size();
      if (progress) progress(done, total);
    }
  } catch (...) {
    engine.set_store_observer(nullptr);
    throw;
  }
  engine.set_store_observer(nullptr);
  CalibrationReport r = build_report(obs, o.rule, o.target, o.per_head);
  if (r.complete && r.tokens_observed < o.min_tokens) {
    r.complete = false;
    r.too_few_tokens = true;
    r.reason = fmt::format("only {} token(s) observed, fewer than the minimum of {} (--min-tokens): an amax over so "
                           "few tokens is not a range; give a longer corpus",
                           r.tokens_observed, o.min_tokens);
  }
  return r;
}

void append_chunks(const std::vector<int>& ids, int context, uint64_t& budget, bool limited,
                   std::vector<std::vector<int>>& chunks) {
  if (context <= 0) throw std::invalid_argument("context must be > 0");
  for (size_t i = 0; i < ids.size(); i += static_cast<size_t>(context)) {
    size_t n = std::min(static_cast<size_t>(context), ids.size() - i);
    if (limited) {
      if (budget == 0) return;
      n = std::min<uint64_t>(n, budget);
      budget -= n;
    }
    chunks.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(i + n));
  }
}

namespace {
std::string fmt_vals(const std::vector<float>& v) {
  if (v.size() == 1) return fmt::format("{:.4g}", v[0]);
  float m = 0;
  for (float x : v) m = std::max(m, x);
  return fmt::format("max {:.4g}", m);
}
}  // namespace

std::string calibration_summary(const CalibrationReport& r) {
  std::string s = fmt::format("calibration {} ({} tokens, rule {}, target {}{})\n", r.complete ? "complete" : "FAILED",
                              r.tokens_observed, r.rule.name(), kv_dtype_name(r.target), r.per_head ? ", per head" : "");
  if (!r.complete) s += fmt::format("  reason: {}\n", r.reason);
  TextTable table({{"layer", 5}, {"q_amax", 10}, {"k_amax", 10}, {"v_amax", 10}, {"q_scale", 10}, {"k_scale", 10},
                   {"v_scale", 10}},
                  "  ");
  std::vector<int> above;  // v_scale > 1: V exceeds what a unity scale stores
  int below = 0, unity = 0;
  float v_min = 0, v_max = 0;
  bool first = true;
  float best = -1;
  std::string where;
  for (const auto& l : r.layers) {
    const bool v_above = std::any_of(l.v_scale.begin(), l.v_scale.end(), [](float x) { return x > 1.0f; });
    table.add_row({std::to_string(l.layer), fmt_vals(l.q_amax), fmt_vals(l.k_amax), fmt_vals(l.v_amax),
                   fmt_vals(l.q_scale), fmt_vals(l.k_scale), fmt_vals(l.v_scale)},
                  v_above ? "  <- v_scale > 1" : "");
    if (v_above) above.push_back(l.layer);
    else if (std::all_of(l.v_scale.begin(), l.v_scale.end(), [](float x) { return x == 1.0f; })) ++unity;
    else ++below;
    for (float x : l.v_scale) {
      v_min = first ? x : std::min(v_min, x);
      v_max = first ? x : std::max(v_max, x);
      first = false;
    }
    for (const auto& [name, vals] : {std::pair<const char*, const std::vector<float>*>{"Q", &l.q_amax},
                                     {"K", &l.k_amax},
                                     {"V", &l.v_amax}}) {
      for (size_t h = 0; h < vals->size(); ++h)
        if ((*vals)[h] > best) {
          best = (*vals)[h];
          where = vals->size() > 1 ? fmt::format("{} at layer {} head {}", name, l.layer, h)
                                   : fmt::format("{} at layer {}", name, l.layer);
        }
    }
  }
  s += table.str();
  std::string list;
  for (int l : above) list += fmt::format("{}{}", list.empty() ? "" : ",", l);
  if (!r.layers.empty())
    s += fmt::format("  v_scale {:.4g} .. {:.4g}: above 1.0 in {} of {} layers{}{}, below 1.0 in {}, exactly 1.0 in {}\n",
                     v_min, v_max, above.size(), r.layers.size(), above.empty() ? "" : ": ", list, below, unity);
  if (best >= 0) s += fmt::format("  largest amax: {:.6g} ({})\n", best, where);
  return s;
}

}  // namespace fp8kv
