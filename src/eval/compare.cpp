#include "eval/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>

#include "eval/stats.h"
#include "io/checkpoint.h"
#include "io/errors.h"
#include "io/user_files.h"
#include "kv/scale_loader.h"

namespace fp8kv::eval {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kArmForms =
    "bf16, fp8, fp8:unity, fp8:scales=DIR, fp8_e4m3[:unity|:scales=DIR], fp8_e5m2[:unity|:scales=DIR], "
    "fp8_per_token_head, int8_per_token_head";

double finite(double x, std::string_view what) {
  if (!std::isfinite(x)) throw std::runtime_error(fmt::format("eval compare: non-finite {}", what));
  return x;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t p = s.find(sep, start);
    out.emplace_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return out;
}

}  // namespace

ArmSpec parse_arm(std::string_view spec) {
  ArmSpec a;
  a.name = std::string(spec);
  const size_t colon = spec.find(':');
  const std::string_view base = spec.substr(0, colon);
  if (base == "bf16") {
    if (colon != std::string_view::npos)
      throw InputError(fmt::format("arm '{}': bf16 takes no scale option (accepted: {})", spec, kArmForms));
    a.dtype = KvDtype::bf16;
    return a;
  }
  if (base == "fp8_per_token_head" || base == "int8_per_token_head") {
    if (colon != std::string_view::npos)
      throw InputError(fmt::format("arm '{}': {} takes no scale option: its scales are per token head, made at store "
                                   "(accepted: {})",
                                   spec, base, kArmForms));
    a.dtype = base == "int8_per_token_head" ? KvDtype::int8_pth : KvDtype::fp8_e4m3_pth;
    return a;
  }
  if (base == "fp8" || base == "fp8_e4m3") a.dtype = KvDtype::fp8_e4m3;
  else if (base == "fp8_e5m2") a.dtype = KvDtype::fp8_e5m2;
  else throw InputError(fmt::format("arm '{}': unknown KV configuration (accepted: {})", spec, kArmForms));
  if (colon == std::string_view::npos) return a;
  const std::string_view opt = spec.substr(colon + 1);
  if (opt == "unity") {
    a.scales = ArmSpec::Scales::unity;
  } else if (opt.substr(0, 7) == "scales=" && opt.size() > 7) {
    a.scales = ArmSpec::Scales::dir;
    a.scales_dir = std::string(opt.substr(7));
  } else {
    throw InputError(fmt::format("arm '{}': unknown option '{}' (accepted: {})", spec, opt, kArmForms));
  }
  return a;
}

std::vector<ArmSpec> parse_arms(std::string_view csv) {
  std::vector<ArmSpec> arms;
  std::set<std::string> seen;
  for (const auto& s : split(csv, ',')) {
    if (s.empty()) throw InputError(fmt::format("--arms '{}': empty arm name", csv));
    if (s == "control") throw InputError("--arms: 'control' is reserved (use --control for the noise-floor pass)");
    if (!seen.insert(s).second) throw InputError(fmt::format("--arms: arm '{}' given twice", s));
    arms.push_back(parse_arm(s));
  }
  if (arms.empty()) throw InputError("--arms: give at least one arm");
  return arms;
}

KvScales arm_scales(const ArmSpec& arm, const fs::path& model_dir, const ModelConfig& cfg) {
  const KvScaleShape shape = kv_scale_shape(cfg);
  if (!kv_dtype_per_tensor_scaled(arm.dtype) || arm.scales == ArmSpec::Scales::unity)
    return KvScales::unity(cfg.num_layers);  // bf16 and the per-token-head dtypes take no KvScales
  const fs::path dir = arm.scales == ArmSpec::Scales::dir ? arm.scales_dir : model_dir;
  if (arm.scales == ArmSpec::Scales::dir && fs::exists(dir / "config.json")) {
    const ModelConfig other = load_model_config(dir);
    if (other.num_layers != cfg.num_layers || other.num_heads != cfg.num_heads ||
        other.num_kv_heads != cfg.num_kv_heads)
      throw InputError(fmt::format(
          "arm '{}': {} has {} layers / {} heads / {} KV heads, the model has {} / {} / {}", arm.name,
          (dir / "config.json").string(), other.num_layers, other.num_heads, other.num_kv_heads, cfg.num_layers,
          cfg.num_heads, cfg.num_kv_heads));
  }
  // Errors name the arm as well as the file and tensor: with several arms the
  // tensor name alone does not say which directory is at fault.
  try {
    const auto ck = Checkpoint::open(dir);
    return load_kv_scales(*ck, shape);
  } catch (const InputError& e) {
    throw InputError(fmt::format("arm '{}': {}", arm.name, e.what()));
  }
}

