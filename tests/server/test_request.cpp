// Request validation: fields honored, no-op values accepted, everything else a
// 400 naming the field; lengths against max_model_len; metrics text.
#include <gtest/gtest.h>

#include <filesystem>
#include <algorithm>
#include <limits>
#include <span>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/request.h"
#include "mini_context.h"
#include "tokenizer/tokenizer.h"

using namespace fp8kv;
using namespace fp8kv::server;
using nlohmann::json;

namespace {
struct Fixture : ::testing::Test, fp8kv::server::test_support::MiniContext {
  ApiError error_of(const json& body, bool chat = false) {
    try {
      chat ? parse_chat_request(body, ctx) : parse_completion_request(body, ctx);
    } catch (const ApiError& e) {
      return e;
    }
    ADD_FAILURE() << "no error for " << body.dump();
    return ApiError(0, "");
  }
};
using ServerRequest = Fixture;
}  // namespace

TEST_F(ServerRequest, FieldsReachTheEngineOptions) {
  const json body = {{"model", "mini"},   {"prompt", "hello world"}, {"max_tokens", 5}, {"temperature", 0.5},
                     {"top_p", 0.9},      {"top_k", 40},             {"seed", -3},      {"stop", {"x", "yz"}},
                     {"stop_token_ids", {7}}, {"ignore_eos", true},  {"logprobs", 2},   {"n", 1},
                     {"presence_penalty", 0}, {"logit_bias", json::object()}, {"user", "u"}, {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  const ParsedRequest r = parse_completion_request(body, ctx);
  EXPECT_EQ(r.prompt, tok->encode("hello world", true));
  EXPECT_EQ(r.gen.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(r.gen.sampling.top_k, 40);
  EXPECT_EQ(r.gen.sampling.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_EQ(r.gen.stop_token_ids, std::vector<int>{7});
  EXPECT_FALSE(r.gen.stop_at_eos);
  EXPECT_EQ(r.gen.logprobs, 2);
  EXPECT_TRUE(r.want_logprobs && r.stream && r.include_usage);
  EXPECT_EQ(r.user, "u");
}

TEST_F(ServerRequest, DefaultsComeFromGenerationConfigThenOpenAI) {
  ParsedRequest r = parse_completion_request({{"prompt", {1, 2, 3}}}, ctx);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.gen.sampling.top_p, 1.0f);
  EXPECT_EQ(r.gen.max_tokens, 64 - 3);  // max_model_len - prompt
  EXPECT_EQ(r.gen.logprobs, -1);
  ctx.defaults.temperature = 0.25f;
  ctx.defaults.top_k = 5;
  r = parse_completion_request({{"prompt", {1, 2, 3}}}, ctx);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.25f);
  EXPECT_EQ(r.gen.sampling.top_k, 5);
}

TEST_F(ServerRequest, BadFieldsAre400sNamingTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"prompt", "a"}, {"temperature", -0.1}}, "temperature"},
      {{{"prompt", "a"}, {"temperature", "hot"}}, "temperature"},
      {{{"prompt", "a"}, {"top_p", 1.5}}, "top_p"},
      {{{"prompt", "a"}, {"top_k", -2}}, "top_k"},
      {{{"prompt", "a"}, {"max_tokens", 0}}, "max_tokens"},
      {{{"prompt", "a"}, {"n", 2}}, "n"},
      {{{"prompt", "a"}, {"logprobs", 21}}, "logprobs"},
      {{{"prompt", "a"}, {"frequency_penalty", 1}}, "frequency_penalty"},
      {{{"prompt", "a"}, {"logit_bias", {{"5", 1}}}}, "logit_bias"},
      {{{"prompt", "a"}, {"stop", {""}}}, "stop"},
      {{{"prompt", "a"}, {"stop_token_ids", {8192}}}, "stop_token_ids"},
      {{{"prompt", "a"}, {"echo", true}}, "echo"},
      {{{"prompt", "a"}, {"wat", 1}}, "wat"},
      {{{"prompt", {"a", "b"}}}, "prompt"},
      {{{"prompt", {-1}}}, "prompt"},
      {{{"prompt", ""}}, "prompt"},
      {{{"max_tokens", 3}}, "prompt"},
      {{{"prompt", "a"}, {"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"prompt", "a"}, {"stream", true}, {"stream_options", {{"continuous_usage_stats", "yes"}}}},
       "stream_options.continuous_usage_stats"},
  };
  for (const auto& [body, field] : cases) {
    const ApiError e = error_of(body);
    EXPECT_EQ(e.status, 400) << body.dump();
    EXPECT_EQ(e.param, field) << body.dump() << ": " << e.what();
    EXPECT_EQ(e.body()["error"]["param"], field);
    EXPECT_EQ(e.body()["error"]["type"], "invalid_request_error");
  }
}

