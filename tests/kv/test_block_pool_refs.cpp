// BlockPool reference counts: a shared block returns to the pool only when
// its last holder releases it (the prefix cache builds on this).
#include <gtest/gtest.h>

#include "kv/block_pool.h"

namespace fp8kv {
namespace {

TEST(BlockPoolRefs, SharedBlockFreedByTheLastHolder) {
  BlockPool p(3);
  const int32_t b = p.allocate();
  EXPECT_EQ(p.ref_count(b), 1);
  p.share(b);
  p.share(b);
  EXPECT_EQ(p.ref_count(b), 3);
  EXPECT_EQ(p.num_free(), 2);
  p.release(b);
  p.release(b);
  EXPECT_EQ(p.num_free(), 2);  // one holder left
  EXPECT_EQ(p.ref_count(b), 1);
  p.release(b);
  EXPECT_EQ(p.num_free(), 3);
  EXPECT_EQ(p.ref_count(b), 0);
  EXPECT_EQ(p.allocate(), b);  // most recently freed first
}

TEST(BlockPoolRefs, ShareOrReleaseOfAFreeBlockThrows) {
  BlockPool p(2);
  EXPECT_THROW(p.share(0), std::logic_error);
  EXPECT_THROW(p.share(5), std::logic_error);
  EXPECT_THROW(p.ref_count(-1), std::logic_error);
  const int32_t b = p.allocate();
  p.release(b);
  EXPECT_THROW(p.release(b), std::logic_error);
  EXPECT_EQ(p.num_free(), 2);
}

}  // namespace
}  // namespace fp8kv
