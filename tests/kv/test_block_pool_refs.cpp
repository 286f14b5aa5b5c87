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


// Prefix cache: a registered block that reaches count 0 stays cached (and
// counts as free); allocate() takes never-registered blocks first, then
// evicts the least recently freed cached block; lookup compares the parent
// digest and the tokens, not only the key.
TEST(BlockPoolCache, LruEvictionAfterPlainFreeBlocks) {
  BlockPool p(3);
  const int32_t a = p.allocate(), b = p.allocate();
  BlockDigest da{}, db{}, parent{};
  da[0] = 1;
  db[0] = 2;
  const std::vector<int> ta = {1, 2}, tb = {3, 4};
  p.register_block(a, 0, da, parent, ta);
  p.register_block(b, 0, db, parent, tb);
  EXPECT_EQ(p.num_cached(), 2);
  p.release(b);  // freed first: evicted first
  p.release(a);
  EXPECT_EQ(p.num_free(), 3);
  EXPECT_EQ(p.lookup(0, da, parent, ta), a);
  EXPECT_EQ(p.lookup(1, da, parent, ta), -1);      // another group
  EXPECT_EQ(p.lookup(0, da, parent, tb), -1);      // same key, other tokens
  EXPECT_EQ(p.lookup(0, da, db, ta), -1);          // same key, other parent
  const int32_t c = p.allocate();                  // the never-registered block
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(p.num_cached(), 2);
  EXPECT_EQ(p.allocate(), b);                      // LRU: b was freed before a
  EXPECT_EQ(p.num_cached(), 1);
  EXPECT_EQ(p.lookup(0, db, parent, tb), -1);
  p.acquire(a);                                    // a hit on a free cached block
  EXPECT_EQ(p.ref_count(a), 1);
  EXPECT_EQ(p.num_free(), 0);
  p.acquire(a);
  EXPECT_EQ(p.ref_count(a), 2);
  p.release(a);
  p.release(a);
  EXPECT_EQ(p.num_free(), 1);
  p.reset_cache();
  EXPECT_EQ(p.num_cached(), 0);
  EXPECT_EQ(p.num_free(), 1);
  EXPECT_EQ(p.lookup(0, da, parent, ta), -1);
  EXPECT_THROW(p.acquire(a), std::logic_error);
}

}  // namespace
}  // namespace fp8kv
