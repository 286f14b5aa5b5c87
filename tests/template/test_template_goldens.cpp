// Chat templates against independent references (docs/chat_templates.md):
// - language.json: jinja2 with transformers' environment, one case per
//   construct of the subset (tools/gen_template_goldens.py);
// - <model>.json: transformers' apply_chat_template(tokenize=False) on the
//   real llama3_1 / qwen3 / gemma3 / deepseek_v3 templates.
// Every expected string must match byte for byte; every case where the
// reference raised must raise here too.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "../common/golden.h"
#include "template/chat_template.h"

namespace fp8kv::tmpl {
namespace {

using ojson = nlohmann::ordered_json;

std::string slurp(const std::string& rel) {
  std::ifstream f(std::string(FP8KV_SOURCE_DIR) + "/" + rel, std::ios::binary);
  EXPECT_TRUE(f.good()) << rel;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ojson golden(const std::string& name) {
  return ojson::parse(test_util::read_golden(std::string(FP8KV_SOURCE_DIR) + "/tests/golden/templates/" + name));
}

TEST(TemplateGoldens, LanguageCasesMatchJinja2) {
  ojson doc = golden("language.json");
  ASSERT_GE(doc["cases"].size(), 60u);
  int checked = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    if (c.contains("expected")) {
      std::string out;
      try {
        out = ChatTemplate::load(c["template"].get<std::string>(), name).render_vars(c["vars"]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "threw: " << e.what();
        continue;
      }
      EXPECT_EQ(out, c["expected"].get<std::string>());
    } else {
      const std::string err = c["error"];
      try {
        auto t = ChatTemplate::load(c["template"].get<std::string>(), name);
        std::string out = t.render_vars(c["vars"]);
        ADD_FAILURE() << "jinja2 raised (" << err << ") but rendered: " << out;
      } catch (const TemplateError& e) {
        EXPECT_EQ(e.kind, TemplateError::Kind::Render) << e.what();
        EXPECT_GT(e.line, 0);
        // raise_exception's message passes through unchanged.
        if (err.rfind("TemplateError: ", 0) == 0) {
          EXPECT_NE(std::string(e.what()).find(err.substr(15)), std::string::npos) << e.what();
        }
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(doc["cases"].size()));
}

class RealTemplate : public ::testing::TestWithParam<const char*> {};

TEST_P(RealTemplate, MatchesTransformersApplyChatTemplate) {
  ojson doc = golden(std::string(GetParam()) + ".json");
  const std::string file = doc["template_file"];
  ChatTemplate t = ChatTemplate::load(slurp(file), file);
  ASSERT_GE(doc["cases"].size(), 12u);
  for (const auto& c : doc["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    if (c.contains("expected")) {
      EXPECT_EQ(t.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]),
                c["expected"].get<std::string>());
    } else {
      try {
        t.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]);
        ADD_FAILURE() << "transformers raised: " << c["error"];
      } catch (const TemplateError& e) {
        EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos) << e.what();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, RealTemplate, ::testing::Values("llama3_1", "qwen3", "gemma3", "deepseek_v3"));

}  // namespace
}  // namespace fp8kv::tmpl
