// BlockManager: block accounting, prefix matching over chained hashes, reference counts
// of shared blocks, and the LRU eviction of freed cached blocks. Expectations are worked
// out by hand from the contract in runtime/block_manager.h (blocks of 4 tokens).
#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/block_manager.h"

namespace kiln::runtime {
namespace {

constexpr int32_t kBs = 4;

std::vector<int32_t> iota_tokens(int32_t n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Allocates (taking the cached prefix) and commits every full block of `tokens`, as a
// sequence that computed all of them would.
BlockTable run_sequence(BlockManager& bm, const std::vector<int32_t>& tokens) {
  BlockTable t;
  const PrefixMatch m = bm.match_prefix(tokens, int32_t(tokens.size()));
  bm.allocate(t, m, int32_t(tokens.size()));
  bm.commit(t, tokens, int32_t(tokens.size()));
  return t;
}

TEST(BlockManager, AllocateAndFreeKeepTheAccounts) {
  BlockManager bm(8, kBs, true);
  EXPECT_EQ(bm.n_blocks(), 8);
  EXPECT_EQ(bm.n_free(), 8);
  EXPECT_EQ(bm.n_used(), 0);

  BlockTable t;
  EXPECT_EQ(bm.blocks_needed(t, 1), 1);
  EXPECT_EQ(bm.blocks_needed(t, 4), 1);
  EXPECT_EQ(bm.blocks_needed(t, 5), 2);
  EXPECT_EQ(bm.blocks_needed(t, 10), 3);
  bm.allocate(t, {}, 10);
  ASSERT_EQ(t.blocks.size(), 3u);
  EXPECT_EQ(std::set<int32_t>(t.blocks.begin(), t.blocks.end()).size(), 3u) << "distinct blocks";
  EXPECT_EQ(bm.n_free(), 5);
  EXPECT_EQ(bm.n_used(), 3);
  EXPECT_EQ(bm.blocks_needed(t, 12), 0) << "the third block still has room";
  EXPECT_EQ(bm.blocks_needed(t, 13), 1);
  EXPECT_EQ(bm.blocks_needed(t, 2), 0) << "fewer tokens than held need nothing";
  EXPECT_TRUE(bm.can_allocate(5));
  EXPECT_FALSE(bm.can_allocate(6));

  bm.allocate(t, {}, 13);  // grows by one block
  EXPECT_EQ(t.blocks.size(), 4u);
  EXPECT_EQ(bm.n_used(), 4);

  BlockTable u;
  bm.allocate(u, {}, 16);
  EXPECT_EQ(bm.n_free(), 0);
  EXPECT_FALSE(bm.can_allocate(1));
  for (int32_t b : u.blocks) EXPECT_EQ(std::count(t.blocks.begin(), t.blocks.end(), b), 0) << "block " << b;

  bm.free(t);
  EXPECT_TRUE(t.blocks.empty()) << "free empties the table";
  EXPECT_EQ(bm.n_free(), 4);
  bm.free(u);
  EXPECT_EQ(bm.n_free(), 8);
  EXPECT_EQ(bm.n_used(), 0);
  EXPECT_EQ(bm.evictions(), 0) << "nothing was cached";
}

TEST(BlockManager, PrefixMatchesOnlyFullBlocksAndAtMostMaxTokens) {
  BlockManager bm(8, kBs, true);
  const std::vector<int32_t> tokens = iota_tokens(11, 10);  // blocks [10..13] [14..17] [18 19 20]
  BlockTable a = run_sequence(bm, tokens);
  EXPECT_EQ(a.n_full_hashed, 2);

  PrefixMatch m = bm.match_prefix(tokens, 100);
  EXPECT_EQ(m.n_tokens, 8) << "the partial third block is never cached";
  ASSERT_EQ(m.blocks.size(), 2u);
  EXPECT_EQ(m.blocks[0], a.blocks[0]);
  EXPECT_EQ(m.blocks[1], a.blocks[1]);
  EXPECT_EQ(m.hashes.size(), 2u);
  EXPECT_EQ(m.n_free, 0) << "a still holds them";

  EXPECT_EQ(bm.match_prefix(tokens, 7).n_tokens, 4) << "max_tokens 7 leaves room for one full block";
  EXPECT_EQ(bm.match_prefix(tokens, 8).n_tokens, 8);
  EXPECT_EQ(bm.match_prefix(tokens, 3).n_tokens, 0);
  const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 6);
  EXPECT_EQ(bm.match_prefix(head, 100).n_tokens, 4) << "a query shorter than a block matches no partial block";

  std::vector<int32_t> diverging = tokens;
  diverging[5] = 99;  // inside the second block
  EXPECT_EQ(bm.match_prefix(diverging, 100).n_tokens, 4);
  diverging[0] = 99;  // inside the first block: nothing after it can match
  EXPECT_EQ(bm.match_prefix(diverging, 100).n_tokens, 0);
  bm.free(a);
}

TEST(BlockManager, EqualBlockTokensAfterADifferentPrefixDoNotMatch) {
  BlockManager bm(8, kBs, true);
  // a caches [1 2 3 4][5 6 7 8]; b caches only its first block [9 9 9 9].
  BlockTable a = run_sequence(bm, {1, 2, 3, 4, 5, 6, 7, 8});
  const std::vector<int32_t> b_tokens = {9, 9, 9, 9, 5, 6, 7, 8};
  BlockTable b;
  bm.allocate(b, {}, 8);
  bm.commit(b, b_tokens, 4);
  // [5 6 7 8] is cached, but after [1 2 3 4]: after [9 9 9 9] it is another prefix.
  const PrefixMatch m = bm.match_prefix(b_tokens, 8);
  EXPECT_EQ(m.n_tokens, 4);
  ASSERT_EQ(m.blocks.size(), 1u);
  EXPECT_EQ(m.blocks[0], b.blocks[0]);
  // The same block content at another position does not match either.
  EXPECT_EQ(bm.match_prefix(std::vector<int32_t>{5, 6, 7, 8}, 4).n_tokens, 0);
  bm.free(a);
  bm.free(b);
}

TEST(BlockManager, SharedBlocksAreReferenceCounted) {
  BlockManager bm(6, kBs, true);
  const std::vector<int32_t> tokens = iota_tokens(10, 1);
  BlockTable a = run_sequence(bm, tokens);  // 3 blocks, 2 full and cached
  EXPECT_EQ(bm.n_used(), 3);

  const PrefixMatch m = bm.match_prefix(tokens, 9);
  ASSERT_EQ(m.n_tokens, 8);
  EXPECT_EQ(m.n_free, 0);
  BlockTable b;
  bm.allocate(b, m, 10);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);
  EXPECT_EQ(b.blocks[1], a.blocks[1]);
  EXPECT_NE(b.blocks[2], a.blocks[2]) << "the partial block is private";
  EXPECT_EQ(b.n_full_hashed, 2);
  EXPECT_EQ(bm.n_used(), 4) << "two shared blocks count once";

