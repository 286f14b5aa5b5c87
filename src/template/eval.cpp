// Evaluator of the chat-template subset: statements, expressions, filters,
// tests, functions and methods (docs/chat_templates.md lists them).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "io/json_limits.h"
#include "template/ast.h"
#include "template/text.h"

namespace fp8kv::tmpl {

namespace {

const std::set<std::string> kFilters = {
    "abs",     "capitalize", "count",  "d",         "default", "dictsort", "first",   "float",  "indent",
    "int",     "items",      "join",   "last",      "length",  "list",     "lower",   "map",    "max",
    "min",     "reject",     "rejectattr", "replace", "reverse", "round",  "safe",    "select", "selectattr",
    "sort",    "string",     "sum",    "title",     "tojson",  "trim",     "unique",  "upper",  "wordcount"};
const std::set<std::string> kTests = {
    "defined", "undefined", "none",   "string", "number", "integer", "float",     "boolean", "true",
    "false",   "iterable",  "mapping", "sequence", "odd",  "even",    "divisibleby", "eq",   "equalto",
    "ne",      "lt",        "le",     "gt",     "ge",     "in",      "lower",     "upper",   "sameas",
    "==",      "!=",        "<",      "<=",     ">",      ">="};
const std::set<std::string> kFunctions = {"raise_exception", "range", "namespace", "strftime_now", "dict"};
const std::set<std::string> kMethods = {
    // str
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower", "replace", "title",
    "capitalize", "format", "find", "rfind", "count", "join", "splitlines", "isdigit", "isalpha", "isalnum",
    "isspace", "isupper", "islower",
    // dict
    "items", "keys", "values", "get"};

// The rendered text is at most 1 MiB plus twice the bytes of the strings
// passed in (messages, tools, ...): a template copies its inputs and adds
// markup, so a runaway template (`{{ 'y' * 100000 }}` in a loop) fails
// within milliseconds instead of growing without bound (docs/chat_templates.md).
constexpr size_t kMaxOutputBase = size_t{1} << 20;

// Bytes of the strings (keys included) in `j`; refuses nesting deeper than
// kMaxJsonDepth before Value::from_json walks it recursively.
size_t input_bytes(const nlohmann::ordered_json& j, const std::string& origin, int depth = 0) {
  if (depth > kMaxJsonDepth)
    throw TemplateError(TemplateError::Kind::Render,
                        fmt::format("{}: template variables nested deeper than {} levels", origin, kMaxJsonDepth), 0, 0);
  if (j.is_string()) return j.get_ref<const std::string&>().size();
  size_t n = 0;
  if (j.is_array())
    for (const auto& e : j) n += input_bytes(e, origin, depth + 1);
  if (j.is_object())
    for (const auto& [k, e] : j.items()) n += k.size() + input_bytes(e, origin, depth + 1);
  return n;
}
constexpr int64_t kMaxRange = 1 << 20;
// All for loops of one render together; nested loops over ranges multiply
// (fuzz_template found 889^k iterations that ran for minutes). 2^18 is two
// loops over a 131,072-message conversation, ~0.7 s in a release build.
constexpr int64_t kMaxLoopIterations = 1 << 18;

enum class Flow { Normal, Break, Continue };

struct Args {
  const std::vector<Value>& pos;
  const std::vector<std::pair<std::string, Value>>& kw;
  const Value* get(size_t idx, const char* name) const {
    if (idx < pos.size()) return &pos[idx];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

class Evaluator {
 public:
  Evaluator(const std::string& origin, ValueMap globals, size_t max_output)
      : origin_(origin), max_output_(max_output) {
    scopes_.emplace_back();
    for (auto& [k, v] : globals.items) scopes_.back()[k] = std::move(v);
  }

  std::string run(const Body& body) {
    exec(body);
    return std::move(out_);
  }

 private:
  const std::string& origin_;
  const size_t max_output_;  // kMaxOutputBase + 2 x the input's string bytes
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::string out_;
  int64_t loop_iterations_ = 0;  // against kMaxLoopIterations

  [[noreturn]] void fail(int line, int col, const std::string& msg) const {
    throw TemplateError(TemplateError::Kind::Render, fmt::format("{}:{}:{}: {}", origin_, line, col, msg), line,
                        col);
  }
  [[noreturn]] void fail(const Expr& e, const std::string& msg) const { fail(e.line, e.col, msg); }

  // Every string the template builds is bounded like its output, checked
  // before the bytes are allocated.
  void check_size(const Expr& e, double n) const {
    if (n > static_cast<double>(max_output_))
      fail(e, fmt::format("a string of {:.0f} bytes exceeds the render limit of {} bytes", n, max_output_));
  }
  std::string replace_checked(const Expr& e, const std::string& s, const std::string& from, const std::string& to,
                              int64_t count) const {
    int64_t k = py_count(s, from);
    if (count >= 0) k = std::min(k, count);
    check_size(e, static_cast<double>(s.size()) + static_cast<double>(k) * (static_cast<double>(to.size()) -
                                                                            static_cast<double>(from.size())));
    return py_replace(s, from, to, count);
  }
  // A run of decimal digits from a format string (a width, a precision or a
  // positional index) as a number no larger than kFormatNumberLimit; larger is
  // a render error, not std::stoul's out_of_range or a giant allocation.
  static constexpr size_t kFormatNumberLimit = 100000;
  size_t format_number(const Expr& e, const std::string& digits, const char* what) const {
    size_t v = 0;
    for (char c : digits) {
      v = v * 10 + static_cast<size_t>(c - '0');
      if (v > kFormatNumberLimit)
        fail(e, fmt::format("format {} {}{} is too large (limit {})", what, digits.substr(0, 12),
                            digits.size() > 12 ? "..." : "", kFormatNumberLimit));
    }
    return v;
  }
  [[noreturn]] void fail_undefined(const Expr& e, const Value& u) const {
    fail(e, u.s && !u.s->empty() ? *u.s : "value is undefined");
  }

  // ---- statements ----
  Flow exec(const Body& body) {
    for (const Node& n : body) {
      Flow f = exec(n);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  void emit(const std::string& s, const Node& n) {
    if (out_.size() + s.size() > max_output_)
      fail(n.line, n.col,
           fmt::format("output exceeds {} bytes (1 MiB + twice the {} bytes of its inputs)", max_output_,
                       (max_output_ - kMaxOutputBase) / 2));
    out_ += s;
  }

  Flow exec(const Node& n) {
    switch (n.k) {
      case Node::K::Text: emit(n.text, n); return Flow::Normal;
      case Node::K::Output: emit(eval(*n.expr).to_str(), n); return Flow::Normal;
      case Node::K::If:
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond).truthy()) return exec(body);
        return exec(n.else_body);
      case Node::K::For: return exec_for(n);
      case Node::K::Set: {
        Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          Value ns = lookup(n.targets[0]);
          if (ns.kind != Value::Kind::Namespace)
            fail(n.line, n.col, fmt::format("cannot assign attribute on non-namespace object '{}'", n.targets[0]));
          ns.map->set(n.attr, std::move(v));
        } else {
          assign(n.targets, std::move(v), n.line, n.col);
        }
        return Flow::Normal;
      }
      case Node::K::SetBlock: {
        std::string saved = std::move(out_);
        out_.clear();
        Flow f = exec(n.body);
        std::string captured = std::move(out_);
        out_ = std::move(saved);
        scopes_.back()[n.targets[0]] = Value::string(std::move(captured));
        return f;
      }
      case Node::K::Break: return Flow::Break;
      case Node::K::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  void assign(const std::vector<std::string>& targets, Value v, int line, int col) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = std::move(v);
      return;
    }
    std::vector<Value> items = iterate(v, line, col);
    if (items.size() != targets.size())
      fail(line, col, fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    for (size_t k = 0; k < targets.size(); ++k) scopes_.back()[targets[k]] = std::move(items[k]);
  }

  std::vector<Value> iterate(const Value& v, int line, int col) const {
    switch (v.kind) {
      case Value::Kind::Undefined: return {};
      case Value::Kind::List: return *v.list;
      case Value::Kind::Map: {
        std::vector<Value> keys;
        for (const auto& kv : v.map->items) keys.push_back(Value::string(kv.first));
        return keys;
      }
      case Value::Kind::String: {
        std::vector<Value> chars;
        for (auto& c : utf8_chars(v.str())) chars.push_back(Value::string(std::move(c)));
        return chars;
      }
      default: fail(line, col, fmt::format("'{}' object is not iterable", v.type_name()));
    }
  }

  Flow exec_for(const Node& n) {
    std::vector<Value> items = iterate(eval(*n.expr), n.expr->line, n.expr->col);
    if (n.filter) {
      std::vector<Value> kept;
      for (auto& it : items) {
        scopes_.emplace_back();
        assign(n.targets, it, n.line, n.col);
        bool keep = eval(*n.filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      if (++loop_iterations_ > kMaxLoopIterations)
        fail(n.line, n.col, fmt::format("for loops ran more than {} iterations in all", kMaxLoopIterations));
      scopes_.emplace_back();
      assign(n.targets, items[static_cast<size_t>(k)], n.line, n.col);
      ValueMap loop;
      loop.set("index", Value::integer(k + 1));
      loop.set("index0", Value::integer(k));
      loop.set("revindex", Value::integer(len - k));
      loop.set("revindex0", Value::integer(len - k - 1));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == len - 1));
      loop.set("length", Value::integer(len));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item"));
      loop.set("nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item"));
      scopes_.back()["loop"] = Value::make_map(std::move(loop));
      Flow f = exec(n.body);
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
    if (len == 0 && !n.else_body.empty()) {
      scopes_.emplace_back();
      Flow f = exec(n.else_body);
      scopes_.pop_back();
      return f;
    }
    return Flow::Normal;
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undefined(fmt::format("'{}' is undefined", name));
  }

  // ---- expressions ----
  Value eval(const Expr& e) {
    switch (e.k) {
      case Expr::K::Literal: return e.lit;
      case Expr::K::Name: return lookup(e.name);
      case Expr::K::List: {
        ValueList l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        Value v = Value::make_list(std::move(l));
        v.tuple = e.tuple;
        return v;
      }
      case Expr::K::Dict: {
        ValueMap m;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (!key.is_string()) fail(*e.args[k], "dict keys must be strings in this subset");
          m.set(key.str(), eval(*e.args[k + 1]));
        }
        return Value::make_map(std::move(m));
      }
      case Expr::K::Attr: return get_attr(e, eval(*e.a), e.name);
      case Expr::K::Item: return get_item(e, eval(*e.a), eval(*e.b));
      case Expr::K::Slice: return slice(e);
      case Expr::K::Call: return call(e);
      case Expr::K::Filter: return filter(e);
      case Expr::K::Test: {
        bool r = test(e, e.name, eval(*e.a), eval_args(e.args));
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::K::Not: return Value::boolean(!eval(*e.a).truthy());
      case Expr::K::Neg:
      case Expr::K::Pos: {
        Value v = eval(*e.a);
        if (v.is_undefined()) fail_undefined(e, v);
        if (!v.is_number()) fail(e, fmt::format("bad operand type for unary {}: '{}'", e.k == Expr::K::Neg ? '-' : '+', v.type_name()));
        if (e.k == Expr::K::Pos) return v.kind == Value::Kind::Bool ? Value::integer(v.b) : v;
        if (v.kind == Value::Kind::Float) return Value::number(-v.f);
        return Value::integer(-(v.kind == Value::Kind::Bool ? v.b : v.i));
      }
      case Expr::K::And: {
        Value a = eval(*e.a);
        return a.truthy() ? eval(*e.b) : a;
      }
      case Expr::K::Or: {
        Value a = eval(*e.a);
        return a.truthy() ? a : eval(*e.b);
      }
      case Expr::K::Cond:
        if (eval(*e.b).truthy()) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined("the inline if had no else and its condition was false");
      case Expr::K::Binary: return binary(e, eval(*e.a), eval(*e.b));
      case Expr::K::Chain: {
        Value left = eval(*e.args[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1]);
          Expr step;
          step.k = Expr::K::Binary;
          step.line = e.line;
          step.col = e.col;
          step.name = e.ops[k];
          if (!binary(step, left, right, e.args[k].get(), e.args[k + 1].get()).truthy()) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
    }
    return Value::undefined();
  }

  std::vector<Value> eval_args(const std::vector<ExprP>& args) {
    std::vector<Value> v;
    for (const auto& a : args) v.push_back(eval(*a));
    return v;
  }

  static std::string kind_object(const Value& v) {
    return fmt::format("'{} object'", v.kind == Value::Kind::Map ? "dict" : v.type_name());
  }

  Value get_attr(const Expr& e, const Value& obj, const std::string& name) const {
    if (obj.is_undefined()) fail_undefined(e, obj);
    if (obj.is_mapping()) {
      if (const Value* v = obj.map->find(name)) return *v;
    }
    return Value::undefined(fmt::format("{} has no attribute '{}'", kind_object(obj), name));
  }

  static int64_t as_int(const Value& v) { return v.kind == Value::Kind::Bool ? v.b : v.i; }
  static bool is_intlike(const Value& v) { return v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool; }

  Value get_item(const Expr& e, const Value& obj, const Value& key) const {
    if (obj.is_undefined()) fail_undefined(e, obj);
    if (obj.is_mapping() && key.is_string()) {
      if (const Value* v = obj.map->find(key.str())) return *v;
      return Value::undefined(fmt::format("{} has no attribute '{}'", kind_object(obj), key.str()));
    }
    if ((obj.is_list() || obj.is_string()) && is_intlike(key)) {
      int64_t i = as_int(key);
      if (obj.is_list()) {
        auto n = static_cast<int64_t>(obj.list->size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return (*obj.list)[static_cast<size_t>(i)];
      } else {
        auto chars = utf8_chars(obj.str());
        auto n = static_cast<int64_t>(chars.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::string(chars[static_cast<size_t>(i)]);
      }
      return Value::undefined(fmt::format("{} has no element {}", kind_object(obj), as_int(key)));
    }
    return Value::undefined(fmt::format("{} has no element {}", kind_object(obj), key.repr()));
  }

  Value slice(const Expr& e) {
    Value obj = eval(*e.a);
    if (obj.is_undefined()) fail_undefined(e, obj);
    std::optional<int64_t> parts[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[static_cast<size_t>(k)]) continue;
      Value v = eval(*e.args[static_cast<size_t>(k)]);
      if (v.is_none()) continue;
      if (!is_intlike(v)) fail(e, "slice indices must be integers or None");
      parts[k] = as_int(v);
    }
    int64_t step = parts[2].value_or(1);
    if (step == 0) fail(e, "slice step cannot be zero");
    std::vector<std::string> chars;
    int64_t n;
    if (obj.is_list()) n = static_cast<int64_t>(obj.list->size());
    else if (obj.is_string()) {
      chars = utf8_chars(obj.str());
      n = static_cast<int64_t>(chars.size());
    } else {
      return Value::undefined(fmt::format("{} is not subscriptable", kind_object(obj)));
    }
    // Python's slice.indices().
    auto clamp = [&](std::optional<int64_t> x, int64_t dflt) -> int64_t {
      if (!x) return dflt;
      int64_t v = *x;
      if (v < 0) {
        v += n;
        if (v < 0) v = step < 0 ? -1 : 0;
      } else if (v >= n) {
        v = step < 0 ? n - 1 : n;
      }
      return v;
    };
    int64_t start = clamp(parts[0], step < 0 ? n - 1 : 0);
    int64_t stop = clamp(parts[1], step < 0 ? -1 : n);
    ValueList out;
    std::string s;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj.is_list()) out.push_back((*obj.list)[static_cast<size_t>(i)]);
      else s += chars[static_cast<size_t>(i)];
    }
    return obj.is_list() ? Value::make_list(std::move(out)) : Value::string(std::move(s));
  }

  // ---- operators ----
  static double as_double(const Value& v) {
    return v.kind == Value::Kind::Float ? v.f : static_cast<double>(as_int(v));
  }

  Value binary(const Expr& e, const Value& a, const Value& b, const Expr* ea = nullptr, const Expr* eb = nullptr) {
    const std::string& op = e.name;
    if (!ea) ea = e.a.get();
    if (!eb) eb = e.b.get();
    if (op == "~") {
      std::string l = a.to_str(), r = b.to_str();
      check_size(e, static_cast<double>(l.size()) + static_cast<double>(r.size()));
      return Value::string(l + r);
    }
    if (op == "==") return Value::boolean(values_equal(a, b));
    if (op == "!=") return Value::boolean(!values_equal(a, b));
    if (op == "in" || op == "not in") {
      bool r = contains(e, b, a);
      return Value::boolean(op == "in" ? r : !r);
    }
    if (a.is_undefined()) fail_undefined(*ea, a);
    if (b.is_undefined()) fail_undefined(*eb, b);
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      try {
        c = values_compare(a, b);
      } catch (const std::invalid_argument& x) {
        fail(e, x.what());
      }
      if (op == "<") return Value::boolean(c < 0);
      if (op == ">") return Value::boolean(c > 0);
      if (op == "<=") return Value::boolean(c <= 0);
      return Value::boolean(c >= 0);
    }
    if (op == "%" && a.is_string()) return Value::string(percent_format(e, a.str(), b));
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        check_size(e, static_cast<double>(a.str().size()) + static_cast<double>(b.str().size()));
        return Value::string(a.str() + b.str());
      }
      if (a.is_list() && b.is_list()) {
        ValueList l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::make_list(std::move(l));
      }
    }
    if (op == "*" && ((a.is_string() || a.is_list()) && is_intlike(b))) {
      int64_t n = std::max<int64_t>(0, as_int(b));
      if (a.is_string()) {
        if (a.str().size() * static_cast<size_t>(n) > max_output_) fail(e, "repeated string too long");
        std::string s;
        for (int64_t k = 0; k < n; ++k) s += a.str();
        return Value::string(std::move(s));
      }
      if (a.list->size() * static_cast<size_t>(n) > static_cast<size_t>(kMaxRange)) fail(e, "repeated list too long");
      ValueList l;
      for (int64_t k = 0; k < n; ++k) l.insert(l.end(), a.list->begin(), a.list->end());
      return Value::make_list(std::move(l));
    }
    if (!a.is_number() || !b.is_number())
      fail(e, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
    bool ints = is_intlike(a) && is_intlike(b);
    if (op == "/") {
      if (as_double(b) == 0.0) fail(e, "division by zero");
      return Value::number(as_double(a) / as_double(b));
    }
    if (op == "+" || op == "-" || op == "*") {  // in int64 or in double, as Python
      auto apply = [&](auto x, auto y) { return op == "+" ? x + y : op == "-" ? x - y : x * y; };
      return ints ? Value::integer(apply(as_int(a), as_int(b))) : Value::number(apply(as_double(a), as_double(b)));
    }
    if (ints) {
      int64_t x = as_int(a), y = as_int(b);
      if (op == "//" || op == "%") {
        if (y == 0) fail(e, "integer division or modulo by zero");
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return Value::integer(op == "//" ? q : r);
      }
      if (op == "**") {
        if (y < 0) return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t r = 1;
        for (int64_t k = 0; k < y && k < 64; ++k) r *= x;
        return Value::integer(r);
      }
    } else {
      double x = as_double(a), y = as_double(b);
      if (op == "//" || op == "%") {
        if (y == 0.0) fail(e, "float division or modulo by zero");
        double m = std::fmod(x, y);
        if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
        if (op == "%") return Value::number(m);
        return Value::number(std::round((x - m) / y));
      }
      if (op == "**") return Value::number(std::pow(x, y));
    }
    fail(e, fmt::format("unsupported operator '{}'", op));
  }

