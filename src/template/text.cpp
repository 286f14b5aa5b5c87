#include "template/text.h"

#include <utf8proc.h>

namespace fp8kv::tmpl {
namespace {

struct Cp {
  int32_t cp;   // -1 for an invalid byte
  size_t len;
};

Cp decode(const std::string& s, size_t i) {
  utf8proc_int32_t cp = -1;
  auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                            static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  if (n <= 0) return {-1, 1};
  return {cp, static_cast<size_t>(n)};
}

std::vector<std::pair<int32_t, std::string>> decode_all(const std::string& s) {
  std::vector<std::pair<int32_t, std::string>> out;
  for (size_t i = 0; i < s.size();) {
    Cp c = decode(s, i);
    out.emplace_back(c.cp, s.substr(i, c.len));
    i += c.len;
  }
  return out;
}

void append_cp(std::string& out, int32_t cp) {
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(cp, buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

bool is_space(int32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0) return true;
  if (c < 0x1680) return false;
  return c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_cased_letter(int32_t c) {
  if (c < 0) return false;
  auto cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool is_alpha(int32_t c) {
  if (c < 0) return false;
  auto cat = utf8proc_category(c);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
bool is_digit(int32_t c) { return c >= 0 && utf8proc_category(c) == UTF8PROC_CATEGORY_ND; }
bool is_numeric(int32_t c) {
  if (c < 0) return false;
  auto cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}
int32_t upper(int32_t c) { return c < 0 ? c : utf8proc_toupper(c); }
int32_t lower(int32_t c) { return c < 0 ? c : utf8proc_tolower(c); }
int32_t title(int32_t c) { return c < 0 ? c : utf8proc_totitle(c); }

template <class F>
std::string map_cps(const std::string& s, F f) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    Cp c = decode(s, i);
    if (c.cp < 0) out += s[i];
    else append_cp(out, f(c.cp));
    i += c.len;
  }
  return out;
}

}  // namespace

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<int32_t> set;
  if (chars)
    for (size_t i = 0; i < chars->size();) {
      Cp c = decode(*chars, i);
      set.push_back(c.cp < 0 ? static_cast<unsigned char>((*chars)[i]) + 0x110000 : c.cp);
      i += c.len;
    }
  auto strip_it = [&](const std::string& str, size_t i, const Cp& c) {
    int32_t key = c.cp < 0 ? static_cast<unsigned char>(str[i]) + 0x110000 : c.cp;
    if (!chars) return is_space(c.cp);
    for (int32_t x : set)
      if (x == key) return true;
    return false;
  };
  auto cps = decode_all(s);
  size_t b = 0, e = cps.size();
  size_t off = 0;
  std::vector<size_t> offs;
  for (auto& c : cps) {
    offs.push_back(off);
    off += c.second.size();
  }
  if (left)
    while (b < e && strip_it(s, offs[b], Cp{cps[b].first, cps[b].second.size()})) ++b;
  if (right)
    while (e > b && strip_it(s, offs[e - 1], Cp{cps[e - 1].first, cps[e - 1].second.size()})) --e;
  if (b == e) return "";
  size_t start = offs[b];
  size_t stop = e < cps.size() ? offs[e] : s.size();
  return s.substr(start, stop - start);
}

std::string py_upper(const std::string& s) { return map_cps(s, upper); }
std::string py_lower(const std::string& s) { return map_cps(s, lower); }

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    Cp c = decode(s, i);
    if (c.cp < 0) {
      out += s[i];
      prev_cased = false;
    } else {
      append_cp(out, prev_cased ? lower(c.cp) : title(c.cp));
      prev_cased = is_cased_letter(c.cp);
    }
    i += c.len;
  }
  return out;
}

