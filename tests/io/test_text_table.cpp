// TextTable (src/io/text_table.h): the one table printer of the CLI.
#include <gtest/gtest.h>

#include "io/text_table.h"

namespace fp8kv {
namespace {

using A = TextTable::Align;

TEST(TextTable, MinimumWidthsGiveTheFixedLayout) {
  TextTable t({{"group", 6, A::left}, {"type", 8, A::left}, {"layers", 7}}, "", "");
  t.add_row({"0", "full", "32"});
  t.add_row({"total", "", "32"});
  EXPECT_EQ(t.str(),
            "group type     layers\n"
            "0     full         32\n"
            "total              32\n");
}

TEST(TextTable, ALongCellWidensItsColumnOnly) {
  TextTable t({{"arm", 4, A::left}, {"ppl", 6}}, "  ");
  t.add_row({"bf16", "1.0"});
  t.add_row({"fp8:scales=/a/long/dir", "12.5"}, "  <- note");
  EXPECT_EQ(t.str(),
            "  arm                       ppl\n"
            "  bf16                      1.0\n"
            "  fp8:scales=/a/long/dir   12.5  <- note\n");
}

TEST(TextTable, ShortRowsPrintTheirCellsOnly) {
  TextTable t({{"a", 3}, {"b", 3}, {"c", 3}});
  t.add_row({"1"});
  EXPECT_EQ(t.str(), "  a   b   c\n  1\n");
}

}  // namespace
}  // namespace fp8kv
