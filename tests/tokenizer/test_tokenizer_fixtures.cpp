// Hand-made tokenizer.json fixtures (tests/data/tokenizers, written by
// make_fixtures.py). Every expected id below is derived by hand from the
// fixture's vocab and merge ranks (comments show the derivation).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/errors.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv {
namespace {

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/data/tokenizers" / name;
}

using Ids = std::vector<int>;

class ByteLevel : public ::testing::Test {
 protected:
  void SetUp() override { tok = Tokenizer::from_file(fixture("bytelevel.json")); }
  std::unique_ptr<Tokenizer> tok;
};

TEST_F(ByteLevel, MergesFollowRankOrder) {
  // "hello" -> ll(r0) he(r1) hell(r3) hello(r4); " world" -> Ġw or Ġwor ld Ġworld
  EXPECT_EQ(tok->encode("hello world"), (Ids{260, 265}));
  // "ell": "l l" (rank 0) beats "e l" (rank 2): [e, ll]
  EXPECT_EQ(tok->encode("ell"), (Ids{'e', 256}));
  // "helo": he, then no merge for (he,l) or (l,o)
  EXPECT_EQ(tok->encode("helo"), (Ids{257, 'l', 'o'}));
}

TEST_F(ByteLevel, Gpt2RegexWhitespace) {
  // "a  b": "a", " " (\s+(?!\S) backs off one space), " b" -> Ġ b
  EXPECT_EQ(tok->encode("a  b"), (Ids{'a', 32, 32, 'b'}));
  // trailing run "  " is one piece -> ĠĠ (r10)
  EXPECT_EQ(tok->encode("  "), (Ids{266}));
  EXPECT_EQ(tok->encode(""), Ids{});
  // byte-level: U+4E2D is E4 B8 AD, id == byte value
  EXPECT_EQ(tok->encode("\xE4\xB8\xAD"), (Ids{0xE4, 0xB8, 0xAD}));
  // "\n" maps to Ċ whose id is byte 10
  EXPECT_EQ(tok->encode("a\nb"), (Ids{'a', 10, 'b'}));
}

TEST_F(ByteLevel, SpecialAndAddedTokens) {
  EXPECT_EQ(tok->encode("hello<|endoftext|>world"), (Ids{260, 267, 'w', 262, 264}));
  // lstrip: the spaces before [L] belong to the token
  EXPECT_EQ(tok->encode("hello   [L]x"), (Ids{260, 268, 'x'}));
  // rstrip: the spaces after [R] belong to the token
  EXPECT_EQ(tok->encode("x[R]   hello"), (Ids{'x', 269, 260}));
  // without rstrip the space stays with the word: " hello" -> Ġ hello? no merge (Ġ,h) -> Ġ h e l l o merged to Ġ hello
  EXPECT_EQ(tok->encode("x[L] hello"), (Ids{'x', 268, 32, 260}));
  // single_word "cat": matches alone and before '.', not inside "concat"
  EXPECT_EQ(tok->encode("cat concat cat."), (Ids{270, 32, 'c', 'o', 'n', 'c', 'a', 't', 32, 270, '.'}));
  // longest match wins and matches never overlap
  EXPECT_EQ(tok->encode("<|endoftext|><|endoftext|>"), (Ids{267, 267}));
}

