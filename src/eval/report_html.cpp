#include "eval/report_html.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace fp8kv::eval {

using nlohmann::json;

namespace {

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
const char* color(size_t i) { return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))]; }

std::string bucket_label(const json& b) {
  return b["hi"].is_null() ? fmt::format("{}+", b["lo"].get<int>())
                           : fmt::format("{}-{}", b["lo"].get<int>(), b["hi"].get<int>());
}

double num_or(const json& v, double d) { return v.is_number() ? v.get<double>() : d; }

// Grouped bars: one group per bucket, one bar per non-reference arm.
std::string dnll_chart(const json& arms) {
  std::vector<size_t> shown;
  for (size_t a = 1; a < arms.size(); ++a) shown.push_back(a);
  if (shown.empty()) return "<p>Only the reference arm: nothing to compare.</p>";
  const json& buckets = arms[0]["buckets"];
  double lo = 0, hi = 0;
  for (size_t a : shown)
    for (const auto& b : arms[a]["buckets"]) {
      const double v = num_or(b["dnll_pct"], 0.0);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (hi - lo < 1e-9) hi = lo + 1.0;
  const double pad = 0.1 * (hi - lo);
  lo -= lo < 0 ? pad : 0;
  hi += pad;
  const int W = 900, H = 360, L = 70, R = 20, T = 20, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  auto y = [&](double v) { return T + ph * (hi - v) / (hi - lo); };
  std::string s = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' viewBox='0 0 {} {}' role='img' "
      "aria-label='dNLL by position bucket'>\n",
      W, H, W, H);
  for (int t = 0; t <= 5; ++t) {
    const double v = lo + (hi - lo) * t / 5.0;
    s += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#ddd'/>"
                     "<text x='{}' y='{:.1f}' font-size='12' text-anchor='end'>{:.3g}%</text>\n",
                     L, W - R, y(v), y(v), L - 6, y(v) + 4, v);
  }
  s += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#000'/>\n", L, W - R, y(0), y(0));
  const size_t nb = buckets.size();
  const double gw = pw / static_cast<double>(nb), bw = gw * 0.8 / static_cast<double>(shown.size());
  for (size_t b = 0; b < nb; ++b) {
    const double gx = L + gw * static_cast<double>(b) + gw * 0.1;
    for (size_t k = 0; k < shown.size(); ++k) {
      const json& e = arms[shown[k]]["buckets"][b];
      if (e["dnll_pct"].is_null()) continue;
      const double v = e["dnll_pct"].get<double>();
      const double y0 = y(std::max(v, 0.0)), y1 = y(std::min(v, 0.0));
      s += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='{}'>"
                       "<title>{} {}: {:.4g}% (n={})</title></rect>\n",
                       gx + bw * static_cast<double>(k), y0, bw, std::max(y1 - y0, 0.5), color(shown[k] - 1),
                       html_escape(arms[shown[k]]["name"].get<std::string>()), bucket_label(e), v,
                       e["n"].get<uint64_t>());
    }
    s += fmt::format("<text x='{:.1f}' y='{}' font-size='12' text-anchor='middle'>{}</text>\n", gx + gw * 0.4,
                     H - B + 18, bucket_label(buckets[b]));
  }
  s += fmt::format("<text x='{}' y='{}' font-size='13' text-anchor='middle'>token position bucket</text>\n",
                   L + pw / 2, H - B + 40);
  s += fmt::format("<text x='16' y='{}' font-size='13' transform='rotate(-90 16 {})' text-anchor='middle'>"
                   "dNLL as % PPL vs reference</text>\n",
                   T + ph / 2, T + ph / 2);
  for (size_t k = 0; k < shown.size(); ++k)
    s += fmt::format("<rect x='{}' y='{}' width='12' height='12' fill='{}'/><text x='{}' y='{}' font-size='12'>{}</text>\n",
                     L + 10 + 170 * static_cast<int>(k), H - 14, color(shown[k] - 1),
                     L + 26 + 170 * static_cast<int>(k), H - 4,
                     html_escape(arms[shown[k]]["name"].get<std::string>()));
  return s + "</svg>\n";
}

