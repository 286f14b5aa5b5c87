// PCRE2 (UTF + UCP, JIT) wrapper that matches the way `tokenizers` runs its
// Oniguruma patterns: `\s` / `\S` are rewritten to Unicode White_Space so the
// two engines agree, and find_all mirrors onig's find_iter.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fp8kv::tok {

using Span = std::pair<size_t, size_t>;  // [begin, end) byte offsets

class Regex {
 public:
  // Throws InputError naming `what` when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& what);
  static Regex literal(std::string_view text, const std::string& what);
  // Non-overlapping matches left to right; an empty match advances one char.
  // `s` must be valid UTF-8.
  void find_all(std::string_view s, std::vector<Span>& out) const;
  const std::string& pattern() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<void> code_;  // pcre2_code_8
};

// Rewrites Oniguruma-only syntax to PCRE2 (exposed for tests).
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace fp8kv::tok
