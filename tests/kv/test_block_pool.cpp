#include <gtest/gtest.h>

#include <set>

#include "kv/block_pool.h"

namespace fp8kv {
namespace {

TEST(BlockPool, AllocatesEveryBlockOnceLowestFirst) {
  BlockPool p(5);
  EXPECT_EQ(p.num_free(), 5);
  std::vector<int32_t> got;
  for (int i = 0; i < 5; ++i) got.push_back(p.allocate());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(p.num_free(), 0);
  EXPECT_THROW(p.allocate(), std::runtime_error);
  p.release(3);
  p.release(1);
  EXPECT_EQ(p.allocate(), 1);  // most recently freed first
  EXPECT_EQ(p.allocate(), 3);
}

TEST(BlockPool, RejectsDoubleAndForeignRelease) {
  BlockPool p(2);
  const int32_t b = p.allocate();
  p.release(b);
  EXPECT_THROW(p.release(b), std::logic_error);
  EXPECT_THROW(p.release(7), std::logic_error);
  EXPECT_THROW(p.release(-1), std::logic_error);
}

}  // namespace
}  // namespace fp8kv