  bool contains(const Expr& e, const Value& container, const Value& item) const {
    switch (container.kind) {
      case Value::Kind::Undefined: return false;
      case Value::Kind::String:
        if (!item.is_string())
          fail(e, fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
        return container.str().find(item.str()) != std::string::npos;
      case Value::Kind::List:
        for (const auto& v : *container.list)
          if (values_equal(v, item)) return true;
        return false;
      case Value::Kind::Map:
      case Value::Kind::Namespace:
        return item.is_string() && container.map->find(item.str()) != nullptr;
      default: fail(e, fmt::format("argument of type '{}' is not iterable", container.type_name()));
    }
  }

  std::string percent_format(const Expr& e, const std::string& fmt_s, const Value& rhs) const {
    std::vector<Value> args;
    if (rhs.is_list()) args = *rhs.list;
    else args.push_back(rhs);
    size_t next = 0;
    std::string out;
    for (size_t k = 0; k < fmt_s.size(); ++k) {
      char c = fmt_s[k];
      if (c != '%') {
        out += c;
        continue;
      }
      ++k;
      if (k >= fmt_s.size()) fail(e, "incomplete format");
      const Value* arg = nullptr;
      if (fmt_s[k] == '(') {
        size_t close = fmt_s.find(')', k);
        if (close == std::string::npos || !rhs.is_mapping()) fail(e, "format requires a mapping");
        arg = rhs.map->find(fmt_s.substr(k + 1, close - k - 1));
        if (!arg) fail(e, fmt::format("KeyError: '{}'", fmt_s.substr(k + 1, close - k - 1)));
        k = close + 1;
      }
      std::string spec;
      while (k < fmt_s.size() && std::string_view("-+ #0123456789.").find(fmt_s[k]) != std::string_view::npos)
        spec += fmt_s[k++];
      if (k >= fmt_s.size()) fail(e, "incomplete format");
      char type = fmt_s[k];
      if (type == '%') {
        out += '%';
        continue;
      }
      if (!arg) {
        if (next >= args.size()) fail(e, "not enough arguments for format string");
        arg = &args[next++];
      }
      std::string flags, width, prec;
      size_t q = 0;
      while (q < spec.size() && std::string_view("-+ #0").find(spec[q]) != std::string_view::npos) flags += spec[q++];
      while (q < spec.size() && std::isdigit(static_cast<unsigned char>(spec[q]))) width += spec[q++];
      const bool has_dot = q < spec.size() && spec[q] == '.';
      if (has_dot)
        for (++q; q < spec.size() && std::isdigit(static_cast<unsigned char>(spec[q]));) prec += spec[q++];
      if (q != spec.size()) fail(e, fmt::format("unsupported format character '{}'", spec[q]));
      // Bounded, and the buffer of the snprintf cases below sized from them
      // (a double's %f needs at most 309 integer digits, a sign and a point).
      const size_t width_n = width.empty() ? 0 : format_number(e, width, "width");
      const size_t prec_n = prec.empty() ? 0 : format_number(e, prec, "precision");
      std::string cfmt = "%" + flags + width + (has_dot ? "." + prec : "");
      std::vector<char> buf(width_n + prec_n + 400);
      switch (type) {
        case 's':
        case 'r': {
          std::string s = type == 's' ? arg->to_str() : arg->repr();
          if (has_dot) s = s.substr(0, prec_n);
          size_t w = width_n;
          size_t len = utf8_length(s);
          if (len < w) {
            if (flags.find('-') != std::string::npos) s += std::string(w - len, ' ');
            else s = std::string(w - len, ' ') + s;
          }
          out += s;
          break;
        }
        case 'd':
        case 'i':
        case 'x':
        case 'X':
        case 'o': {
          if (!arg->is_number()) fail(e, fmt::format("%{} format: a number is required, not {}", type, arg->type_name()));
          auto v = static_cast<long long>(arg->kind == Value::Kind::Float ? std::trunc(arg->f) : as_int(*arg));
          std::snprintf(buf.data(), buf.size(), (cfmt + "ll" + (type == 'i' ? 'd' : type)).c_str(), v);
          out += buf.data();
          break;
        }
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G': {
          if (!arg->is_number()) fail(e, fmt::format("must be real number, not {}", arg->type_name()));
          std::snprintf(buf.data(), buf.size(), (cfmt + type).c_str(), as_double(*arg));
          out += buf.data();
          break;
        }
        default: fail(e, fmt::format("unsupported format character '{}'", type));
      }
    }
    if (!rhs.is_mapping() && next < args.size() && !(args.size() == 1 && rhs.is_mapping()))
      fail(e, "not all arguments converted during string formatting");
    return out;
  }

