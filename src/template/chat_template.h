// Chat templates: a Jinja subset renderer for Hugging Face chat templates
// (docs/chat_templates.md lists the subset; docs/design.md, serve).
//
// A template is parsed once by ChatTemplate::load. Anything outside the subset
// (an unknown tag, filter, test or syntax) fails there, with line and column,
// never mid-request. render() then evaluates with the environment transformers
// uses for apply_chat_template: trim_blocks, lstrip_blocks, loopcontrols,
// tojson without ASCII escaping, raise_exception, strftime_now.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "io/errors.h"

namespace fp8kv::tmpl {

// Bad template or failed render. Derives from InputError (the CLI maps it to
// exit 2; the server to a 400). line/column are 1-based; 0 when unknown.
struct TemplateError : InputError {
  enum class Kind {
    Syntax,  // from load(): outside the subset or malformed
    Render,  // from render(): raise_exception(), a type error, ...
  };
  TemplateError(Kind kind, std::string message, int line, int column);
  Kind kind;
  int line;
  int column;
};

class ChatTemplate {
 public:
  // Parses `source`. `origin` names it in errors ("chat_template.jinja").
  // Throws TemplateError(Kind::Syntax) with "origin:line:col: message".
  static ChatTemplate load(std::string_view source, std::string origin = "chat template");

  // Renders with `messages` (a JSON array of {"role", "content", ...}),
  // `add_generation_prompt`, and every member of `extra` (a JSON object:
  // bos_token, eos_token, tools, enable_thinking, ...) as top-level variables.
  // Throws TemplateError(Kind::Render) on raise_exception() or a type error.
  // Thread-safe: a loaded template is immutable.
  // JSON objects keep their key order (tojson prints them in that order, as
  // Python does): parse requests with nlohmann::ordered_json. A
  // nlohmann::json converts implicitly, with its keys sorted.
  // tools and documents are None unless `extra` sets them (as transformers).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // Renders with arbitrary top-level variables (a JSON object).
  std::string render_vars(const nlohmann::ordered_json& vars) const;

  const std::string& origin() const { return origin_; }

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  struct Program;  // parsed tree (template.cpp)

 private:
  ChatTemplate() = default;
  std::shared_ptr<const Program> program_;
  std::string origin_;
};

struct ChatTemplateSource {
  std::string source;
  std::string origin;  // the file it came from, for errors and logs
};

// Finds the chat template for a model directory:
//   1. `override_file` (--chat-template FILE) when non-empty: an explicit flag
//      wins, as in vLLM;
//   2. MODEL_DIR/chat_template.jinja (transformers 5 writes it there);
//   3. MODEL_DIR/tokenizer_config.json's "chat_template": a string, or a list
//      of {"name", "template"} from which "default" is taken.
// Returns std::nullopt when none exists. Throws InputError when a file exists
// but is unreadable or malformed, or when override_file does not exist.
std::optional<ChatTemplateSource> find_chat_template(const std::filesystem::path& model_dir,
                                      const std::filesystem::path& override_file = {});

}  // namespace fp8kv::tmpl
