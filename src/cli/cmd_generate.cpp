// `fp8kv generate MODEL_DIR --prompt TEXT`: greedy (default) or sampled
// generation; the text streams to stdout, timings go to stderr.
#include <fmt/format.h>

#include <cstdio>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "io/errors.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt;
  int max_tokens = 128;
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  EngineFlags engine;
};

int run_generate(const GenerateArgs& a) {
  if (a.prompt.empty()) throw UsageError("--prompt is empty");
  auto tok = Tokenizer::load(a.engine.tokenizer_path(a.model));
  const std::vector<int> ids = tok->encode(a.prompt, true);
  if (ids.empty()) throw InputError("the prompt encodes to no tokens");
  auto engine = Engine::load(a.model, a.engine.options());
  if (!engine) return 0;  // a multi-process follower: rank 0 did the work (Engine::load)
  if (static_cast<int>(ids.size()) >= engine->max_model_len())
    throw InputError(fmt::format("the prompt has {} tokens; max_model_len {} leaves no room to generate", ids.size(),
                                 engine->max_model_len()));
  GenerateOptions o;
  o.max_tokens = a.max_tokens;
  o.sampling.temperature = a.temperature;
  o.sampling.top_p = a.top_p;
  o.sampling.top_k = a.top_k;
  o.sampling.seed = a.seed;
  IncrementalDecoder dec(*tok, /*skip_special_tokens=*/true);
  const GenerateResult r = engine->generate(ids, o, [&](int t) {
    const std::string s = dec.push(t);
    if (!s.empty()) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  const std::string rest = dec.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const int decoded = std::max(0, static_cast<int>(r.tokens.size()) - 1);
  std::fprintf(stderr, "prompt: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s (%.1f tok/s); finish: %s\n",
               r.prompt_tokens, r.prefill_seconds, r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0.0,
               decoded, r.decode_seconds, r.decode_seconds > 0 ? decoded / r.decode_seconds : 0.0,
               std::string(finish_reason_name(r.finish)).c_str());
  // Per-tensor-scaled fp8 caches: what the store saturated (docs/robustness.md
  // "KV clipping"), the run's share of fp8kv:kv_cache_clipped_total.
  if (kv_dtype_per_tensor_scaled(engine->kv_dtype()))
    if (const auto c = engine->kv_clip_counts()) {
      KvClipCounts sum;
      int worst = -1;
      uint64_t worst_n = 0;
      for (size_t l = 0; l < c->size(); ++l) {
        sum += (*c)[l];
        const uint64_t n = (*c)[l].k + (*c)[l].v;
        if (n > worst_n) {
          worst_n = n;
          worst = static_cast<int>(l);
        }
      }
      std::fprintf(stderr, "KV clipped at store: K %llu, V %llu of %llu values each%s\n",
                   static_cast<unsigned long long>(sum.k), static_cast<unsigned long long>(sum.v),
                   static_cast<unsigned long long>(sum.stored),
                   worst < 0 ? "" : fmt::format(" (most in layer {}: {})", worst, worst_n).c_str());
    }
  return 0;
}

Registrar reg_generate([](CLI::App& app) {
  add_model_command<GenerateArgs>(app, "generate", "Generate text from a prompt (greedy by default)", run_generate, [](CLI::App* sub, GenerateArgs& a) {
    sub->add_option("--prompt", a.prompt, "Prompt text")->required()->check(utf8_text());
    sub->add_option("--max-tokens", a.max_tokens, "New tokens at most (default 128)")->check(at_least(1));
    sub->add_option("--temperature", a.temperature, "0: greedy")->check(at_least(0));
    sub->add_option("--top-p", a.top_p, "Nucleus sampling mass (0, 1]")->check(in_range(0.0, 1.0, /*open_lo=*/true));
    sub->add_option("--top-k", a.top_k, "Top-k sampling (0: off)")->check(at_least(0));
    sub->add_option("--seed", a.seed, "Sampling seed (default 0; -1: random, logged)")->transform(seed_rule());
  });
});

}  // namespace
}  // namespace fp8kv::cli
