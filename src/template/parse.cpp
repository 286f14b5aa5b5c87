// Lexer and parser for the chat-template subset (docs/chat_templates.md).
// Whitespace follows transformers' jinja2 environment: trim_blocks and
// lstrip_blocks on, "-" strips, "+" disables lstrip/trim for that tag.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>

#include "template/ast.h"

namespace fp8kv::tmpl {
namespace {

enum class T { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  T t;
  std::string v;
  int line, col;
  int64_t i = 0;
  double f = 0;
};

struct Lexer {
  std::string_view src;
  const std::string& origin;
  std::vector<size_t> line_starts{0};
  std::vector<Token> out;

  Lexer(std::string_view s, const std::string& o) : src(s), origin(o) {
    for (size_t k = 0; k < s.size(); ++k)
      if (s[k] == '\n') line_starts.push_back(k + 1);
  }

  std::pair<int, int> pos(size_t p) const {
    size_t l = static_cast<size_t>(std::upper_bound(line_starts.begin(), line_starts.end(), p) -
                                   line_starts.begin()) - 1;
    return {static_cast<int>(l + 1), static_cast<int>(p - line_starts[l] + 1)};
  }

  [[noreturn]] void fail(size_t p, const std::string& msg) const {
    auto [l, c] = pos(p);
    throw TemplateError(TemplateError::Kind::Syntax, fmt::format("{}:{}:{}: {}", origin, l, c, msg), l, c);
  }

  void push(T t, std::string v, size_t p) {
    auto [l, c] = pos(p);
    out.push_back(Token{t, std::move(v), l, c});
  }

  static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

