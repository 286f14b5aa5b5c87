// Bit-exactness against Hugging Face `tokenizers` / transformers references
// produced by tools/gen_tokenizer_goldens.py on the GPU machine (files under
// tests/golden/tokenizer/). Every id and every decoded string must match.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/golden.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path golden_dir() { return fs::path(FP8KV_SOURCE_DIR) / "tests/golden/tokenizer"; }

json read_json(const fs::path& p) { return json::parse(test_util::read_golden(p)); }

std::string show(const std::string& s) {
  std::string out = json(s).dump(-1, ' ', true, json::error_handler_t::replace);
  return out.size() > 160 ? out.substr(0, 160) + "...\"" : out;
}

std::string show(const std::vector<int>& v) {
  std::string out = json(v).dump();
  return out.size() > 160 ? out.substr(0, 160) + "...]" : out;
}

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
    size_t n = 0, bad = 0;
    auto report = [&](const std::string& what) {
      ++bad;
      if (bad <= 8) ADD_FAILURE() << name << ": " << what;
    };
    for (const json& c : doc["cases"]) {
      std::string text = c["text"];
      auto want = c["ids"].get<std::vector<int>>();
      auto want_ns = c["ids_no_special"].get<std::vector<int>>();
      auto got = tok->encode(text, true);
      auto got_ns = tok->encode(text, false);
      ++n;
      if (got != want) report("encode " + show(text) + "\n  want " + show(want) + "\n  got  " + show(got));
      if (got_ns != want_ns)
        report("encode(no special) " + show(text) + "\n  want " + show(want_ns) + "\n  got  " + show(got_ns));
      std::string d = tok->decode(want, false), ds = tok->decode(want, true);
      if (d != c["decoded"].get<std::string>())
        report("decode " + show(want) + "\n  want " + show(c["decoded"].get<std::string>()) + "\n  got  " + show(d));
      if (ds != c["decoded_skip"].get<std::string>())
        report("decode(skip) " + show(want) + "\n  want " + show(c["decoded_skip"].get<std::string>()) +
               "\n  got  " + show(ds));
      // Streaming the ids of valid text gives the full decode.
      IncrementalDecoder inc(*tok);
      std::string streamed;
      for (int id : want) streamed += inc.push(id);
      streamed += inc.flush();
      if (streamed != d) report("incremental decode " + show(want) + "\n  want " + show(d) + "\n  got  " + show(streamed));
    }
    for (const json& c : doc["decode_cases"]) {
      auto ids = c["ids"].get<std::vector<int>>();
      ++n;
      std::string d = tok->decode(ids, false), ds = tok->decode(ids, true);
      if (d != c["text"].get<std::string>())
        report("decode " + show(ids) + "\n  want " + show(c["text"].get<std::string>()) + "\n  got  " + show(d));
      if (ds != c["text_skip"].get<std::string>())
        report("decode(skip) " + show(ids) + "\n  want " + show(c["text_skip"].get<std::string>()) + "\n  got  " +
               show(ds));
    }
    EXPECT_EQ(bad, 0u) << name << ": " << bad << " mismatches in " << n << " cases";
    EXPECT_GT(n, 100u) << name;
  }
}

}  // namespace
}  // namespace fp8kv
