// `fp8kv eval compare | kvstats | niah`: paired accuracy evaluation of KV
// cache configurations (src/eval/, docs/eval.md). stdout carries the result
// (JSON); tables and progress go to stderr. Exit: 0 ok, 2 bad input, 1 internal.
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/text_input.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "eval/compare.h"
#include "eval/kvstats.h"
#include "eval/niah.h"
#include "eval/report_html.h"
#include "io/errors.h"
#include "io/fs_util.h"
#include "io/host_memory.h"
#include "io/text_table.h"
#include "io/user_files.h"
#include "kv/planner.h"
#include "numerics/version.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::cli {
namespace {

using nlohmann::json;

// Documents from --text-file (tokenized, special tokens as the tokenizer adds
// them) and --token-ids-file (an array of ids or an array of arrays).
struct Docs {
  std::vector<std::vector<int>> ids;
  std::vector<std::string> names;
};
Docs read_docs(const std::string& model, const std::vector<std::string>& text_files,
               const std::vector<std::string>& ids_files, const Tokenizer* tok, int vocab) {
  Docs d;
  for (const auto& f : text_files) {
    if (!tok) throw InputError(fmt::format("{}: no tokenizer in {} to tokenize --text-file", f, model));
    d.ids.push_back(tok->encode(read_text_option_file(f, "--text-file")));
    d.names.push_back(f);
  }
  for (const auto& f : ids_files) {
    const json j = parse_json_option_file(f, "--token-ids-file");
    if (!j.is_array()) throw InputError(fmt::format("{}: expected an array of token ids or of arrays", f));
    const bool nested = !j.empty() && j[0].is_array();
    const json arr = nested ? j : json::array({j});
    for (size_t s = 0; s < arr.size(); ++s) {
      if (!arr[s].is_array()) throw InputError(fmt::format("{}: item {} is not an array", f, s));
      std::vector<int> ids;
      for (size_t i = 0; i < arr[s].size(); ++i) {
        const auto& v = arr[s][i];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
          throw InputError(fmt::format("{}: sequence {} item {} is not a token id in [0, {})", f, s, i, vocab));
        ids.push_back(v.get<int>());
      }
      d.ids.push_back(std::move(ids));
      d.names.push_back(nested ? fmt::format("{}#{}", f, s) : f);
    }
  }
  if (d.ids.empty()) throw UsageError("give --text-file FILE (or --token-ids-file IDS.json)");
  return d;
}

std::unique_ptr<Tokenizer> try_tokenizer(const std::filesystem::path& path, bool required) {
  if (!required && !std::filesystem::exists(std::filesystem::is_directory(path) ? path / "tokenizer.json" : path))
    return nullptr;
  return Tokenizer::load(path);
}

// A comma-separated list of ints in [min, max] (io/user_files.h parses it).
std::vector<int> int_list(const std::string& csv, const char* option, int min, int max) {
  std::vector<int> out;
  for (int64_t v : parse_int_list(csv, option, min, max)) out.push_back(static_cast<int>(v));
  return out;
}

void write_json(const std::string& path, const json& j) { atomic_write_file(path, dump_json(j) + "\n"); }

// ---- compare ----
struct CompareArgs {
  std::string model, arms = "bf16,fp8", buckets = "0,512,1024,2048,4096", output, html,
                     control_prefix = "[control]\n";
  std::vector<std::string> text_files, ids_files;
  int context = 0, bootstrap = 2000;
  bool control = false;
  uint64_t seed = 0;
  EngineFlags eng;
};

// The cluster bootstrap keeps each resample's document indices and its
// statistic: resamples x (24 + 4 x documents + 8) bytes (eval/stats.h
// bootstrap_indices, bootstrap_interval). Refused by that arithmetic, before
// any scoring, when it exceeds half of what this process may use (issue 37:
// --bootstrap 2000000000 ended in the out-of-memory message about --kv-memory).
void check_bootstrap_memory(int resamples, size_t documents) {
  const HostMemoryLimit mem = host_memory_limit();
  if (mem.bytes == 0 || resamples <= 0) return;
  const uint64_t per = 24 + 4 * static_cast<uint64_t>(documents) + 8;
  const unsigned __int128 need = static_cast<unsigned __int128>(resamples) * per;
  const uint64_t allowed = mem.bytes / 2;
  if (need <= allowed) return;
  const auto need_b = static_cast<uint64_t>(need);  // resamples < 2^31, per < 2^40: fits
  throw UsageError(fmt::format(
      "--bootstrap {}: {} resamples x (24 + 4 x {} documents + 8) bytes = {} ({} bytes) of resample indices and "
      "statistics, more than half of {} ({}); use at most --bootstrap {} (the default is 2000)",
      resamples, resamples, documents, format_bytes(need_b), need_b, mem.what, format_bytes(mem.bytes),
      allowed / per));
}

int run_compare_cmd(const CompareArgs& a) {
  // Output paths are checked before the (long) computation.
  if (!a.output.empty()) check_output_file(a.output, "--output");
  if (!a.html.empty()) check_output_file(a.html, "--html");
  eval::CompareInput in;
  in.model_dir = a.model;
  in.engine = a.eng.options();
  in.arms = eval::parse_arms(a.arms);
  in.stats.buckets = eval::parse_buckets(a.buckets);
  in.stats.seed = a.seed;
  if (a.bootstrap < eval::kMinBootstrapResamples || a.bootstrap > eval::kMaxBootstrapResamples)
    throw UsageError(fmt::format("--bootstrap {}: give {} to {} resamples (the default is 2000; the bootstrap's time "
                                 "grows with resamples x documents, docs/eval.md \"Bootstrap bounds\")",
                                 a.bootstrap, eval::kMinBootstrapResamples, eval::kMaxBootstrapResamples));
  in.stats.bootstrap_resamples = a.bootstrap;
  in.context = a.context;
  const ModelConfig cfg = load_model_config(a.model);
  auto tok = try_tokenizer(a.eng.tokenizer_path(a.model), !a.text_files.empty());
  Docs docs = read_docs(a.model, a.text_files, a.ids_files, tok.get(), cfg.vocab_size);
  in.docs = std::move(docs.ids);
  in.doc_names = std::move(docs.names);
  check_bootstrap_memory(a.bootstrap, in.docs.size());
  in.control = a.control;
  if (a.control) {
    if (!tok) throw InputError(fmt::format("--control: no tokenizer in {} for the control prefix", a.model));
    in.control_prefix = tok->encode(a.control_prefix, /*add_special_tokens=*/false);
    in.is_special = [t = tok.get()](int id) { return t->is_special(id); };
  }
  Progress progress("compare");
  json report = eval::run_compare(in, std::ref(progress));
  report["fp8kv_version"] = version_string();
  if (a.control) report["control_prefix"] = a.control_prefix;

  TextTable table({{"arm", 22, TextTable::Align::left}, {"PPL", 10}, {"dPPL %", 10}, {"KLD mean", 10}, {"KLD p99", 10},
                   {"RMS dp %", 10}, {"top-1 %", 8}});
  for (const auto& arm : report["arms"])
    table.add_row({arm["name"].get<std::string>(), fmt::format("{:.4f}", arm["ppl"].get<double>()),
                   fmt::format("{:+.4f}", arm["ppl_delta_pct"].get<double>()),
                   fmt::format("{:.3g}", arm["kld"]["mean"].get<double>()),
                   fmt::format("{:.3g}", arm["kld"]["p99"].get<double>()),
                   fmt::format("{:.4f}", 100.0 * arm["rms_dp"].get<double>()),
                   fmt::format("{:.3f}", 100.0 * arm["top1_agree"].get<double>())});
  std::fputs(table.str().c_str(), stderr);
  if (!a.html.empty()) atomic_write_file(a.html, eval::compare_report_html(report));
  if (a.output.empty()) {
    std::printf("%s\n", dump_json(report).c_str());
    return 0;
  }
  write_json(a.output, report);
  json out{{"fp8kv_version", version_string()}, {"output", a.output}, {"reference", report["reference"]}};
  if (!a.html.empty()) out["html"] = a.html;
  json arms = json::array();
  for (const auto& arm : report["arms"])
    arms.push_back({{"name", arm["name"]}, {"ppl", arm["ppl"]}, {"ppl_delta_pct", arm["ppl_delta_pct"]},
                    {"kld_mean", arm["kld"]["mean"]}, {"top1_agree", arm["top1_agree"]}});
  out["arms"] = arms;
  std::printf("%s\n", dump_json(out).c_str());
  return 0;
}

// ---- kvstats ----
struct KvStatsArgs {
  std::string model, scales = "checkpoint", target = "fp8_e4m3", output, kv_cache_dtype = "bf16";
  std::vector<std::string> text_files, ids_files;
  int context = 0;
  EngineFlags eng;
};

int run_kvstats_cmd(const KvStatsArgs& a) {
  if (!a.output.empty()) check_output_file(a.output, "--output");
  const KvDtype target = parse_kv_dtype_flag(a.target, "--target");
  if (target == KvDtype::bf16)
    throw UsageError("--target: expected fp8_e4m3, fp8_e5m2, fp8_per_token_head or int8_per_token_head");
  EngineOptions eo = a.eng.options();
  eo.kv_cache_dtype = parse_kv_cache_dtype_flag(a.kv_cache_dtype);
  auto engine = Engine::load(a.model, eo);
  if (!engine) return 0;  // a multi-process follower: rank 0 did the work (Engine::load)
  const ModelConfig& cfg = engine->config();
  std::unique_ptr<KvScales> ck;
  if (a.scales == "checkpoint" && !kv_dtype_per_token_head(target)) {  // a per-token-head target takes no scales
    eval::ArmSpec arm = eval::parse_arm("fp8");
    ck = std::make_unique<KvScales>(eval::arm_scales(arm, a.model, cfg));
  }
  eval::KvStatsObserver obs(kv_dtype_per_token_head(target) ? KvScales::unity(cfg.num_layers)
                                                             : eval::kvstats_scales(a.scales, cfg.num_layers, ck.get()),
                            target);
  auto tok = try_tokenizer(a.eng.tokenizer_path(a.model), !a.text_files.empty());
  Docs docs = read_docs(a.model, a.text_files, a.ids_files, tok.get(), cfg.vocab_size);
  const int context = a.context > 0 ? a.context : std::min(engine->max_model_len(), 4096);
  if (context > engine->max_model_len())
    throw UsageError(fmt::format("--context {} exceeds max_model_len {}", context, engine->max_model_len()));
  std::vector<std::vector<int>> chunks;
  uint64_t total = 0;
  for (const auto& d : docs.ids)
    for (auto& c : eval::cut_chunks(d, context)) {
      total += c.size();
      chunks.push_back(std::move(c));
    }
  if (chunks.empty()) throw InputError("eval kvstats: no chunk of at least 2 tokens");
  engine->set_store_observer(&obs);
  Progress progress("kvstats");
  uint64_t done = 0;
  for (const auto& c : chunks) {
    engine->score(c);
    done += c.size();
    progress(done, total);
  }
  engine->set_store_observer(nullptr);
  json j = obs.to_json(cfg);
  j["fp8kv_version"] = version_string();
  j["model"] = a.model;
  j["scales"] = kv_dtype_per_token_head(target) ? std::string("per token head") : a.scales;
  j["kv_cache_dtype"] = std::string(engine->kv_dtype() == KvDtype::bf16 ? "bf16" : kv_dtype_name(engine->kv_dtype()));
  j["tokens"] = total;
  j["documents"] = docs.names;
  std::fputs(obs.table(cfg).c_str(), stderr);
  if (a.output.empty()) {
    std::printf("%s\n", dump_json(j).c_str());
    return 0;
  }
  write_json(a.output, j);
  json out{{"fp8kv_version", version_string()}, {"output", a.output}, {"tokens", total}};
  json clipping = json::array();
  for (const auto& l : j["layers"])
    if (l["clipped"].get<uint64_t>() > 0) clipping.push_back({{"layer", l["layer"]}, {"stream", l["stream"]},
                                                              {"clip_frac", l["clip_frac"]}});
  out["clipping"] = clipping;
  std::printf("%s\n", dump_json(out).c_str());
  return 0;
}

// ---- niah ----
struct NiahArgs {
  std::string model, haystack, lengths = "1024,2048,4096", depths = "10,50,90", arms = "bf16,fp8", output;
  int trials = 5;
  uint64_t seed = 0;
  EngineFlags eng;
};

int run_niah_cmd(const NiahArgs& a) {
  eval::NiahOptions o;
  if (!a.output.empty()) check_output_file(a.output, "--output");
  o.lengths = int_list(a.lengths, "--lengths", 1, std::numeric_limits<int>::max());
  o.depths = int_list(a.depths, "--depths", 0, 100);
  o.trials = a.trials;
  o.seed = a.seed;
  const auto arms = eval::parse_arms(a.arms);
  // The limit every arm's engine will have: --max-model-len, else the model's.
  {
    const ModelConfig cfg = load_model_config(a.model);
    KvPlanSettings given;
    given.max_model_len = a.eng.max_model_len;
    o.max_model_len = a.eng.max_model_len > 0 ? a.eng.max_model_len : model_max_len(cfg);
    o.max_model_len_origin = max_model_len_origin(cfg, given);
  }
  auto tok = Tokenizer::load(a.eng.tokenizer_path(a.model));
  const auto prompts = eval::build_niah_prompts(*tok, read_text_option_file(a.haystack, "--haystack"), o);
  Progress progress("niah");
  json j = eval::run_niah(a.model, a.eng.options(), arms, *tok, prompts, o, std::ref(progress));
  j["fp8kv_version"] = version_string();
  j["model"] = a.model;
  j["haystack"] = a.haystack;
  std::vector<TextTable::Column> cols{{"length", 8, TextTable::Align::left}, {"depth", 6, TextTable::Align::left}};
  for (const auto& arm : arms) cols.push_back({arm.name, 12});
  TextTable table(std::move(cols));
  const size_t ncell = j["cells"].size() / arms.size();
  for (size_t c = 0; c < ncell; ++c) {
    std::vector<std::string> row{std::to_string(j["cells"][c]["length"].get<int>()),
                                 std::to_string(j["cells"][c]["depth"].get<int>())};
    for (size_t k = 0; k < arms.size(); ++k) {
      const auto& e = j["cells"][k * ncell + c];
      row.push_back(fmt::format("{}/{}", e["correct"].get<int>(), e["trials"].get<int>()));
    }
    table.add_row(std::move(row));
  }
  std::fputs(table.str().c_str(), stderr);
  for (const auto& m : j["mcnemar"])
    std::fprintf(stderr, "McNemar %s vs %s: only_a %llu, only_b %llu, p = %.4g\n", m["a"].get<std::string>().c_str(),
                 m["b"].get<std::string>().c_str(), static_cast<unsigned long long>(m["only_a"].get<uint64_t>()),
                 static_cast<unsigned long long>(m["only_b"].get<uint64_t>()), m["p_value"].get<double>());
  if (!a.output.empty()) write_json(a.output, j);
  std::printf("%s\n", dump_json(j).c_str());
  return 0;
}

// The model positional and the --text-file / --token-ids-file inputs that
// compare and kvstats take.
template <class Args>
void add_model_and_inputs(CLI::App* sub, Args& a) {
  sub->add_option("model", a.model, "model directory")->required();
  sub->add_option("--text-file", a.text_files, "document (repeatable)");
  sub->add_option("--token-ids-file", a.ids_files, "JSON array of ids or of arrays (repeatable)");
}

// An eval subcommand whose arguments (Args: .eng) live for the program: its
// own options (add_own(sub, args)), then the engine flags; run(args) is its
// action.
template <class Args, class Run, class AddOwn>
void add_eval_command(CLI::App* ev, const char* name, const char* about, Run run, AddOwn&& add_own) {
  static Args args;
  auto* sub = ev->add_subcommand(name, about);
  add_own(sub, args);
  args.eng.add(sub, EngineFlags::Shape{false, 1});
  set_action(sub, [run] { return run(args); });
}

const Registrar reg_eval([](CLI::App& app) {
  auto* ev = app.add_subcommand("eval", "Paired accuracy evaluation of KV cache configurations (docs/eval.md)");
  ev->require_subcommand(1);

  add_eval_command<CompareArgs>(ev, "compare", "Teacher-forced per-position comparison of arms against a reference",
                                run_compare_cmd, [](CLI::App* sub, CompareArgs& a) {
    add_model_and_inputs(sub, a);
    sub->add_option("--arms", a.arms,
                    "bf16, fp8, fp8:unity, fp8:scales=DIR, fp8_e5m2, fp8_per_token_head, int8_per_token_head (first = "
                    "reference)");
    sub->add_option("--context", a.context, "tokens per scored chunk (default min(max_model_len, 4096))")
        ->check(at_least(2));
    sub->add_option("--buckets", a.buckets, "position bucket edges (last bucket open-ended)");
    sub->add_flag("--control", a.control, "add a control pass: the reference with a short prefix (noise floor)");
    sub->add_option("--control-prefix", a.control_prefix, "text of the control prefix")->check(utf8_text());
    sub->add_option("--seed", a.seed, "seed of the bootstrap / Monte Carlo draws (default 0; -1: random, logged)")
        ->transform(seed_rule());
    sub->add_option("--bootstrap", a.bootstrap, "bootstrap resamples, 100 to 100000 (default 2000)");
    sub->add_option("--output", a.output, "REPORT.json (else the report goes to stdout)");
    sub->add_option("--html", a.html, "REPORT.html");
  });

  add_eval_command<KvStatsArgs>(ev, "kvstats", "Q/K/V range statistics at the store point, per layer and stream",
                                run_kvstats_cmd, [](CLI::App* sub, KvStatsArgs& a) {
    add_model_and_inputs(sub, a);
    sub->add_option("--scales", a.scales, "unity | checkpoint | VALUE (every stream)");
    sub->add_option("--target", a.target, "fp8_e4m3 | fp8_e5m2 | fp8_per_token_head | int8_per_token_head");
    sub->add_option("--context", a.context, "tokens per chunk (default min(max_model_len, 4096))")->check(at_least(2));
    sub->add_option("--kv-cache-dtype", a.kv_cache_dtype, "cache the run itself uses (default bf16)");
    sub->add_option("--output", a.output, "STATS.json (else the stats go to stdout)");
  });

  add_eval_command<NiahArgs>(ev, "niah", "Paired needle-in-a-haystack retrieval with exact McNemar tests",
                             run_niah_cmd, [](CLI::App* sub, NiahArgs& a) {
    sub->add_option("model", a.model, "model directory")->required();
    sub->add_option("--haystack", a.haystack, "haystack text file")->required();
    sub->add_option("--lengths", a.lengths, "prompt lengths in tokens");
    sub->add_option("--depths", a.depths, "needle depths in percent");
    sub->add_option("--trials", a.trials, "trials per cell");
    sub->add_option("--arms", a.arms, "arms (as compare)");
    sub->add_option("--seed", a.seed, "seed of the passkeys (default 0; -1: random, logged)")->transform(seed_rule());
    sub->add_option("--output", a.output, "NIAH.json");
  });
});

}  // namespace
}  // namespace fp8kv::cli