TEST_F(ByteLevel, Decode) {
  EXPECT_EQ(tok->decode(Ids{260, 265}), "hello world");
  EXPECT_EQ(tok->decode(Ids{260, 267}), "hello<|endoftext|>");
  EXPECT_EQ(tok->decode(Ids{260, 267}, true), "hello");
  EXPECT_EQ(tok->decode(Ids{0xE4, 0xB8, 0xAD}), "\xE4\xB8\xAD");
  // truncated sequence E4 B8 is one maximal subpart -> one U+FFFD
  EXPECT_EQ(tok->decode(Ids{0xE4, 0xB8, 'a'}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(tok->decode(Ids{0xFF, 0xFF}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // unknown ids are dropped, as in `tokenizers`
  EXPECT_EQ(tok->decode(Ids{260, 99999, -1}), "hello");
  EXPECT_TRUE(tok->is_special(267));
  EXPECT_FALSE(tok->is_special(268));
  EXPECT_EQ(tok->token_to_id("Ġworld"), 265);
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), 267);
  EXPECT_EQ(tok->id_to_token(270), "cat");
  EXPECT_EQ(tok->vocab_size(), 271);
  EXPECT_EQ(tok->bos_id(), std::nullopt);
}

TEST_F(ByteLevel, RoundTripsArbitraryText) {
  std::string s = "Mixed: d\xC3\xA9j\xC3\xA0 vu \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB\t\ttabs  \n\n x=1+2;";
  EXPECT_EQ(tok->decode(tok->encode(s)), s);
}

TEST_F(ByteLevel, InvalidUtf8InputIsAnInputError) {
  EXPECT_THROW(tok->encode("ab\xC3"), InputError);
  EXPECT_THROW(tok->encode("\xED\xA0\x80"), InputError);  // surrogate
  EXPECT_THROW(tok->encode("\xC0\xAF"), InputError);      // overlong
}

TEST_F(ByteLevel, IncrementalDecoderNeverSplitsUtf8) {
  IncrementalDecoder dec(*tok);
  EXPECT_EQ(dec.push(260), "hello");
  EXPECT_EQ(dec.push(0xE4), "");
  EXPECT_EQ(dec.push(0xB8), "");
  EXPECT_EQ(dec.push(0xAD), "\xE4\xB8\xAD");
  EXPECT_EQ(dec.push(265), " world");
  EXPECT_EQ(dec.push(0xE4), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
}

TEST(Llama3Style, SplitRegexThenByteLevel) {
  auto tok = Tokenizer::from_file(fixture("llama3.json"));
  // "hello", " ", "123", "456", " world"; TemplateProcessing adds <|begin_of_text|>
  EXPECT_EQ(tok->encode("hello 123456 world"), (Ids{269, 260, 32, '1', '2', '3', '4', '5', '6', 265}));
  EXPECT_EQ(tok->encode("hello 123456 world", false), (Ids{260, 32, '1', '2', '3', '4', '5', '6', 265}));
  // (?i:'m): "I", "'M"
  EXPECT_EQ(tok->encode("I'M", false), (Ids{'I', '\'', 'M'}));
  // ignore_merges: "ow" is in the vocab although no merge builds it
  EXPECT_EQ(tok->encode("ow", false), (Ids{267}));
  // "\n\n" then "x": \s*[\r\n]+ keeps newlines together
  EXPECT_EQ(tok->encode("a\n\nb", false), (Ids{'a', 10, 10, 'b'}));
  EXPECT_EQ(tok->bos_id(), 269);
  EXPECT_EQ(tok->decode(Ids{269, 260, 265}), "<|begin_of_text|>hello world");
  EXPECT_EQ(tok->decode(Ids{269, 260, 265}, true), "hello world");
}

TEST(ByteLevelNoIgnoreMerges, OwSplits) {
  auto tok = Tokenizer::from_file(fixture("bytelevel.json"));
  EXPECT_EQ(tok->encode("ow"), (Ids{'o', 'w'}));
}

class SpmLlama2 : public ::testing::Test {
 protected:
  void SetUp() override { tok = Tokenizer::from_file(fixture("spm_llama2.json")); }
  std::unique_ptr<Tokenizer> tok;
};

TEST_F(SpmLlama2, PrependReplaceAndMerges) {
  // "▁hello▁world": ll, ▁h, ▁he, ▁hell, ▁hello, ▁w, or, ▁wor, ▁worl, ▁world
  EXPECT_EQ(tok->encode("hello world"), (Ids{1, 271, 276}));
  EXPECT_EQ(tok->encode("hello world", false), (Ids{271, 276}));
  // "i" is not in the vocab: byte fallback <0x69> = 3 + 0x69
  EXPECT_EQ(tok->encode("hi", false), (Ids{268, 3 + 0x69}));
  // é = C3 A9
  EXPECT_EQ(tok->encode("\xC3\xA9", false), (Ids{259, 3 + 0xC3, 3 + 0xA9}));
  // each piece between special tokens is normalized on its own (Prepend again)
  EXPECT_EQ(tok->encode("<s>hello", false), (Ids{1, 271}));
  EXPECT_EQ(tok->encode("hello</s>hello", false), (Ids{271, 2, 271}));
  EXPECT_EQ(tok->encode("", true), (Ids{1}));
}

TEST_F(SpmLlama2, DecodeWithByteFallbackAndStrip) {
  EXPECT_EQ(tok->decode(Ids{1, 271, 276}), "<s> hello world");
  EXPECT_EQ(tok->decode(Ids{1, 271, 276}, true), "hello world");
  EXPECT_EQ(tok->decode(Ids{259, 3 + 0xC3, 3 + 0xA9}), "\xC3\xA9");
  // a lone <0xC3> is invalid: one U+FFFD per byte token
  EXPECT_EQ(tok->decode(Ids{3 + 0xC3, 271}), "\xEF\xBF\xBD hello");
  EXPECT_EQ(tok->decode(Ids{3 + 0xE4, 3 + 0xB8}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_F(SpmLlama2, IncrementalMatchesFullDecode) {
  Ids ids{271, 3 + 0xE4, 3 + 0xB8, 3 + 0xAD, 276, 268};
  IncrementalDecoder dec(*tok);
  std::string streamed;
  std::vector<std::string> chunks;
  for (int id : ids) {
    chunks.push_back(dec.push(id));
    streamed += chunks.back();
  }
  streamed += dec.flush();
  EXPECT_EQ(streamed, tok->decode(ids));
  EXPECT_EQ(chunks[0], "hello");
  EXPECT_EQ(chunks[1], "");
  EXPECT_EQ(chunks[2], "");
  EXPECT_EQ(chunks[3], "\xE4\xB8\xAD");  // byte tokens carry no ▁
  EXPECT_EQ(chunks[4], " world");
}

TEST(SpmGemma, NoPrefixAndFusedUnk) {
  auto tok = Tokenizer::from_file(fixture("spm_gemma.json"));
  // "hello▁world": h e ll o ▁world (no "h e" merge; ▁ attaches to w)
  EXPECT_EQ(tok->encode("hello world", false), (Ids{260, 261, 267, 263, 276}));
  // x y z are unknown (no byte fallback): fused into one <unk>
  EXPECT_EQ(tok->encode("xyz hello", false), (Ids{0, 271}));
  EXPECT_EQ(tok->decode(Ids{260, 261, 267, 263, 276}), "hello world");
}

TEST(Metaspace, PrependSchemeFirst) {
  auto tok = Tokenizer::from_file(fixture("metaspace_first.json"));
  EXPECT_EQ(tok->encode("hello world", false), (Ids{271, 276}));
  // after a special token the piece does not start the text: no ▁ prepended
  EXPECT_EQ(tok->encode("<s>hello world", false), (Ids{1, 260, 261, 267, 263, 276}));
  // Metaspace decoder drops ▁ from the first token only
  EXPECT_EQ(tok->decode(Ids{271, 276}), "hello world");
  EXPECT_EQ(tok->decode(Ids{276, 271}), "world hello");
}

TEST(ModelDir, ConfigAddBosEosIgnoredWithTokenizerJson) {
  // transformers 5 pops add_bos_token / add_eos_token when tokenizer.json is
  // present: llama2_dir's tokenizer.json has no post-processor, so no BOS/EOS
  // although its tokenizer_config.json asks for both.
  auto tok = Tokenizer::load(fixture("llama2_dir"));
  EXPECT_EQ(tok->encode("hello"), (Ids{271}));
  EXPECT_EQ(tok->bos_id(), std::nullopt);
  // tokenizer.json's own TemplateProcessing stays in force
  auto keep = Tokenizer::load(fixture("keep_post_dir"));
  EXPECT_EQ(keep->encode("hello"), (Ids{1, 271}));
  EXPECT_EQ(keep->bos_id(), 1);
}

}  // namespace
}  // namespace fp8kv