std::string jinja_title(const std::string& s) {
  // "".join(item[0].upper() + item[1:].lower() for item in re.split(r"([-\s\(\{\[\<]+)", s) if item)
  std::string out;
  bool word_start = true;
  for (size_t i = 0; i < s.size();) {
    Cp c = decode(s, i);
    bool sep = c.cp == '-' || c.cp == '(' || c.cp == '{' || c.cp == '[' || c.cp == '<' || is_space(c.cp) ||
               (c.cp >= 0 && utf8proc_category(c.cp) == UTF8PROC_CATEGORY_ZS);
    if (c.cp < 0) out += s[i];
    else if (sep) append_cp(out, word_start ? upper(c.cp) : c.cp);
    else append_cp(out, word_start ? upper(c.cp) : lower(c.cp));
    // A separator run is one item: its first char is "uppercased" (no-op),
    // and the next item starts a word.
    word_start = sep;
    i += c.len;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  const size_t n = decode(s, 0).len;  // the first code point (or invalid byte)
  return map_cps(s.substr(0, n), title) + map_cps(s.substr(n), lower);
}

std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit,
                                  bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (!from_right) {
      size_t start = 0;
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        size_t f = s.find(*sep, start);
        if (f == std::string::npos) break;
        out.push_back(s.substr(start, f - start));
        start = f + sep->size();
      }
      out.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
        if (end < sep->size()) break;
        size_t f = s.rfind(*sep, end - sep->size());
        if (f == std::string::npos) break;
        rev.push_back(s.substr(f + sep->size(), end - f - sep->size()));
        end = f;
      }
      rev.push_back(s.substr(0, end));
      out.assign(rev.rbegin(), rev.rend());
    }
    return out;
  }
  // Whitespace split: runs of whitespace, no empty strings.
  auto cps = decode_all(s);
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  if (!from_right) {
    for (size_t k = 0; k < cps.size(); ++k) {
      bool sp = is_space(cps[k].first);
      if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit && (in_word || !sp)) {
        std::string rest;
        for (size_t j = k; j < cps.size(); ++j) rest += cps[j].second;
        cur += rest;
        std::string stripped = py_strip(cur, std::nullopt, false, true);
        words.push_back(stripped);
        return words;
      }
      if (sp) {
        if (in_word) words.push_back(cur), cur.clear();
        in_word = false;
      } else {
        cur += cps[k].second;
        in_word = true;
      }
    }
    if (in_word) words.push_back(cur);
    return words;
  }
  // rsplit() on whitespace: mirror.
  std::string rev_s;
  for (auto it = cps.rbegin(); it != cps.rend(); ++it) rev_s += it->second;
  auto parts = py_split(rev_s, std::nullopt, maxsplit, false);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    auto pc = decode_all(*it);
    std::string w;
    for (auto jt = pc.rbegin(); jt != pc.rend(); ++jt) w += jt->second;
    out.push_back(w);
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    auto cps = decode_all(s);
    int64_t n = 0;
    for (auto& c : cps) {
      if (count < 0 || n < count) out += to, ++n;
      out += c.second;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t f = s.find(from, start);
    if (f == std::string::npos) break;
    out.append(s, start, f - start);
    out += to;
    start = f + from.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

int64_t py_count(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(decode_all(s).size()) + 1;
  int64_t n = 0;
  for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
  return n;
}

bool py_is(const std::string& what, const std::string& s) {
  auto cps = decode_all(s);
  if (cps.empty()) return false;
  if (what == "isupper" || what == "islower") {
    bool any_cased = false;
    for (auto& [c, b] : cps) {
      if (!is_cased_letter(c)) continue;
      any_cased = true;
      if (what == "isupper" ? lower(c) == c && upper(c) != c : upper(c) == c && lower(c) != c) return false;
    }
    return any_cased;
  }
  for (auto& [c, b] : cps) {
    bool ok = what == "isdigit"   ? is_digit(c)
              : what == "isalpha" ? is_alpha(c)
              : what == "isalnum" ? (is_alpha(c) || is_numeric(c))
                                  : is_space(c);
    if (!ok) return false;
  }
  return true;
}

int64_t py_wordcount(const std::string& s) {
  int64_t n = 0;
  bool in = false;
  for (size_t i = 0; i < s.size();) {
    Cp c = decode(s, i);
    bool w = c.cp == '_' || is_alpha(c.cp) || is_numeric(c.cp) ||
             (c.cp >= 0 && (utf8proc_category(c.cp) == UTF8PROC_CATEGORY_MN || utf8proc_category(c.cp) == UTF8PROC_CATEGORY_MC));
    if (w && !in) ++n;
    in = w;
    i += c.len;
  }
  return n;
}

std::string jinja_indent(const std::string& s_in, const std::string& pad, bool first, bool blank) {
  std::string s = s_in + "\n";
  // splitlines on \n, \r\n, \r (the common separators).
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '\n' || s[k] == '\r') {
      lines.push_back(s.substr(start, k - start));
      if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
      start = k + 1;
    }
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + pad;
      rv += lines[k];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t k = 1; k < lines.size(); ++k) {
        if (k > 1) rv += "\n";
        if (!lines[k].empty()) rv += pad;
        rv += lines[k];
      }
    }
  }
  if (first) rv = pad + rv;
  return rv;
}

}  // namespace fp8kv::tmpl
