#include "server/generation.h"

#include <algorithm>

namespace fp8kv::server {

using nlohmann::json;

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse_data(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

Generation::Generation(const ParsedRequest& req, const Tokenizer& tok, std::vector<int> eos_ids, std::string model,
                       std::string id, int64_t created)
    : req_(req),
      tok_(tok),
      eos_ids_(std::move(eos_ids)),
      model_(std::move(model)),
      id_(std::move(id)),
      created_(created),
      decoder_(tok, req.skip_special_tokens),
      stops_(req.stop),
      prompt_tokens_(static_cast<int>(req.prompt.size())) {}

std::string Generation::token_text(int id) const { return tok_.decode(std::span<const int>(&id, 1), false); }

Delta Generation::consume(const std::vector<StepEvent>& events) {
  Delta d;
  auto emit = [&](const std::string& piece) {
    decoded_bytes_ += piece.size();
    const StopMatcher::Result r = stops_.push(piece);
    d.text += r.text;
    if (r.stop) {
      stop_matched_ = true;
      stop_string_ = r.stop;
      finish_reason_ = "stop";
    }
  };
  for (const auto& ev : events) {
    if (done()) break;
    if (ev.token >= 0) {
      ++completion_tokens_;
      ++d.tokens;
      const bool eos = req_.gen.stop_at_eos && std::count(eos_ids_.begin(), eos_ids_.end(), ev.token);
      const bool stop_id = std::count(req_.gen.stop_token_ids.begin(), req_.gen.stop_token_ids.end(), ev.token) > 0;
      const bool stop_token = ev.finished == FinishReason::stop && (eos || stop_id);
      if (req_.want_logprobs && ev.logprob) {
        LogprobEntry e{ev.token, *ev.logprob, ev.top_logprobs, text_.size() + d.text.size()};
        d.logprobs.push_back(std::move(e));
      }
      if (stop_token) {
        if (stop_id && !eos) stop_token_ = ev.token;  // vLLM reports a stop_token_ids hit as stop_reason
      } else {
        emit(decoder_.push(ev.token));
      }
    }
    if (ev.finished && !done()) {
      emit(decoder_.flush());
      if (!done()) {
        d.text += stops_.flush();
        switch (*ev.finished) {
          case FinishReason::stop: finish_reason_ = "stop"; break;
          case FinishReason::length: finish_reason_ = "length"; break;
          case FinishReason::cancelled: finish_reason_ = "abort"; break;
        }
      }
    }
  }
  text_ += d.text;
  logprobs_.insert(logprobs_.end(), d.logprobs.begin(), d.logprobs.end());
  return d;
}

json Generation::usage() const {
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens_ + completion_tokens_}};
}

json Generation::stop_reason_json() const {
  if (stop_string_) return *stop_string_;
  if (stop_token_) return *stop_token_;
  return nullptr;
}

json Generation::completion_logprobs(const std::vector<LogprobEntry>& entries) const {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& e : entries) {
    tokens.push_back(token_text(e.token));
    lps.push_back(e.logprob);
    json top = json::object();
    top[token_text(e.token)] = e.logprob;  // the sampled token is always listed (vLLM)
    for (const auto& t : e.top) top[token_text(t.token)] = t.logprob;
    tops.push_back(top);
    offsets.push_back(e.text_offset);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json Generation::chat_logprobs(const std::vector<LogprobEntry>& entries) const {
  auto item = [&](int id, float lp) {
    const std::string s = token_text(id);
    json bytes = json::array();
    for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
    return json{{"token", s}, {"logprob", lp}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const auto& e : entries) {
    json c = item(e.token, e.logprob);
    json top = json::array();
    for (const auto& t : e.top) top.push_back(item(t.token, t.logprob));
    c["top_logprobs"] = top;
    content.push_back(c);
  }
  return {{"content", content}};
}

json Generation::response(const char* object, json choice, json logprobs) const {
  choice["index"] = 0;
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason_ ? json(*finish_reason_) : json();
  choice["stop_reason"] = stop_reason_json();
  return {{"id", id_},
          {"object", object},
          {"created", created_},
          {"model", model_},
          {"choices", json::array({std::move(choice)})},
          {"usage", usage()}};
}

json Generation::completion_response() const {
  return response("text_completion", {{"text", text_}},
                  req_.want_logprobs ? completion_logprobs(logprobs_) : json());
}

json Generation::chat_response() const {
  return response("chat.completion", {{"message", {{"role", "assistant"}, {"content", text_}}}},
                  req_.want_logprobs ? chat_logprobs(logprobs_) : json());
}

std::string Generation::sse(const Delta& d, bool first) {
  std::string out;
  const bool chat = req_.chat;
  // include_usage: "usage": null in every chunk but the last (OpenAI's
  // shape); with continuous_usage_stats too, the counts so far (vLLM's).
  auto chunk = [&](json choice, int completion_tokens) {
    json c = {{"id", id_},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_},
              {"choices", json::array({std::move(choice)})}};
    if (req_.include_usage)
      c["usage"] = req_.continuous_usage ? json{{"prompt_tokens", prompt_tokens_},
                                                {"completion_tokens", completion_tokens},
                                                {"total_tokens", prompt_tokens_ + completion_tokens}}
                                         : json();
    out += sse_data(c);
  };
  if (chat && first) {  // the role opens the stream, before any token
    chunk({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
           {"finish_reason", nullptr}},
          0);
  }
  // A chunk for every batch of new tokens, even one whose text is empty (as
  // vLLM: a client sees each step's progress and can time it).
  const bool has = !d.text.empty() || !d.logprobs.empty() || d.tokens > 0;
  if (has || done()) {
    json lp = nullptr;
    if (req_.want_logprobs && !d.logprobs.empty()) lp = chat ? chat_logprobs(d.logprobs) : completion_logprobs(d.logprobs);
    json choice = {{"index", 0}, {"logprobs", lp}};
    if (chat) {
      choice["delta"] = (d.text.empty() && done()) ? json::object() : json{{"content", d.text}};
    } else {
      choice["text"] = d.text;
    }
    choice["finish_reason"] = done() ? json(*finish_reason_) : json();
    choice["stop_reason"] = done() ? stop_reason_json() : json();
    chunk(std::move(choice), completion_tokens_);
  }
  if (done()) {
    if (req_.include_usage) {
      out += sse_data({{"id", id_},
                       {"object", chat ? "chat.completion.chunk" : "text_completion"},
                       {"created", created_},
                       {"model", model_},
                       {"choices", json::array()},
                       {"usage", usage()}});
    }
    out += "data: [DONE]\n\n";
  }
  return out;
}

}  // namespace fp8kv::server
