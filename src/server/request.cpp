#include "server/request.h"

#include <fmt/format.h>

#include <cmath>
#include <algorithm>
#include <fstream>
#include <span>
#include <limits>
#include <random>
#include <set>

#include "io/errors.h"
#include "io/fs_util.h"
#include "server/api_error.h"

namespace fp8kv::server {

using nlohmann::json;

SamplingDefaults load_sampling_defaults(const std::filesystem::path& model_dir) {
  SamplingDefaults d;
  const auto path = model_dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return d;
  const json g = read_json_object(path);  // the depth check of every JSON file fp8kv reads
  auto num = [&](const char* k) -> std::optional<double> {
    if (!g.contains(k) || g[k].is_null()) return std::nullopt;
    if (!g[k].is_number()) throw InputError(fmt::format("{}: {} must be a number", path.string(), k));
    const double v = g[k].get<double>();
    if (!(std::fabs(v) <= std::numeric_limits<float>::max()))
      throw InputError(fmt::format("{}: {} = {} is outside the 32-bit float range", path.string(), k, v));
    return v;
  };
  if (auto t = num("temperature")) d.temperature = static_cast<float>(*t);
  if (auto p = num("top_p")) d.top_p = static_cast<float>(*p);
  if (auto k = num("top_k")) d.top_k = static_cast<int>(*k);
  // Fields vLLM would apply but this server cannot: reported, never silently dropped.
  if (auto r = num("repetition_penalty"); r && *r != 1.0) d.not_applied.push_back("repetition_penalty");
  if (auto m = num("min_p"); m && *m != 0.0) d.not_applied.push_back("min_p");
  return d;
}

size_t prompt_byte_bound(const Tokenizer& tok, int max_model_len) {
  size_t longest = 4;
  for (int id = 0; id < tok.vocab_size(); ++id)
    longest = std::max(longest, tok.decode(std::span<const int>(&id, 1), false).size());
  return 2 * static_cast<size_t>(std::max(max_model_len, 1)) * longest;
}

void check_model_field(const json& body, const ModelContext& ctx) {
  if (!body.contains("model") || body["model"].is_null()) return;
  if (!body["model"].is_string()) throw bad_field("model", "must be a string");
  const std::string m = body["model"].get<std::string>();
  if (m != ctx.served_name)
    throw ApiError(404, fmt::format("The model `{}` does not exist (this server serves `{}`).", m, ctx.served_name),
                   "model", "not_found_error", "model_not_found");
}

namespace {

// Tokenizes a prompt text, refusing it first when its bytes alone prove it
// cannot fit (tokenizing 23 MiB took 11-24 s of CPU for a certain 400).
std::vector<int> encode_prompt(const std::string& text, const ModelContext& ctx, const char* field, bool add_special) {
  if (ctx.max_prompt_bytes > 0 && text.size() > ctx.max_prompt_bytes)
    throw bad_field(field, fmt::format("the prompt is {} bytes; this model's maximum context length is {} tokens, which "
                                       "no text over {} bytes can fit (refused before tokenizing)",
                                       text.size(), ctx.max_model_len, ctx.max_prompt_bytes));
  try {
    return ctx.tokenizer->encode(text, add_special);
  } catch (const InputError& e) {
    throw bad_field(field, e.what());
  }
}

bool present(const json& body, const char* k) { return body.contains(k) && !body[k].is_null(); }

// Every numeric field the engine keeps is a 32-bit float: a value beyond
// FLT_MAX would become inf there, so it is refused here, for every field.
double get_number(const json& body, const char* k) {
  if (!body[k].is_number()) throw bad_field(k, "must be a number");
  const double v = body[k].get<double>();
  if (!std::isfinite(v)) throw bad_field(k, "must be finite");
  if (std::fabs(v) > std::numeric_limits<float>::max())
    throw bad_field(k, fmt::format("{} is outside the 32-bit float range (magnitude at most {})", v,
                                   std::numeric_limits<float>::max()));
  return v;
}

int64_t get_int(const json& body, const char* k, int64_t lo, int64_t hi) {
  const json& v = body[k];
  if (!v.is_number_integer()) throw bad_field(k, "must be an integer");
  int64_t x;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    x = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                          : static_cast<int64_t>(u);
  } else {
    x = v.get<int64_t>();
  }
  if (x < lo || x > hi) throw bad_field(k, fmt::format("{} is out of range [{}, {}]", x, lo, hi));
  return x;
}

bool get_bool(const json& body, const char* k) {
  if (!body[k].is_boolean()) throw bad_field(k, "must be a boolean");
  return body[k].get<bool>();
}

std::vector<int> token_list(const json& v, const char* field, int vocab) {
  std::vector<int> ids;
  for (const auto& t : v) {
    if (!t.is_number_integer()) throw bad_field(field, "token ids must be integers");
    const int64_t x = t.get<int64_t>();
    if (x < 0 || x >= vocab) throw bad_field(field, fmt::format("token id {} is outside the vocabulary [0, {})", x, vocab));
    ids.push_back(static_cast<int>(x));
  }
  return ids;
}

// Fields both endpoints share. Returns false when `k` is not one of them.
bool common_field(const std::string& k, const json& body, ParsedRequest& r, const ModelContext& ctx) {
  const char* f = k.c_str();
  if (k == "model" || k == "user") {
    if (k == "user" && !body[f].is_string()) throw bad_field(f, "must be a string");
    if (k == "user") r.user = body[f].get<std::string>();
    return true;  // model: check_model_field
  }
  if (k == "max_tokens" || k == "max_completion_tokens") {
    r.gen.max_tokens = static_cast<int>(get_int(body, f, 1, std::numeric_limits<int>::max()));
    return true;
  }
  if (k == "temperature") {
    const double t = get_number(body, f);
    if (t < 0.0) throw bad_field(f, fmt::format("{} must be >= 0", t));
    r.gen.sampling.temperature = static_cast<float>(t);
    return true;
  }
  if (k == "top_p") {
    const double p = get_number(body, f);
    if (!(p > 0.0 && p <= 1.0)) throw bad_field(f, fmt::format("{} must be in (0, 1]", p));
    r.gen.sampling.top_p = static_cast<float>(p);
    return true;
  }
  if (k == "top_k") {
    const int64_t t = get_int(body, f, -1, std::numeric_limits<int>::max());
    r.gen.sampling.top_k = t <= 0 ? 0 : static_cast<int>(t);  // -1 and 0: off (vLLM)
    return true;
  }
  if (k == "seed") {
    // vLLM: -1 = random (as when absent; the default drawn in the request's
    // defaults stays); any other int64 is the seed's 64 bits.
    const int64_t s = get_int(body, f, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    if (s != -1) r.gen.sampling.seed = static_cast<uint64_t>(s);
    return true;
  }
  if (k == "stop") {
    const json& s = body[f];
    if (s.is_string()) {
      r.stop = {s.get<std::string>()};
    } else if (s.is_array()) {
      for (const auto& x : s) {
        if (!x.is_string()) throw bad_field(f, "must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad_field(f, "must be a string or an array of strings");
    }
    for (const auto& x : r.stop)
      if (x.empty()) throw bad_field(f, "stop strings must not be empty");
    return true;
  }
  if (k == "stop_token_ids") {
    if (!body[f].is_array()) throw bad_field(f, "must be an array of token ids");
    r.gen.stop_token_ids = token_list(body[f], f, ctx.vocab_size);
    return true;
  }
  if (k == "ignore_eos") {
    r.gen.stop_at_eos = !get_bool(body, f);
    return true;
  }
  if (k == "skip_special_tokens") {
    r.skip_special_tokens = get_bool(body, f);
    return true;
  }
  if (k == "stream") {
    r.stream = get_bool(body, f);
    return true;
  }
  if (k == "stream_options") {
    const json& o = body[f];
    if (!o.is_object()) throw bad_field(f, "must be an object");
    for (const auto& [ok, ov] : o.items()) {
      if (ok == "include_usage") {
        if (!ov.is_boolean() && !ov.is_null()) throw bad_field("stream_options.include_usage", "must be a boolean");
        r.include_usage = ov.is_boolean() && ov.get<bool>();
      } else if (ok == "continuous_usage_stats") {
        if (!ov.is_boolean() && !ov.is_null())
          throw bad_field("stream_options.continuous_usage_stats", "must be a boolean");
        r.continuous_usage = ov.is_boolean() && ov.get<bool>();
      } else {
        throw bad_field("stream_options." + ok, "is not supported");
      }
    }
    return true;
  }
  // Accepted only at their no-op values.
  if (k == "n" || k == "best_of") {
    if (get_int(body, f, 1, std::numeric_limits<int64_t>::max()) != 1) throw bad_field(f, "only 1 is supported");
    return true;
  }
  if (k == "presence_penalty" || k == "frequency_penalty" || k == "min_p") {
    if (get_number(body, f) != 0.0) throw bad_field(f, "is not supported (only 0)");
    return true;
  }
  if (k == "repetition_penalty") {
    if (get_number(body, f) != 1.0) throw bad_field(f, "is not supported (only 1)");
    return true;
  }
  if (k == "min_tokens") {
    if (get_int(body, f, 0, std::numeric_limits<int64_t>::max()) != 0) throw bad_field(f, "is not supported (only 0)");
    return true;
  }
  if (k == "logit_bias") {
    if (!body[f].is_object() || !body[f].empty()) throw bad_field(f, "is not supported (only an empty object)");
    return true;
  }
  return false;
}

ParsedRequest start(const json& body, const ModelContext& ctx) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model_field(body, ctx);
  ParsedRequest r;
  r.gen.max_tokens = -1;  // set below from the prompt when absent
  r.gen.sampling.temperature = ctx.defaults.temperature.value_or(1.0f);
  r.gen.sampling.top_p = ctx.defaults.top_p.value_or(1.0f);
  r.gen.sampling.top_k = std::max(0, ctx.defaults.top_k.value_or(0));
  r.gen.sampling.seed = std::random_device{}() * 0x100000001ull + std::random_device{}();
  return r;
}

void finish(ParsedRequest& r, const json& body, const ModelContext& ctx) {
  if (r.include_usage && !r.stream) throw bad_field("stream_options", "is only allowed when stream is true");
  const int n = static_cast<int>(r.prompt.size());
  const int L = ctx.max_model_len;
  const char* pf = r.chat ? "messages" : "prompt";
  if (n == 0) throw bad_field(pf, "the prompt is empty (no tokens)");
  if (n >= L)
    throw bad_field(pf, fmt::format("this model's maximum context length is {} tokens; the prompt has {} tokens, {} over "
                                    "(and at least 1 token must be left to generate)",
                                    L, n, n - L + 1));
  const char* mf = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (r.gen.max_tokens < 0) {
    r.gen.max_tokens = L - n;
  } else if (static_cast<int64_t>(n) + r.gen.max_tokens > L) {
    throw bad_field(mf, fmt::format("this model's maximum context length is {} tokens; you requested {} tokens ({} in "
                                    "the prompt, {} for the completion), {} over",
                                    L, static_cast<int64_t>(n) + r.gen.max_tokens, n, r.gen.max_tokens,
                                    static_cast<int64_t>(n) + r.gen.max_tokens - L));
  }
}

}  // namespace

ParsedRequest parse_completion_request(const json& body, const ModelContext& ctx) {
  ParsedRequest r = start(body, ctx);
  bool have_prompt = false;
  for (const auto& [k, v] : body.items()) {
    if (v.is_null()) continue;  // null = omitted
    if (common_field(k, body, r, ctx)) continue;
    const char* f = k.c_str();
    if (k == "prompt") {
      have_prompt = true;
      const json* p = &v;
      // A batch of exactly one prompt is the same request.
      if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
      if (p->is_string()) {
        r.prompt = encode_prompt(p->get<std::string>(), ctx, f, /*add_special=*/true);
      } else if (p->is_array()) {
        if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array()))
          throw bad_field(f, "only one prompt per request is supported (n = 1, no batches)");
        r.prompt = token_list(*p, f, ctx.vocab_size);
      } else {
        throw bad_field(f, "must be a string, an array of token ids, or an array of one of these");
      }
    } else if (k == "logprobs") {
      r.gen.logprobs = static_cast<int>(get_int(body, f, 0, ctx.max_logprobs));
      r.want_logprobs = true;
    } else if (k == "echo") {
      if (get_bool(body, f)) throw bad_field(f, "is not supported (only false)");
    } else if (k == "suffix") {
      throw bad_field(f, "is not supported");
    } else {
      throw bad_field(f, "is not a supported field of /v1/completions");
    }
  }
  if (!have_prompt) throw bad_field("prompt", "is required");
  finish(r, body, ctx);
  return r;
}

