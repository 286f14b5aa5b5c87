// `fp8kv score MODEL_DIR (--token-ids-file IDS.json | --text-file FILE
// [--context N]) --output OUT.json`: teacher-forced per-token logprobs and
// top-1 ids (docs/design.md "Command line" has the output format).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/progress.h"
#include "cli/text_input.h"
#include "engine/engine.h"
#include "io/errors.h"
#include "io/fs_util.h"
#include "io/user_files.h"
#include "numerics/version.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ScoreArgs {
  std::string model;
  std::string ids_file, text_file, output;
  int context = 0;
  int chunk_size = 0;
  EngineFlags engine;
};

std::vector<std::vector<int>> read_ids_file(const std::string& path) {
  json j = parse_json_option_file(path, "--token-ids-file");
  // `fp8kv tokenize`'s own output, {"ids": [...]}, is accepted as it is.
  if (j.is_object()) {
    if (!j.contains("ids") || j.size() != (j.contains("fp8kv_version") ? 2u : 1u))
      throw InputError(path + ": expected a JSON array of token ids (or of arrays), or {\"ids\": [...]} as "
                              "`fp8kv tokenize` prints");
    json ids = std::move(j["ids"]);
    j = std::move(ids);
  }
  auto ids_of = [&](const json& a, const std::string& where) {
    if (!a.is_array()) throw InputError(fmt::format("{}: {} must be an array of token ids", path, where));
    std::vector<int> out;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number_integer())
        throw InputError(fmt::format("{}: {}[{}] is not an integer token id", path, where, i));
      const int64_t v = a[i].get<int64_t>();
      if (v < 0 || v > INT32_MAX) throw InputError(fmt::format("{}: {}[{}] = {} is not a token id", path, where, i, v));
      out.push_back(static_cast<int>(v));
    }
    if (out.empty()) throw InputError(fmt::format("{}: {} is empty", path, where));
    // The first token has no prediction: one token leaves nothing to score
    // (as a one-token --text-file).
    if (out.size() < 2)
      throw InputError(fmt::format("{}: {} has 1 token; scoring needs at least 2 (the first is only context)", path,
                                   where));
    return out;
  };
  if (!j.is_array() || j.empty()) throw InputError(path + ": expected a JSON array of token ids or of arrays of ids");
  std::vector<std::vector<int>> seqs;
  if (j[0].is_array()) {
    for (size_t i = 0; i < j.size(); ++i) seqs.push_back(ids_of(j[i], fmt::format("sequence {}", i)));
  } else {
    seqs.push_back(ids_of(j, "the array"));
  }
  return seqs;
}