  // ---- calls ----
  Value call(const Expr& e) {
    std::vector<Value> pos = eval_args(e.args);
    std::vector<std::pair<std::string, Value>> kw;
    for (const auto& [k, v] : e.kwargs) kw.emplace_back(k, eval(*v));
    Args args{pos, kw};
    if (!e.a) return call_function(e, args);
    Value obj = eval(*e.a);
    if (obj.is_undefined()) fail_undefined(e, obj);
    if (obj.is_string()) return string_method(e, obj.str(), args);
    if (obj.kind == Value::Kind::Map) return dict_method(e, obj, args);
    fail(e, fmt::format("'{}' object has no method '{}'", obj.type_name(), e.name));
  }

  Value call_function(const Expr& e, const Args& args) {
    const std::string& n = e.name;
    if (n == "raise_exception") {
      const Value* m = args.get(0, "message");
      fail(e, m ? m->to_str() : "raise_exception()");
    }
    if (n == "range") {
      if (args.pos.empty() || args.pos.size() > 3) fail(e, "range() takes 1 to 3 arguments");
      for (const auto& v : args.pos)
        if (!is_intlike(v)) fail(e, fmt::format("range() argument must be an integer, not {}", v.type_name()));
      int64_t start = 0, stop, step = 1;
      if (args.pos.size() == 1) stop = as_int(args.pos[0]);
      else {
        start = as_int(args.pos[0]);
        stop = as_int(args.pos[1]);
        if (args.pos.size() == 3) step = as_int(args.pos[2]);
      }
      if (step == 0) fail(e, "range() arg 3 must not be zero");
      ValueList l;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (static_cast<int64_t>(l.size()) >= kMaxRange) fail(e, "range() too large");
        l.push_back(Value::integer(i));
      }
      return Value::make_list(std::move(l));
    }
    if (n == "namespace" || n == "dict") {
      ValueMap m;
      for (const auto& v : args.pos) {
        if (v.kind != Value::Kind::Map) fail(e, fmt::format("{}() positional argument must be a dict", n));
        for (const auto& [k, x] : v.map->items) m.set(k, x);
      }
      for (const auto& [k, v] : args.kw) m.set(k, v);
      Value r = Value::make_map(std::move(m));
      if (n == "namespace") r.kind = Value::Kind::Namespace;
      return r;
    }
    if (n == "strftime_now") {
      const Value* f = args.get(0, "format");
      if (!f || !f->is_string()) fail(e, "strftime_now() needs a format string");
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[256];
      size_t len = std::strftime(buf, sizeof buf, f->str().c_str(), &tm);
      return Value::string(std::string(buf, len));
    }
    fail(e, fmt::format("unknown function '{}'", n));
  }

