// ReplicaRouter: a prompt goes back to the replica that served most of it before, within
// the load gap; otherwise to the least busy replica, equal ones in turn; what it remembers
// is bounded.
#include "server/replica_router.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace kiln::server {
namespace {

std::vector<int32_t> tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> extended(std::vector<int32_t> t, int more, int32_t first) {
  for (int i = 0; i < more; ++i) t.push_back(first + i);
  return t;
}

TEST(ReplicaRouter, AConversationsNextTurnGoesWhereItsPrefixIsWithinTheLoadGap) {
  ReplicaRouter router(2, /*slack=*/4, /*block_tokens=*/16);
  const std::vector<int32_t> turn1 = tokens(64, 1000);  // 4 blocks
  const std::vector<int32_t> idle = {0, 0};
  const int r = router.pick(turn1, idle);
  const int other = 1 - r;
  // The next turn (turn 1 and 36 tokens more: its 4 remembered blocks are over half of it)
  // goes back, though that replica is busier, as long as it is within the gap.
  const std::vector<int32_t> turn2 = extended(turn1, 36, 5000);
  std::vector<int32_t> open = {0, 0};
  open[size_t(r)] = 4;
  EXPECT_EQ(router.pick(turn2, open), r);
  // Beyond the gap the least busy takes it, and its blocks are that one's from then on.
  open[size_t(r)] = 5;
  EXPECT_EQ(router.pick(turn2, open), other);
  EXPECT_EQ(router.pick(extended(turn2, 20, 9000), idle), other);
}

TEST(ReplicaRouter, APromptWithLittleRememberedGoesToTheLeastBusyInTurn) {
  ReplicaRouter router(3, /*slack=*/100, /*block_tokens=*/16);
  const std::vector<int32_t> system = tokens(32, 1);  // 2 blocks every prompt below shares
  router.pick(system, std::vector<int32_t>{0, 0, 0});
  // 2 shared blocks of 6: under half, so no preference: in turn while equal...
  std::vector<int> seen(3, 0);
  for (int i = 0; i < 6; ++i) ++seen[size_t(router.pick(extended(system, 64, 100 * (i + 1)), std::vector<int32_t>{0, 0, 0}))];
  EXPECT_EQ(seen, (std::vector<int>{2, 2, 2}));
  // ... and the least busy otherwise; prompts shorter than a block likewise.
  EXPECT_EQ(router.pick(extended(system, 64, 7777), std::vector<int32_t>{3, 1, 2}), 1);
  EXPECT_EQ(router.pick(tokens(10, 1), std::vector<int32_t>{3, 2, 1}), 2);
}

TEST(ReplicaRouter, WithoutPrefixesToFollowGoesByLoadAlone) {
  ReplicaRouter router(2, /*slack=*/-1, /*block_tokens=*/16);
  const std::vector<int32_t> turn1 = tokens(64, 1000);
  const int r = router.pick(turn1, std::vector<int32_t>{0, 0});
  EXPECT_EQ(router.pick(extended(turn1, 16, 5000), std::vector<int32_t>{0, 0}), 1 - r) << "in turn, not back";
  EXPECT_EQ(router.remembered_blocks(), 0u);
}

TEST(ReplicaRouter, RemembersAtMostItsBoundLeastRecentlyUsedFirst) {
  ReplicaRouter router(2, /*slack=*/100, /*block_tokens=*/16, /*max_blocks=*/8);
  const std::vector<int32_t> a = tokens(64, 1), b = tokens(64, 1000), c = tokens(64, 2000);  // 4 blocks each
  const int ra = router.pick(a, std::vector<int32_t>{0, 0});
  router.pick(b, std::vector<int32_t>{0, 0});
  EXPECT_EQ(router.remembered_blocks(), 8u);
  router.pick(c, std::vector<int32_t>{0, 0});  // a's blocks go
  EXPECT_EQ(router.remembered_blocks(), 8u);
  // a is forgotten: its replica no longer counts, the least busy takes it.
  std::vector<int32_t> open = {0, 0};
  open[size_t(ra)] = 1;
  EXPECT_EQ(router.pick(a, open), 1 - ra);
}

}  // namespace
}  // namespace kiln::server
