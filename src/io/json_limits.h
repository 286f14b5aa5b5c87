// Bounds on JSON read from files and requests (docs/robustness.md "Nesting").
// Our readers walk parsed JSON recursively (a tokenizer's Sequence of
// Sequences, a template's values), so a file nested 100,000 deep would
// overflow the stack: the nesting depth is checked on the bytes, before the
// parse, and refused with exit 2.
#pragma once
#include <cstddef>
#include <string_view>

#include <fmt/format.h>

#include "io/errors.h"

namespace fp8kv {

// No file fp8kv reads nests deeper than ~10 ([ and { levels); 100 leaves
// room and keeps every recursive walk far from the stack's limit.
inline constexpr int kMaxJsonDepth = 100;

// Throws InputError "SOURCE: JSON nested deeper than 100 levels (at byte N)"
// when an array/object nesting in `text` exceeds kMaxJsonDepth. Brackets in
// strings do not count. Linear in the size; no allocation. Header-only:
// the tokenizer and template modules use it without linking fp8kv_io.
inline void check_json_depth(std::string_view text, std::string_view source) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw InputError(fmt::format("{}: JSON nested deeper than {} levels (at byte {}); no valid input nests this deep",
                                     source, kMaxJsonDepth, i));
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
}

}  // namespace fp8kv
