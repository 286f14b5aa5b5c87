#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <fmt/format.h>
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <mutex>
#include <optional>

#include "io/errors.h"
#include "tokenizer/utf8.h"

namespace fp8kv::tok {

namespace {
// Unicode White_Space, which is what Oniguruma's \s means for UTF-8 text.
constexpr std::string_view kWhiteSpaceItems =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

struct MatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    md = pcre2_match_data_create(1, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~MatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(stack);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
  thread_local MatchState st;
  return st;
}
}  // namespace

namespace {
// ---- Unicode 15 classes from utf8proc ----------------------------------------
// PCRE2 10.42 (Debian 12) carries Unicode 14 tables; `tokenizers`' Oniguruma
// and utf8proc 2.8 carry Unicode 15. So \p{..} general categories, \d and \w
// are expanded into explicit code-point ranges built from utf8proc before
// PCRE2 sees the pattern (see src/tokenizer/README.md, "Unicode 15").

using CatMask = uint64_t;  // bit k: utf8proc category k
constexpr CatMask bit(utf8proc_category_t c) { return CatMask{1} << c; }
constexpr CatMask kL = bit(UTF8PROC_CATEGORY_LU) | bit(UTF8PROC_CATEGORY_LL) | bit(UTF8PROC_CATEGORY_LT) |
                       bit(UTF8PROC_CATEGORY_LM) | bit(UTF8PROC_CATEGORY_LO);
constexpr CatMask kM = bit(UTF8PROC_CATEGORY_MN) | bit(UTF8PROC_CATEGORY_MC) | bit(UTF8PROC_CATEGORY_ME);
constexpr CatMask kN = bit(UTF8PROC_CATEGORY_ND) | bit(UTF8PROC_CATEGORY_NL) | bit(UTF8PROC_CATEGORY_NO);
constexpr CatMask kP = bit(UTF8PROC_CATEGORY_PC) | bit(UTF8PROC_CATEGORY_PD) | bit(UTF8PROC_CATEGORY_PS) |
                       bit(UTF8PROC_CATEGORY_PE) | bit(UTF8PROC_CATEGORY_PI) | bit(UTF8PROC_CATEGORY_PF) |
                       bit(UTF8PROC_CATEGORY_PO);
constexpr CatMask kS = bit(UTF8PROC_CATEGORY_SM) | bit(UTF8PROC_CATEGORY_SC) | bit(UTF8PROC_CATEGORY_SK) |
                       bit(UTF8PROC_CATEGORY_SO);
constexpr CatMask kZ = bit(UTF8PROC_CATEGORY_ZS) | bit(UTF8PROC_CATEGORY_ZL) | bit(UTF8PROC_CATEGORY_ZP);
// Pseudo-category of U+200C / U+200D (Cf, but word characters for \w).
constexpr int kJoinerCat = 30;
constexpr CatMask kCf = bit(UTF8PROC_CATEGORY_CF) | (CatMask{1} << kJoinerCat);
constexpr CatMask kC = bit(UTF8PROC_CATEGORY_CN) | bit(UTF8PROC_CATEGORY_CC) | kCf | bit(UTF8PROC_CATEGORY_CO) |
                       bit(UTF8PROC_CATEGORY_CS);
// \w as Rust's regex / utf8::is_word_char: letters, marks, Nd, Nl, Pc, joiners.
constexpr CatMask kWord = kL | kM | bit(UTF8PROC_CATEGORY_ND) | bit(UTF8PROC_CATEGORY_NL) |
                          bit(UTF8PROC_CATEGORY_PC) | (CatMask{1} << kJoinerCat);

// The category of every code point as runs [first, next first), built once.
// Planes 4-13 are unassigned in Unicode 15 (test_tokenizer_unicode15 checks
// that against utf8proc), which saves most of the scan.
struct CatRun {
  char32_t first;
  uint8_t cat;
};
const std::vector<CatRun>& category_runs() {
  static const std::vector<CatRun> runs = [] {
    std::vector<CatRun> r;
    auto push = [&](char32_t c, int k) {
      if (r.empty() || r.back().cat != k) r.push_back({c, static_cast<uint8_t>(k)});
    };
    for (char32_t c = 0; c <= 0x10FFFF; ++c) {
      if (c == 0x40000) {
        push(c, UTF8PROC_CATEGORY_CN);
        c = 0xDFFFF;
        continue;
      }
      int k = (c == 0x200C || c == 0x200D) ? kJoinerCat : utf8proc_category(static_cast<utf8proc_int32_t>(c));
      push(c, k);
    }
    return r;
  }();
  return runs;
}

struct Category {
  CatMask mask;
  const char* pcre2_name;  // PCRE2's own name of the same category
};
std::optional<Category> category_mask(std::string_view name) {
  struct E {
    const char* a;
    const char* b;
    CatMask m;
  };
  static const E table[] = {
      {"L", "Letter", kL}, {"Lu", "Uppercase_Letter", bit(UTF8PROC_CATEGORY_LU)},
      {"Ll", "Lowercase_Letter", bit(UTF8PROC_CATEGORY_LL)}, {"Lt", "Titlecase_Letter", bit(UTF8PROC_CATEGORY_LT)},
      {"Lm", "Modifier_Letter", bit(UTF8PROC_CATEGORY_LM)}, {"Lo", "Other_Letter", bit(UTF8PROC_CATEGORY_LO)},
      {"LC", "Cased_Letter", bit(UTF8PROC_CATEGORY_LU) | bit(UTF8PROC_CATEGORY_LL) | bit(UTF8PROC_CATEGORY_LT)},
      {"L&", "L&", bit(UTF8PROC_CATEGORY_LU) | bit(UTF8PROC_CATEGORY_LL) | bit(UTF8PROC_CATEGORY_LT)},
      {"M", "Mark", kM}, {"Mn", "Nonspacing_Mark", bit(UTF8PROC_CATEGORY_MN)},
      {"Mc", "Spacing_Mark", bit(UTF8PROC_CATEGORY_MC)}, {"Me", "Enclosing_Mark", bit(UTF8PROC_CATEGORY_ME)},
      {"N", "Number", kN}, {"Nd", "Decimal_Number", bit(UTF8PROC_CATEGORY_ND)},
      {"Nl", "Letter_Number", bit(UTF8PROC_CATEGORY_NL)}, {"No", "Other_Number", bit(UTF8PROC_CATEGORY_NO)},
      {"P", "Punctuation", kP}, {"Pc", "Connector_Punctuation", bit(UTF8PROC_CATEGORY_PC)},
      {"Pd", "Dash_Punctuation", bit(UTF8PROC_CATEGORY_PD)}, {"Ps", "Open_Punctuation", bit(UTF8PROC_CATEGORY_PS)},
      {"Pe", "Close_Punctuation", bit(UTF8PROC_CATEGORY_PE)}, {"Pi", "Initial_Punctuation", bit(UTF8PROC_CATEGORY_PI)},
      {"Pf", "Final_Punctuation", bit(UTF8PROC_CATEGORY_PF)}, {"Po", "Other_Punctuation", bit(UTF8PROC_CATEGORY_PO)},
      {"S", "Symbol", kS}, {"Sm", "Math_Symbol", bit(UTF8PROC_CATEGORY_SM)},
      {"Sc", "Currency_Symbol", bit(UTF8PROC_CATEGORY_SC)}, {"Sk", "Modifier_Symbol", bit(UTF8PROC_CATEGORY_SK)},
      {"So", "Other_Symbol", bit(UTF8PROC_CATEGORY_SO)}, {"Z", "Separator", kZ},
      {"Zs", "Space_Separator", bit(UTF8PROC_CATEGORY_ZS)}, {"Zl", "Line_Separator", bit(UTF8PROC_CATEGORY_ZL)},
      {"Zp", "Paragraph_Separator", bit(UTF8PROC_CATEGORY_ZP)}, {"C", "Other", kC},
      {"Cc", "Control", bit(UTF8PROC_CATEGORY_CC)}, {"Cf", "Format", kCf},
      {"Co", "Private_Use", bit(UTF8PROC_CATEGORY_CO)}, {"Cn", "Unassigned", bit(UTF8PROC_CATEGORY_CN)},
      {"Cs", "Surrogate", bit(UTF8PROC_CATEGORY_CS)},
  };
  for (const E& e : table)
    if (name == e.a || name == e.b) return Category{e.m, std::string_view(e.a) == "LC" ? "L&" : e.a};
  return std::nullopt;
}

void emit_range(std::string& out, char32_t a, char32_t b) {
  if (a == b)
    out += fmt::format("\\x{{{:X}}}", static_cast<uint32_t>(a));
  else
    out += fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", static_cast<uint32_t>(a), static_cast<uint32_t>(b));
}

// Code-point ranges (surrogates excluded: PCRE2 rejects them in UTF mode) of
// the characters whose category is in `mask`, as PCRE2 class items.
// The characters whose utf8proc category differs from PCRE2's (all of them
// new in Unicode 15), from tools/gen_unicode_delta.cpp.
struct Delta {
  char32_t first, last;
  int cat15, cat14;
};
constexpr Delta kDelta[] = {
#include "tokenizer/unicode_delta.inc"
};

std::string class_items(CatMask mask, bool negate, const std::string& native) {
  auto in = [&](int cat) { return ((mask >> cat) & 1) != negate; };
  // Fast path: PCRE2's native property plus the characters it misses, when
  // it matches nothing that utf8proc excludes.
  if (!native.empty()) {
    bool removals = false;
    std::string out = native;
    for (const Delta& d : kDelta) {
      if (in(d.cat14) && !in(d.cat15)) removals = true;
      if (in(d.cat15) && !in(d.cat14)) emit_range(out, d.first, d.last);
    }
    if (!removals) return out;
  }
  static std::mutex mu;
  static std::vector<std::pair<std::pair<CatMask, bool>, std::string>> cache;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [k, v] : cache)
    if (k.first == mask && k.second == negate) return v;
  std::string out;
  auto emit = [&](char32_t a, char32_t b) {  // [a, b], surrogates removed
    if (a <= 0xDFFF && b >= 0xD800) {
      if (a < 0xD800) emit_range(out, a, 0xD7FF);
      if (b > 0xDFFF) emit_range(out, 0xE000, b);
      return;
    }
    emit_range(out, a, b);
  };
  const auto& runs = category_runs();
  bool open = false;
  char32_t start = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    bool m = ((mask >> runs[k].cat) & 1) != negate;
    if (m && !open) {
      start = runs[k].first;
      open = true;
    } else if (!m && open) {
      emit(start, runs[k].first - 1);
      open = false;
    }
  }
  if (open) emit(start, 0x10FFFF);
  cache.push_back({{mask, negate}, out});
  return out;
}

