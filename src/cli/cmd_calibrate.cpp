// `fp8kv calibrate MODEL_DIR --corpus FILE [--corpus FILE ...] --output REPORT.json`:
// runs the model with a bf16 cache over the corpus, observes Q/K/V at the
// store point and writes per-layer amax, p99.99 and scales (src/calib/,
// docs/kv_scales.md). Exit: 0 complete; 2 bad input or empty corpus / non-finite
// activations (report written with status failed); 1 internal.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "calib/calibrate.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/text_input.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "io/errors.h"
#include "io/fs_util.h"
#include "io/user_files.h"
#include "numerics/version.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::cli {
namespace {

struct CalibrateArgs {
  std::string model, output, rule = "safety:1.3", target = "fp8_e4m3";
  std::vector<std::string> corpus, corpus_ids;
  int context = 0;
  int64_t max_corpus_tokens = 0;
  int64_t min_tokens = static_cast<int64_t>(CalibrateOptions::kDefaultMinCalibrationTokens);
  bool per_head = false;
  EngineFlags engine;
};

// A JSON array of token ids, or an array of such arrays (as `fp8kv score`).
std::vector<std::vector<int>> read_token_ids(const std::string& path, int vocab) {
  const nlohmann::json j = parse_json_option_file(path, "--corpus-ids-file");
  if (!j.is_array()) throw InputError(fmt::format("{}: expected an array of token ids or of arrays", path));
  std::vector<std::vector<int>> out;
  auto one = [&](const nlohmann::json& a, size_t seq) {
    std::vector<int> ids;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number_integer() || a[i].get<int64_t>() < 0 || a[i].get<int64_t>() >= vocab)
        throw InputError(fmt::format("{}: sequence {} item {} is not a token id in [0, {})", path, seq, i, vocab));
      ids.push_back(a[i].get<int>());
    }
    out.push_back(std::move(ids));
  };
  if (!j.empty() && j[0].is_array()) {
    for (size_t s = 0; s < j.size(); ++s) {
      if (!j[s].is_array()) throw InputError(fmt::format("{}: item {} is not an array", path, s));
      one(j[s], s);
    }
  } else {
    one(j, 0);
  }
  return out;
}

// A per-token-head --target: calibration is not needed (docs/design.md
// "Per-token-head KV cache dtypes"). Checked at parse time too, before the
// required options, so that the answer is this and not "--output is required".
std::string pth_refusal(KvDtype d) {
  return fmt::format("{}: calibration is not needed for a per-token-head KV cache (each token's K and V heads are "
                     "scaled when stored); run with --kv-cache-dtype {} directly",
                     kv_dtype_name(d), kv_dtype_name(d));
}

