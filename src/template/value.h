// Runtime values of the chat-template language (internal to src/template).
// Python semantics where templates can observe them: str() of None/True/1.0,
// repr of lists and dicts, dicts keep insertion order, strings index by code
// point (docs/chat_templates.md).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp8kv::tmpl {

struct Value;
using ValueList = std::vector<Value>;

// Insertion-ordered string-keyed map (Python dict order).
struct ValueMap {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Map, Namespace };
  Kind kind = Kind::Undefined;
  bool b = false;
  bool tuple = false;  // List: a Python tuple (repr "(1, 2)")
  int64_t i = 0;
  double f = 0.0;
  std::shared_ptr<const std::string> s;  // String; the name for Undefined
  std::shared_ptr<const ValueList> list;  // List
  std::shared_ptr<ValueMap> map;          // Map (never mutated) or Namespace

  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value make_list(ValueList v);
  static Value make_map(ValueMap v);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_mapping() const { return kind == Kind::Map || kind == Kind::Namespace; }
  bool is_number() const { return kind == Kind::Bool || kind == Kind::Int || kind == Kind::Float; }
  const std::string& str() const { return *s; }

  bool truthy() const;
  std::string to_str() const;   // Python str()
  std::string repr() const;     // Python repr()
  const char* type_name() const;  // Python type name, for errors
};

bool values_equal(const Value& a, const Value& b);
// Python ordering; throws std::invalid_argument for incomparable types.
int values_compare(const Value& a, const Value& b);
// Python float repr (shortest round trip, "1.0", "1e+16").
std::string python_float(double d);
// json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys)
// (indent < 0: none). Throws std::invalid_argument for Undefined.
std::string to_json(const Value& v, int indent, bool sort_keys);

// UTF-8 helpers: code points of s (invalid bytes pass as single units).
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);

}  // namespace fp8kv::tmpl
