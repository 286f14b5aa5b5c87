// Replays the kept corpus of the tokenizer.json fuzz target
// (tests/fuzz/fuzz_tokenizer.cpp, tests/data/fuzz_tokenizer/) in every build,
// the ASan+UBSan one included, so a fixed finding stays fixed without clang
// in CI (docs/fuzzing.md). The contract is the target's: a file loads and
// then encodes/decodes with every id < vocab_size(), or is refused with an
// InputError naming the file; nothing else.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "../common/fuzz_corpus.h"
#include "io/errors.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

TEST(TokenizerFuzzCorpus, EveryFileLoadsOrIsRefusedWithInputError) {
  const auto corpus = fp8kv::test_util::fuzz_corpus("fuzz_tokenizer");
  ASSERT_GE(corpus.size(), 20u) << "tests/data/fuzz_tokenizer";
  int loaded = 0, refused = 0;
  for (const auto& f : corpus) {
    try {
      const auto tok = fp8kv::Tokenizer::from_file(f.path);
      for (const char* t : {"Hello world! It's 2026, isn't it?\n\n  x  ",
                            "\xC3\xA9t\xC3\xA9 \xE2\x96\x81 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 123456", ""}) {
        for (bool special : {false, true}) {
          const auto ids = tok->encode(t, special);
          for (int id : ids) EXPECT_TRUE(id >= 0 && id < tok->vocab_size()) << f.path << " id " << id;
          (void)tok->decode(ids, true);
        }
      }
      ++loaded;
    } catch (const fp8kv::InputError& err) {
      EXPECT_NE(std::string(err.what()).find(f.path.filename().string()), std::string::npos)
          << f.path << ": " << err.what();
      ++refused;
    } catch (const std::exception& err) {
      ADD_FAILURE() << f.path << ": " << typeid(err).name() << ": " << err.what();
    }
  }
  EXPECT_GE(loaded, 7);  // the real fixtures of tests/data/tokenizers
  EXPECT_GT(refused, 0);
  std::printf("fuzz_tokenizer corpus: %zu files, %d loaded, %d refused\n", corpus.size(), loaded, refused);
}

// Found by fuzz_tokenizer (2026-12-01, docs/fuzzing.md): the model vocabulary
// has 245 entries with ids up to 267, the added tokens declared at 268/269 land
// on 245/246 (as `tokenizers` assigns them), and the TemplateProcessing BOS
// stays 269, an id past the vocabulary (size 268). Refused at load, naming the
// post-processor.
TEST(TokenizerFuzzCorpus, PostProcessorIdPastTheVocabularyIsRefused) {
  const fs::path f =
      fs::path(FP8KV_SOURCE_DIR) / "tests" / "data" / "fuzz_tokenizer" / "post_processor_id_past_vocab.json";
  try {
    (void)fp8kv::Tokenizer::from_file(f);
    FAIL() << "loaded " << f;
  } catch (const fp8kv::InputError& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("post_processor: special token id 269 is not in the vocabulary (size 268)"), std::string::npos)
        << m;
  }
}