  bm.free(a);
  EXPECT_EQ(bm.n_used(), 3) << "only a's private block is free; b still holds the shared two";
  // Every free block handed out now: none of them is one b holds.
  BlockTable c;
  bm.allocate(c, {}, bm.n_free() * kBs);
  EXPECT_EQ(bm.n_free(), 0);
  for (int32_t x : c.blocks) EXPECT_EQ(std::count(b.blocks.begin(), b.blocks.end(), x), 0) << "block " << x;
  EXPECT_EQ(bm.evictions(), 0) << "the shared cached blocks were never free";
  EXPECT_EQ(bm.match_prefix(tokens, 9).n_tokens, 8) << "still cached while b holds them";

  bm.free(b);
  EXPECT_EQ(bm.n_free(), 3);
  bm.free(c);
  EXPECT_EQ(bm.n_free(), 6);
}

TEST(BlockManager, FreedCachedBlocksAreTakenBackByALaterMatch) {
  BlockManager bm(4, kBs, true);
  const std::vector<int32_t> tokens = iota_tokens(9, 20);
  BlockTable a = run_sequence(bm, tokens);
  const std::vector<int32_t> a_blocks = a.blocks;
  bm.free(a);
  EXPECT_EQ(bm.n_free(), 4) << "cached blocks nobody holds are free";

  const PrefixMatch m = bm.match_prefix(tokens, 8);
  ASSERT_EQ(m.n_tokens, 8);
  EXPECT_EQ(m.n_free, 2) << "both matched blocks sit in the free list";
  EXPECT_EQ(m.blocks[0], a_blocks[0]);
  EXPECT_EQ(m.blocks[1], a_blocks[1]);
  BlockTable b;
  bm.allocate(b, m, 12);
  EXPECT_EQ(bm.n_free(), 1) << "two taken back from the free list, one new";
  EXPECT_EQ(bm.evictions(), 0);
  EXPECT_EQ(b.blocks.size(), 3u);
  bm.free(b);
}

TEST(BlockManager, EvictsLeastRecentlyFreedFirstAndATailBeforeItsHead) {
  BlockManager bm(6, kBs, true);
  const std::vector<int32_t> a_tokens = iota_tokens(8, 100), b_tokens = iota_tokens(8, 200);
  BlockTable a = run_sequence(bm, a_tokens);
  BlockTable b = run_sequence(bm, b_tokens);
  BlockTable pin;  // holds the two never-used blocks, so the free list is a's and b's only
  bm.allocate(pin, {}, 8);
  EXPECT_EQ(bm.n_free(), 0);
  bm.free(a);  // freed first: evicted first, its tail (second block) before its head
  bm.free(b);
  bm.free(pin);  // uncached blocks freed last go to the back
  ASSERT_EQ(bm.n_free(), 6);
  EXPECT_EQ(bm.match_prefix(a_tokens, 8).n_tokens, 8);
  EXPECT_EQ(bm.match_prefix(b_tokens, 8).n_tokens, 8);

  BlockTable x;
  bm.allocate(x, {}, 4);
  EXPECT_EQ(bm.evictions(), 1);
  EXPECT_EQ(bm.match_prefix(a_tokens, 8).n_tokens, 4) << "a's tail went first";
  EXPECT_EQ(bm.match_prefix(b_tokens, 8).n_tokens, 8);
  bm.allocate(x, {}, 8);
  EXPECT_EQ(bm.evictions(), 2);
  EXPECT_EQ(bm.match_prefix(a_tokens, 8).n_tokens, 0) << "then a's head";
  EXPECT_EQ(bm.match_prefix(b_tokens, 8).n_tokens, 8) << "b was freed later: kept";
  bm.allocate(x, {}, 12);
  EXPECT_EQ(bm.evictions(), 3);
  EXPECT_EQ(bm.match_prefix(b_tokens, 8).n_tokens, 4) << "then b's tail";

  // A matched block taken again leaves the free list: b's head, held by y, survives while
  // every other free block is handed out.
  const PrefixMatch m = bm.match_prefix(b_tokens, 8);
  BlockTable y;
  bm.allocate(y, m, 4);
  bm.allocate(x, {}, x.blocks.size() * kBs + bm.n_free() * kBs);
  EXPECT_EQ(bm.n_free(), 0);
  EXPECT_EQ(bm.evictions(), 3) << "the only other cached block is held by y";
  bm.free(y);
  bm.free(x);
  EXPECT_EQ(bm.match_prefix(b_tokens, 8).n_tokens, 4);
}

TEST(BlockManager, PrefixCachingOffNeverMatches) {
  BlockManager bm(4, kBs, false);
  EXPECT_FALSE(bm.prefix_caching());
  const std::vector<int32_t> tokens = iota_tokens(12, 1);
  BlockTable a = run_sequence(bm, tokens);
  EXPECT_EQ(a.n_full_hashed, 0) << "commit registers nothing";
  const PrefixMatch m = bm.match_prefix(tokens, 12);
  EXPECT_EQ(m.n_tokens, 0);
  EXPECT_TRUE(m.blocks.empty());
  bm.free(a);
  EXPECT_EQ(bm.match_prefix(tokens, 12).n_tokens, 0);
  BlockTable b;
  bm.allocate(b, {}, 16);
  EXPECT_EQ(bm.evictions(), 0) << "nothing cached, nothing evicted";
  bm.free(b);
}

TEST(BlockManager, CommitRegistersOnlyBlocksFullWithinTheComputedTokens) {
  BlockManager bm(4, kBs, true);
  const std::vector<int32_t> tokens = iota_tokens(10, 50);
  BlockTable a;
  bm.allocate(a, {}, 10);
  bm.commit(a, tokens, 3);
  EXPECT_EQ(a.n_full_hashed, 0);
  EXPECT_EQ(bm.match_prefix(tokens, 10).n_tokens, 0) << "no block is computed in full";
  bm.commit(a, tokens, 7);
  EXPECT_EQ(a.n_full_hashed, 1);
  EXPECT_EQ(bm.match_prefix(tokens, 10).n_tokens, 4);
  bm.commit(a, tokens, 10);
  EXPECT_EQ(a.n_full_hashed, 2);
  EXPECT_EQ(bm.match_prefix(tokens, 10).n_tokens, 8) << "the third block holds 2 of 4 tokens";
  bm.commit(a, tokens, 10);  // again: idempotent
  EXPECT_EQ(a.n_full_hashed, 2);

  // The same blocks committed chunk by chunk hash as one chain: a sequence that computed
  // the prompt in one go matches them.
  BlockTable b;
  const PrefixMatch m = bm.match_prefix(tokens, 9);
  bm.allocate(b, m, 10);
  EXPECT_EQ(b.last_hash, a.last_hash);
  bm.free(a);
  bm.free(b);
}

TEST(BlockManager, CountsLookupsHitsAndEvictions) {
  BlockManager bm(2, kBs, true);
  EXPECT_EQ(bm.prefix_queried_tokens(), 0);
  bm.count_lookup(10, 4);
  bm.count_lookup(6, 0);
  EXPECT_EQ(bm.prefix_queried_tokens(), 16);
  EXPECT_EQ(bm.prefix_hit_tokens(), 4);
  EXPECT_EQ(bm.match_prefix(iota_tokens(8, 0), 8).n_tokens, 0);
  EXPECT_EQ(bm.prefix_queried_tokens(), 16) << "match_prefix itself counts nothing";

  BlockTable a = run_sequence(bm, iota_tokens(8, 0));
  bm.free(a);
  BlockTable b;
  bm.allocate(b, {}, 8);
  EXPECT_EQ(bm.evictions(), 2);
  bm.free(b);
  bm.allocate(b, {}, 8);
  EXPECT_EQ(bm.evictions(), 2) << "uncached blocks are not evictions";
  bm.free(b);
}

}  // namespace
}  // namespace kiln::runtime
