#include "template/value.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace fp8kv::tmpl {

const Value* ValueMap::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void ValueMap::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Value::undefined(std::string name) { return {.s = std::make_shared<const std::string>(std::move(name))}; }
Value Value::none() { return {.kind = Kind::None}; }
Value Value::boolean(bool b) { return {.kind = Kind::Bool, .b = b}; }
Value Value::integer(int64_t i) { return {.kind = Kind::Int, .i = i}; }
Value Value::number(double f) { return {.kind = Kind::Float, .f = f}; }
Value Value::string(std::string s) { return {.kind = Kind::String, .s = std::make_shared<const std::string>(std::move(s))}; }
Value Value::make_list(ValueList l) { return {.kind = Kind::List, .list = std::make_shared<const ValueList>(std::move(l))}; }
Value Value::make_map(ValueMap m) { return {.kind = Kind::Map, .map = std::make_shared<ValueMap>(std::move(m))}; }

Value Value::from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
    case T::discarded: return none();
    case T::boolean: return boolean(j.get<bool>());
    case T::number_integer: return integer(j.get<int64_t>());
    case T::number_unsigned: {
      auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return number(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case T::number_float: return number(j.get<double>());
    case T::string: return string(j.get<std::string>());
    case T::binary: throw std::invalid_argument("binary JSON values are not supported");
    case T::array: {
      ValueList l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return make_list(std::move(l));
    }
    case T::object: {
      ValueMap m;
      m.items.reserve(j.size());
      for (const auto& [k, e] : j.items()) m.set(k, from_json(e));
      return make_map(std::move(m));
    }
  }
  return none();
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0.0;
    case Kind::String: return !s->empty();
    case Kind::List: return !list->empty();
    case Kind::Map: return !map->items.empty();
    case Kind::Namespace: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Map: return "dict";
    case Kind::Namespace: return "Namespace";
  }
  return "?";
}

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string r = fmt::format("{}", d);
  if (r.find_first_of(".e") == std::string::npos) r += ".0";
  return r;
}

static std::string repr_string(const std::string& s) {
  // Python: single quotes unless the string has ' and no ".
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string r(1, q);
  for (unsigned char c : s) {
    if (c == '\\') r += "\\\\";
    else if (c == static_cast<unsigned char>(q)) { r += '\\'; r += static_cast<char>(c); }
    else if (c == '\n') r += "\\n";
    else if (c == '\r') r += "\\r";
    else if (c == '\t') r += "\\t";
    else if (c < 0x20 || c == 0x7f) r += fmt::format("\\x{:02x}", c);
    else r += static_cast<char>(c);
  }
  r += q;
  return r;
}

std::string Value::to_str() const {
  switch (kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b ? "True" : "False";
    case Kind::Int: return std::to_string(i);
    case Kind::Float: return python_float(f);
    case Kind::String: return *s;
    case Kind::Namespace: return "<Namespace>";
    case Kind::List:
    case Kind::Map: return repr();
  }
  return "";
}

std::string Value::repr() const {
  switch (kind) {
    case Kind::String: return repr_string(*s);
    case Kind::List: {
      std::string r = tuple ? "(" : "[";
      for (size_t k = 0; k < list->size(); ++k) {
        if (k) r += ", ";
        r += (*list)[k].repr();
      }
      if (tuple && list->size() == 1) r += ",";
      return r + (tuple ? ")" : "]");
    }
    case Kind::Map: {
      std::string r = "{";
      bool first = true;
      for (const auto& [k, v] : map->items) {
        if (!first) r += ", ";
        first = false;
        r += repr_string(k) + ": " + v.repr();
      }
      return r + "}";
    }
    default: return to_str();
  }
}

static bool numeric(const Value& v) { return v.is_number(); }
static double as_double(const Value& v) {
  if (v.kind == Value::Kind::Float) return v.f;
  if (v.kind == Value::Kind::Bool) return v.b ? 1.0 : 0.0;
  return static_cast<double>(v.i);
}

bool values_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (numeric(a) && numeric(b)) {
    if (a.kind != K::Float && b.kind != K::Float) {
      int64_t x = a.kind == K::Bool ? a.b : a.i, y = b.kind == K::Bool ? b.b : b.i;
      return x == y;
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return *a.s == *b.s;
    case K::List: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case K::Map: {
      if (a.map->items.size() != b.map->items.size()) return false;
      for (const auto& [k, v] : a.map->items) {
        const Value* o = b.map->find(k);
        if (!o || !values_equal(v, *o)) return false;
      }
      return true;
    }
    case K::Namespace: return a.map == b.map;
    default: return false;
  }
}

int values_compare(const Value& a, const Value& b) {
  if (numeric(a) && numeric(b)) {
    if (a.kind == Value::Kind::Int && b.kind == Value::Kind::Int) return a.i < b.i ? -1 : a.i > b.i;
    double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.s->compare(*b.s);  // byte order == code point order in UTF-8
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_list() && b.is_list()) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (values_equal((*a.list)[k], (*b.list)[k])) continue;
      return values_compare((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size();
  }
  throw std::invalid_argument(fmt::format("'<' not supported between instances of '{}' and '{}'",
                                          a.type_name(), b.type_name()));
}

static void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

static void json_write(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
  using K = Value::Kind;
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case K::Undefined: throw std::invalid_argument("Object of type Undefined is not JSON serializable");
    case K::Namespace: throw std::invalid_argument("Object of type Namespace is not JSON serializable");
    case K::None: out += "null"; return;
    case K::Bool: out += v.b ? "true" : "false"; return;
    case K::Int: out += std::to_string(v.i); return;
    case K::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += python_float(v.f);
      return;
    case K::String: json_string(out, *v.s); return;
    case K::List: {
      if (v.list->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        json_write(out, (*v.list)[k], indent, sort_keys, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case K::Map: {
      if (v.map->items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.map->items) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(depth + 1);
        json_string(out, kv->first);
        out += ": ";
        json_write(out, kv->second, indent, sort_keys, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
  }
}

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_write(out, v, indent, sort_keys, 0);
  return out;
}

static size_t utf8_len_at(const std::string& s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_len_at(s, i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += utf8_len_at(s, i)) ++n;
  return n;
}

}  // namespace fp8kv::tmpl