// KLD quantile curves on a log10 axis (x = quantile, y = KLD).
std::string kld_chart(const json& arms) {
  std::vector<size_t> shown;
  for (size_t a = 1; a < arms.size(); ++a) shown.push_back(a);
  if (shown.empty()) return "";
  const double floor_v = 1e-9;
  double lmin = 0, lmax = -9;
  bool first = true;
  for (size_t a : shown)
    for (const auto& q : arms[a]["kld"]["quantiles"]) {
      const double l = std::log10(std::max(q["value"].get<double>(), floor_v));
      if (first) lmin = lmax = l, first = false;
      lmin = std::min(lmin, l);
      lmax = std::max(lmax, l);
    }
  lmin = std::floor(lmin);
  lmax = std::ceil(lmax);
  if (lmax <= lmin) lmax = lmin + 1;
  const int W = 900, H = 360, L = 70, R = 20, T = 20, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  const json& qs0 = arms[shown[0]]["kld"]["quantiles"];
  const size_t nq = qs0.size();
  auto x = [&](size_t i) { return L + pw * static_cast<double>(i) / static_cast<double>(nq - 1); };
  auto y = [&](double v) { return T + ph * (lmax - std::log10(std::max(v, floor_v))) / (lmax - lmin); };
  std::string s = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' viewBox='0 0 {} {}' role='img' "
      "aria-label='KLD quantiles'>\n",
      W, H, W, H);
  for (int e = static_cast<int>(lmin); e <= static_cast<int>(lmax); ++e) {
    const double yy = T + ph * (lmax - e) / (lmax - lmin);
    s += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#ddd'/>"
                     "<text x='{}' y='{:.1f}' font-size='12' text-anchor='end'>1e{}</text>\n",
                     L, W - R, yy, yy, L - 6, yy + 4, e);
  }
  for (size_t i = 0; i < nq; ++i) {
    const double q = qs0[i]["q"].get<double>();
    s += fmt::format("<text x='{:.1f}' y='{}' font-size='11' text-anchor='middle'>{}</text>\n", x(i), H - B + 18,
                     q == 100 ? std::string("max") : fmt::format("p{:g}", q));
  }
  for (size_t k = 0; k < shown.size(); ++k) {
    const json& qs = arms[shown[k]]["kld"]["quantiles"];
    std::string pts;
    for (size_t i = 0; i < qs.size() && i < nq; ++i) pts += fmt::format("{:.1f},{:.1f} ", x(i), y(qs[i]["value"].get<double>()));
    s += fmt::format("<polyline points='{}' fill='none' stroke='{}' stroke-width='2'/>\n", pts, color(shown[k] - 1));
    for (size_t i = 0; i < qs.size() && i < nq; ++i)
      s += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='3' fill='{}'><title>{} p{:g}: {:.4g}</title></circle>\n",
                       x(i), y(qs[i]["value"].get<double>()), color(shown[k] - 1),
                       html_escape(arms[shown[k]]["name"].get<std::string>()), qs[i]["q"].get<double>(),
                       qs[i]["value"].get<double>());
    s += fmt::format("<rect x='{}' y='{}' width='12' height='12' fill='{}'/><text x='{}' y='{}' font-size='12'>{}</text>\n",
                     L + 10 + 170 * static_cast<int>(k), H - 14, color(shown[k] - 1),
                     L + 26 + 170 * static_cast<int>(k), H - 4,
                     html_escape(arms[shown[k]]["name"].get<std::string>()));
  }
  s += fmt::format("<text x='16' y='{}' font-size='13' transform='rotate(-90 16 {})' text-anchor='middle'>"
                   "KL(reference || arm), nats (log scale; 0 shown at 1e-9)</text>\n",
                   T + ph / 2, T + ph / 2);
  return s + "</svg>\n";
}

std::string fmt_num(const json& v, const char* f = "{:.4g}") {
  if (!v.is_number()) return "&ndash;";
  return fmt::format(fmt::runtime(f), v.get<double>());
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o.push_back(c);
    }
  }
  return o;
}