nlohmann::ordered_json normalize_chat_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) throw bad_field("messages", "must be an array of messages");
  nlohmann::ordered_json out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    auto& m = out[i];
    const std::string mf = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw bad_field(mf, "must be an object");
    if (!m.contains("role") || !m["role"].is_string()) throw bad_field(mf + ".role", "must be a string");
    if (!m.contains("content") || m["content"].is_null() || m["content"].is_string()) continue;
    if (!m["content"].is_array())
      throw bad_field(mf + ".content", "must be a string or an array of content parts");
    // OpenAI's content parts: text parts are joined with "\n" (vLLM's
    // "string" content format); any other part type is refused by name.
    std::string text;
    const auto& parts = m["content"];
    for (size_t j = 0; j < parts.size(); ++j) {
      const std::string pf = fmt::format("{}.content[{}]", mf, j);
      const auto& part = parts[j];
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
        throw bad_field(pf, "must be a content part object with a string \"type\"");
      const std::string type = part["type"].get<std::string>();
      if (type != "text")
        throw bad_field(pf, fmt::format("content part type \"{}\" is not supported (only \"text\" parts)", type));
      if (!part.contains("text") || !part["text"].is_string()) throw bad_field(pf + ".text", "must be a string");
      if (j > 0) text += '\n';
      text += part["text"].get<std::string>();
    }
    m["content"] = text;
  }
  return out;
}