  void run() {
    size_t p = 0;
    bool strip_next = false, trim_next = false;
    while (p <= src.size()) {
      size_t start = p;
      if (strip_next) {
        while (start < src.size() && is_ws(src[start])) ++start;
      } else if (trim_next) {
        if (src.compare(start, 1, "\n") == 0) start += 1;
        else if (src.compare(start, 2, "\r\n") == 0) start += 2;
      }
      strip_next = trim_next = false;
      // Next tag opening.
      size_t t = start;
      while (true) {
        t = src.find('{', t);
        if (t == std::string_view::npos || t + 1 >= src.size()) { t = std::string_view::npos; break; }
        char c = src[t + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++t;
      }
      size_t end = t == std::string_view::npos ? src.size() : t;
      std::string_view text = src.substr(start, end - start);
      if (t != std::string_view::npos) {
        char kind = src[t + 1];
        char mod = t + 2 < src.size() ? src[t + 2] : '\0';
        if (mod == '-') {
          size_t n = text.size();
          while (n > 0 && is_ws(text[n - 1])) --n;
          text = text.substr(0, n);
        } else if (mod != '+' && kind != '{') {
          // lstrip_blocks: drop spaces/tabs between the line start and the tag.
          size_t nl = text.rfind('\n');
          size_t l = nl == std::string_view::npos ? 0 : nl + 1;
          bool line_starting = start == 0 || src[start - 1] == '\n';
          if (l > 0 || line_starting) {
            bool blank = true;
            for (size_t k = l; k < text.size(); ++k)
              if (text[k] != ' ' && text[k] != '\t') blank = false;
            if (blank) text = text.substr(0, l);
          }
        }
      }
      if (!text.empty()) push(T::Text, std::string(text), start);
      if (t == std::string_view::npos) break;
      char kind = src[t + 1];
      size_t q = t + 2;
      if (q < src.size() && (src[q] == '-' || src[q] == '+')) ++q;
      if (kind == '#') {
        size_t e = src.find("#}", q);
        if (e == std::string_view::npos) fail(t, "unclosed comment");
        bool minus = e > q && src[e - 1] == '-';
        bool plus = e > q && src[e - 1] == '+';
        strip_next = minus;
        trim_next = !minus && !plus;
        p = e + 2;
        continue;
      }
      push(kind == '{' ? T::VarBegin : T::BlockBegin, "", t);
      p = lex_tag(q, kind == '{', strip_next, trim_next);
    }
    push(T::Eof, "", src.size());
  }

  // Lexes expression tokens up to the closing delimiter; returns the
  // position after it.
  size_t lex_tag(size_t p, bool var, bool& strip_next, bool& trim_next) {
    std::string brackets;  // open brackets, innermost last
    size_t open = p;
    while (true) {
      while (p < src.size() && is_ws(src[p])) ++p;
      if (p >= src.size()) fail(open - 2, var ? "unclosed '{{'" : "unclosed '{%'");
      // Closing delimiters.
      if (var && brackets.empty()) {
        if (src.compare(p, 3, "-}}") == 0) { push(T::VarEnd, "", p); strip_next = true; return p + 3; }
        if (src.compare(p, 2, "}}") == 0) { push(T::VarEnd, "", p); return p + 2; }
      }
      if (!var) {
        if (src.compare(p, 3, "-%}") == 0) { push(T::BlockEnd, "", p); strip_next = true; return p + 3; }
        if (src.compare(p, 3, "+%}") == 0) { push(T::BlockEnd, "", p); return p + 3; }
        if (src.compare(p, 2, "%}") == 0) { push(T::BlockEnd, "", p); trim_next = true; return p + 2; }
      }
      char c = src[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        push(T::Name, std::string(src.substr(p, e - p)), p);
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        bool is_float = false;
        while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
        }
        if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
          size_t x = e + 1;
          if (x < src.size() && (src[x] == '+' || src[x] == '-')) ++x;
          if (x < src.size() && std::isdigit(static_cast<unsigned char>(src[x]))) {
            is_float = true;
            e = x;
            while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
          }
        }
        std::string num;
        for (size_t k = p; k < e; ++k)
          if (src[k] != '_') num += src[k];
        push(is_float ? T::Float : T::Int, num, p);
        errno = 0;
        if (is_float) out.back().f = std::strtod(num.c_str(), nullptr);
        else out.back().i = std::strtoll(num.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(p, "number out of range");
        p = e;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                    ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        bool found = false;
        for (const char* op : ops) {
          size_t n = std::char_traits<char>::length(op);
          if (src.compare(p, n, op) == 0) {
            if (op[0] == '(' || op[0] == '[' || op[0] == '{') brackets += op[0];
            if (op[0] == ')' || op[0] == ']' || op[0] == '}') {
              if (brackets.empty()) fail(p, fmt::format("unexpected '{}'", op));
              char want = brackets.back() == '(' ? ')' : brackets.back() == '[' ? ']' : '}';
              if (op[0] != want) fail(p, fmt::format("unexpected '{}', expected '{}'", op, want));
              brackets.pop_back();
            }
            push(T::Op, op, p);
            p += n;
            found = true;
            break;
          }
        }
        if (!found) fail(p, fmt::format("unexpected character '{}'", c));
      }
    }
  }

