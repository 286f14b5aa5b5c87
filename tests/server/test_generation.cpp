// The streamed output side (src/server/generation.cpp): one SSE chunk per
// batch of new tokens, as vLLM streams (docs/server.md "Streaming"). A token
// whose bytes end mid-character adds no text but still gets its chunk, with
// "text": ""; tokens consumed together go out in one chunk. Usage in the
// chunks: null with include_usage, the counts so far with
// continuous_usage_stats, then the usage chunk.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "server/bench_client.h"
#include "server/generation.h"
#include "server/request.h"
#include "mini_context.h"
#include "tokenizer/tokenizer.h"

using namespace fp8kv;
using namespace fp8kv::server;
using nlohmann::json;

namespace {

// The `data:` payloads of an SSE string ("[DONE]" kept as text), split as
// bench serve's client splits them.
std::vector<std::string> data_lines(const std::string& sse) { return SseSplitter().feed(sse.data(), sse.size()); }

StepEvent token(int id, std::optional<FinishReason> fin = std::nullopt) {
  StepEvent e;
  e.id = 1;
  e.token = id;
  e.finished = fin;
  return e;
}
}  // namespace

struct ServerGeneration : ::testing::Test, fp8kv::server::test_support::MiniContext {};

TEST_F(ServerGeneration, EveryBatchOfTokensStreamsAChunkEvenWithoutText) {
  // "€" is three byte tokens in the bundled tokenizer (E2 82 AC): the first
  // two end mid-character and decode to nothing yet.
  const std::vector<int> euro = tok->encode("\u20ac", false);
  ASSERT_EQ(euro.size(), 3u);
  const std::vector<int> ab = tok->encode(" a b", false);
  ASSERT_GE(ab.size(), 2u);
  const ParsedRequest req = parse_completion_request(
      json{{"model", "mini"}, {"prompt", "x"}, {"max_tokens", 8}, {"stream", true}, {"ignore_eos", true}}, ctx);
  Generation g(req, *tok, {}, "mini", "cmpl-1", 0);

  std::string all;
  for (size_t i = 0; i < euro.size(); ++i) {
    const Delta d = g.consume({token(euro[i])});
    EXPECT_EQ(d.tokens, 1);
    const std::vector<std::string> lines = data_lines(g.sse(d, i == 0));
    ASSERT_EQ(lines.size(), 1u) << "token " << i;
    const json c = json::parse(lines[0]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_EQ(c["choices"][0]["text"], i < 2 ? "" : "\u20ac");
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
    all += c["choices"][0]["text"].get<std::string>();
  }
  // Two tokens consumed together (the writer ran late): one chunk with both
  // texts, here the last one, then [DONE].
  const Delta d = g.consume({token(ab[0]), token(ab[1], FinishReason::length)});
  EXPECT_EQ(d.tokens, 2);
  const std::vector<std::string> lines = data_lines(g.sse(d, false));
  ASSERT_EQ(lines.size(), 2u);
  const json c = json::parse(lines[0]);
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  all += c["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(lines[1], "[DONE]");
  EXPECT_EQ(all, "\u20ac" + tok->decode(std::vector<int>{ab[0], ab[1]}, false));
  EXPECT_EQ(g.completion_tokens(), 5);
}

TEST_F(ServerGeneration, ContinuousUsageStatsCountSoFar) {
  const std::vector<int> ids = tok->encode(" one two three", false);
  ASSERT_GE(ids.size(), 3u);
  for (const bool continuous : {false, true}) {
    SCOPED_TRACE(continuous ? "continuous_usage_stats" : "include_usage only");
    const ParsedRequest req = parse_completion_request(
        json{{"model", "mini"},
             {"prompt", {7, 8, 9, 10}},
             {"max_tokens", 3},
             {"stream", true},
             {"ignore_eos", true},
             {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", continuous}}}},
        ctx);
    EXPECT_EQ(req.continuous_usage, continuous);
    Generation g(req, *tok, {}, "mini", "cmpl-2", 0);
    std::vector<json> chunks;
    for (int i = 0; i < 3; ++i) {
      const Delta d = g.consume({token(ids[i], i == 2 ? std::optional(FinishReason::length) : std::nullopt)});
      for (const std::string& l : data_lines(g.sse(d, i == 0)))
        if (l != "[DONE]") chunks.push_back(json::parse(l));
    }
    ASSERT_EQ(chunks.size(), 4u);  // three tokens, then the usage chunk
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(chunks[i].contains("usage"));
      if (continuous) {
        EXPECT_EQ(chunks[i]["usage"], (json{{"prompt_tokens", 4}, {"completion_tokens", i + 1}, {"total_tokens", 5 + i}}));
      } else {
        EXPECT_TRUE(chunks[i]["usage"].is_null());
      }
    }
    EXPECT_TRUE(chunks[3]["choices"].empty());
    EXPECT_EQ(chunks[3]["usage"], (json{{"prompt_tokens", 4}, {"completion_tokens", 3}, {"total_tokens", 7}}));
  }
}
