// OpenAI request bodies (/v1/completions, /v1/chat/completions) -> what the
// engine runs. Every field is either honored, accepted as a no-op value
// (n 1, penalties 0, an empty logit_bias), or refused with a 400 naming it:
// nothing is silently ignored (docs/server.md lists the fields).
#pragma once
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::server {

// Sampling defaults from generation_config.json; unset ones fall back to
// OpenAI's (temperature 1, top_p 1, top_k off), as vLLM does.
struct SamplingDefaults {
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
  std::vector<std::string> not_applied;  // generation_config fields the server cannot honor (logged at start)
};
SamplingDefaults load_sampling_defaults(const std::filesystem::path& model_dir);

// Renders chat messages to a prompt string (add_generation_prompt, extra
// template variables); empty when this build has no chat templates.
// Messages keep the client's key order (templates print them with tojson).
using ChatRenderer = std::function<std::string(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                               const nlohmann::ordered_json& extra_vars)>;

struct ModelContext {
  std::string served_name;
  std::filesystem::path model_dir;
  const Tokenizer* tokenizer = nullptr;
  int vocab_size = 0;       // the model's (ids >= this are refused)
  int max_model_len = 0;
  int max_logprobs = 20;    // as vLLM's default --max-logprobs
  size_t max_prompt_bytes = 0;  // a prompt text longer than this is refused before tokenizing; 0: no bound
  SamplingDefaults defaults;
  ChatRenderer chat;        // empty: chat requests get a 400
  std::string chat_unavailable_reason;
};

struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;   // stream_options.continuous_usage_stats: usage so far in every chunk (with include_usage)
  std::vector<int> prompt;
  GenerateOptions gen;             // max_tokens, sampling, eos, stop ids, logprobs
  std::vector<std::string> stop;   // stop strings
  bool want_logprobs = false;      // logprobs requested (top count in gen.logprobs)
  bool skip_special_tokens = true;
  std::string user;
};

// Throws ApiError (400 naming the field, 404 for an unknown model).
ParsedRequest parse_completion_request(const nlohmann::json& body, const ModelContext& ctx);
// `ordered`: the same body parsed with key order kept (for the template);
// nullptr: taken from `body` (keys sorted).
ParsedRequest parse_chat_request(const nlohmann::json& body, const ModelContext& ctx,
                                 const nlohmann::ordered_json* ordered = nullptr);

// Validates chat messages (objects with a string role; content a string,
// null, or an array of OpenAI content parts) and returns them with text-part
// arrays joined into one string (parts joined by "\n", as vLLM). A non-text
// part is a 400 naming it (messages[i].content[j]).
nlohmann::ordered_json normalize_chat_messages(const nlohmann::ordered_json& messages);

// The longest prompt text, in bytes, that can fit in max_model_len tokens:
// every token covers at most max_token_bytes bytes of input (the longest
// vocabulary entry decoded, at least 4: one UTF-8 character), doubled as a
// margin for normalizers that shrink text. A prompt over it is refused
// before the tokenizer sees it (docs/server.md "Limits").
size_t prompt_byte_bound(const Tokenizer& tok, int max_model_len);

// The model field, when present, must name the served model (404 otherwise).
void check_model_field(const nlohmann::json& body, const ModelContext& ctx);

}  // namespace fp8kv::server
