// Constructs outside the subset, and malformed templates, fail at load with
// their line and column; render-time errors name theirs.
#include <gtest/gtest.h>

#include "template/chat_template.h"

namespace fp8kv::tmpl {
namespace {

struct SyntaxCase {
  const char* src;
  int line, col;
  const char* what;
};

TEST(TemplateErrors, OutsideSubsetFailsAtLoadWithLineAndColumn) {
  const SyntaxCase cases[] = {
      {"{% macro m() %}x{% endmacro %}", 1, 4, "unsupported tag 'macro'"},
      {"a\n  {% include 'x' %}", 2, 6, "unsupported tag 'include'"},
      {"{{ x | frobnicate }}", 1, 8, "unsupported filter 'frobnicate'"},
      {"{% if x is prime %}{% endif %}", 1, 12, "unsupported test 'prime'"},
      {"\n\n{{ lipsum(3) }}", 3, 4, "unsupported function 'lipsum'"},
      {"{{ s.zfill(3) }}", 1, 6, "unsupported method 'zfill'"},
      {"{% for x in y recursive %}{% endfor %}", 1, 15, "recursive loops are not supported"},
      {"{% if x %}\nabc", 1, 4, "'if' is never closed"},
      {"{% for x in y %}{% endif %}", 1, 20, "unexpected 'endif'"},
      {"{{ 'abc }}", 1, 4, "unterminated string"},
      {"{{ x ", 1, 1, "unclosed '{{'"},
      {"{# note", 1, 1, "unclosed comment"},
      {"{% break %}", 1, 4, "'break' outside a for loop"},
      {"{{ (1 + 2 }}", 1, 11, "unexpected '}', expected ')'"},
      {"{{ x = 1 }}", 1, 6, "expected '}}'"},
      {"{{ a ! b }}", 1, 6, "unexpected character '!'"},
      {"{{ x) }}", 1, 5, "unexpected ')'"},
      {"{{ f()() }}", 1, 4, "unsupported function 'f'"},
      {"{{ x[] }}", 1, 5, "empty subscript"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.src);
    try {
      ChatTemplate::load(c.src, "t.jinja");
      ADD_FAILURE() << "loaded";
    } catch (const TemplateError& e) {
      EXPECT_EQ(e.kind, TemplateError::Kind::Syntax);
      EXPECT_EQ(e.line, c.line) << e.what();
      EXPECT_EQ(e.column, c.col) << e.what();
      std::string prefix = "t.jinja:" + std::to_string(c.line) + ":" + std::to_string(c.col) + ": ";
      EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.what), std::string::npos) << e.what();
    }
  }
}

TEST(TemplateErrors, RenderErrorsNameTheirPosition) {
  auto t = ChatTemplate::load("line one\n{% for m in messages %}\n  {{ m.content.strip() }}{% endfor %}", "c.jinja");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(R"([{"role": "user"}])");
  try {
    t.render(msgs, false);
    ADD_FAILURE() << "rendered";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind, TemplateError::Kind::Render);
    EXPECT_EQ(e.line, 3);
    EXPECT_STREQ(e.what(), "c.jinja:3:16: 'dict object' has no attribute 'content'");
  }
}

TEST(TemplateErrors, RaiseExceptionCarriesTheMessage) {
  auto t = ChatTemplate::load("{% if messages[0].role != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(R"([{"role": "assistant", "content": "x"}])");
  try {
    t.render(msgs, true);
    ADD_FAILURE() << "rendered";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind, TemplateError::Kind::Render);
    EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos);
  }
}

TEST(TemplateErrors, BadArgumentsToRender) {
  auto t = ChatTemplate::load("x");
  EXPECT_THROW(t.render(nlohmann::ordered_json::object(), false), TemplateError);
  EXPECT_THROW(t.render(nlohmann::ordered_json::array(), false, nlohmann::ordered_json::array()), TemplateError);
  EXPECT_EQ(t.render(nlohmann::ordered_json::array(), false), "x");
}

TEST(TemplateErrors, DeepNestingFailsCleanly) {
  // Bounded recursion: a hostile template cannot overflow the stack.
  for (std::string open : {"(", "[", "not ", "-"}) {
    std::string src = "{{ ";
    for (int k = 0; k < 20000; ++k) src += open;
    src += "1";
    for (int k = 0; k < 20000; ++k) src += open == "(" ? ")" : open == "[" ? "]" : "";
    src += " }}";
    try {
      ChatTemplate::load(src);
      ADD_FAILURE() << open;
    } catch (const TemplateError& e) {
      EXPECT_NE(std::string(e.what()).find("nesting deeper than 200"), std::string::npos) << e.what();
    }
  }
  std::string blocks;
  for (int k = 0; k < 20000; ++k) blocks += "{% if x %}";
  EXPECT_THROW(ChatTemplate::load(blocks), TemplateError);
  // 150 levels are fine.
  std::string ok = "{{ ";
  for (int k = 0; k < 50; ++k) ok += "(";
  ok += "1";
  for (int k = 0; k < 50; ++k) ok += ")";
  EXPECT_EQ(ChatTemplate::load(ok + " }}").render(nlohmann::ordered_json::array(), false), "1");
}