std::string compare_report_html(const json& r) {
  const json& arms = r["arms"];
  std::string h =
      "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>fp8kv eval compare</title>\n"
      "<style>body{font-family:sans-serif;max-width:960px;margin:24px auto;color:#222}"
      "table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;padding:4px 8px;"
      "text-align:right}th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}"
      ".note{color:#555;font-size:13px}</style></head><body>\n";
  h += fmt::format("<h1>fp8kv eval compare</h1>\n<p>model <code>{}</code>, reference <b>{}</b>, context {} tokens, "
                   "{} documents. {}</p>\n",
                   html_escape(r.value("model", "")), html_escape(r.value("reference", "")), r.value("context", 0),
                   r.contains("documents") ? r["documents"].size() : 0,
                   html_escape(r.value("fp8kv_version", "")));
  h += "<h2>Summary</h2>\n<table><tr><th>arm</th><th>KV</th><th>PPL</th><th>&Delta;PPL %</th><th>95% CI</th>"
       "<th>KLD mean</th><th>median</th><th>p99</th><th>max</th><th>RMS &Delta;p</th><th>same top-1</th>"
       "<th>doc sign-flip p</th></tr>\n";
  for (const auto& a : arms) {
    const auto& ci = a["ppl_delta_pct_ci"];
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>[{}, {}]</td><td>{}</td><td>{}</td>"
                     "<td>{}</td><td>{}</td><td>{}%</td><td>{}%</td><td>{}</td></tr>\n",
                     html_escape(a["name"].get<std::string>()), html_escape(a.value("kv_cache_dtype", "")),
                     fmt_num(a["ppl"]), fmt_num(a["ppl_delta_pct"], "{:+.3f}"), fmt_num(ci[0], "{:+.3f}"),
                     fmt_num(ci[1], "{:+.3f}"), fmt_num(a["kld"]["mean"]), fmt_num(a["kld"]["median"]),
                     fmt_num(a["kld"]["p99"]), fmt_num(a["kld"]["max"]),
                     fmt::format("{:.3f}", 100.0 * a["rms_dp"].get<double>()),
                     fmt::format("{:.2f}", 100.0 * a["top1_agree"].get<double>()),
                     fmt_num(a["doc_sign_flip"]["p_value"], "{:.3g}"));
  }
  h += "</table>\n<p class='note'>&Delta;PPL % = 100 &times; (exp(mean dNLL) &minus; 1) over all scored tokens; "
       "CI: percentile bootstrap over documents. A <i>control</i> arm (if present) is the reference configuration "
       "run again with a short prefix: its deltas are the noise floor to read the other arms against.</p>\n";
  h += "<h2>dNLL by position bucket (% PPL)</h2>\n" + dnll_chart(arms);
  h += "<table><tr><th>arm</th>";
  for (const auto& b : arms[0]["buckets"]) h += "<th>" + bucket_label(b) + "</th>";
  h += "</tr>\n";
  for (const auto& a : arms) {
    h += "<tr><td>" + html_escape(a["name"].get<std::string>()) + "</td>";
    for (const auto& b : a["buckets"])
      h += fmt::format("<td>{}% <span class='note'>({}; top-1 {})</span></td>", fmt_num(b["dnll_pct"], "{:+.3f}"),
                       b["n"].get<uint64_t>(), fmt_num(b["top1_agree"], "{:.3f}"));
    h += "</tr>\n";
  }
  h += "</table>\n<h2>KL divergence distribution</h2>\n" + kld_chart(arms);
  h += "<h2>Per document</h2>\n<table><tr><th>document</th>";
  for (const auto& a : arms) h += "<th>" + html_escape(a["name"].get<std::string>()) + "<br>PPL (&Delta;%)</th>";
  h += "</tr>\n";
  const size_t nd = arms[0]["documents"].size();
  for (size_t d = 0; d < nd; ++d) {
    h += "<tr><td>" + html_escape(arms[0]["documents"][d]["name"].get<std::string>()) + "</td>";
    for (const auto& a : arms) {
      const auto& e = a["documents"][d];
      h += fmt::format("<td>{} ({})</td>", fmt_num(e["ppl"]), fmt_num(e["ppl_delta_pct"], "{:+.3f}"));
    }
    h += "</tr>\n";
  }
  h += "</table>\n</body></html>\n";
  return h;
}

}  // namespace fp8kv::eval