std::unique_ptr<Engine> load_arm_engine(const ArmSpec& arm, const fs::path& model_dir, EngineOptions base) {
  base.kv_cache_dtype = std::string(kv_dtype_name(arm.dtype));
  auto e = Engine::load(model_dir, base);
  if (!e) throw InputError("eval: one rank per process (--nnodes > 1) is not supported: each arm loads its own engine");
  KvScales scales = arm_scales(arm, model_dir, e->config());
  try {
    e->set_kv_scales(std::move(scales));  // errors name file and tensor; add the arm
  } catch (const InputError& err) {
    throw InputError(fmt::format("arm '{}': {}", arm.name, err.what()));
  }
  return e;
}

std::vector<int> parse_buckets(std::string_view csv) {
  std::vector<int> b;
  // One integer-list parser for every option (io/user_files.h).
  for (const int64_t v : parse_int_list(csv, "--buckets", 0, std::numeric_limits<int>::max())) {
    if (!b.empty() && v <= b.back())
      throw InputError(fmt::format("--buckets '{}': edges must be strictly ascending", csv));
    b.push_back(static_cast<int>(v));
  }
  if (b.empty() || b[0] != 0) throw InputError(fmt::format("--buckets '{}': the first edge must be 0", csv));
  return b;
}

void log_softmax(std::span<const float> logits, std::span<float> out) {
  double m = -std::numeric_limits<double>::infinity();
  for (float x : logits) m = std::max(m, static_cast<double>(x));
  double s = 0.0;
  for (float x : logits) s += std::exp(static_cast<double>(x) - m);
  const double lse = m + std::log(s);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(static_cast<double>(logits[i]) - lse);
}

int argmax_lowest(std::span<const float> x) {
  int best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[static_cast<size_t>(best)]) best = static_cast<int>(i);
  return best;
}

PositionDelta compare_position(std::span<const float> ref_lp, int ref_top1, std::span<const float> arm_lp,
                               int arm_top1, int token) {
  if (ref_lp.size() != arm_lp.size()) throw std::runtime_error("compare_position: vocabulary sizes differ");
  PositionDelta d;
  double kl = 0.0;
  for (size_t v = 0; v < ref_lp.size(); ++v) {
    const double lp = ref_lp[v], lq = arm_lp[v];
    if (lp == lq) continue;  // exact zero term (also avoids -inf - -inf)
    kl += std::exp(lp) * (lp - lq);
  }
  d.kld = finite(kl, "KL divergence");
  d.nll_ref = -static_cast<double>(ref_lp[static_cast<size_t>(token)]);
  d.nll_arm = -static_cast<double>(arm_lp[static_cast<size_t>(token)]);
  finite(d.nll_ref, "reference NLL");
  finite(d.nll_arm, "arm NLL");
  d.p_ref = std::exp(-d.nll_ref);
  d.p_arm = std::exp(-d.nll_arm);
  d.top1_same = ref_top1 == arm_top1;
  return d;
}

void ArmSamples::add(const PositionDelta& d, int position, int document) {
  kld.push_back(d.kld);
  nll.push_back(d.nll_arm);
  dnll.push_back(d.nll_arm - d.nll_ref);
  dp.push_back(d.p_arm - d.p_ref);
  top1_same.push_back(d.top1_same ? 1 : 0);
  pos.push_back(position);
  doc.push_back(document);
}

namespace {

double pct_from_dnll(double mean_dnll) { return 100.0 * std::expm1(mean_dnll); }

json interval_json(const Interval& iv) { return json::array({finite(iv.lo, "CI"), finite(iv.hi, "CI")}); }

}  // namespace