  static std::string str_arg(const Expr& e, const Evaluator& self, const Value* v, const char* what) {
    if (!v || !v->is_string()) self.fail(e, fmt::format("{}() argument must be a string", what));
    return v->str();
  }

  Value string_method(const Expr& e, const std::string& s, const Args& args) {
    const std::string& n = e.name;
    auto opt_chars = [&]() -> std::optional<std::string> {
      const Value* c = args.get(0, "chars");
      if (!c || c->is_none()) return std::nullopt;
      if (!c->is_string()) fail(e, fmt::format("{} arg must be None or str", n));
      return c->str();
    };
    if (n == "strip") return Value::string(py_strip(s, opt_chars(), true, true));
    if (n == "lstrip") return Value::string(py_strip(s, opt_chars(), true, false));
    if (n == "rstrip") return Value::string(py_strip(s, opt_chars(), false, true));
    if (n == "upper") return Value::string(py_upper(s));
    if (n == "lower") return Value::string(py_lower(s));
    if (n == "title") return Value::string(py_title(s));
    if (n == "capitalize") return Value::string(py_capitalize(s));
    if (n == "split" || n == "rsplit") {
      const Value* sep = args.get(0, "sep");
      const Value* maxv = args.get(1, "maxsplit");
      int64_t maxsplit = maxv && is_intlike(*maxv) ? as_int(*maxv) : -1;
      std::optional<std::string> sp;
      if (sep && !sep->is_none()) {
        if (!sep->is_string()) fail(e, "must be str or None");
        if (sep->str().empty()) fail(e, "empty separator");
        sp = sep->str();
      }
      ValueList l;
      for (auto& part : py_split(s, sp, maxsplit, n == "rsplit")) l.push_back(Value::string(std::move(part)));
      return Value::make_list(std::move(l));
    }
    if (n == "splitlines") {
      ValueList l;
      size_t start = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '\n' || s[k] == '\r') {
          l.push_back(Value::string(s.substr(start, k - start)));
          if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
          start = k + 1;
        }
      }
      if (start < s.size()) l.push_back(Value::string(s.substr(start)));
      return Value::make_list(std::move(l));
    }
    if (n == "startswith" || n == "endswith") {
      const Value* p = args.get(0, "prefix");
      if (!p) fail(e, fmt::format("{}() takes at least 1 argument", n));
      std::vector<std::string> cands;
      if (p->is_string()) cands.push_back(p->str());
      else if (p->is_list()) {
        for (const auto& x : *p->list) {
          if (!x.is_string()) fail(e, fmt::format("{}() tuple must contain only strings", n));
          cands.push_back(x.str());
        }
      } else {
        fail(e, fmt::format("{} first arg must be str or a tuple of str, not {}", n, p->type_name()));
      }
      for (const auto& c : cands) {
        if (c.size() > s.size()) continue;
        if (n == "startswith" ? s.compare(0, c.size(), c) == 0 : s.compare(s.size() - c.size(), c.size(), c) == 0)
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (n == "replace") {
      std::string from = str_arg(e, *this, args.get(0, "old"), "replace");
      std::string to = str_arg(e, *this, args.get(1, "new"), "replace");
      const Value* c = args.get(2, "count");
      return Value::string(replace_checked(e, s, from, to, c && is_intlike(*c) ? as_int(*c) : -1));
    }
    if (n == "find" || n == "rfind" || n == "count") {
      std::string sub = str_arg(e, *this, args.get(0, "sub"), n.c_str());
      if (n == "count") return Value::integer(py_count(s, sub));
      size_t r = n == "find" ? s.find(sub) : s.rfind(sub);
      if (r == std::string::npos) return Value::integer(-1);
      return Value::integer(static_cast<int64_t>(utf8_length(s.substr(0, r))));
    }
    if (n == "join") {
      const Value* it = args.get(0, "iterable");
      if (!it) fail(e, "join() takes exactly one argument");
      std::string r;
      bool first = true;
      for (const auto& v : iterate(*it, e.line, e.col)) {
        if (!v.is_string()) fail(e, fmt::format("sequence item: expected str instance, {} found", v.type_name()));
        if (!first) r += s;
        first = false;
        r += v.str();
        check_size(e, static_cast<double>(r.size()));
      }
      return Value::string(std::move(r));
    }
    if (n == "format") return Value::string(brace_format(e, s, args));
    if (n == "isdigit" || n == "isalpha" || n == "isalnum" || n == "isspace" || n == "isupper" || n == "islower")
      return Value::boolean(py_is(n, s));
    fail(e, fmt::format("'str' object has no method '{}'", n));
  }

  std::string brace_format(const Expr& e, const std::string& f, const Args& args) {
    std::string out;
    size_t auto_idx = 0;
    for (size_t k = 0; k < f.size(); ++k) {
      char c = f[k];
      if (c == '{' && k + 1 < f.size() && f[k + 1] == '{') { out += '{'; ++k; continue; }
      if (c == '}' && k + 1 < f.size() && f[k + 1] == '}') { out += '}'; ++k; continue; }
      if (c == '}') fail(e, "single '}' encountered in format string");
      if (c != '{') { out += c; continue; }
      size_t close = f.find('}', k);
      if (close == std::string::npos) fail(e, "single '{' encountered in format string");
      std::string field = f.substr(k + 1, close - k - 1);
      if (field.find_first_of(":!.[") != std::string::npos) fail(e, "format specs are not supported in .format()");
      const Value* v = nullptr;
      if (field.empty()) {
        if (auto_idx >= args.pos.size()) fail(e, "Replacement index out of range for positional args tuple");
        v = &args.pos[auto_idx++];
      } else if (std::all_of(field.begin(), field.end(), [](char x) { return std::isdigit(static_cast<unsigned char>(x)); })) {
        size_t i = format_number(e, field, "index");
        if (i >= args.pos.size()) fail(e, "Replacement index out of range for positional args tuple");
        v = &args.pos[i];
      } else {
        for (const auto& [kk, vv] : args.kw)
          if (kk == field) v = &vv;
        if (!v) fail(e, fmt::format("KeyError: '{}'", field));
      }
      out += v->to_str();
      k = close;
    }
    return out;
  }

  Value dict_method(const Expr& e, const Value& obj, const Args& args) {
    const std::string& n = e.name;
    if (n == "items") return items_of(obj);
    if (n == "keys" || n == "values") {
      ValueList l;
      for (const auto& [k, v] : obj.map->items) l.push_back(n == "keys" ? Value::string(k) : v);
      return Value::make_list(std::move(l));
    }
    if (n == "get") {
      const Value* k = args.get(0, "key");
      if (!k) fail(e, "get() takes at least 1 argument");
      if (k->is_string())
        if (const Value* v = obj.map->find(k->str())) return *v;
      const Value* d = args.get(1, "default");
      return d ? *d : Value::none();
    }
    fail(e, fmt::format("'dict' object has no method '{}'", n));
  }

  static Value items_of(const Value& obj) {
    ValueList l;
    for (const auto& [k, v] : obj.map->items) {
      l.push_back(Value::make_list({Value::string(k), v}));
      l.back().tuple = true;
    }
    return Value::make_list(std::move(l));
  }

  // ---- tests ----
  bool test(const Expr& e, const std::string& n, const Value& v, const std::vector<Value>& args) {
    using K = Value::Kind;
    auto arg0 = [&]() -> const Value& {
      if (args.empty()) fail(e, fmt::format("test '{}' needs an argument", n));
      return args[0];
    };
    if (n == "defined") return !v.is_undefined();
    if (n == "undefined") return v.is_undefined();
    if (n == "none") return v.is_none();
    if (n == "string") return v.is_string();
    if (n == "number") return v.is_number();
    if (n == "integer") return v.kind == K::Int;
    if (n == "float") return v.kind == K::Float;
    if (n == "boolean") return v.kind == K::Bool;
    if (n == "true") return v.kind == K::Bool && v.b;
    if (n == "false") return v.kind == K::Bool && !v.b;
    if (n == "mapping") return v.kind == K::Map;
    if (n == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.kind == K::Map;
    if (n == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.kind == K::Map;
    if (n == "lower" || n == "upper") {
      if (!v.is_string()) fail(e, fmt::format("test '{}' needs a string", n));
      return n == "lower" ? py_lower(v.str()) == v.str() : py_upper(v.str()) == v.str();
    }
    if (n == "odd" || n == "even" || n == "divisibleby") {
      if (v.is_undefined()) fail_undefined(e, v);
      if (!is_intlike(v)) fail(e, fmt::format("test '{}' needs an integer", n));
      int64_t x = as_int(v);
      if (n == "odd") return ((x % 2) + 2) % 2 == 1;
      if (n == "even") return x % 2 == 0;
      const Value& d = arg0();
      if (!is_intlike(d) || as_int(d) == 0) fail(e, "divisibleby needs a non-zero integer");
      return x % as_int(d) == 0;
    }
    if (n == "eq" || n == "equalto" || n == "==") return values_equal(v, arg0());
    if (n == "ne" || n == "!=") return !values_equal(v, arg0());
    if (n == "sameas") {
      const Value& o = arg0();
      if (v.kind != o.kind) return false;
      if (v.kind == K::None || v.kind == K::Undefined) return true;
      if (v.kind == K::Bool) return v.b == o.b;
      return false;
    }
    if (n == "in") return contains(e, arg0(), v);
    if (n == "lt" || n == "le" || n == "gt" || n == "ge" || n == "<" || n == "<=" || n == ">" || n == ">=") {
      const Value& o = arg0();
      if (v.is_undefined()) fail_undefined(e, v);
      if (o.is_undefined()) fail(e, "comparison with an undefined value");
      int c;
      try {
        c = values_compare(v, o);
      } catch (const std::invalid_argument& x) {
        fail(e, x.what());
      }
      if (n == "lt" || n == "<") return c < 0;
      if (n == "le" || n == "<=") return c <= 0;
      if (n == "gt" || n == ">") return c > 0;
      return c >= 0;
    }
    fail(e, fmt::format("unknown test '{}'", n));
  }

  // ---- filters ----
  Value filter(const Expr& e) {
    Value v = eval(*e.a);
    std::vector<Value> pos = eval_args(e.args);
    std::vector<std::pair<std::string, Value>> kw;
    for (const auto& [k, x] : e.kwargs) kw.emplace_back(k, eval(*x));
    return apply_filter(e, e.name, v, Args{pos, kw});
  }

  std::vector<Value> as_sequence(const Expr& e, const Value& v) const { return iterate(v, e.line, e.col); }

  Value attr_path(const Expr& e, const Value& v, const std::string& path) const {
    Value cur = v;
    size_t start = 0;
    while (true) {
      size_t dot = path.find('.', start);
      std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (cur.is_undefined()) return cur;
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      cur = digits ? get_item(e, cur, Value::integer(std::stoll(part))) : get_item(e, cur, Value::string(part));
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  Value apply_filter(const Expr& e, const std::string& n, const Value& v, const Args& args) {
    using K = Value::Kind;
    auto need_defined = [&]() {
      if (v.is_undefined()) fail_undefined(e, v);
    };
    if (n == "default" || n == "d") {
      const Value* dv = args.get(0, "default_value");
      const Value* boolean = args.get(1, "boolean");
      bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
      if (use_default) return dv ? *dv : Value::string("");
      return v;
    }
    if (n == "safe") return v;
    if (n == "string") return Value::string(v.to_str());
    if (n == "trim") {
      const Value* c = args.get(0, "chars");
      std::optional<std::string> chars;
      if (c && !c->is_none()) chars = c->to_str();
      return Value::string(py_strip(v.to_str(), chars, true, true));
    }
    if (n == "upper") return Value::string(py_upper(v.to_str()));
    if (n == "lower") return Value::string(py_lower(v.to_str()));
    if (n == "title") return Value::string(jinja_title(v.to_str()));
    if (n == "capitalize") return Value::string(py_capitalize(v.to_str()));
    if (n == "length" || n == "count") {
      switch (v.kind) {
        case K::Undefined: return Value::integer(0);
        case K::String: return Value::integer(static_cast<int64_t>(utf8_length(v.str())));
        case K::List: return Value::integer(static_cast<int64_t>(v.list->size()));
        case K::Map:
        case K::Namespace: return Value::integer(static_cast<int64_t>(v.map->items.size()));
        default: fail(e, fmt::format("object of type '{}' has no len()", v.type_name()));
      }
    }
    if (n == "wordcount") return Value::integer(py_wordcount(v.to_str()));
    if (n == "tojson") {
      const Value* ind = args.get(0, "indent");
      int indent = -1;
      if (ind && !ind->is_none()) {
        if (!is_intlike(*ind)) fail(e, "tojson indent must be an integer");
        indent = static_cast<int>(std::clamp<int64_t>(as_int(*ind), 0, 64));
      }
      const Value* sk = args.get(1, "sort_keys");
      try {
        return Value::string(to_json(v, indent, sk && sk->truthy()));
      } catch (const std::invalid_argument& x) {
        fail(e, x.what());
      }
    }
    if (n == "int") {
      const Value* d = args.get(0, "default");
      Value dflt = d ? *d : Value::integer(0);
      if (is_intlike(v)) return Value::integer(as_int(v));
      if (v.kind == K::Float) return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(v.f)) : dflt;
      if (v.is_string()) {
        std::string s = py_strip(v.str(), std::nullopt, true, true);
        char* end = nullptr;
        errno = 0;
        long long x = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end && *end == '\0' && errno == 0) return Value::integer(x);
        double f = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0' && std::isfinite(f)) return Value::integer(static_cast<int64_t>(f));
      }
      return dflt;
    }
    if (n == "float") {
      const Value* d = args.get(0, "default");
      Value dflt = d ? *d : Value::number(0.0);
      if (v.is_number()) return Value::number(as_double(v));
      if (v.is_string()) {
        std::string s = py_strip(v.str(), std::nullopt, true, true);
        char* end = nullptr;
        double f = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value::number(f);
      }
      return dflt;
    }
    if (n == "abs") {
      need_defined();
      if (v.kind == K::Float) return Value::number(std::fabs(v.f));
      if (is_intlike(v)) return Value::integer(std::llabs(as_int(v)));
      fail(e, fmt::format("bad operand type for abs(): '{}'", v.type_name()));
    }
    if (n == "round") {
      need_defined();
      if (!v.is_number()) fail(e, "round needs a number");
      const Value* pr = args.get(0, "precision");
      const Value* me = args.get(1, "method");
      int64_t prec = pr && is_intlike(*pr) ? as_int(*pr) : 0;
      std::string method = me && me->is_string() ? me->str() : "common";
      double x = as_double(v), scale = std::pow(10.0, static_cast<double>(prec));
      double r;
      if (method == "common") r = std::round(x * scale) / scale;
      else if (method == "ceil") r = std::ceil(x * scale) / scale;
      else if (method == "floor") r = std::floor(x * scale) / scale;
      else fail(e, "method must be common, ceil or floor");
      return Value::number(r);
    }
    if (n == "first" || n == "last") {
      if (v.is_undefined()) return Value::undefined("No first item, sequence was empty.");
      auto seq = as_sequence(e, v);
      if (seq.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", n));
      return n == "first" ? seq.front() : seq.back();
    }
    if (n == "list") return Value::make_list(as_sequence(e, v));
    if (n == "reverse") {
      if (v.is_string()) {
        auto chars = utf8_chars(v.str());
        std::string r;
        for (auto it = chars.rbegin(); it != chars.rend(); ++it) r += *it;
        return Value::string(std::move(r));
      }
      auto seq = as_sequence(e, v);
      std::reverse(seq.begin(), seq.end());
      return Value::make_list(std::move(seq));
    }
    if (n == "items") {
      if (v.is_undefined()) return Value::make_list({});
      if (v.kind != K::Map) fail(e, fmt::format("can only get item pairs from a mapping, not {}", v.type_name()));
      return items_of(v);
    }
    if (n == "dictsort") {
      if (v.kind != K::Map) fail(e, "dictsort needs a mapping");
      const Value* cs = args.get(0, "case_sensitive");
      const Value* by = args.get(1, "by");
      const Value* rev = args.get(2, "reverse");
      bool case_sensitive = cs && cs->truthy();
      bool by_value = by && by->is_string() && by->str() == "value";
      ValueList pairs = *items_of(v).list;
      sort_values(e, pairs, case_sensitive, rev && rev->truthy(), [&](const Value& p) { return (*p.list)[by_value ? 1 : 0]; });
      return Value::make_list(std::move(pairs));
    }
    if (n == "join") {
      const Value* d = args.get(0, "d");
      const Value* attr = args.get(1, "attribute");
      std::string sep = d ? d->to_str() : "";
      std::string r;
      bool first = true;
      for (const auto& x : as_sequence(e, v)) {
        if (!first) r += sep;
        first = false;
        r += (attr && !attr->is_none() ? attr_path(e, x, attr->to_str()) : x).to_str();
        check_size(e, static_cast<double>(r.size()));
      }
      return Value::string(std::move(r));
    }
    if (n == "replace") {
      need_defined();
      const Value* a = args.get(0, "old");
      const Value* b = args.get(1, "new");
      const Value* c = args.get(2, "count");
      if (!a || !b) fail(e, "replace needs old and new");
      return Value::string(
          replace_checked(e, v.to_str(), a->to_str(), b->to_str(), c && is_intlike(*c) ? as_int(*c) : -1));
    }
    if (n == "indent") {
      const Value* w = args.get(0, "width");
      const Value* first = args.get(1, "first");
      const Value* blank = args.get(2, "blank");
      if (w && !w->is_string()) check_size(e, static_cast<double>(as_int(*w)));
      std::string pad = w ? (w->is_string() ? w->str() : std::string(static_cast<size_t>(std::max<int64_t>(0, as_int(*w))), ' ')) : "    ";
      const std::string text = v.to_str();
      check_size(e, static_cast<double>(text.size()) +
                        static_cast<double>(std::count(text.begin(), text.end(), '\n') + 1) * static_cast<double>(pad.size()));
      return Value::string(jinja_indent(v.to_str(), pad, first && first->truthy(), blank && blank->truthy()));
    }
    if (n == "selectattr" || n == "rejectattr" || n == "select" || n == "reject") {
      bool attr_mode = n == "selectattr" || n == "rejectattr";
      bool want = n == "selectattr" || n == "select";
      size_t k = 0;
      std::string attr;
      if (attr_mode) {
        if (args.pos.empty() || !args.pos[0].is_string()) fail(e, fmt::format("{} needs an attribute name", n));
        attr = args.pos[0].str();
        k = 1;
      }
      std::string test_name;
      if (k < args.pos.size()) {
        if (!args.pos[k].is_string()) fail(e, "test name must be a string");
        test_name = args.pos[k].str();
        if (test_name == "None") test_name = "none";
        if (!is_known_test(test_name)) fail(e, fmt::format("unsupported test '{}'", test_name));
      }
      std::vector<Value> test_args(args.pos.begin() + static_cast<std::ptrdiff_t>(std::min(args.pos.size(), k + 1)), args.pos.end());
      ValueList out;
      for (const auto& x : as_sequence(e, v)) {
        Value item = attr_mode ? attr_path(e, x, attr) : x;
        bool r = test_name.empty() ? item.truthy() : test(e, test_name, item, test_args);
        if (r == want) out.push_back(x);
      }
      return Value::make_list(std::move(out));
    }
    if (n == "map") {
      const Value* attr = nullptr;
      const Value* dflt = nullptr;
      for (const auto& [k, x] : args.kw) {
        if (k == "attribute") attr = &x;
        else if (k == "default") dflt = &x;
      }
      ValueList out;
      if (attr) {
        for (const auto& x : as_sequence(e, v)) {
          Value r = attr_path(e, x, attr->to_str());
          if (r.is_undefined() && dflt) r = *dflt;
          out.push_back(std::move(r));
        }
        return Value::make_list(std::move(out));
      }
      if (args.pos.empty() || !args.pos[0].is_string()) fail(e, "map needs a filter name or attribute=");
      std::string f = args.pos[0].str();
      if (!is_known_filter(f) || f == "map") fail(e, fmt::format("unsupported filter '{}' in map", f));
      std::vector<Value> rest(args.pos.begin() + 1, args.pos.end());
      Args sub{rest, args.kw};
      for (const auto& x : as_sequence(e, v)) out.push_back(apply_filter(e, f, x, sub));
      return Value::make_list(std::move(out));
    }
    if (n == "sort" || n == "unique" || n == "min" || n == "max") {
      const Value* rev = n == "sort" ? args.get(0, "reverse") : nullptr;
      const Value* cs = args.get(n == "sort" ? 1 : 0, "case_sensitive");
      const Value* attr = args.get(n == "sort" ? 2 : 1, "attribute");
      bool case_sensitive = cs && cs->truthy();
      auto key = [&](const Value& x) { return attr && !attr->is_none() ? attr_path(e, x, attr->to_str()) : x; };
      ValueList seq = as_sequence(e, v);
      if (n == "unique") {
        ValueList out;
        std::vector<Value> seen;
        for (const auto& x : seq) {
          Value kx = fold_case(key(x), case_sensitive);
          if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, kx); })) {
            seen.push_back(kx);
            out.push_back(x);
          }
        }
        return Value::make_list(std::move(out));
      }
      sort_values(e, seq, case_sensitive, rev && rev->truthy(), key);
      if (n == "sort") return Value::make_list(std::move(seq));
      if (seq.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      return n == "min" ? seq.front() : seq.back();
    }
    if (n == "sum") {
      const Value* attr = args.get(0, "attribute");
      const Value* start = args.get(1, "start");
      Value acc = start ? *start : Value::integer(0);
      for (const auto& x : as_sequence(e, v)) {
        Value item = attr && !attr->is_none() ? attr_path(e, x, attr->to_str()) : x;
        if (!item.is_number() || !acc.is_number()) fail(e, "sum needs numbers");
        if (is_intlike(acc) && is_intlike(item)) acc = Value::integer(as_int(acc) + as_int(item));
        else acc = Value::number(as_double(acc) + as_double(item));
      }
      return acc;
    }
    fail(e, fmt::format("unknown filter '{}'", n));
  }

  static Value fold_case(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.str()));
    return v;
  }

  template <class KeyFn>
  void sort_values(const Expr& e, ValueList& seq, bool case_sensitive, bool reverse, KeyFn key) {
    std::vector<std::pair<Value, size_t>> keyed;
    for (size_t k = 0; k < seq.size(); ++k) keyed.emplace_back(fold_case(key(seq[k]), case_sensitive), k);
    try {
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        int c = values_compare(a.first, b.first);
        return reverse ? c > 0 : c < 0;
      });
    } catch (const std::invalid_argument& x) {
      fail(e, x.what());
    }
    ValueList out;
    for (const auto& [kv, idx] : keyed) out.push_back(seq[idx]);
    seq = std::move(out);
  }
};

}  // namespace

