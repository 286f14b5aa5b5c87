#include "eval/niah.h"

#include <fmt/format.h>

#include <map>

#include "eval/stats.h"
#include "io/errors.h"

namespace fp8kv::eval {

namespace {
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
std::string rstrip(std::string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}
std::string lstrip(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return s.substr(i);
}
}  // namespace

std::string needle_sentence(const std::string& key) {
  return fmt::format("The passkey is {}. Remember it. {} is the passkey.", key, key);
}

std::string insert_needle(const std::string& hay, double depth, const std::string& key) {
  size_t pos = static_cast<size_t>(static_cast<double>(hay.size()) * depth);
  pos = std::min(pos, hay.size());
  size_t cut = hay.size();
  for (size_t i = pos; i + 1 < hay.size(); ++i) {
    if ((hay[i] == '.' || hay[i] == '!' || hay[i] == '?') && is_space(hay[i + 1])) {
      cut = i + 1;
      break;
    }
  }
  const std::string before = rstrip(hay.substr(0, cut)), after = lstrip(hay.substr(cut));
  std::string out = before;
  if (!before.empty()) out.push_back(' ');
  out.append(needle_sentence(key));
  if (!after.empty()) out.push_back(' ');
  out.append(after);
  return out;
}

std::string needle_prompt(const std::string& hay, double depth, const std::string& key) {
  std::string out = rstrip(insert_needle(hay, depth, key));
  out.append("\n\n");
  out.append(kNiahQuestion);
  return out;
}

bool niah_correct(const std::string& generated, const std::string& key) {
  size_t i = 0;
  while (i < generated.size() && is_space(generated[i])) ++i;
  if (generated.size() - i < 5) return false;
  for (size_t k = 0; k < 5; ++k)
    if (generated[i + k] < '0' || generated[i + k] > '9') return false;
  return generated.compare(i, 5, key) == 0;
}

std::vector<NiahPrompt> build_niah_prompts(const Tokenizer& tok, const std::string& haystack, const NiahOptions& o) {
  if (o.trials <= 0) throw InputError("--trials: expected a positive number");
  for (int d : o.depths)
    if (d < 0 || d > 100) throw InputError(fmt::format("--depths: {} is not a percentage in [0, 100]", d));
  const std::vector<int> hay_ids = tok.encode(haystack, /*add_special_tokens=*/false);
  Rng rng(o.seed);
  std::vector<NiahPrompt> out;
  for (int T : o.lengths) {
    if (T <= o.answer_tokens + 16) throw InputError(fmt::format("--lengths: {} is too short for a needle prompt", T));
    if (o.max_model_len > 0 && T > o.max_model_len)
      throw InputError(fmt::format("--lengths: {} exceeds max_model_len {} ({})", T, o.max_model_len,
                                   o.max_model_len_origin));
  }
  for (int T : o.lengths) {
    for (int depth : o.depths) {
      for (int trial = 0; trial < o.trials; ++trial) {
        NiahPrompt p{T, depth, trial, {}, {}};
        for (int k = 0; k < 5; ++k) p.key.push_back(static_cast<char>('0' + rng.below(10)));
        const int budget = T - o.answer_tokens;
        const int overhead =
            static_cast<int>(tok.encode(fmt::format(" {} \n\n{}", needle_sentence(p.key), kNiahQuestion), false).size());
        int keep = budget - 1 - overhead;
        if (static_cast<int>(hay_ids.size()) < keep)
          throw InputError(fmt::format("--haystack: {} tokens, length {} needs about {}", hay_ids.size(), T, keep));
        for (int iter = 0;; ++iter) {
          if (keep <= 0 || iter > 50) throw InputError(fmt::format("niah: cannot fit a prompt into {} tokens", T));
          const std::vector<int> head(hay_ids.begin(), hay_ids.begin() + keep);
          p.ids = tok.encode(needle_prompt(tok.decode(head), depth / 100.0, p.key), true);
          if (static_cast<int>(p.ids.size()) <= budget) break;
          keep -= static_cast<int>(p.ids.size()) - budget;
        }
        out.push_back(std::move(p));
      }
    }
  }
  return out;
}

nlohmann::json run_niah(const std::filesystem::path& model_dir, const EngineOptions& engine,
                        const std::vector<ArmSpec>& arms, const Tokenizer& tok, const std::vector<NiahPrompt>& prompts,
                        const NiahOptions& o, const NiahProgress& progress) {
  if (prompts.empty()) throw InputError("niah: no prompts");
  std::vector<std::vector<bool>> correct(arms.size());
  nlohmann::json samples = nlohmann::json::array();
  uint64_t done = 0;
  const uint64_t total = static_cast<uint64_t>(arms.size()) * prompts.size();
  for (size_t a = 0; a < arms.size(); ++a) {
    auto e = load_arm_engine(arms[a], model_dir, engine);
    for (const auto& p : prompts) {
      if (static_cast<int>(p.ids.size()) + o.answer_tokens > e->max_model_len())
        throw InputError(fmt::format("--lengths: {} exceeds max_model_len {}", p.length, e->max_model_len()));
      GenerateOptions g;
      g.max_tokens = o.answer_tokens;
      const GenerateResult r = e->generate(p.ids, g);
      const std::string text = tok.decode(r.tokens, true);
      const bool ok = niah_correct(text, p.key);
      correct[a].push_back(ok);
      if (samples.size() < 6 * arms.size() && p.trial == 0)
        samples.push_back({{"arm", arms[a].name}, {"length", p.length}, {"depth", p.depth}, {"key", p.key},
                           {"prompt_tokens", p.ids.size()}, {"output", text}, {"correct", ok}});
      if (progress) progress(++done, total);
    }
  }
  nlohmann::json cells = nlohmann::json::array();
  for (size_t a = 0; a < arms.size(); ++a) {
    std::map<std::pair<int, int>, std::pair<int, int>> by;  // (length, depth) -> (correct, trials)
    std::vector<std::pair<int, int>> order;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto key = std::make_pair(prompts[i].length, prompts[i].depth);
      if (!by.count(key)) order.push_back(key);
      by[key].first += correct[a][i];
      by[key].second += 1;
    }
    for (const auto& k : order)
      cells.push_back({{"length", k.first}, {"depth", k.second}, {"arm", arms[a].name}, {"correct", by[k].first},
                       {"trials", by[k].second}, {"accuracy", static_cast<double>(by[k].first) / by[k].second}});
  }
  nlohmann::json totals = nlohmann::json::array();
  for (size_t a = 0; a < arms.size(); ++a) {
    int c = 0;
    for (bool b : correct[a]) c += b;
    totals.push_back({{"arm", arms[a].name}, {"correct", c}, {"trials", prompts.size()}});
  }
  nlohmann::json mc = nlohmann::json::array();
  for (size_t a = 0; a < arms.size(); ++a) {
    for (size_t b = a + 1; b < arms.size(); ++b) {
      std::vector<char> ca(correct[a].begin(), correct[a].end()), cb(correct[b].begin(), correct[b].end());
      const McNemar m = mcnemar_exact(std::span<const bool>(reinterpret_cast<const bool*>(ca.data()), ca.size()),
                                      std::span<const bool>(reinterpret_cast<const bool*>(cb.data()), cb.size()));
      mc.push_back({{"a", arms[a].name}, {"b", arms[b].name}, {"only_a", m.only_a}, {"only_b", m.only_b},
                    {"both", m.both}, {"neither", m.neither}, {"p_value", m.p_value}});
    }
  }
  return {{"cells", cells}, {"totals", totals}, {"mcnemar", mc}, {"samples", samples},
          {"seed", o.seed}, {"answer_tokens", o.answer_tokens}};
}

}  // namespace fp8kv::eval
