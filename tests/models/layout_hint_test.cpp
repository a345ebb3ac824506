// The note `kiln serve` prints where a tensor / pipeline-parallel layout runs over GPUs
// without peer access and one GPU holds the model (cli/common.h, data_parallel_hint): as a
// pure function of the layout, the peer-access verdict and the sizes.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "cli/common.h"

namespace kiln::cli {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;
const std::string kNoP2P = "GPU 0 has no peer access to GPU 1";

TEST(DataParallelHint, SuggestsReplicasWhereSumsCrossHostMemoryAndOneGpuHoldsTheModel) {
  const std::string hint = data_parallel_hint(2, 1, 1, kNoP2P, 20 * kGiB, 80 * kGiB);
  EXPECT_NE(hint.find("kiln: note: GPU 0 has no peer access to GPU 1"), std::string::npos) << hint;
  EXPECT_NE(hint.find("--data-parallel-size 2 "), std::string::npos) << hint;
  EXPECT_NE(hint.find("(20.0 GiB)"), std::string::npos) << hint;
  EXPECT_NE(hint.find("(80.0 GiB)"), std::string::npos) << hint;
  // As many replicas as the layout has ranks: pipeline and tensor parallelism alike.
  EXPECT_NE(data_parallel_hint(1, 2, 1, kNoP2P, 20 * kGiB, 80 * kGiB).find("--data-parallel-size 2 "),
            std::string::npos);
  EXPECT_NE(data_parallel_hint(2, 2, 1, kNoP2P, 20 * kGiB, 80 * kGiB).find("--data-parallel-size 4 "),
            std::string::npos);
}

TEST(DataParallelHint, SaysNothingWhereItDoesNotApply) {
  EXPECT_EQ(data_parallel_hint(2, 1, 1, "", 20 * kGiB, 80 * kGiB), "");          // peer access: TP's sums are fast
  EXPECT_EQ(data_parallel_hint(1, 1, 1, kNoP2P, 20 * kGiB, 80 * kGiB), "");      // one rank: no sums
  EXPECT_EQ(data_parallel_hint(2, 1, 2, kNoP2P, 20 * kGiB, 80 * kGiB), "");      // replicas asked for already
  EXPECT_EQ(data_parallel_hint(2, 1, 1, kNoP2P, 49 * kGiB, 80 * kGiB), "");      // over 60%: little room for a KV cache
  EXPECT_NE(data_parallel_hint(2, 1, 1, kNoP2P, 48 * kGiB, 80 * kGiB), "");      // at 60%: it fits
  EXPECT_EQ(data_parallel_hint(2, 1, 1, kNoP2P, 0, 80 * kGiB), "");              // sizes unknown (the CPU backend)
  EXPECT_EQ(data_parallel_hint(2, 1, 1, kNoP2P, 20 * kGiB, 0), "");
}

}  // namespace
}  // namespace kiln::cli
