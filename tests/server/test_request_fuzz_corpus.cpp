// Replays the kept corpus of the request-body fuzz target
// (tests/fuzz/fuzz_request.cpp, tests/data/fuzz_request/) in every build, the
// ASan+UBSan one included (docs/fuzzing.md). Contract: a JSON body parses
// into a request with ids inside the vocabulary, or is refused with ApiError
// (4xx); any other exception would be a 500 in the server.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "../common/fuzz_corpus.h"
#include "server/api_error.h"
#include "server/request.h"

namespace fs = std::filesystem;
using namespace fp8kv;
using namespace fp8kv::server;

TEST(RequestFuzzCorpus, EveryBodyParsedOrRefusedWithApiError) {
  const fs::path model = fs::path(FP8KV_SOURCE_DIR) / "models" / "fp8kv-mini";
  const auto tok = Tokenizer::load(model);
  ModelContext ctx;
  ctx.served_name = "mini";
  ctx.model_dir = model;
  ctx.tokenizer = tok.get();
  ctx.vocab_size = tok->vocab_size();
  ctx.max_model_len = 256;
  ctx.chat = [](const nlohmann::ordered_json& m, bool gen, const nlohmann::ordered_json& extra) {
    return m.dump() + (gen ? "<assistant>" : "") + extra.dump();
  };
  const auto corpus = fp8kv::test_util::fuzz_corpus("fuzz_request");
  ASSERT_GE(corpus.size(), 20u) << "tests/data/fuzz_request";
  int parsed = 0, refused = 0;
  for (const auto& [path, text] : corpus) {
    const auto body = nlohmann::json::parse(text, nullptr, false);
    if (body.is_discarded()) continue;
    const auto ordered = nlohmann::ordered_json::parse(text, nullptr, false);
    for (bool chat : {false, true}) {
      try {
        const ParsedRequest r = chat ? parse_chat_request(body, ctx, &ordered) : parse_completion_request(body, ctx);
        EXPECT_FALSE(r.prompt.empty()) << path;
        for (int id : r.prompt) EXPECT_TRUE(id >= 0 && id < ctx.vocab_size) << path << " id " << id;
        ++parsed;
      } catch (const ApiError& err) {
        EXPECT_GE(err.status, 400) << path;
        EXPECT_LT(err.status, 500) << path << ": " << err.what();
        ++refused;
      } catch (const std::exception& err) {
        ADD_FAILURE() << path << (chat ? " (chat)" : " (completion)") << ": " << typeid(err).name() << ": "
                      << err.what();
      }
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 0);
  std::printf("fuzz_request corpus: %zu files, %d parses, %d refusals\n", corpus.size(), parsed, refused);
}
