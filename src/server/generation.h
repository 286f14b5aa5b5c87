// One request's output side: StepEvents -> detokenized text with stop strings
// applied, logprobs, finish reason, and the OpenAI response / SSE chunk JSON
// for /v1/completions and /v1/chat/completions.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/request.h"
#include "server/stop_matcher.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::server {

struct LogprobEntry {
  int token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
  size_t text_offset = 0;
};

// New output since the last call.
struct Delta {
  std::string text;
  std::vector<LogprobEntry> logprobs;
  int tokens = 0;  // tokens consumed (a token may add no text: bytes that end mid-character, a held-back stop prefix)
};

class Generation {
 public:
  Generation(const ParsedRequest& req, const Tokenizer& tok, std::vector<int> eos_ids, std::string model,
             std::string id, int64_t created);

  // Consumes events; returns the new text/logprobs. Once a stop string
  // matched, stop_matched() turns true (the caller cancels the engine request).
  Delta consume(const std::vector<StepEvent>& events);
  bool done() const { return finish_reason_.has_value(); }
  bool stop_matched() const { return stop_matched_; }
  void fail_as(std::string reason) { finish_reason_ = std::move(reason); }

  int prompt_tokens() const { return prompt_tokens_; }
  int completion_tokens() const { return completion_tokens_; }
  nlohmann::json usage() const;

  // Non-streaming response bodies (the whole text).
  nlohmann::json completion_response() const;
  nlohmann::json chat_response() const;
  // Streaming: data lines ("data: {...}\n\n") for this delta (and the finish
  // when done), plus the usage chunk and [DONE] after the last.
  std::string sse(const Delta& d, bool first);

 private:
  nlohmann::json completion_logprobs(const std::vector<LogprobEntry>& e) const;
  nlohmann::json chat_logprobs(const std::vector<LogprobEntry>& e) const;
  nlohmann::json stop_reason_json() const;
  // A non-streaming body: the one choice (its endpoint's fields plus index,
  // logprobs, finish_reason, stop_reason) in the envelope both share.
  nlohmann::json response(const char* object, nlohmann::json choice, nlohmann::json logprobs) const;
  std::string token_text(int id) const;

  const ParsedRequest& req_;
  const Tokenizer& tok_;
  std::vector<int> eos_ids_;
  std::string model_, id_;
  int64_t created_;
  IncrementalDecoder decoder_;
  StopMatcher stops_;
  std::string text_;                 // all emitted text
  size_t decoded_bytes_ = 0;         // text decoded so far (before stop hold-back)
  std::vector<LogprobEntry> logprobs_;
  std::optional<std::string> finish_reason_;
  std::optional<std::string> stop_string_;
  std::optional<int> stop_token_;
  bool stop_matched_ = false;
  int prompt_tokens_ = 0;
  int completion_tokens_ = 0;
};

std::string sse_data(const nlohmann::json& j);
std::string dump_json(const nlohmann::json& j);

}  // namespace fp8kv::server
