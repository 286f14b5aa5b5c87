#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <fmt/format.h>
#include <pcre2.h>

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
