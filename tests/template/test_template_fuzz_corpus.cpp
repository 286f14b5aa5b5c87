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

#include "../common/fuzz_corpus.h"
#include "../fuzz/template_inputs.h"
#include "template/chat_template.h"

namespace fs = std::filesystem;

namespace fp8kv::tmpl {
namespace {

TEST(TemplateFuzzCorpus, EveryInputLoadsAndRendersOrFailsWithItsKind) {
  const auto corpus = fp8kv::test_util::fuzz_corpus("fuzz_template");
  ASSERT_GE(corpus.size(), 20u) << "tests/data/fuzz_template";
  int syntax = 0, rendered = 0, render_errors = 0;
  for (const auto& [path, text] : corpus) {
    std::optional<ChatTemplate> t;
    try {
      t.emplace(ChatTemplate::load(text, path.filename().string()));
    } catch (const TemplateError& err) {
      EXPECT_EQ(err.kind, TemplateError::Kind::Syntax) << path << ": " << err.what();
      EXPECT_GE(err.line, 1) << path;
      EXPECT_GE(err.column, 1) << path;
      ++syntax;
      continue;
    } catch (const std::exception& err) {
      ADD_FAILURE() << path << ": load: " << typeid(err).name() << ": " << err.what();
      continue;
    }
    for (bool gen : {false, true}) {
      try {
        (void)t->render(fuzz::messages(), gen, fuzz::extra());
        ++rendered;
      } catch (const TemplateError& err) {
        EXPECT_EQ(err.kind, TemplateError::Kind::Render) << path << ": " << err.what();
        ++render_errors;
      } catch (const std::exception& err) {
        ADD_FAILURE() << path << ": render: " << typeid(err).name() << ": " << err.what();
      }
    }
  }
  EXPECT_GT(syntax, 0);
  EXPECT_GT(rendered, 0);
  EXPECT_GT(render_errors, 0);
  std::printf("fuzz_template corpus: %zu files, %d syntax errors, %d renders, %d render errors\n", corpus.size(),
              syntax, rendered, render_errors);
}

}  // namespace
}  // namespace fp8kv::tmpl
