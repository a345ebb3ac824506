// The in-process communicator: every collective against the sum / copy it stands for,
// over 1..4 ranks on their own threads, in f32 and bf16; point-to-point order; and a
// failing rank releasing the others (CommAborted) instead of hanging them.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "comm/local_group.h"

namespace kiln {
namespace {

// Runs fn(rank) on `n` threads at once.
void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

// Distinct, non-zero values per (rank, index).
float value(int rank, int64_t i) { return float(rank + 1) * 0.5f + float(i % 7) * 0.125f - float(i) * 0.01f; }

Tensor filled(DType dtype, int64_t n, int rank) {
  Tensor t = host_tensor(dtype, {n});
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      t.as<float>()[i] = value(rank, i);
    } else {
      t.as<uint16_t>()[i] = f32_to_bf16(value(rank, i));
    }
  }
  return t;
}

float at(const Tensor& t, int64_t i) {
  return t.dtype == DType::kF32 ? t.as<float>()[i] : bf16_to_f32(t.as<uint16_t>()[i]);
}

class Collectives : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(Collectives, MatchTheirDefinitions) {
  const auto [n, dtype] = GetParam();
  const int64_t len = 6;  // elements per rank's chunk
  comm::LocalGroup group(n);
  on_ranks(n, [&, n = n, dtype = dtype](int r) {
    comm::Communicator& c = group.rank(r);
    ASSERT_EQ(c.rank(), r);
    ASSERT_EQ(c.size(), n);
    // all_reduce: the fp32 sum in rank order, rounded once to the dtype.
    Tensor t = filled(dtype, len * n, r);
    c.all_reduce(t);
    for (int64_t i = 0; i < len * n; ++i) {
      float want = 0.0f;
      for (int q = 0; q < n; ++q) want += at(filled(dtype, len * n, q), i);
      if (dtype == DType::kBF16) want = bf16_to_f32(f32_to_bf16(want));
      EXPECT_EQ(at(t, i), want) << "all_reduce rank " << r << " i " << i;
    }
    // all_gather: every rank's chunk in rank order.
    Tensor mine = filled(dtype, len, r), all = host_tensor(dtype, {len * n});
    c.all_gather(mine, all);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < len; ++i) EXPECT_EQ(at(all, q * len + i), at(filled(dtype, len, q), i));
    // reduce_scatter: this rank's chunk of the sum.
    Tensor in = filled(dtype, len * n, r), out = host_tensor(dtype, {len});
    c.reduce_scatter(in, out);
    for (int64_t i = 0; i < len; ++i) {
      float want = 0.0f;
      for (int q = 0; q < n; ++q) want += at(filled(dtype, len * n, q), r * len + i);
      if (dtype == DType::kBF16) want = bf16_to_f32(f32_to_bf16(want));
      EXPECT_EQ(at(out, i), want);
    }
    // all_to_all: chunk j of rank q lands as chunk q of rank j.
    Tensor send = filled(dtype, len * n, r), recv = host_tensor(dtype, {len * n});
    c.all_to_all(send, recv);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < len; ++i) EXPECT_EQ(at(recv, q * len + i), at(filled(dtype, len * n, q), r * len + i));
    // broadcast from the last rank.
    Tensor b = filled(dtype, len, r);
    c.broadcast(b, n - 1);
    for (int64_t i = 0; i < len; ++i) EXPECT_EQ(at(b, i), at(filled(dtype, len, n - 1), i));
    // send / recv around a ring, two messages each, arriving in order.
    if (n > 1) {
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      c.send(filled(dtype, len, r), next);
      c.send(filled(dtype, len, r + 10), next);
      Tensor m1 = host_tensor(dtype, {len}), m2 = host_tensor(dtype, {len});
      c.recv(m1, prev);
      c.recv(m2, prev);
      for (int64_t i = 0; i < len; ++i) {
        EXPECT_EQ(at(m1, i), at(filled(dtype, len, prev), i));
        EXPECT_EQ(at(m2, i), at(filled(dtype, len, prev + 10), i));
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "_ranks_" +
                                  (std::get<1>(info.param) == DType::kF32 ? "f32" : "bf16");
                         });

// Rank 0 dies before a collective: the others, waiting in it, and a sub-group sharing
// the failure state, get CommAborted naming the reason.
TEST(LocalGroup, AbortReleasesWaitingRanks) {
  comm::LocalGroup world(3);
  comm::LocalGroup sub(2, world.fail_state());
  std::vector<std::string> seen(3);
  on_ranks(3, [&](int r) {
    try {
      if (r == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        world.rank(0).abort("rank 0: out of memory");
        return;
      }
      Tensor t = filled(DType::kF32, 4, r);
      if (r == 1) world.rank(1).all_reduce(t);
      if (r == 2) sub.rank(1).recv(t, 0);  // a message that never comes
      seen[size_t(r)] = "returned";
    } catch (const comm::CommAborted& e) {
      seen[size_t(r)] = e.what();
    }
  });
  EXPECT_NE(seen[1].find("rank 0: out of memory"), std::string::npos) << seen[1];
  EXPECT_NE(seen[2].find("rank 0: out of memory"), std::string::npos) << seen[2];
  // A later collective fails at once.
  Tensor t = filled(DType::kF32, 4, 0);
  EXPECT_THROW(world.rank(0).all_reduce(t), comm::CommAborted);
}

}  // namespace
}  // namespace kiln
