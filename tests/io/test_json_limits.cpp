// io/json_limits.h: nesting deeper than kMaxJsonDepth is refused on the bytes,
// before any parser or recursive walk sees it (issue 37: a tokenizer.json
// nested 100,000 deep was a SIGSEGV).
#include <gtest/gtest.h>

#include <string>

#include "io/errors.h"
#include "io/json_limits.h"

namespace fp8kv {
namespace {

std::string nested(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(depth), open) + std::string(static_cast<size_t>(depth), close);
}

TEST(JsonDepth, AtTheBoundPassesAboveIsRefusedNamingTheSource) {
  EXPECT_NO_THROW(check_json_depth(nested(kMaxJsonDepth), "f.json"));
  EXPECT_NO_THROW(check_json_depth(nested(kMaxJsonDepth, '{', '}'), "f.json"));
  for (int d : {kMaxJsonDepth + 1, 100000}) {
    try {
      check_json_depth(nested(d), "f.json");
      ADD_FAILURE() << d;
    } catch (const InputError& e) {
      EXPECT_STREQ(e.what(), "f.json: JSON nested deeper than 100 levels (at byte 100); no valid input nests this deep");
    }
  }
  // Siblings do not add up: depth is nesting, not count.
  std::string wide = "[";
  for (int i = 0; i < 10000; ++i) wide += nested(50) + ",";
  wide += "1]";
  EXPECT_NO_THROW(check_json_depth(wide, "f.json"));
}

TEST(JsonDepth, BracketsInStringsDoNotCount) {
  const std::string s = "{\"a\": \"" + nested(500) + "\\\"[[[\", \"b\": [\"]]]]\"]}";
  EXPECT_NO_THROW(check_json_depth(s, "f.json"));
  // An escaped backslash ends before the quote: the string closes there.
  EXPECT_THROW(check_json_depth("[\"\\\\\", " + nested(kMaxJsonDepth) + "]", "f.json"), InputError);
}

}  // namespace
}  // namespace fp8kv
