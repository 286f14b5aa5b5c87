#include "tokenizer/utf8.h"

#include <utf8proc.h>

namespace fp8kv::utf8 {

namespace {
// Allowed range of the second byte for a lead byte (Unicode Table 3-7).
bool second_ok(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}
size_t width(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}
// Number of bytes of the (possibly truncated) valid prefix at s[i]; sets
// complete when the whole sequence is valid.
size_t valid_prefix(std::string_view s, size_t i, bool& complete) {
  complete = false;
  unsigned char lead = static_cast<unsigned char>(s[i]);
  size_t w = width(lead);
  if (w == 0) return 0;
  if (w == 1) {
    complete = true;
    return 1;
  }
  size_t n = 1;
  while (n < w) {
    if (i + n >= s.size()) return n;
    unsigned char b = static_cast<unsigned char>(s[i + n]);
    bool ok = n == 1 ? second_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return n;
    ++n;
  }
  complete = true;
  return n;
}
}  // namespace

size_t valid_seq_len(std::string_view s, size_t i) {
  bool complete = false;
  size_t n = valid_prefix(s, i, complete);
  return complete ? n : 0;
}

size_t first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = valid_seq_len(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    bool complete = false;
    size_t n = valid_prefix(s, i, complete);
    if (complete) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      i += n == 0 ? 1 : n;  // the maximal subpart is replaced by one U+FFFD
    }
  }
  return out;
}

char32_t next_cp(std::string_view s, size_t& i) {
  unsigned char b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  size_t n = cp_len(b0);
  char32_t cp = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

char32_t prev_cp(std::string_view s, size_t end, size_t* start) {
  size_t b = end;
  while (b > 0) {
    --b;
    if ((static_cast<unsigned char>(s[b]) & 0xC0) != 0x80) break;
  }
  if (start) *start = b;
  size_t i = b;
  return next_cp(s, i);
}

void append_cp(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

static utf8proc_category_t cat(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

bool is_numeric(char32_t c) {
  auto k = cat(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static bool is_letter(utf8proc_category_t k) {
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}

bool is_alphanumeric(char32_t c) {
  auto k = cat(c);
  return is_letter(k) || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NO;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  auto k = cat(c);
  return is_letter(k) || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_MN ||
         k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_PC || c == 0x200C ||
         c == 0x200D;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                       (c >= 0x7B && c <= 0x7E);
  auto k = cat(c);
  return k == UTF8PROC_CATEGORY_PC || k == UTF8PROC_CATEGORY_PD || k == UTF8PROC_CATEGORY_PS ||
         k == UTF8PROC_CATEGORY_PE || k == UTF8PROC_CATEGORY_PI || k == UTF8PROC_CATEGORY_PF ||
         k == UTF8PROC_CATEGORY_PO;
}

}  // namespace fp8kv::utf8
