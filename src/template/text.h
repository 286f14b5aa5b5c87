// Python str semantics used by the template filters and methods (internal).
// Case mapping is per code point through utf8proc (no special casing:
// "ß".upper() stays "ß", where Python gives "SS"); whitespace is Python's
// str.isspace() set.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fp8kv::tmpl {

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_title(const std::string& s);       // str.title()
std::string jinja_title(const std::string& s);    // jinja2's |title
std::string py_capitalize(const std::string& s);  // str.capitalize()
std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit,
                                  bool from_right);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
int64_t py_count(const std::string& s, const std::string& sub);
bool py_is(const std::string& what, const std::string& s);  // isdigit, isalpha, ...
int64_t py_wordcount(const std::string& s);                 // jinja2's |wordcount
std::string jinja_indent(const std::string& s, const std::string& pad, bool first, bool blank);

}  // namespace fp8kv::tmpl