TEST_F(ServerRequest, LengthsAgainstMaxModelLenSayByHowMuch) {
  std::vector<int> prompt(60, 5);
  ApiError e = error_of({{"prompt", prompt}, {"max_tokens", 10}});
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(std::string(e.what()).find("70 tokens (60 in the prompt, 10 for the completion), 6 over"), std::string::npos)
      << e.what();
  prompt.resize(64);
  e = error_of({{"prompt", prompt}});
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(std::string(e.what()).find("1 over"), std::string::npos) << e.what();
  EXPECT_EQ(parse_completion_request({{"prompt", std::vector<int>(60, 5)}, {"max_tokens", 4}}, ctx).gen.max_tokens, 4);
}

TEST_F(ServerRequest, UnknownModelIs404) {
  const ApiError e = error_of({{"model", "gpt-4"}, {"prompt", "a"}});
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.param, "model");
}

TEST_F(ServerRequest, ChatWithoutTemplatesIsAClear400AndFieldsAreStillChecked) {
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  ApiError e = error_of({{"messages", msgs}}, true);
  EXPECT_EQ(e.status, 400);
  EXPECT_STREQ(e.what(), "no chat template support in this build");
  EXPECT_EQ(error_of({{"messages", msgs}, {"top_logprobs", 2}}, true).param, "top_logprobs");
  EXPECT_EQ(error_of({{"messages", msgs}, {"tools", {{{"type", "function"}}}}}, true).param, "tools");
  EXPECT_EQ(error_of({{"messages", "hi"}}, true).param, "messages");
}

TEST_F(ServerRequest, ChatRendersWithoutSpecialTokens) {
  ctx.chat = [](const nlohmann::ordered_json& m, bool gen, const nlohmann::ordered_json&) {
    return "<|endoftext|>" + m[0]["content"].get<std::string>() + (gen ? "!" : "");
  };
  const ParsedRequest r = parse_chat_request(
      {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"logprobs", true}, {"top_logprobs", 3}}, ctx);
  EXPECT_EQ(r.prompt, tok->encode("<|endoftext|>hi!", false));
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.gen.logprobs, 3);
}