json summarize_arm(const ArmSamples& s, const std::vector<std::string>& doc_names, const CompareStatsOptions& o) {
  const size_t n = s.size();
  if (n == 0) throw InputError("eval compare: no positions were scored (documents need at least 2 tokens)");
  json j;
  j["name"] = s.name;
  j["n_positions"] = n;
  double sum_nll = 0, sum_dnll = 0, sum_kld = 0, sum_dp2 = 0;
  uint64_t agree = 0;
  for (size_t i = 0; i < n; ++i) {
    sum_nll += s.nll[i];
    sum_dnll += s.dnll[i];
    sum_kld += s.kld[i];
    sum_dp2 += s.dp[i] * s.dp[i];
    agree += s.top1_same[i];
  }
  const double dn = static_cast<double>(n);
  j["ppl"] = finite(std::exp(sum_nll / dn), "perplexity");
  j["mean_nll"] = finite(sum_nll / dn, "mean NLL");
  j["mean_dnll"] = finite(sum_dnll / dn, "mean dNLL");
  j["ppl_delta_pct"] = finite(pct_from_dnll(sum_dnll / dn), "PPL delta");
  j["top1_agree"] = static_cast<double>(agree) / dn;
  j["rms_dp"] = finite(std::sqrt(sum_dp2 / dn), "RMS dp");

  std::vector<double> sorted = s.kld;
  std::sort(sorted.begin(), sorted.end());
  json kld;
  kld["mean"] = finite(sum_kld / dn, "KLD mean");
  kld["median"] = percentile_sorted(sorted, 50);
  kld["p90"] = percentile_sorted(sorted, 90);
  kld["p99"] = percentile_sorted(sorted, 99);
  kld["p999"] = percentile_sorted(sorted, 99.9);
  kld["max"] = sorted.back();
  json qs = json::array();
  for (double q : {0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.99, 100.0})
    qs.push_back({{"q", q}, {"value", percentile_sorted(sorted, q)}});
  kld["quantiles"] = qs;

  // Per-document sums: the unit of the sign-flip test and the cluster bootstrap.
  const size_t nd = doc_names.size();
  std::vector<double> d_nll(nd, 0), d_dnll(nd, 0), d_kld(nd, 0);
  std::vector<uint64_t> d_n(nd, 0);
  for (size_t i = 0; i < n; ++i) {
    const auto d = static_cast<size_t>(s.doc[i]);
    d_nll[d] += s.nll[i];
    d_dnll[d] += s.dnll[i];
    d_kld[d] += s.kld[i];
    ++d_n[d];
  }
  std::vector<uint32_t> scored_docs;
  json docs = json::array();
  std::vector<double> doc_mean_dnll;
  for (size_t d = 0; d < nd; ++d) {
    if (d_n[d] == 0) continue;
    scored_docs.push_back(static_cast<uint32_t>(d));
    const double m = d_dnll[d] / static_cast<double>(d_n[d]);
    doc_mean_dnll.push_back(m);
    docs.push_back({{"name", doc_names[d]},
                    {"n", d_n[d]},
                    {"ppl", finite(std::exp(d_nll[d] / static_cast<double>(d_n[d])), "document PPL")},
                    {"ppl_delta_pct", finite(pct_from_dnll(m), "document PPL delta")},
                    {"kld_mean", finite(d_kld[d] / static_cast<double>(d_n[d]), "document KLD")}});
  }
  j["documents"] = docs;
  const SignFlip sf = sign_flip_test(doc_mean_dnll, o.seed, o.mc_resamples);
  j["doc_sign_flip"] = {{"statistic", "mean over documents of the per-document mean dNLL (log PPL ratio)"},
                        {"n_docs", doc_mean_dnll.size()},
                        {"n_worse", sf.n_pos},
                        {"n_better", sf.n_neg},
                        {"p_value", sf.p_value},
                        {"exact", sf.exact},
                        {"resamples", sf.resamples}};

  // Cluster (document) bootstrap of pooled statistics.
  const auto nsd = static_cast<uint32_t>(scored_docs.size());
  const auto idx = bootstrap_indices(nsd, o.bootstrap_resamples, o.seed ^ 0x5eedb007ull);
  auto pooled = [&](const std::vector<double>& num) {
    return [&, num_ptr = &num](std::span<const uint32_t> ii) {
      double a = 0, b = 0;
      for (uint32_t k : ii) {
        a += (*num_ptr)[scored_docs[k]];
        b += static_cast<double>(d_n[scored_docs[k]]);
      }
      return a / b;
    };
  };
  Interval dnll_ci = bootstrap_interval(nsd, pooled(d_dnll), idx, o.ci_level);
  j["ppl_delta_pct_ci"] = json::array({finite(pct_from_dnll(dnll_ci.lo), "CI"), finite(pct_from_dnll(dnll_ci.hi), "CI")});
  kld["mean_ci"] = interval_json(bootstrap_interval(nsd, pooled(d_kld), idx, o.ci_level));
  j["kld"] = kld;
  j["ci"] = {{"level", o.ci_level}, {"method", "percentile bootstrap over documents"},
             {"resamples", o.bootstrap_resamples}, {"seed", o.seed}};

  json buckets = json::array();
  for (size_t b = 0; b < o.buckets.size(); ++b) {
    const int lo = o.buckets[b];
    const bool last = b + 1 == o.buckets.size();
    const int hi = last ? std::numeric_limits<int>::max() : o.buckets[b + 1];
    uint64_t bn = 0, bagree = 0;
    double bd = 0, bk = 0, bnll = 0;
    for (size_t i = 0; i < n; ++i) {
      if (s.pos[i] < lo || s.pos[i] >= hi) continue;
      ++bn;
      bd += s.dnll[i];
      bk += s.kld[i];
      bnll += s.nll[i];
      bagree += s.top1_same[i];
    }
    json e{{"lo", lo}, {"hi", last ? json(nullptr) : json(hi)}, {"n", bn}};
    if (bn > 0) {
      const double dbn = static_cast<double>(bn);
      e["dnll_pct"] = finite(pct_from_dnll(bd / dbn), "bucket dNLL");
      e["mean_dnll"] = finite(bd / dbn, "bucket dNLL");
      e["ppl"] = finite(std::exp(bnll / dbn), "bucket PPL");
      e["top1_agree"] = static_cast<double>(bagree) / dbn;
      e["kld_mean"] = finite(bk / dbn, "bucket KLD");
    } else {
      e["dnll_pct"] = nullptr;  // empty bucket: no estimate (never NaN)
      e["mean_dnll"] = nullptr;
      e["ppl"] = nullptr;
      e["top1_agree"] = nullptr;
      e["kld_mean"] = nullptr;
    }
    buckets.push_back(e);
  }
  j["buckets"] = buckets;
  return j;
}