ParsedRequest parse_chat_request(const json& body, const ModelContext& ctx, const nlohmann::ordered_json* ordered) {
  ParsedRequest r = start(body, ctx);
  r.chat = true;
  bool add_generation_prompt = true;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  int top_logprobs = -1;
  nlohmann::ordered_json messages;
  for (const auto& [k, v] : body.items()) {
    if (v.is_null()) continue;
    if (common_field(k, body, r, ctx)) continue;
    const char* f = k.c_str();
    if (k == "messages") {
      if (!v.is_array() || v.empty()) throw bad_field(f, "must be a non-empty array of messages");
      messages = normalize_chat_messages(ordered ? (*ordered)[k] : nlohmann::ordered_json(v));
    } else if (k == "logprobs") {
      r.want_logprobs = get_bool(body, f);
    } else if (k == "top_logprobs") {
      top_logprobs = static_cast<int>(get_int(body, f, 0, ctx.max_logprobs));
    } else if (k == "add_generation_prompt") {
      add_generation_prompt = get_bool(body, f);
    } else if (k == "chat_template_kwargs") {
      if (!v.is_object()) throw bad_field(f, "must be an object");
      extra = ordered ? (*ordered)[k] : nlohmann::ordered_json(v);
    } else if (k == "response_format") {
      if (!v.is_object() || v.value("type", "") != "text" || v.size() != 1)
        throw bad_field(f, "only {\"type\": \"text\"} is supported");
    } else if (k == "tools" || k == "functions") {
      if (!v.is_array() || !v.empty()) throw bad_field(f, "tool calling is not supported");
    } else if (k == "tool_choice") {
      if (v != "none") throw bad_field(f, "tool calling is not supported (only \"none\")");
    } else if (k == "parallel_tool_calls") {
      get_bool(body, f);  // meaningless without tools
    } else if (k == "echo" || k == "continue_final_message") {
      if (get_bool(body, f)) throw bad_field(f, "is not supported (only false)");
    } else {
      throw bad_field(f, "is not a supported field of /v1/chat/completions");
    }
  }
  if (!present(body, "messages")) throw bad_field("messages", "is required");
  if (top_logprobs >= 0 && !r.want_logprobs) throw bad_field("top_logprobs", "requires logprobs to be true");
  if (r.want_logprobs) r.gen.logprobs = std::max(0, top_logprobs);
  if (!ctx.chat) throw ApiError(400, ctx.chat_unavailable_reason, "messages");
  std::string text;
  try {
    text = ctx.chat(messages, add_generation_prompt, extra);
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {
    throw bad_field("messages", std::string("the chat template failed: ") + e.what());
  }
  r.prompt = encode_prompt(text, ctx, "messages", /*add_special=*/false);  // the template wrote the BOS (vLLM)
  finish(r, body, ctx);
  return r;
}

}  // namespace fp8kv::server
