// libFuzzer target: the chat-template parser and evaluator. Any input must
// either load, or be rejected at load with TemplateError (Kind::Syntax) and a
// line:column inside the input; a loaded template must render or fail with
// TemplateError (Kind::Render). A crash, hang, sanitizer report or other
// exception is a bug. Build and run: docs/fuzzing.md.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "template/chat_template.h"
#include "template_inputs.h"


extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  using fp8kv::tmpl::ChatTemplate;
  using fp8kv::tmpl::TemplateError;
  std::optional<ChatTemplate> t;
  try {
    t.emplace(ChatTemplate::load(src, "fuzz"));
  } catch (const TemplateError& e) {
    if (e.kind != TemplateError::Kind::Syntax || e.line < 1 || e.column < 1) __builtin_trap();
    return 0;
  }
  for (bool gen : {false, true}) {
    try {
      (void)t->render(fp8kv::tmpl::fuzz::messages(), gen, fp8kv::tmpl::fuzz::extra());
    } catch (const TemplateError& e) {
      if (e.kind != TemplateError::Kind::Render) __builtin_trap();
    }
  }
  return 0;
}