int run_score(const ScoreArgs& a) {
  if (a.ids_file.empty() == a.text_file.empty()) throw UsageError("give exactly one of --token-ids-file and --text-file");
  if (!a.ids_file.empty() && a.context != 0) throw UsageError("--context applies to --text-file only");
  check_output_file(a.output, "--output");
  auto engine = Engine::load(a.model, a.engine.options());
  if (!engine) return 0;  // a multi-process follower: rank 0 did the work (Engine::load)
  const int max_len = engine->max_model_len();

  std::vector<std::vector<int>> seqs;
  if (!a.ids_file.empty()) {
    seqs = read_ids_file(a.ids_file);
  } else {
    const int n = a.context > 0 ? a.context : std::min(max_len, 4096);
    if (n < 2) throw InputError(fmt::format("max_model_len {} leaves chunks of under 2 tokens: nothing to score", max_len));
    if (n > max_len) throw InputError(fmt::format("--context {} exceeds max_model_len {}", n, max_len));
    auto tok = Tokenizer::load(a.engine.tokenizer_path(a.model));
    const std::vector<int> ids = tok->encode(read_text_option_file(a.text_file, "--text-file"), true);
    for (size_t s = 0; s < ids.size(); s += static_cast<size_t>(n)) {
      const size_t e = std::min(ids.size(), s + static_cast<size_t>(n));
      if (e - s >= 2) seqs.emplace_back(ids.begin() + s, ids.begin() + e);
    }
    if (seqs.empty()) throw InputError(a.text_file + ": fewer than 2 tokens to score");
  }
  for (size_t i = 0; i < seqs.size(); ++i)
    if (static_cast<int>(seqs[i].size()) > max_len)
      throw InputError(fmt::format("sequence {} has {} tokens, more than max_model_len {} (use --max-model-len)", i,
                                   seqs[i].size(), max_len));

  json out = {{"fp8kv_version", version_string()},
              {"model", a.model},
              {"kv_cache_dtype", std::string(kv_dtype_name(engine->kv_dtype()))},
              {"sequences", json::array()}};
  ScoreOptions so;
  so.chunk_size = a.chunk_size;
  uint64_t total = 0, done = 0;
  for (const auto& s : seqs) total += s.size();
  Progress progress("score", "tokens");
  // Perplexity over every scored position, with llama-perplexity's
  // uncertainty: PPL x the standard error of the mean negative log-likelihood.
  double nll_sum = 0.0, nll_sq = 0.0;
  uint64_t n = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const ScoreResult r = engine->score(seqs[i], so);
    json lp = json::array(), top = json::array();
    for (size_t p = 0; p < r.token_ids.size(); ++p) {
      lp.push_back(r.logprobs[p] ? json(*r.logprobs[p]) : json(nullptr));
      top.push_back(r.top1_ids[p] ? json(*r.top1_ids[p]) : json(nullptr));
      if (r.logprobs[p]) {
        const double nll = -static_cast<double>(*r.logprobs[p]);
        nll_sum += nll;
        nll_sq += nll * nll;
        ++n;
      }
    }
    out["sequences"].push_back({{"token_ids", r.token_ids}, {"logprobs", lp}, {"top1_ids", top}});
    done += seqs[i].size();
    progress(done, total);
  }
  const double mean = n ? nll_sum / static_cast<double>(n) : 0.0;
  const double var = n > 1 ? std::max(0.0, nll_sq / static_cast<double>(n) - mean * mean) : 0.0;
  const double ppl = std::exp(mean), ppl_err = n > 1 ? ppl * std::sqrt(var / static_cast<double>(n - 1)) : 0.0;
  out["positions"] = n;
  out["ppl"] = ppl;
  out["ppl_stderr"] = ppl_err;
  atomic_write_file(a.output, dump_json(out, -1) + "\n");
  std::printf("PPL = %.4f ± %.4f (%llu positions, %zu sequence%s)\n", ppl, ppl_err, static_cast<unsigned long long>(n),
              seqs.size(), seqs.size() == 1 ? "" : "s");
  return 0;
}

Registrar reg_score([](CLI::App& app) {
  add_model_command<ScoreArgs>(app, "score", "Teacher-forced per-token logprobs and top-1 ids", run_score, [](CLI::App* sub, ScoreArgs& a) {
    sub->add_option("--token-ids-file", a.ids_file, "JSON array of token ids, an array of such arrays, or {\"ids\": [...]} (`fp8kv tokenize` output)");
    sub->add_option("--text-file", a.text_file, "Text to tokenize and score in chunks of --context tokens");
    sub->add_option("--context", a.context, "Tokens per scored chunk of --text-file (default min(max_model_len, 4096))")
        ->check(at_least(2));  // omitted = default; 0 is refused (docs/design.md "One rule per flag")
    sub->add_option("--output", a.output, "Output JSON file")->required();
    sub->add_option("--chunk-size", a.chunk_size, "Prefill chunk in tokens (default: --max-num-batched-tokens)")
        ->check(at_least(1));  // omitted = default; 0 is refused (docs/design.md "One rule per flag")
  });
});

}  // namespace
}  // namespace fp8kv::cli
