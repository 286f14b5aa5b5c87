// Bad input: malformed or unsupported tokenizer.json files give an
// InputError naming what is wrong; and model-level details checked on
// tokenizers written inline.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/errors.h"
#include "io/errors.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv {
using ::testing::HasSubstr;
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<int>;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("fp8kv_tok_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path write(const std::string& name, const std::string& body) const {
    fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << body;
    return p;
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

json minimal_bpe() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
    "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
}

// Loads `j` and expects an InputError whose message contains `needle`.
void expect_error(const std::string& body, const std::string& needle) {
  TempDir d;
  auto p = d.write("tokenizer.json", body);
  EXPECT_THAT(test_util::input_error_of([&] { Tokenizer::from_file(p); }), HasSubstr(needle)) << body.substr(0, 200);
}

TEST(TokenizerErrors, MalformedFiles) {
  expect_error("{not json", "not valid JSON");
  expect_error("[1,2]", "expected a JSON object");
  expect_error(R"({"version": "1.0"})", "missing field \"model\"");
  json j = minimal_bpe();
  j["model"]["merges"] = json::array({"a b c"});
  expect_error(j.dump(), "merges[0]");
  j = minimal_bpe();
  j["model"]["merges"] = json::array({"a x"});
  expect_error(j.dump(), "\"x\" is not in the vocab");
  j = minimal_bpe();
  j["model"]["vocab"]["a"] = "zero";
  expect_error(j.dump(), "invalid id");
  // The streaming loader's own checks of model.vocab / model.merges.
  j = minimal_bpe();
  j["model"]["vocab"]["a"] = json::array({0});
  expect_error(j.dump(), "vocab entry \"a\" has an invalid id");
  j = minimal_bpe();
  j["model"]["vocab"]["a"] = -3;
  expect_error(j.dump(), "invalid id");
  j = minimal_bpe();
  j["model"]["merges"] = json::parse(R"([["a", "b", "c"]])");
  expect_error(j.dump(), "merges[0] must be \"a b\" or [\"a\", \"b\"]");
  j = minimal_bpe();
  j["model"]["merges"] = json::parse(R"(["a b", 7])");
  expect_error(j.dump(), "merges[1] must be");
  j = minimal_bpe();
  j["model"]["merges"] = 5;
  expect_error(j.dump(), "\"merges\" must be an array");
  j = minimal_bpe();
  j["model"]["vocab"] = json::array({"a"});
  expect_error(j.dump(), "\"vocab\" must be an object");
  j = minimal_bpe();
  j["model"].erase("vocab");
  expect_error(j.dump(), "missing field \"vocab\"");
  j = minimal_bpe();
  j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})");
  expect_error(j.dump(), "does not compile");
  j = minimal_bpe();
  j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"})");
  expect_error(j.dump(), "unknown split behavior");
  j = minimal_bpe();
  j["added_tokens"] = json::parse(R"([{"content": "<s>"}])");
  expect_error(j.dump(), "added_tokens[0]: missing field \"id\"");
}

TEST(TokenizerErrors, UnsupportedComponentsAreNamed) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    json j = minimal_bpe();
    j["model"]["type"] = type;
    expect_error(j.dump(), std::string("model type \"") + type + "\" is unsupported");
  }
  json j = minimal_bpe();
  j["normalizer"] = json::parse(R"({"type": "Precompiled", "precompiled_charsmap": ""})");
  expect_error(j.dump(), "unsupported normalizer type \"Precompiled\"");
  j = minimal_bpe();
  j["pre_tokenizer"] = json::parse(R"({"type": "UnicodeScripts"})");
  expect_error(j.dump(), "unsupported pre-tokenizer type \"UnicodeScripts\"");
  j = minimal_bpe();
  j["decoder"] = json::parse(R"({"type": "CTC"})");
  expect_error(j.dump(), "unsupported decoder type \"CTC\"");
  j = minimal_bpe();
  j["model"]["dropout"] = 0.1;
  expect_error(j.dump(), "dropout");
}

TEST(TokenizerErrors, MissingPaths) {
  EXPECT_THROW(Tokenizer::load("/nonexistent/tokenizer.json"), InputError);
  TempDir d;
  EXPECT_THROW(Tokenizer::load(d.path()), InputError);  // a directory without tokenizer.json
}

TEST(TokenizerModel, NoPreTokenizerMergesAcrossMetaspaceWhenAMergeDoes) {
  // "o▁" is a merge: a "▁"-chunked shortcut would miss it.
  json j = minimal_bpe();
  j["normalizer"] = json::parse(R"({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})");
  j["model"]["vocab"] = json::parse(R"({"▁": 0, "h": 1, "e": 2, "l": 3, "o": 4, "w": 5, "o▁": 6})");
  j["model"]["merges"] = json::parse(R"([["o", "▁"]])");
  TempDir d;
  auto tok = Tokenizer::from_file(d.write("tokenizer.json", j.dump()));
  EXPECT_EQ(tok->encode("hello wo"), (Ids{1, 2, 3, 3, 6, 5, 4}));
}

TEST(TokenizerModel, ContinuingSubwordPrefixAndSuffix) {
  // BPE with "##" prefix and "</w>" suffix: "abc" -> a, ##b, ##c</w>; merge a+##b -> "ab".
  json j = minimal_bpe();
  j["model"]["vocab"] = json::parse(R"({"a": 0, "##b": 1, "##c</w>": 2, "ab": 3, "c</w>": 4})");
  j["model"]["merges"] = json::parse(R"([["a", "##b"]])");
  j["model"]["continuing_subword_prefix"] = "##";
  j["model"]["end_of_word_suffix"] = "</w>";
  TempDir d;
  auto tok = Tokenizer::from_file(d.write("tokenizer.json", j.dump()));
  EXPECT_EQ(tok->encode("abc"), (Ids{3, 2}));
  EXPECT_EQ(tok->encode("c"), (Ids{4}));
}

TEST(TokenizerModel, UnkWithoutFuseAndTruncationPadding) {
  json j = minimal_bpe();
  j["model"]["vocab"] = json::parse(R"({"<unk>": 0, "a": 1, "b": 2, "ab": 3, "<pad>": 4})");
  j["model"]["unk_token"] = "<unk>";
  j["model"]["fuse_unk"] = false;
  TempDir d;
  auto tok = Tokenizer::from_file(d.write("tokenizer.json", j.dump()));
  EXPECT_EQ(tok->encode("xyab"), (Ids{0, 0, 3}));
  j["model"]["fuse_unk"] = true;
  j["truncation"] = json::parse(R"({"direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0})");
  j["padding"] = json::parse(
      R"({"strategy": {"Fixed": 5}, "direction": "Left", "pad_to_multiple_of": null, "pad_id": 4, "pad_type_id": 0, "pad_token": "<pad>"})");
  auto tok2 = Tokenizer::from_file(d.write("t2.json", j.dump()));
  // "xy" fuses into one <unk>; "abababab" -> 4 x ab, truncated to 3, then left-padded to 5
  EXPECT_EQ(tok2->encode("xyab"), (Ids{4, 4, 4, 0, 3}));
  EXPECT_EQ(tok2->encode("abababab"), (Ids{4, 4, 3, 3, 3}));
}

}  // namespace
}  // namespace fp8kv