// fuzz_template found (2026-12-01) that a positional index with more digits
// than an unsigned long ('{1555...5}'.format(...)) escaped as std::out_of_range
// from std::stoul; a huge %-format width or precision did the same or asked
// for a giant string. Each is now a render error naming the number.
TEST(TemplateErrors, HugeFormatNumbersAreRenderErrors) {
  const auto render = [](const std::string& src) {
    return ChatTemplate::load(src, "f.jinja").render(nlohmann::ordered_json::array(), false);
  };
  const std::string huge(60, '5');
  for (const std::string& src : {"{{ '{" + huge + "}'.format('a') }}", "{{ '%" + huge + "s' % 'a' }}",
                                 "{{ '%." + huge + "f' % 1.5 }}", std::string("{{ '%100001d' % 1 }}")}) {
    try {
      render(src);
      ADD_FAILURE() << "rendered: " << src;
    } catch (const TemplateError& e) {
      EXPECT_EQ(e.kind, TemplateError::Kind::Render) << src;
      EXPECT_NE(std::string(e.what()).find("is too large (limit 100000)"), std::string::npos) << e.what();
    }
  }
  // Within the limit, as Python formats them.
  EXPECT_EQ(render("{{ '{1}{0}'.format('a', 'b') }}"), "ba");
  EXPECT_EQ(render("{{ '%5s|%-3s|%.2s|%.s|' % ('ab', 'c', 'xyz', 'q') }}"), "   ab|c  |xy||");
  EXPECT_EQ(render("{{ '%08.3f' % 3.14159 }}"), "0003.142");
  EXPECT_EQ(render("{{ '%1000d' % 7 }}").size(), 1000u);
  // A second '.' is not a format character, as in Python.
  EXPECT_THROW(render("{{ '%5.3.2s' % 'a' }}"), TemplateError);
}

// fuzz_template found (2026-12-01) nested loops over range(889) that ran for
// minutes; all loops of one render now share a budget of 2^18 iterations.
TEST(TemplateErrors, NestedLoopsHaveOneIterationBudget) {
  const auto render = [](const std::string& src) {
    return ChatTemplate::load(src, "loops.jinja").render(nlohmann::ordered_json::array(), false);
  };
  try {
    render("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}"
           "{% endfor %}{% endfor %}");  // 10^9 iterations
    ADD_FAILURE() << "rendered";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.kind, TemplateError::Kind::Render);
    EXPECT_STREQ(e.what(), "loops.jinja:1:56: for loops ran more than 262144 iterations in all");
  }
  // Within the budget, nested loops run as in Jinja.
  EXPECT_EQ(render("{% set n = namespace(c=0) %}{% for a in range(300) %}{% for b in range(300) %}"
                   "{% set n.c = n.c + 1 %}{% endfor %}{% endfor %}{{ n.c }}"),
            "90000");
}

// Issue 37: `{{ 'y' * 100000 }}` in a loop took 5.2 GB in the server. The
// output, and every string a render builds, is bounded by 1 MiB plus twice
// the bytes of the strings passed in, checked before the bytes are allocated.
TEST(TemplateErrors, RenderedSizeIsBounded) {
  const auto render = [](const std::string& src, const nlohmann::ordered_json& msgs = nlohmann::ordered_json::array()) {
    return ChatTemplate::load(src, "big.jinja").render(msgs, false);
  };
  const auto expect_bounded = [&](const std::string& src, const char* what) {
    SCOPED_TRACE(src);
    try {
      render(src);
      ADD_FAILURE() << "rendered";
    } catch (const TemplateError& e) {
      EXPECT_EQ(e.kind, TemplateError::Kind::Render);
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // Output growing by emits; strings growing by ~, +, *, join, replace, indent.
  expect_bounded("{% for i in range(200000) %}{{ 'y' * 100000 }}{% endfor %}", "output exceeds");
  expect_bounded("{% set n = namespace(s='y' * 1000) %}{% for i in range(40) %}{% set n.s = n.s ~ n.s %}{% endfor %}",
                 "exceeds the render limit");
  expect_bounded("{% set n = namespace(s='y' * 1000) %}{% for i in range(40) %}{% set n.s = n.s + n.s %}{% endfor %}",
                 "exceeds the render limit");
  expect_bounded("{{ 'y' * 2000000 }}", "repeated string too long");
  expect_bounded("{{ ('y' * 1000000).replace('', 'zz') }}", "exceeds the render limit");
  expect_bounded("{{ ('y' * 100000) | replace('y', 'y' * 100) }}", "exceeds the render limit");
  expect_bounded("{{ range(100000) | map('string') | join('y' * 100) }}", "exceeds the render limit");
  expect_bounded("{{ 'ab' | indent(100000000000) }}", "exceeds the render limit");
  // Large inputs raise the bound: a 3 MiB message renders (copied once), and
  // 1 MiB of markup on top of it is fine.
  const std::string big(3 << 20, 'm');
  const auto msgs = nlohmann::ordered_json::array({{{"role", "user"}, {"content", big}}});
  EXPECT_EQ(render("{% for m in messages %}{{ m.content }}{% endfor %}{{ 'x' * 1000000 }}", msgs).size(),
            big.size() + 1000000);
  // Variables nested deeper than 100 levels are refused before conversion.
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  nlohmann::ordered_json* cur = &vars["x"];
  for (int i = 0; i < 1000; ++i) {
    *cur = nlohmann::ordered_json::array({0});
    cur = &(*cur)[0];
  }
  try {
    ChatTemplate::load("{{ x }}", "deep.jinja").render_vars(vars);
    ADD_FAILURE() << "rendered";
  } catch (const TemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than 100 levels"), std::string::npos) << e.what();
  }
}

TEST(TemplateErrors, ErrorsAreInputErrors) {
  // The CLI maps InputError to exit 2, the server to a 400.
  EXPECT_THROW(ChatTemplate::load("{% while %}"), InputError);
}

}  // namespace
}  // namespace fp8kv::tmpl
