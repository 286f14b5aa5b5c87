// Replays the chat-template fuzz corpus (tests/data/fuzz_template, kept from
// tests/fuzz/fuzz_template.cpp runs: docs/fuzzing.md) in every build,
// ASan+UBSan included, with the fuzz target's contract: each input loads or is
// refused with TemplateError{Syntax} at a line:column >= 1, and whatever
// loads renders or fails with TemplateError{Render}. Any other exception, a
// crash or a sanitizer report is a bug.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <typeinfo>

#include "../fuzz/template_inputs.h"
#include "template/chat_template.h"

namespace fs = std::filesystem;

namespace fp8kv::tmpl {
namespace {

TEST(TemplateFuzzCorpus, EveryInputLoadsAndRendersOrFailsWithItsKind) {
  const fs::path dir = fs::path(FP8KV_SOURCE_DIR) / "tests" / "data" / "fuzz_template";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int files = 0, syntax = 0, rendered = 0, render_errors = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    ++files;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::optional<ChatTemplate> t;
    try {
      t.emplace(ChatTemplate::load(text, e.path().filename().string()));
    } catch (const TemplateError& err) {
      EXPECT_EQ(err.kind, TemplateError::Kind::Syntax) << e.path() << ": " << err.what();
      EXPECT_GE(err.line, 1) << e.path();
      EXPECT_GE(err.column, 1) << e.path();
      ++syntax;
      continue;
    } catch (const std::exception& err) {
      ADD_FAILURE() << e.path() << ": load: " << typeid(err).name() << ": " << err.what();
      continue;
    }
    for (bool gen : {false, true}) {
      try {
        (void)t->render(fuzz::messages(), gen, fuzz::extra());
        ++rendered;
      } catch (const TemplateError& err) {
        EXPECT_EQ(err.kind, TemplateError::Kind::Render) << e.path() << ": " << err.what();
        ++render_errors;
      } catch (const std::exception& err) {
        ADD_FAILURE() << e.path() << ": render: " << typeid(err).name() << ": " << err.what();
      }
    }
  }
  EXPECT_GE(files, 20);
  EXPECT_GT(syntax, 0);
  EXPECT_GT(rendered, 0);
  EXPECT_GT(render_errors, 0);
  std::printf("fuzz_template corpus: %d files, %d syntax errors, %d renders, %d render errors\n", files, syntax,
              rendered, render_errors);
}

}  // namespace
}  // namespace fp8kv::tmpl
