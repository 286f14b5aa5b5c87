// Unicode 15 in the split patterns: Debian 12's PCRE2 10.42 has Unicode 14
// tables (to it 🩷, 🫨, the Kawi and Nag Mundari digits are unassigned), so
// \p{..}, \d and \w are expanded into utf8proc 2.8 (Unicode 15) ranges before
// PCRE2 compiles a pattern (src/tokenizer/regex.cpp). `tokenizers`'
// Oniguruma 6.9.8 knows Unicode 15; the real-vocabulary goldens check the
// ids end to end, these check the classes themselves.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <utf8proc.h>

#include "tokenizer/regex.h"

namespace fp8kv::tok {
namespace {

std::vector<std::string> pieces(const std::string& pattern, const std::string& s) {
  Regex re(pattern, "test");
  std::vector<Span> found;
  re.find_all(s, found);
  std::vector<std::string> out;
  for (auto [b, e] : found) out.push_back(s.substr(b, e - b));
  return out;
}

bool whole(const std::string& pattern, const std::string& s) {
  auto p = pieces(pattern, s);
  return p.size() == 1 && p[0] == s;
}

const std::string kPinkHeart = "\U0001FA77";   // 🩷 So, Unicode 15
const std::string kShaking = "\U0001FAE8";     // 🫨 So, Unicode 15
const std::string kKawiDigit0 = "\U00011F50";  // Nd, Unicode 15
const std::string kKawiLetter = "\U00011F04";  // Lo, Unicode 15
const std::string kNagMundari0 = "\U0001E4F0"; // Nd, Unicode 15
const std::string kNagLetter = "\U0001E4D0";   // Lo, Unicode 15

TEST(TokenizerUnicode15, GeneralCategoriesComeFromUtf8proc) {
  EXPECT_TRUE(whole(R"(\p{S})", kPinkHeart));
  EXPECT_TRUE(whole(R"(\p{So})", kShaking));
  EXPECT_TRUE(whole(R"(\p{N})", kKawiDigit0));
  EXPECT_TRUE(whole(R"(\p{Nd})", kNagMundari0));
  EXPECT_TRUE(whole(R"(\d)", kNagMundari0));
  EXPECT_TRUE(whole(R"(\p{L})", kKawiLetter));
  EXPECT_TRUE(whole(R"(\pL)", kNagLetter));
  EXPECT_TRUE(whole(R"(\w)", kKawiLetter));
  EXPECT_FALSE(whole(R"(\p{L})", kPinkHeart));
  EXPECT_FALSE(whole(R"(\p{Cn})", kPinkHeart));
  // Negations, outside and inside classes.
  EXPECT_TRUE(whole(R"(\P{L})", kPinkHeart));
  EXPECT_FALSE(whole(R"(\P{N})", kKawiDigit0));
  EXPECT_FALSE(whole(R"(\p{^N})", kKawiDigit0));
  EXPECT_FALSE(whole(R"([^\s\p{L}\p{N}])", kKawiDigit0));
  EXPECT_TRUE(whole(R"([^\s\p{L}\p{N}])", kShaking));
  EXPECT_TRUE(whole(R"([\P{L}])", kShaking));
  // Unicode 14 characters keep their classes.
  EXPECT_TRUE(whole(R"(\p{L}+)", "h\xC3\xA9llo\xE4\xB8\x96"));
  EXPECT_TRUE(whole(R"(\p{N}+)", "123\xD9\xA3"));
  EXPECT_TRUE(whole(R"(\p{P})", "!"));
  EXPECT_FALSE(whole(R"(\p{L})", "1"));
  // Names PCRE2 knows that are not general categories pass through.
  EXPECT_TRUE(whole(R"(\p{Han}+)", "\xE4\xB8\x96\xE7\x95\x8C"));
}

TEST(TokenizerUnicode15, Llama3PatternSplitsNewDigitsAndEmojiLikeOniguruma) {
  const std::string llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  std::string k = kKawiDigit0;
  std::string k1 = "\U00011F51", k2 = "\U00011F52", k3 = "\U00011F53";
  EXPECT_EQ(pieces(llama3, "abc" + k + k1 + k2 + k3 + "def"),
            (std::vector<std::string>{"abc", k + k1 + k2, k3, "def"}));
  EXPECT_EQ(pieces(llama3, "I " + kPinkHeart + " you"), (std::vector<std::string>{"I", " " + kPinkHeart, " you"}));
  EXPECT_EQ(pieces(llama3, "x" + kShaking + "y"), (std::vector<std::string>{"x", kShaking + "y"}));
  EXPECT_EQ(pieces(llama3, kNagLetter + kNagLetter + " 12345"),
            (std::vector<std::string>{kNagLetter + kNagLetter, " ", "123", "45"}));
}

// regex.cpp skips planes 4-13 when it builds its category runs.
TEST(TokenizerUnicode15, Planes4To13AreUnassigned) {
  for (utf8proc_int32_t c = 0x40000; c <= 0xDFFFF; ++c)
    ASSERT_EQ(utf8proc_category(c), UTF8PROC_CATEGORY_CN) << std::hex << c;
}

TEST(TokenizerUnicode15, ExpansionKeepsSurrogatesOutAndCompiles) {
  std::string t = onig_to_pcre2(R"(\p{L})");
  EXPECT_EQ(t.find("D800"), std::string::npos);
  EXPECT_NE(t.find("\\x{11F04}"), std::string::npos) << "Kawi letters (Unicode 15) in \\p{L}";
  EXPECT_NO_THROW(Regex(R"(\p{Cs}|\P{Cs}|[\p{C}\p{Z}])", "t"));
  EXPECT_TRUE(pieces(R"(\p{Cs})", "abc").empty());
  // \w keeps the joiners (Cf) as Rust's regex does; \W excludes them.
  EXPECT_TRUE(whole(R"(\w+)", "a\u200Db"));
  EXPECT_FALSE(whole(R"(\W)", "\u200C"));
  EXPECT_TRUE(whole(R"(\p{Cf})", "\u200D"));
}

}  // namespace
}  // namespace fp8kv::tok
