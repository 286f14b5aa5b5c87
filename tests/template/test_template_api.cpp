// ChatTemplate API details and find_chat_template's search order.
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../common/errors.h"
#include "../common/temp_dir.h"
#include "template/chat_template.h"

namespace fp8kv::tmpl {
using ::testing::HasSubstr;
namespace {

using ojson = nlohmann::ordered_json;
using test_util::TempDir;

void write(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

TEST(ChatTemplateApi, ToolsAndDocumentsDefaultToNoneAsTransformers) {
  auto t = ChatTemplate::load("{{ tools is defined }}{{ tools is none }}{{ documents is none }}{{ bos_token }}");
  EXPECT_EQ(t.render(ojson::array(), false), "TrueTrueTrue");
  EXPECT_EQ(t.render(ojson::array(), false, ojson{{"bos_token", "<s>"}, {"tools", ojson::array()}}),
            "TrueFalseTrue<s>");
}

TEST(ChatTemplateApi, KeyOrderIsKeptForTojson) {
  auto t = ChatTemplate::load("{{ tools[0] | tojson }}");
  ojson extra = ojson::parse(R"({"tools": [{"type": "function", "function": {"name": "f", "a": 1}}]})");
  EXPECT_EQ(t.render(ojson::array(), false, extra), R"({"type": "function", "function": {"name": "f", "a": 1}})");
  // A plain nlohmann::json converts, with its keys sorted.
  nlohmann::json sorted = nlohmann::json::parse(R"({"tools": [{"z": 1, "a": 2}]})");
  EXPECT_EQ(t.render(ojson::array(), false, sorted), R"({"a": 2, "z": 1})");
}

TEST(ChatTemplateApi, AddGenerationPromptAndMessages) {
  auto t = ChatTemplate::load("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{% if add_generation_prompt %}A:{% endif %}");
  ojson msgs = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(t.render(msgs, false), "user:hi;");
  EXPECT_EQ(t.render(msgs, true), "user:hi;A:");
  // add_generation_prompt and messages cannot be overridden through extra.
  EXPECT_EQ(t.render(msgs, true, ojson{{"add_generation_prompt", false}, {"messages", ojson::array()}}),
            "user:hi;A:");
}

TEST(ChatTemplateApi, LoadedTemplateIsReusableAndMovable) {
  auto t = ChatTemplate::load("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}", "count");
  ojson two = ojson::parse(R"([{"role": "user"}, {"role": "user"}])");
  EXPECT_EQ(t.render(two, false), "2");
  EXPECT_EQ(t.render(two, false), "2");  // namespace state does not leak across renders
  ChatTemplate moved = std::move(t);
  EXPECT_EQ(moved.render(two, false), "2");
  EXPECT_EQ(moved.origin(), "count");
}

TEST(ChatTemplateApi, StrftimeNowFormatsTheCurrentDate) {
  auto t = ChatTemplate::load("{{ strftime_now('%Y') }}");
  std::string year = t.render(ojson::array(), false);
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

TEST(FindChatTemplate, SearchOrder) {
  TempDir d;
  EXPECT_FALSE(find_chat_template(d.path()).has_value());
  write(d.path() / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_FALSE(find_chat_template(d.path()).has_value());
  write(d.path() / "tokenizer_config.json", R"({"chat_template": "from config"})");
  auto s = find_chat_template(d.path());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->source, "from config");
  EXPECT_NE(s->origin.find("tokenizer_config.json"), std::string::npos);
  write(d.path() / "chat_template.jinja", "from jinja");
  EXPECT_EQ(find_chat_template(d.path())->source, "from jinja");
  write(d.path() / "override.jinja", "from flag");
  EXPECT_EQ(find_chat_template(d.path(), d.path() / "override.jinja")->source, "from flag");
  EXPECT_THROW(find_chat_template(d.path(), d.path() / "missing.jinja"), InputError);
}

TEST(FindChatTemplate, NamedTemplateListTakesDefault) {
  TempDir d;
  write(d.path() / "tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(find_chat_template(d.path())->source, "D");
  write(d.path() / "tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_THAT(test_util::input_error_of([&] { find_chat_template(d.path()); }),
              HasSubstr("none named \"default\" (tool_use)"));
  write(d.path() / "tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_THROW(find_chat_template(d.path()), InputError);
  write(d.path() / "tokenizer_config.json", R"({"chat_template": )");
  EXPECT_THROW(find_chat_template(d.path()), InputError);
}

}  // namespace
}  // namespace fp8kv::tmpl

namespace fp8kv::tmpl {
namespace {

TEST(BundledModel, ChatTemplateRendersChatMlTurns) {
  // Expected strings: jinja2 3.1.6 with transformers' environment on the same
  // template and messages (docs/chat_templates.md).
  auto src = find_chat_template(std::filesystem::path(FP8KV_SOURCE_DIR) / "models/fp8kv-mini");
  ASSERT_TRUE(src.has_value());
  EXPECT_NE(src->origin.find("chat_template.jinja"), std::string::npos);
  auto t = ChatTemplate::load(src->source, src->origin);
  auto msgs = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": " Hi "}, {"type": "image"}, {"type": "text", "text": "there"}]},
    {"role": "assistant", "content": "Hello.\n"}])");
  EXPECT_EQ(t.render(msgs, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render(nlohmann::ordered_json::array({msgs[0]}), false), "<|im_start|>system\nBe brief.<|im_end|>\n");
}

}  // namespace
}  // namespace fp8kv::tmpl