TEST(ServerAuth, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("sekrit", "sekrit"));
  EXPECT_FALSE(constant_time_equal("sekrit", "sekriT"));
  EXPECT_FALSE(constant_time_equal("sekrit", "sekrit2"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

TEST(ServerMetrics, PrometheusTextWithCumulativeBuckets) {
  Metrics m("mini");
  m.set_gauges({3, 4, 75, 100, 5, 320, 96});
  m.add_prompt_tokens(10);
  m.add_generation_tokens(7);
  m.observe_ttft(0.003);
  m.observe_ttft(0.05);
  m.observe_e2e(1.2, "length");
  const std::string t = m.render();
  auto has = [&](const std::string& line) { return t.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has("fp8kv:num_requests_running{model_name=\"mini\"} 3")) << t;
  EXPECT_TRUE(has("fp8kv:num_requests_waiting{model_name=\"mini\"} 4"));
  EXPECT_TRUE(has("fp8kv:kv_cache_usage_perc{model_name=\"mini\"} 0.25"));
  EXPECT_TRUE(has("fp8kv:prompt_tokens_total{model_name=\"mini\"} 10"));
  EXPECT_TRUE(has("fp8kv:generation_tokens_total{model_name=\"mini\"} 7"));
  EXPECT_TRUE(has("fp8kv:time_to_first_token_seconds_bucket{model_name=\"mini\",le=\"0.001\"} 0"));
  EXPECT_TRUE(has("fp8kv:time_to_first_token_seconds_bucket{model_name=\"mini\",le=\"0.005\"} 1"));
  EXPECT_TRUE(has("fp8kv:time_to_first_token_seconds_bucket{model_name=\"mini\",le=\"0.06\"} 2"));
  EXPECT_TRUE(has("fp8kv:time_to_first_token_seconds_bucket{model_name=\"mini\",le=\"+Inf\"} 2"));
  EXPECT_TRUE(has("fp8kv:time_to_first_token_seconds_count{model_name=\"mini\"} 2"));
  EXPECT_TRUE(has("fp8kv:e2e_request_latency_seconds_count{model_name=\"mini\"} 1"));
  EXPECT_TRUE(has("fp8kv:request_success_total{model_name=\"mini\",finished_reason=\"length\"} 1"));
  EXPECT_TRUE(has("# TYPE fp8kv:inter_token_latency_seconds histogram"));
  EXPECT_TRUE(has("fp8kv:num_preemptions_total{model_name=\"mini\"} 5"));
  EXPECT_TRUE(has("fp8kv:prefix_cache_queries_total{model_name=\"mini\"} 320"));
  EXPECT_TRUE(has("fp8kv:prefix_cache_hits_total{model_name=\"mini\"} 96"));
  EXPECT_TRUE(has("# TYPE fp8kv:prefix_cache_hits_total counter"));
}

// seed -1 means a random seed, as in vLLM's SamplingParams (docs/design.md
// "One rule per flag"); any other int64 is the seed's 64 bits.
TEST_F(ServerRequest, SeedMinusOneIsRandom) {
  const json body = {{"prompt", {1, 2, 3}}, {"seed", -1}};
  const uint64_t a = parse_completion_request(body, ctx).gen.sampling.seed;
  const uint64_t b = parse_completion_request(body, ctx).gen.sampling.seed;
  EXPECT_NE(a, b);  // two 64-bit draws
  EXPECT_NE(a, static_cast<uint64_t>(int64_t{-1}));
  EXPECT_EQ(parse_completion_request({{"prompt", {1, 2, 3}}, {"seed", -2}}, ctx).gen.sampling.seed,
            static_cast<uint64_t>(int64_t{-2}));
}

// Issue 37 C5: every float field is a 32-bit float in the engine; a finite
// double beyond FLT_MAX (3.4028235e38) is a 400 naming the field, not a 500.
TEST_F(ServerRequest, FloatFieldsBeyondFltMaxAre400NamingTheField) {
  for (const char* f : {"temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "repetition_penalty"}) {
    for (double v : {3.5e38, 1e39, 1e308, -1e39}) {
      const ApiError e = error_of({{"prompt", {1, 2, 3}}, {f, v}});
      EXPECT_EQ(e.status, 400) << f << " " << v;
      EXPECT_EQ(e.param, f) << e.what();
    }
  }
  // FLT_MAX itself is a float: temperature accepts it.
  const ParsedRequest r =
      parse_completion_request({{"prompt", {1, 2, 3}}, {"temperature", std::numeric_limits<float>::max()}}, ctx);
  EXPECT_EQ(r.gen.sampling.temperature, std::numeric_limits<float>::max());
}

// Issue 37 C7: content as an array of text parts (OpenAI, vLLM): joined with
// "\n"; a non-text part is refused by its name and place.
TEST_F(ServerRequest, ChatContentTextPartsAreJoinedAndOtherPartsRefusedByName) {
  std::string rendered;
  ctx.chat = [&](const nlohmann::ordered_json& m, bool, const nlohmann::ordered_json&) {
    rendered = m[1]["content"].get<std::string>();
    return "<|endoftext|>" + rendered;
  };
  const json parts = json::array({{{"type", "text"}, {"text", "one"}}, {{"type", "text"}, {"text", "two"}}});
  const json msgs = json::array({{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", parts}}});
  const ParsedRequest r = parse_chat_request({{"messages", msgs}}, ctx);
  EXPECT_EQ(rendered, "one\ntwo");
  EXPECT_EQ(r.prompt, tok->encode("<|endoftext|>one\ntwo", false));
  const json image = json::array({{{"role", "user"},
                                   {"content", json::array({{{"type", "text"}, {"text", "a"}},
                                                            {{"type", "image_url"}, {"image_url", {{"url", "x"}}}}})}}});
  ApiError e = error_of({{"messages", image}}, true);
  EXPECT_EQ(e.param, "messages[0].content[1]");
  EXPECT_NE(std::string(e.what()).find("\"image_url\""), std::string::npos) << e.what();
  e = error_of({{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}}})}}})}}, true);
  EXPECT_EQ(e.param, "messages[0].content[0].text");
  e = error_of({{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}, true);
  EXPECT_EQ(e.param, "messages[0].content");
}

// Issue 37 C1: a prompt text is refused by its bytes before tokenizing when
// no text that long can fit in max_model_len tokens.
TEST_F(ServerRequest, PromptBytesBeyondTheBoundAreRefusedBeforeTokenizing) {
  ctx.max_prompt_bytes = prompt_byte_bound(*tok, ctx.max_model_len);
  // The bound holds: the longest tokens, max_model_len of them, fit under it.
  size_t longest = 0;
  for (int id = 0; id < tok->vocab_size(); ++id)
    longest = std::max(longest, tok->decode(std::span<const int>(&id, 1), false).size());
  EXPECT_GE(ctx.max_prompt_bytes, longest * 64);
  const std::string over(ctx.max_prompt_bytes + 1, 'a');
  const ApiError e = error_of({{"prompt", over}});
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(std::string(e.what()).find("refused before tokenizing"), std::string::npos) << e.what();
  // At the bound, the text is tokenized (and here is over max_model_len by its tokens).
  const ApiError at = error_of({{"prompt", std::string(ctx.max_prompt_bytes, 'a')}});
  EXPECT_EQ(std::string(at.what()).find("refused before tokenizing"), std::string::npos) << at.what();
}