  size_t lex_string(size_t p) {
    char q = src[p];
    std::string v;
    size_t k = p + 1;
    while (true) {
      if (k >= src.size()) fail(p, "unterminated string");
      char c = src[k];
      if (c == q) break;
      if (c == '\\') {
        if (k + 1 >= src.size()) fail(p, "unterminated string");
        char e = src[k + 1];
        k += 2;
        switch (e) {
          case 'n': v += '\n'; break;
          case 't': v += '\t'; break;
          case 'r': v += '\r'; break;
          case '\\': v += '\\'; break;
          case '\'': v += '\''; break;
          case '"': v += '"'; break;
          case '0': v += '\0'; break;
          case 'a': v += '\a'; break;
          case 'b': v += '\b'; break;
          case 'f': v += '\f'; break;
          case 'v': v += '\v'; break;
          case '\n': break;
          case 'x':
          case 'u':
          case 'U': {
            size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (k + n > src.size()) fail(k - 2, "truncated escape");
            std::string hex(src.substr(k, n));
            for (char h : hex)
              if (!std::isxdigit(static_cast<unsigned char>(h))) fail(k - 2, "bad escape");
            auto cp = static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16));
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail(k - 2, "bad code point in escape");
            if (cp < 0x80) v += static_cast<char>(cp);
            else if (cp < 0x800) { v += static_cast<char>(0xC0 | (cp >> 6)); v += static_cast<char>(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
              v += static_cast<char>(0xE0 | (cp >> 12));
              v += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              v += static_cast<char>(0x80 | (cp & 0x3F));
            } else {
              v += static_cast<char>(0xF0 | (cp >> 18));
              v += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
              v += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              v += static_cast<char>(0x80 | (cp & 0x3F));
            }
            k += n;
            break;
          }
          default: v += '\\'; v += e; break;  // Python keeps unknown escapes
        }
        continue;
      }
      v += c;
      ++k;
    }
    push(T::String, std::move(v), p);
    return k + 1;
  }
};

struct Parser {
  std::vector<Token> toks;
  const std::string& origin;
  size_t p = 0;
  int loop_depth = 0;
  int depth = 0;  // nesting of expressions and blocks: bounded, so no input overflows the stack

  struct DepthGuard {
    Parser& ps;
    explicit DepthGuard(Parser& p) : ps(p) {
      if (++ps.depth > kMaxDepth) ps.fail(ps.cur(), fmt::format("nesting deeper than {}", kMaxDepth));
    }
    ~DepthGuard() { --ps.depth; }
  };
  static constexpr int kMaxDepth = 200;

  const Token& cur() const { return toks[p]; }
  const Token& peek(size_t n = 1) const { return toks[std::min(p + n, toks.size() - 1)]; }

  [[noreturn]] void fail(const Token& t, const std::string& msg) const {
    throw TemplateError(TemplateError::Kind::Syntax, fmt::format("{}:{}:{}: {}", origin, t.line, t.col, msg),
                        t.line, t.col);
  }
  static std::string describe(const Token& t) {
    switch (t.t) {
      case T::Eof: return "end of template";
      case T::BlockEnd: return "end of statement '%}'";
      case T::VarEnd: return "end of print '}}'";
      case T::String: return "string";
      case T::Int:
      case T::Float: return "number '" + t.v + "'";
      default: return "'" + t.v + "'";
    }
  }
  bool is_op(const char* op) const { return cur().t == T::Op && cur().v == op; }
  bool is_name(const char* n) const { return cur().t == T::Name && cur().v == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur(), fmt::format("expected '{}', got {}", op, describe(cur())));
    ++p;
  }
  std::string expect_name() {
    if (cur().t != T::Name) fail(cur(), fmt::format("expected a name, got {}", describe(cur())));
    return toks[p++].v;
  }
  void expect_block_end() {
    if (cur().t != T::BlockEnd) fail(cur(), fmt::format("expected end of statement '%}}', got {}", describe(cur())));
    ++p;
  }

