#include "core/tensor.h"

#include <atomic>

#include <gtest/gtest.h>

#include "core/thread_pool.h"

namespace kiln {
namespace {

TEST(Tensor, SliceAndIndexAreViewsOfTheSameMemory) {
  Tensor t = host_tensor(DType::kF32, {4, 3});
  for (int i = 0; i < 12; ++i) t.as<float>()[i] = float(i);
  Tensor row2 = t.index0(2);
  EXPECT_EQ(row2.shape, Shape({3}));
  EXPECT_EQ(row2.as<float>()[0], 6.0f);
  Tensor rows = t.slice0(1, 3);
  EXPECT_EQ(rows.shape, Shape({2, 3}));
  EXPECT_EQ(rows.as<float>()[0], 3.0f);
  EXPECT_EQ(t.reshape({2, 6}).shape, Shape({2, 6}));
  EXPECT_EQ(t.nbytes(), 48u);
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1000);
  for (int rep = 0; rep < 20; ++rep) {
    pool.parallel_for(1000, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
  }
  for (auto& h : hits) EXPECT_EQ(h.load(), 20);
}

}  // namespace
}  // namespace kiln
