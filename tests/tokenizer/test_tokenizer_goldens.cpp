// Bit-exactness against Hugging Face `tokenizers` / transformers references
// produced by tools/gen_tokenizer_goldens.py on the GPU machine (files under
// tests/golden/tokenizer/). Every id and every decoded string must match.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/golden.h"
#include "golden_check.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path golden_dir() { return fs::path(FP8KV_SOURCE_DIR) / "tests/golden/tokenizer"; }

json read_json(const fs::path& p) { return json::parse(test_util::read_golden(p)); }

std::vector<json> entries() {
  auto m = golden_dir() / "manifest.json";
  if (!fs::exists(m)) return {};
  return read_json(m)["entries"].get<std::vector<json>>();
}

TEST(TokenizerGoldens, Present) {
  if (!fs::exists(golden_dir() / "manifest.json"))
    GTEST_SKIP() << "tests/golden/tokenizer/manifest.json is missing: run `python3 tools/gen_tokenizer_goldens.py` "
                    "on the GPU machine and commit tests/golden/tokenizer/";
  EXPECT_GE(entries().size(), 8u);
}

TEST(TokenizerGoldens, EveryEntryMatchesExactly) {
  auto list = entries();
  if (list.empty())
    GTEST_SKIP() << "tests/golden/tokenizer/manifest.json is missing: run `python3 tools/gen_tokenizer_goldens.py` "
                    "on the GPU machine and commit tests/golden/tokenizer/";
  for (const json& e : list) {
    std::string name = e["name"];
    SCOPED_TRACE(name + " (reference: " + e.value("reference", std::string("?")) + ")");
    json doc = read_json(golden_dir() / e["cases"].get<std::string>());
    std::unique_ptr<Tokenizer> tok;
    ASSERT_NO_THROW(tok = Tokenizer::load(golden_dir() / e["path"].get<std::string>()));
    const test_util::GoldenCheck r = test_util::check_tokenizer_golden(*tok, doc, name, 8, /*incremental=*/true);
    EXPECT_EQ(r.mismatches, 0u) << name << ": " << r.mismatches << " mismatches in " << r.cases << " cases";
    EXPECT_GT(r.cases, 100u) << name;
  }
}

}  // namespace
}  // namespace fp8kv