  ExprP node(Expr::K k, const Token& t) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = t.line;
    e->col = t.col;
    return e;
  }

  // ---- statements ----
  // Parses until one of `stops` block tags (not consumed: p at the tag name).
  Body parse_body(std::initializer_list<const char*> stops, const Token* opener) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.t == T::Eof) {
        if (stops.size() == 0) return body;
        fail(opener ? *opener : t, fmt::format("'{}' is never closed (expected '{}')", opener ? opener->v : "?",
                                               *stops.begin()));
      }
      if (t.t == T::Text) {
        Node n{Node::K::Text, t.line, t.col};
        n.text = t.v;
        body.push_back(std::move(n));
        ++p;
      } else if (t.t == T::VarBegin) {
        ++p;
        Node n{Node::K::Output, t.line, t.col};
        n.expr = parse_expr();
        if (cur().t != T::VarEnd) fail(cur(), fmt::format("expected '}}}}', got {}", describe(cur())));
        ++p;
        body.push_back(std::move(n));
      } else if (t.t == T::BlockBegin) {
        const Token& name = peek();
        if (name.t != T::Name) fail(name, fmt::format("expected a tag name, got {}", describe(name)));
        for (const char* s : stops)
          if (name.v == s) {
            ++p;
            return body;
          }
        p += 2;
        parse_statement(name, body);
      } else {
        fail(t, fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  void parse_statement(const Token& tag, Body& body) {
    DepthGuard guard(*this);
    const std::string& n = tag.v;
    if (n == "if") {
      Node node{Node::K::If, tag.line, tag.col};
      ExprP cond = parse_expr();
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, &tag);
        node.branches.emplace_back(std::move(cond), std::move(b));
        const std::string& stop = toks[p].v;
        ++p;
        if (stop == "elif") {
          cond = parse_expr();
          expect_block_end();
          continue;
        }
        if (stop == "else") {
          expect_block_end();
          node.else_body = parse_body({"endif"}, &tag);
          ++p;
        }
        expect_block_end();
        break;
      }
      body.push_back(std::move(node));
    } else if (n == "for") {
      Node node{Node::K::For, tag.line, tag.col};
      node.targets.push_back(expect_name());
      more_names(node.targets);
      if (!is_name("in")) fail(cur(), fmt::format("expected 'in', got {}", describe(cur())));
      ++p;
      node.expr = parse_or_expr(/*no_cond=*/true);
      if (is_name("if")) {
        ++p;
        node.filter = parse_expr();
      }
      if (is_name("recursive")) fail(cur(), "recursive loops are not supported");
      expect_block_end();
      ++loop_depth;
      node.body = parse_body({"else", "endfor"}, &tag);
      --loop_depth;
      if (toks[p++].v == "else") {
        expect_block_end();
        node.else_body = parse_body({"endfor"}, &tag);
        ++p;
      }
      expect_block_end();
      body.push_back(std::move(node));
    } else if (n == "set") {
      Node node{Node::K::Set, tag.line, tag.col};
      node.targets.push_back(expect_name());
      if (is_op(".")) {
        ++p;
        node.attr = expect_name();
      } else {
        more_names(node.targets);
      }
      if (cur().t == T::BlockEnd) {
        if (node.targets.size() != 1 || !node.attr.empty()) fail(cur(), "a block set assigns one name");
        ++p;
        node.k = Node::K::SetBlock;
        node.body = parse_body({"endset"}, &tag);
        ++p;
        expect_block_end();
      } else {
        expect_op("=");
        node.expr = parse_expr();
        if (is_op(",")) {  // a, b = x, y: tuple on the right
          auto list = node_list_from(std::move(node.expr));
          list->tuple = true;
          while (is_op(",")) {
            ++p;
            list->args.push_back(parse_expr());
          }
          node.expr = std::move(list);
        }
        expect_block_end();
      }
      body.push_back(std::move(node));
    } else if (n == "break" || n == "continue") {
      if (loop_depth == 0) fail(tag, fmt::format("'{}' outside a for loop", n));
      body.push_back(Node{n == "break" ? Node::K::Break : Node::K::Continue, tag.line, tag.col});
      expect_block_end();
    } else if (n == "generation") {
      // transformers' AssistantTracker tag: renders its body unchanged.
      expect_block_end();
      Body inner = parse_body({"endgeneration"}, &tag);
      ++p;
      expect_block_end();
      for (auto& x : inner) body.push_back(std::move(x));
    } else if (n == "elif" || n == "else" || n.rfind("end", 0) == 0) {
      fail(tag, fmt::format("unexpected '{}'", n));
    } else {
      fail(tag, fmt::format("unsupported tag '{}' (outside the chat-template subset, docs/chat_templates.md)", n));
    }
  }

  ExprP node_list_from(ExprP first) {
    auto l = std::make_unique<Expr>();
    l->k = Expr::K::List;
    l->line = first->line;
    l->col = first->col;
    l->args.push_back(std::move(first));
    return l;
  }

  // ---- expressions (jinja2's precedence) ----
  ExprP parse_expr() {
    ExprP e = parse_or_expr(false);
    return e;
  }

  ExprP parse_or_expr(bool no_cond) {
    DepthGuard guard(*this);
    ExprP e = parse_or();
    if (!no_cond) {
      while (is_name("if")) {
        const Token& t = cur();
        ++p;
        auto c = node(Expr::K::Cond, t);
        c->a = std::move(e);
        c->b = parse_or();
        if (is_name("else")) {
          ++p;
          c->c = parse_or_expr(false);
        }
        e = std::move(c);
      }
    }
    return e;
  }

  // A node of kind k at n named `name` over e (a method call, an attribute, a filter).
  ExprP named(Expr::K k, const Token& n, const std::string& name, ExprP e) {
    auto x = node(k, n);
    x->name = name;
    x->a = std::move(e);
    return x;
  }
  [[noreturn]] void unsupported(const Token& n, const char* what, const std::string& name) const {
    fail(n, fmt::format("unsupported {} '{}' (outside the chat-template subset, docs/chat_templates.md)", what, name));
  }

  // ", NAME" repeated: the further targets of a for or set tag.
  void more_names(std::vector<std::string>& names) {
    while (is_op(",")) {
      ++p;
      names.push_back(expect_name());
    }
  }

  // The comma-separated items of a [...] or {...} literal up to `close` (a
  // trailing comma allowed), each parsed by item(); consumes close.
  template <class F>
  void comma_items(const char* close, F&& item) {
    bool first = true;
    while (!is_op(close)) {
      if (!first) expect_op(",");
      if (is_op(close)) break;
      item();
      first = false;
    }
    ++p;
  }

  // A left-associative chain of the keyword `word` (or, and) over next's operands.
  ExprP word_loop(ExprP (Parser::*next)(), const char* word, Expr::K k) {
    ExprP e = (this->*next)();
    while (is_name(word)) {
      auto n = node(k, cur());
      ++p;
      n->a = std::move(e);
      n->b = (this->*next)();
      e = std::move(n);
    }
    return e;
  }
  ExprP parse_or() { return word_loop(&Parser::parse_and, "or", Expr::K::Or); }
  ExprP parse_and() { return word_loop(&Parser::parse_not, "and", Expr::K::And); }
  ExprP parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto n = node(Expr::K::Not, cur());
      ++p;
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    ExprP chain;  // a < b < c: Python's chained comparison
    bool compared = false;  // e is a comparison parsed by this loop
    while (true) {
      std::string op;
      const Token& t = cur();
      if (t.t == T::Op && (t.v == "==" || t.v == "!=" || t.v == "<" || t.v == ">" || t.v == "<=" || t.v == ">=")) {
        op = t.v;
        ++p;
      } else if (is_name("in")) {
        op = "in";
        ++p;
      } else if (is_name("not") && peek().t == T::Name && peek().v == "in") {
        op = "not in";
        p += 2;
      } else {
        if (chain) {
          chain->args.push_back(std::move(e));
          return chain;
        }
        return e;
      }
      if (compared && !chain) {
        // Second operator of a chain: a OP1 b OP2 c -> Chain[a, b, c], ops.
        chain = node(Expr::K::Chain, t);
        chain->ops.push_back(e->name);
        chain->args.push_back(std::move(e->a));
        e = std::move(e->b);
      }
      if (chain) {
        chain->ops.push_back(op);
        chain->args.push_back(std::move(e));
        e = parse_math1();
        continue;
      }
      auto n = node(Expr::K::Binary, t);
      n->name = op;
      n->a = std::move(e);
      n->b = parse_math1();
      e = std::move(n);
      compared = true;
    }
  }
  ExprP binary_loop(ExprP (Parser::*next)(), std::initializer_list<const char*> ops) {
    ExprP e = (this->*next)();
    while (true) {
      const Token& t = cur();
      bool hit = false;
      for (const char* op : ops)
        if (t.t == T::Op && t.v == op) hit = true;
      if (!hit) return e;
      ++p;
      auto n = node(Expr::K::Binary, t);
      n->name = t.v;
      n->a = std::move(e);
      n->b = (this->*next)();
      e = std::move(n);
    }
  }
  ExprP parse_math1() { return binary_loop(&Parser::parse_concat, {"+", "-"}); }
  ExprP parse_concat() { return binary_loop(&Parser::parse_math2, {"~"}); }
  ExprP parse_math2() { return binary_loop(&Parser::parse_pow, {"*", "/", "//", "%"}); }
  ExprP parse_pow() { return binary_loop(&Parser::parse_unary_f, {"**"}); }
  ExprP parse_unary_f() { return parse_unary(true); }

  ExprP parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const Token& t = cur();
    ExprP e;
    if (is_op("-") || is_op("+")) {
      ++p;
      e = node(t.v == "-" ? Expr::K::Neg : Expr::K::Pos, t);
      e->a = parse_unary(false);
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprP parse_primary() {
    const Token& t = cur();
    switch (t.t) {
      case T::Name: {
        ++p;
        auto e = node(Expr::K::Literal, t);
        if (t.v == "true" || t.v == "True") e->lit = Value::boolean(true);
        else if (t.v == "false" || t.v == "False") e->lit = Value::boolean(false);
        else if (t.v == "none" || t.v == "None") e->lit = Value::none();
        else {
          e->k = Expr::K::Name;
          e->name = t.v;
        }
        return e;
      }
      case T::String: {
        std::string s;
        while (cur().t == T::String) s += toks[p++].v;  // adjacent literals concatenate
        auto e = node(Expr::K::Literal, t);
        e->lit = Value::string(std::move(s));
        return e;
      }
      case T::Int: {
        ++p;
        auto e = node(Expr::K::Literal, t);
        e->lit = Value::integer(t.i);
        return e;
      }
      case T::Float: {
        ++p;
        auto e = node(Expr::K::Literal, t);
        e->lit = Value::number(t.f);
        return e;
      }
      case T::Op:
        if (t.v == "(") {
          ++p;
          if (is_op(")")) {  // empty tuple
            ++p;
            auto l = node(Expr::K::List, t);
            l->tuple = true;
            return l;
          }
          ExprP e = parse_expr();
          if (is_op(",")) {
            auto l = node_list_from(std::move(e));
            l->tuple = true;
            while (is_op(",")) {
              ++p;
              if (is_op(")")) break;
              l->args.push_back(parse_expr());
            }
            e = std::move(l);
          }
          expect_op(")");
          return e;
        }
        if (t.v == "[") {
          ++p;
          auto l = node(Expr::K::List, t);
          comma_items("]", [&] { l->args.push_back(parse_expr()); });
          return l;
        }
        if (t.v == "{") {
          ++p;
          auto d = node(Expr::K::Dict, t);
          comma_items("}", [&] {
            d->args.push_back(parse_expr());
            expect_op(":");
            d->args.push_back(parse_expr());
          });
          return d;
        }
        break;
      default: break;
    }
    fail(t, fmt::format("unexpected {}", describe(t)));
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e.args.empty() || !e.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (cur().t == T::Name && peek().t == T::Op && peek().v == "=") {
        std::string k = cur().v;
        p += 2;
        e.kwargs.emplace_back(k, parse_expr());
      } else {
        if (!e.kwargs.empty()) fail(cur(), "positional argument after keyword argument");
        e.args.push_back(parse_expr());
      }
    }
    ++p;
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      const Token& t = cur();
      if (is_op(".")) {
        ++p;
        const Token& n = cur();
        if (n.t == T::Int) {  // x.0 is x[0]
          ++p;
          auto it = node(Expr::K::Item, n);
          it->a = std::move(e);
          it->b = node(Expr::K::Literal, n);
          it->b->lit = Value::integer(n.i);
          e = std::move(it);
          continue;
        }
        std::string name = expect_name();
        if (is_op("(")) {
          if (!is_known_method(name)) unsupported(n, "method", name);
          auto c = named(Expr::K::Call, n, name, std::move(e));
          parse_call_args(*c);
          e = std::move(c);
          continue;
        }
        e = named(Expr::K::Attr, n, name, std::move(e));
      } else if (is_op("[")) {
        ++p;
        ExprP parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expr();
          if (k < 2 && is_op(":")) {
            slice = true;
            ++p;
            continue;
          }
          break;
        }
        expect_op("]");
        if (slice) {
          auto s = node(Expr::K::Slice, t);
          s->a = std::move(e);
          for (auto& x : parts) s->args.push_back(std::move(x));
          e = std::move(s);
        } else {
          if (!parts[0]) fail(t, "empty subscript");
          auto it = node(Expr::K::Item, t);
          it->a = std::move(e);
          it->b = std::move(parts[0]);
          e = std::move(it);
        }
      } else if (is_op("(")) {
        if (e->k != Expr::K::Name) fail(t, "only named functions and methods can be called");
        if (!is_known_function(e->name)) unsupported(toks[p - 1], "function", e->name);
        auto c = node(Expr::K::Call, t);
        c->line = e->line;
        c->col = e->col;
        c->name = e->name;
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      if (is_op("|")) {
        ++p;
        const Token& n = cur();
        std::string name = expect_name();
        if (!is_known_filter(name)) unsupported(n, "filter", name);
        auto f = named(Expr::K::Filter, n, name, std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++p;
        bool neg = false;
        if (is_name("not")) {
          neg = true;
          ++p;
        }
        const Token& n = cur();
        std::string name;
        if (n.t == T::Name) name = n.v;
        else if (n.t == T::Op && (n.v == "==" || n.v == "!=" || n.v == "<" || n.v == ">" || n.v == "<=" || n.v == ">="))
          name = n.v;
        else fail(n, fmt::format("expected a test name, got {}", describe(n)));
        ++p;
        if (name == "none" || name == "None") name = "none";
        if (name == "true" || name == "True") name = "true";
        if (name == "false" || name == "False") name = "false";
        if (!is_known_test(name))
          fail(n, fmt::format("unsupported test '{}' (outside the chat-template subset, docs/chat_templates.md)",
                              name));
        auto te = node(Expr::K::Test, n);
        te->name = name;
        te->negated = neg;
        te->a = std::move(e);
        if (is_op("(")) {
          parse_call_args(*te);
        } else if (cur().t == T::String || cur().t == T::Int || cur().t == T::Float || is_op("[") || is_op("{") ||
                   (cur().t == T::Name && cur().v != "and" && cur().v != "or" && cur().v != "else" &&
                    cur().v != "if" && cur().v != "is" && cur().v != "in" && cur().v != "not")) {
          te->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(te);
      } else if (is_op("(") || is_op("[") || is_op(".")) {
        e = parse_postfix(std::move(e));
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Body parse_template(std::string_view raw, const std::string& origin) {
  // As jinja2: newlines normalized to "\n", one trailing newline dropped
  // (keep_trailing_newline=False).
  std::string source;
  source.reserve(raw.size());
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] == '\r') {
      source += '\n';
      if (k + 1 < raw.size() && raw[k + 1] == '\n') ++k;
    } else {
      source += raw[k];
    }
  }
  if (!source.empty() && source.back() == '\n') source.pop_back();
  Lexer lx(source, origin);
  lx.run();
  Parser ps{std::move(lx.out), origin};
  return ps.parse_body({}, nullptr);
}

}  // namespace fp8kv::tmpl
