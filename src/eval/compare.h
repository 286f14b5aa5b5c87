// `fp8kv eval compare`: teacher-forced, paired comparison of KV cache
// configurations ("arms") against a reference arm, per position.
//
// For every scored position i (token i given tokens < i, i >= 1 within a
// chunk) the reference's full distribution P and each arm's Q give:
// KL(P || Q) = sum_v P_v (log P_v - log Q_v), the arm's NLL of the actual
// token and its difference to the reference's (dNLL), the change of the
// actual token's probability (for the RMS, as llama.cpp's perplexity tool),
// and whether the top-1 tokens agree. docs/eval.md explains the statistics.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "kv/kv_scales.h"
#include "model/config.h"
#include "numerics/fp8.h"

namespace fp8kv::eval {

// One KV configuration: bf16 | fp8 (= fp8_e4m3, checkpoint scales where
// present) | fp8:unity | fp8:scales=DIR | fp8_e5m2 (checkpoint scales where
// present; fp8_e5m2:unity and fp8_e5m2:scales=DIR also accepted) |
// fp8_per_token_head | int8_per_token_head (no scale option).
struct ArmSpec {
  enum class Scales { checkpoint, unity, dir };
  std::string name;  // as written
  KvDtype dtype = KvDtype::bf16;
  Scales scales = Scales::checkpoint;
  std::filesystem::path scales_dir;
};
// Throws InputError naming the spec and the accepted forms.
ArmSpec parse_arm(std::string_view spec);
// Comma-separated, at least one, names unique, "control" reserved.
std::vector<ArmSpec> parse_arms(std::string_view csv);

// The scales an arm runs with (bf16, per-token-head: unity; fp8:unity: unity; fp8: the model
// checkpoint's; fp8:scales=DIR: DIR's, which must have the same layer and
// head counts).
KvScales arm_scales(const ArmSpec& arm, const std::filesystem::path& model_dir, const ModelConfig& cfg);
// Loads an engine for the arm (base options with the arm's dtype) and sets its scales.
std::unique_ptr<Engine> load_arm_engine(const ArmSpec& arm, const std::filesystem::path& model_dir,
                                        EngineOptions base);

// "0,512,1024": strictly ascending, first 0. Throws InputError.
std::vector<int> parse_buckets(std::string_view csv);

// log-softmax computed in double, rounded to float (the same function for
// every arm, so identical logits give identical log-probs).
void log_softmax(std::span<const float> logits, std::span<float> out);
int argmax_lowest(std::span<const float> x);  // ties: lowest index

struct PositionDelta {
  double kld = 0.0;                // KL(ref || arm), nats
  double nll_ref = 0.0, nll_arm = 0.0;
  double p_ref = 0.0, p_arm = 0.0; // probability of the actual token
  bool top1_same = true;
};
// ref_lp, arm_lp: log-probs over the vocabulary. Throws std::runtime_error on
// non-finite results.
PositionDelta compare_position(std::span<const float> ref_lp, int ref_top1, std::span<const float> arm_lp,
                               int arm_top1, int token);

// Everything recorded per scored position of one arm.
struct ArmSamples {
  std::string name;
  std::vector<double> kld, nll, dnll, dp;
  std::vector<uint8_t> top1_same;
  std::vector<int32_t> pos, doc;
  void add(const PositionDelta& d, int position, int document);
  size_t size() const { return kld.size(); }
};

// --bootstrap's range (docs/eval.md "Bootstrap bounds"): the cluster
// bootstrap's time is resamples x documents (one index draw and two sums per
// pair), so the cap bounds it per scored document; 100000 resamples put the
// Monte Carlo error of a 95% interval's ends far below the interval's width.
inline constexpr int kMinBootstrapResamples = 100, kMaxBootstrapResamples = 100000;

struct CompareStatsOptions {
  std::vector<int> buckets{0, 512, 1024, 2048, 4096};
  int bootstrap_resamples = 2000;
  double ci_level = 0.95;
  uint64_t seed = 0;
  uint64_t mc_resamples = 100000;  // sign-flip beyond 20 documents
};

// The report's "arms" entry for one arm (the reference's own samples give
// KLD 0, dNLL 0, agreement 1). doc_names index by ArmSamples::doc.
nlohmann::json summarize_arm(const ArmSamples& s, const std::vector<std::string>& doc_names,
                             const CompareStatsOptions& o);

struct CompareInput {
  std::filesystem::path model_dir;
  EngineOptions engine;                  // kv_cache_dtype is set per arm
  std::vector<ArmSpec> arms;             // first = reference
  std::vector<std::vector<int>> docs;    // token ids per document
  std::vector<std::string> doc_names;
  int context = 0;                       // 0: min(max_model_len, 4096)
  bool control = false;
  std::vector<int> control_prefix;       // tokens prepended for the control pass
  std::function<bool(int)> is_special;   // a leading special token stays first in the control pass
  CompareStatsOptions stats;
};

// progress(tokens_done, tokens_total), tokens counted over all passes.
using CompareProgress = std::function<void(uint64_t done, uint64_t total)>;

// Runs every arm over every chunk and returns the report JSON (without
// "fp8kv_version"; the CLI adds it). Throws InputError on bad input (no
// tokens to score, prefix longer than the context, ...).
nlohmann::json run_compare(const CompareInput& in, const CompareProgress& progress = {});

// Cuts ids into consecutive chunks of `context` tokens; a last chunk shorter
// than 2 tokens is dropped (as `fp8kv score`).
std::vector<std::vector<int>> cut_chunks(const std::vector<int>& ids, int context);

}  // namespace fp8kv::eval