int run_calibrate(const CalibrateArgs& a) {
  CalibrateOptions o;
  try {
    o.target = parse_kv_dtype_flag(a.target, "--target");
  } catch (const UsageError&) {  // list what --target takes, not every --kv-cache-dtype name
    throw UsageError(fmt::format("--target '{}': expected fp8_e4m3 (or fp8) or fp8_e5m2", a.target));
  }
  if (kv_dtype_per_token_head(o.target)) throw UsageError("--target " + pth_refusal(o.target));
  if (!kv_dtype_per_tensor_scaled(o.target)) throw UsageError("--target: expected fp8_e4m3 or fp8_e5m2");
  if (a.corpus.empty() && a.corpus_ids.empty()) throw UsageError("calibrate: give --corpus FILE (or --corpus-ids-file IDS.json)");
  check_output_file(a.output, "--output");  // before the (long) run
  o.rule = ScaleRule::parse(a.rule);
  o.per_head = a.per_head;
  o.min_tokens = static_cast<uint64_t>(a.min_tokens);
  if (a.max_corpus_tokens < 0) throw UsageError("--max-corpus-tokens: expected a positive number");

  EngineOptions eo = a.engine.options();
  eo.kv_cache_dtype = KvDtype::bf16;  // observe unquantized values
  auto engine = Engine::load(a.model, eo);
  if (!engine) return 0;  // a multi-process follower: rank 0 did the work (Engine::load)
  const int context = a.context > 0 ? a.context : std::min(engine->max_model_len(), 4096);
  if (context > engine->max_model_len())
    throw UsageError(fmt::format("--context {} exceeds max_model_len {}", context, engine->max_model_len()));

  std::vector<std::vector<int>> chunks;
  uint64_t budget = static_cast<uint64_t>(a.max_corpus_tokens);
  const bool limited = a.max_corpus_tokens > 0;
  if (!a.corpus.empty()) {
    auto tok = Tokenizer::load(a.engine.tokenizer_path(a.model));
    for (const auto& f : a.corpus) {
      const std::string text = read_text_option_file(f, "--corpus");
      // An empty corpus file would "calibrate" on the BOS token alone.
      if (text.empty()) throw InputError(fmt::format("--corpus {}: empty file (expected text to calibrate on)", f));
      append_chunks(tok->encode(text), context, budget, limited, chunks);
    }
  }
  for (const auto& f : a.corpus_ids) {
    for (const auto& seq : read_token_ids(f, engine->config().vocab_size))
      append_chunks(seq, context, budget, limited, chunks);
  }
  Progress progress("calibrate", "tokens");
  CalibrationReport rep = calibrate(*engine, chunks, o, std::ref(progress));
  rep.model = a.model;
  rep.model_identity = model_identity(engine->config());
  rep.corpus = a.corpus;
  rep.context = context;
  const nlohmann::json j = rep.to_json();
  atomic_write_file(a.output, dump_json(j) + "\n");
  std::fputs(calibration_summary(rep).c_str(), stderr);

  nlohmann::json out;
  out["fp8kv_version"] = version_string();
  out["status"] = j["status"];
  if (!rep.complete) out["reason"] = rep.reason;
  out["output"] = a.output;
  out["tokens_observed"] = rep.tokens_observed;
  nlohmann::json above = nlohmann::json::array();  // V beyond what a unity scale stores
  for (const auto& l : rep.layers)
    for (float v : l.v_scale)
      if (v > 1.0f) {
        above.push_back(l.layer);
        break;
      }
  out["layers_with_v_scale_above_1"] = above;
  std::printf("%s\n", dump_json(out).c_str());
  if (!rep.complete) {
    std::fprintf(stderr, "error: calibration failed: %s (report written to %s with status failed)\n", rep.reason.c_str(),
                 a.output.c_str());
    return rep.tokens_observed == 0 || rep.too_few_tokens || rep.reason.find("non-finite") != std::string::npos ? 2 : 1;
  }
  return 0;
}

const Registrar reg_calibrate([](CLI::App& app) {
  auto args = std::make_shared<CalibrateArgs>();
  CLI::App* sub = app.add_subcommand("calibrate", "measure per-layer Q/K/V ranges at the KV store point and derive scales");
  sub->add_option("model", args->model, "checkpoint directory")->required();
  sub->add_option("--corpus", args->corpus, "text file (repeatable)");
  sub->add_option("--corpus-ids-file", args->corpus_ids, "JSON token ids (array, or array of arrays; repeatable)");
  sub->add_option("--output", args->output, "REPORT.json to write")->required();
  sub->add_option("--rule", args->rule, "safety:M (amax * M / 448 for e4m3, no floor; default safety:1.3) | amax (= safety:1) | modelopt (max(amax / 448, 1))");
  sub->add_option("--context", args->context, "tokens per chunk (default min(max_model_len, 4096))")
      ->check(at_least(2));  // omitted = default; 0 is refused (docs/design.md "One rule per flag")
  sub->add_option("--max-corpus-tokens", args->max_corpus_tokens, "stop after this many tokens (default: all)")
      ->check(at_least(1));  // omitted = all; 0 is refused (docs/design.md "One rule per flag")
  sub->add_option("--min-tokens", args->min_tokens,
                  "fewer observed tokens fail the calibration (status failed, exit 2)")
      ->check(at_least(1));
  sub->add_flag("--per-head", args->per_head, "per-head amax and scales (k/v per KV head, q per query head)");
  sub->add_option("--target", args->target, "fp8_e4m3 (default) | fp8_e5m2")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            for (const auto& n : kv_cache_dtype_names())
              if (n.name == s && n.dtype && kv_dtype_per_token_head(*n.dtype)) return pth_refusal(*n.dtype);
            return "";
          },
          "", "per-token-head"));
  args->engine.add(sub, EngineFlags::Shape{false, 1});
  set_action(sub, [args] { return run_calibrate(*args); });
});

}  // namespace
}  // namespace fp8kv::cli