// Parses \p{..} / \P{..} / \pX at p[i] (p[i] == '\\'); returns the mask, the
// negation and the length, or nullopt when it is not a general category.
struct PropRef {
  CatMask mask;
  bool negate;
  size_t len;
  std::string native;  // the same class in PCRE2 syntax (its Unicode 14 tables), "" if none
};
std::optional<PropRef> parse_prop(std::string_view p, size_t i) {
  char n = p[i + 1];
  bool neg = n == 'P';
  if (n != 'p' && n != 'P') return std::nullopt;
  if (i + 2 >= p.size()) return std::nullopt;
  if (p[i + 2] != '{') {
    auto m = category_mask(p.substr(i + 2, 1));
    if (!m) return std::nullopt;
    return PropRef{m->mask, neg, 3, fmt::format("\\{}{{{}}}", neg ? 'P' : 'p', m->pcre2_name)};
  }
  size_t close = p.find('}', i + 3);
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view name = p.substr(i + 3, close - i - 3);
  if (!name.empty() && name[0] == '^') {
    neg = !neg;
    name.remove_prefix(1);
  }
  auto m = category_mask(name);
  if (!m) return std::nullopt;
  return PropRef{m->mask, neg, close + 1 - i, fmt::format("\\{}{{{}}}", neg ? 'P' : 'p', m->pcre2_name)};
}
}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        if (in_class) {
          out += kWhiteSpaceItems;
        } else {
          out += "[";
          out += kWhiteSpaceItems;
          out += "]";
        }
        ++i;
        continue;
      }
      if (n == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceItems;
        out += "]";
        ++i;
        continue;
      }
      std::optional<PropRef> prop;
      if (n == 'p' || n == 'P') prop = parse_prop(p, i);
      if (n == 'd' || n == 'D') prop = PropRef{bit(UTF8PROC_CATEGORY_ND), n == 'D', 2, n == 'd' ? "\\p{Nd}" : "\\P{Nd}"};
      if (n == 'w' || n == 'W') prop = PropRef{kWord, n == 'W', 2, ""};  // PCRE2's \w differs from Rust's
      if (prop) {
        // Inside a class the items; outside, a class of them.
        std::string items = class_items(prop->mask, prop->negate, prop->native);
        if (in_class)
          out += items;
        else if (items.empty())
          out += "(?!)";  // an empty set (e.g. \p{Cs}: surrogates never occur in UTF-8)
        else
          out += "[" + items + "]";
        i += prop->len - 1;
        continue;
      }
      out.push_back(c);
      out.push_back(n);
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') {
        out += "\\]";
        ++i;
      }
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:alpha:]
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& what) : source_(pattern) {
  std::string translated = onig_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw InputError(fmt::format("{}: regex {:?} does not compile at offset {}: {}", what, pattern, off,
                                 reinterpret_cast<const char*>(msg)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  code_ = std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
}

Regex Regex::literal(std::string_view text, const std::string& what) {
  std::string p = "\\Q";
  // \Q...\E cannot contain \E: split it out.
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'E') {
      p += "\\E\\\\\\Q";
      continue;
    }
    p.push_back(text[i]);
  }
  p += "\\E";
  return Regex(p, what);
}

void Regex::find_all(std::string_view s, std::vector<Span>& out) const {
  out.clear();
  auto* code = static_cast<pcre2_code*>(code_.get());
  MatchState& st = match_state();
  size_t pos = 0;
  while (pos <= s.size()) {
    int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, st.md,
                         st.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw InputError(fmt::format("regex {:?} failed while matching: {}", source_, reinterpret_cast<const char*>(msg)));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      pos = e;
    } else {
      if (b >= s.size()) break;
      pos = b + utf8::cp_len(static_cast<unsigned char>(s[b]));
    }
  }
}

}  // namespace fp8kv::tok