std::vector<std::vector<int>> cut_chunks(const std::vector<int>& ids, int context) {
  if (context < 2) throw InputError(fmt::format("context {} is too small (need at least 2 tokens)", context));
  std::vector<std::vector<int>> out;
  for (size_t i = 0; i < ids.size(); i += static_cast<size_t>(context)) {
    const size_t end = std::min(ids.size(), i + static_cast<size_t>(context));
    if (end - i < 2) break;
    out.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return out;
}

json run_compare(const CompareInput& in, const CompareProgress& progress) {
  if (in.arms.empty()) throw InputError("eval compare: no arms");
  if (in.docs.size() != in.doc_names.size()) throw std::invalid_argument("run_compare: doc_names size mismatch");
  // Engines first: a bad arm fails before any work.
  std::vector<std::unique_ptr<Engine>> engines;
  for (const auto& a : in.arms) engines.push_back(load_arm_engine(a, in.model_dir, in.engine));
  Engine& ref = *engines[0];
  const int max_len = ref.max_model_len();
  int context = in.context > 0 ? in.context : std::min(max_len, 4096);
  if (context > max_len) throw InputError(fmt::format("--context {} exceeds max_model_len {}", context, max_len));
  const int P = static_cast<int>(in.control_prefix.size());
  if (in.control) {
    if (P == 0) throw InputError("--control: the control prefix is empty");
    if (context - P < 2)
      throw InputError(fmt::format("--control: prefix of {} tokens leaves no room in a context of {}", P, context));
    context -= P;  // every arm scores the same chunks; the control pass fits
  }
  const int vocab = ref.config().vocab_size;
  std::vector<std::vector<std::vector<int>>> chunks;
  uint64_t total = 0;
  for (const auto& d : in.docs) {
    chunks.push_back(cut_chunks(d, context));
    for (const auto& c : chunks.back()) total += c.size() * (in.arms.size() + (in.control ? 1 : 0));
  }
  if (total == 0) throw InputError("eval compare: no chunk of at least 2 tokens to score");

  std::vector<ArmSamples> samples(in.arms.size());
  for (size_t a = 0; a < in.arms.size(); ++a) samples[a].name = in.arms[a].name;
  ArmSamples control;
  control.name = "control";

  std::vector<float> ref_lp, scratch(static_cast<size_t>(vocab));
  std::vector<int> ref_top1;
  uint64_t done = 0;
  for (size_t d = 0; d < chunks.size(); ++d) {
    for (const auto& c : chunks[d]) {
      const int T = static_cast<int>(c.size());
      const size_t row = static_cast<size_t>(vocab);
      ref_lp.assign(static_cast<size_t>(T - 1) * row, 0.0f);
      ref_top1.assign(static_cast<size_t>(T - 1), 0);
      ref.score(c, {}, [&](int i, std::span<const float> logits) {
        if (i >= T - 1) return;
        if (logits.size() != row) throw std::runtime_error("eval compare: logits row size != vocab_size");
        log_softmax(logits, std::span<float>(ref_lp.data() + static_cast<size_t>(i) * row, row));
        ref_top1[static_cast<size_t>(i)] = argmax_lowest(logits);
      });
      auto ref_row = [&](int i) { return std::span<const float>(ref_lp.data() + static_cast<size_t>(i) * row, row); };
      // The reference against itself: KLD 0, dNLL 0, agreement 1 (exactly).
      for (int i = 0; i + 1 < T; ++i)
        samples[0].add(compare_position(ref_row(i), ref_top1[i], ref_row(i), ref_top1[i], c[i + 1]), i + 1,
                       static_cast<int>(d));
      done += c.size();
      if (progress) progress(done, total);
      for (size_t a = 1; a < engines.size(); ++a) {
        engines[a]->score(c, {}, [&](int i, std::span<const float> logits) {
          if (i >= T - 1) return;
          log_softmax(logits, scratch);
          samples[a].add(compare_position(ref_row(i), ref_top1[i], scratch, argmax_lowest(logits), c[i + 1]),
                         i + 1, static_cast<int>(d));
        });
        done += c.size();
        if (progress) progress(done, total);
      }
      if (in.control) {
        // Control pass: the reference configuration with the prefix inserted
        // (after a leading special token such as BOS); token i of the chunk
        // (i >= 1) sits at P + i in the control sequence.
        std::vector<int> seq;
        const bool keep_first = in.is_special && in.is_special(c[0]);
        if (keep_first) seq.push_back(c[0]);
        seq.insert(seq.end(), in.control_prefix.begin(), in.control_prefix.end());
        seq.insert(seq.end(), c.begin() + (keep_first ? 1 : 0), c.end());
        ref.score(seq, {}, [&](int j, std::span<const float> logits) {
          const int i = j - P + 1;  // chunk index of the predicted token
          if (i < 1 || i > T - 1) return;
          log_softmax(logits, scratch);
          control.add(compare_position(ref_row(i - 1), ref_top1[i - 1], scratch, argmax_lowest(logits), c[i]), i,
                      static_cast<int>(d));
        });
        done += c.size();
        if (progress) progress(done, total);
      }
    }
  }

  json report;
  report["model"] = in.model_dir.string();
  report["reference"] = in.arms[0].name;
  report["context"] = context;
  report["buckets"] = in.stats.buckets;
  report["documents"] = in.doc_names;
  json arms = json::array();
  arms.push_back(summarize_arm(samples[0], in.doc_names, in.stats));
  if (in.control) {
    json cj = summarize_arm(control, in.doc_names, in.stats);
    cj["control_prefix_tokens"] = in.control_prefix;
    arms.push_back(cj);
  }
  for (size_t a = 1; a < samples.size(); ++a) arms.push_back(summarize_arm(samples[a], in.doc_names, in.stats));
  for (size_t a = 0; a < in.arms.size(); ++a) {
    for (auto& j : arms) {
      if (j["name"] != in.arms[a].name) continue;
      j["kv_cache_dtype"] = std::string(kv_dtype_name(in.arms[a].dtype));
      j["scales"] = in.arms[a].dtype == KvDtype::bf16               ? "none"
                    : kv_dtype_per_token_head(in.arms[a].dtype)     ? "per token head"
                    : in.arms[a].scales == ArmSpec::Scales::unity ? "unity"
                    : in.arms[a].scales == ArmSpec::Scales::dir   ? "dir:" + in.arms[a].scales_dir.string()
                                                                  : "checkpoint";
    }
  }
  if (in.control) {
    arms[1]["kv_cache_dtype"] = std::string(kv_dtype_name(in.arms[0].dtype));
    arms[1]["scales"] = "as reference";
  }
  // Noise-floor comparison: per document, is the arm's |log PPL delta| larger
  // than the control's? (sign-flip on |arm| - |control|)
  if (in.control) {
    const json& cj = arms[1];
    for (size_t k = 2; k < arms.size(); ++k) {
      std::vector<double> diff;
      for (size_t d = 0; d < arms[k]["documents"].size(); ++d) {
        const double a = std::log1p(arms[k]["documents"][d]["ppl_delta_pct"].get<double>() / 100.0);
        const double c = std::log1p(cj["documents"][d]["ppl_delta_pct"].get<double>() / 100.0);
        diff.push_back(std::fabs(a) - std::fabs(c));
      }
      const SignFlip sf = sign_flip_test(diff, in.stats.seed, in.stats.mc_resamples);
      arms[k]["vs_control"] = {{"statistic", "mean over documents of |log PPL ratio arm| - |log PPL ratio control|"},
                               {"mean", sf.mean}, {"p_value", sf.p_value}, {"exact", sf.exact}};
    }
  }
  report["arms"] = arms;
  return report;
}

}  // namespace fp8kv::eval
