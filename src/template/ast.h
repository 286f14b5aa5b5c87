// Parsed form of a chat template (internal to src/template): the lexer and
// parser (parse.cpp) build it, the evaluator (eval.cpp) walks it.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "template/chat_template.h"
#include "template/value.h"

namespace fp8kv::tmpl {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    Literal,  // lit
    Name,     // name
    List,     // args
    Dict,     // kwargs-like: keys in args[2k], values in args[2k+1]
    Attr,     // a.name
    Item,     // a[b]
    Slice,    // a[args0:args1:args2] (null = omitted)
    Call,     // name(args, kwargs) or a.name(args, kwargs) (a = object)
    Filter,   // a | name(args, kwargs)
    Test,     // a is [not] name(args)
    Not,      // not a
    Neg,      // -a
    Pos,      // +a
    Binary,   // a op b (arithmetic, comparison, in, not in, ~)
    And,      // a and b
    Or,       // a or b
    Cond,     // a if b else c (c may be null)
    Chain,    // args[0] ops[0] args[1] ops[1] args[2] ... (chained comparison)
  };
  K k;
  int line = 0, col = 0;
  Value lit;
  std::string name;  // Name / Attr / Call / Filter / Test name; Binary op
  bool negated = false;  // Test: "is not"
  bool tuple = false;    // List: a tuple literal
  ExprP a, b, c;
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;  // Chain
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class K { Text, Output, If, For, Set, SetBlock, Break, Continue };
  K k;
  int line = 0, col = 0;
  std::string text;  // Text
  ExprP expr;        // Output; Set value; For iterable
  // If: (condition, body) per if/elif; else_body for else.
  std::vector<std::pair<ExprP, Body>> branches;
  Body body;       // For body; SetBlock body
  Body else_body;  // If else; For else
  std::vector<std::string> targets;  // For / Set names (tuple unpacking)
  std::string attr;                  // Set ns.attr: targets[0] = ns
  ExprP filter;                      // For ... if filter
};

struct ChatTemplate::Program {
  Body body;
  std::string origin;
};

// Throws TemplateError(Kind::Syntax).
Body parse_template(std::string_view source, const std::string& origin);

// Names the parser accepts (eval.cpp implements each).
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);
bool is_known_function(const std::string& name);
bool is_known_method(const std::string& name);

}  // namespace fp8kv::tmpl
