// Robustness: arbitrary bytes never crash encode (valid UTF-8 round-trips
// through byte-level BPE, invalid UTF-8 is an InputError), arbitrary ids
// always decode to valid UTF-8, and results do not depend on threads.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/errors.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace fp8kv {
namespace {

std::filesystem::path fixture_path(const std::string& name) {
  return std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/data/tokenizers" / name;
}

// Random strings mixing ASCII, multi-byte chars, and (sometimes) junk bytes.
std::string random_text(std::mt19937& rng, bool allow_invalid) {
  static const std::vector<std::string> pieces = {
      "a", "Z", " ", "  ", "\t", "\n", "\r\n", "'s", "123", ".", "<|endoftext|>", "<s>", "</s>", "[L]", "[R]", "cat",
      "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xE2\x80\x8D", "\xCC\x81", "\xE2\x96\x81", "\xC2\xA0"};
  static const std::vector<std::string> junk = {"\xC3", "\xE4\xB8", "\xFF", "\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80"};
  std::string s;
  int n = std::uniform_int_distribution<int>(0, 40)(rng);
  for (int i = 0; i < n; ++i) {
    if (allow_invalid && std::uniform_int_distribution<int>(0, 9)(rng) == 0)
      s += junk[std::uniform_int_distribution<size_t>(0, junk.size() - 1)(rng)];
    else
      s += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
  }
  return s;
}

TEST(TokenizerRobustness, RandomTextNeverCrashes) {
  std::mt19937 rng(7);
  for (const char* f : {"bytelevel.json", "llama3.json", "spm_llama2.json", "spm_gemma.json", "metaspace_first.json"}) {
    auto tok = Tokenizer::from_file(fixture_path(f));
    bool byte_level = std::string(f) == "bytelevel.json" || std::string(f) == "llama3.json";
    for (int i = 0; i < 400; ++i) {
      std::string s = random_text(rng, true);
      if (!utf8::is_valid(s)) {
        EXPECT_THROW(tok->encode(s), InputError) << f;
        continue;
      }
      auto ids = tok->encode(s, false);
      for (int id : ids) ASSERT_TRUE(id >= 0 && id < tok->vocab_size()) << f;
      std::string back = tok->decode(ids);
      EXPECT_TRUE(utf8::is_valid(back));
      // Byte-level BPE loses nothing, except the whitespace that lstrip /
      // rstrip added tokens ([L], [R]) absorb.
      bool strips = s.find("[L]") != std::string::npos || s.find("[R]") != std::string::npos;
      if (byte_level && !strips) {
        EXPECT_EQ(back, s) << f;
      }
    }
  }
}

TEST(TokenizerRobustness, RandomIdsDecodeToValidUtf8) {
  std::mt19937 rng(11);
  for (const char* f : {"bytelevel.json", "spm_llama2.json", "metaspace_first.json"}) {
    auto tok = Tokenizer::from_file(fixture_path(f));
    std::uniform_int_distribution<int> pick(-5, tok->vocab_size() + 5);
    for (int i = 0; i < 300; ++i) {
      std::vector<int> ids(std::uniform_int_distribution<int>(0, 30)(rng));
      for (int& id : ids) id = pick(rng);
      std::string d = tok->decode(ids), ds = tok->decode(ids, true);
      EXPECT_TRUE(utf8::is_valid(d)) << f;
      EXPECT_TRUE(utf8::is_valid(ds)) << f;
      IncrementalDecoder inc(*tok);
      std::string streamed;
      for (int id : ids) {
        std::string part = inc.push(id);
        EXPECT_TRUE(utf8::is_valid(part)) << f;
        streamed += part;
      }
      streamed += inc.flush();
      EXPECT_TRUE(utf8::is_valid(streamed)) << f;
    }
  }
}

TEST(TokenizerRobustness, SameIdsFromManyThreads) {
  auto tok = Tokenizer::from_file(fixture_path("llama3.json"));
  std::mt19937 rng(3);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(random_text(rng, false));
  std::vector<std::vector<int>> want;
  for (auto& t : texts) want.push_back(tok->encode(t));
  auto fresh = Tokenizer::from_file(fixture_path("llama3.json"));  // cold cache, shared by the threads
  std::vector<int> bad(4, 0);
  std::vector<std::thread> pool;
  for (int w = 0; w < 4; ++w)
    pool.emplace_back([&, w] {
      for (size_t i = w; i < texts.size() * 4; i += 4)
        if (fresh->encode(texts[i % texts.size()]) != want[i % texts.size()]) ++bad[w];
    });
  for (auto& t : pool) t.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

TEST(Utf8, LossyMatchesRustMaximalSubparts) {
  // Examples from the Unicode standard (U+FFFD substitution of maximal subparts).
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8::lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + R + R + R + "b" + R + "c" + R + R + "d");
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80"), R + R + R);  // surrogates: each byte
  EXPECT_EQ(utf8::lossy("\xF0\x9F\x98"), R);          // truncated at the end: one
  EXPECT_EQ(utf8::lossy("\xC0\xAF"), R + R);          // overlong lead is never valid
  EXPECT_EQ(utf8::lossy("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC");
}

}  // namespace
}  // namespace fp8kv