bool is_known_filter(const std::string& name) { return kFilters.count(name) != 0; }
bool is_known_test(const std::string& name) { return kTests.count(name) != 0; }
bool is_known_function(const std::string& name) { return kFunctions.count(name) != 0; }
bool is_known_method(const std::string& name) { return kMethods.count(name) != 0; }

TemplateError::TemplateError(Kind k, std::string message, int l, int c)
    : InputError(std::move(message)), kind(k), line(l), column(c) {}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::load(std::string_view source, std::string origin) {
  auto prog = std::make_shared<Program>();
  prog->origin = origin;
  prog->body = parse_template(source, prog->origin);
  ChatTemplate t;
  t.program_ = std::move(prog);
  t.origin_ = std::move(origin);
  return t;
}

std::string ChatTemplate::render_vars(const nlohmann::ordered_json& vars) const {
  if (!vars.is_object())
    throw TemplateError(TemplateError::Kind::Render, origin_ + ": template variables must be a JSON object", 0, 0);
  const size_t in_bytes = input_bytes(vars, origin_);
  ValueMap globals;
  for (const auto& [k, v] : vars.items()) globals.set(k, Value::from_json(v));
  Evaluator ev(program_->origin, std::move(globals), kMaxOutputBase + 2 * in_bytes);
  return ev.run(program_->body);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  if (!messages.is_array())
    throw TemplateError(TemplateError::Kind::Render, origin_ + ": messages must be a JSON array", 0, 0);
  if (!extra.is_null() && !extra.is_object())
    throw TemplateError(TemplateError::Kind::Render, origin_ + ": extra template variables must be a JSON object", 0,
                        0);
  // As transformers' apply_chat_template: tools and documents are passed
  // (None when absent), then the caller's variables.
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) vars[k] = v;
  vars["messages"] = messages;
  vars["add_generation_prompt"] = add_generation_prompt;
  return render_vars(vars);
}

}  // namespace fp8kv::tmpl
