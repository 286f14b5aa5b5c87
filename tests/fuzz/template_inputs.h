// The fixed render inputs of the chat-template fuzz target
// (tests/fuzz/fuzz_template.cpp), shared with its corpus replay test
// (tests/template/test_template_fuzz_corpus.cpp) so both check one contract.
#pragma once

#include <nlohmann/json.hpp>

namespace fp8kv::tmpl::fuzz {

inline const nlohmann::ordered_json& messages() {
  static const auto m = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "Hi <think>x</think> 🩷"},
    {"role": "assistant", "content": "Hello", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": {"a": 1}}}]},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": [{"type": "text", "text": "t"}, {"type": "image"}]}])");
  return m;
}

inline const nlohmann::ordered_json& extra() {
  static const auto e = nlohmann::ordered_json::parse(
      R"({"bos_token": "<s>", "eos_token": "</s>", "tools": [{"type": "function", "function": {"name": "f"}}]})");
  return e;
}

}  // namespace fp8kv::tmpl::fuzz
