// The ranks' watchdog (runtime/model_runner.h, comm/progress.h) on CUDA ranks with NCCL
// (cli::cuda_comm_world, as kiln serve builds them): a rank that stalls while the other
// has issued the next collective makes the step fail within the timeout, with an error
// naming the stalled rank, instead of hanging on the GPU; the runner stays failed. Run
// for a decode-sized sum (the one-shot peer path where peers can reach each other) and a
// 16 MiB one (NCCL's own kernels). tests/runtime/watchdog_test.cpp holds the same on the
// in-process CPU group.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "backends/cuda/cuda_backend.h"
#include "cli/common.h"
#include "runtime/model_runner.h"

namespace kiln {
namespace {

#ifdef KILN_HAVE_NCCL

using Clock = std::chrono::steady_clock;

class NcclWatchdog : public ::testing::TestWithParam<int64_t> {};

TEST_P(NcclWatchdog, StalledRankFailsTheStepNamingItInsteadOfHanging) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "needs 2 GPUs";
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < 2; ++r) {
    auto b = cuda::make_cuda_backend({.device = r});
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    backends.push_back(std::move(b).value());
  }
  constexpr double kTimeout = 1.0;
  auto made = runtime::ModelRunner::create(std::move(backends), {.tensor_parallel = 2, .watchdog_seconds = kTimeout},
                                           cli::cuda_comm_world);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  runtime::ModelRunner& runner = **made;
  const int64_t n = GetParam();
  std::vector<Tensor> buf;
  for (int r = 0; r < 2; ++r) {
    ops::Backend& b = runner.backend(r);
    b.bind_thread();
    buf.push_back(b.alloc(DType::kF32, {n}));
    ASSERT_EQ(cudaMemset(buf.back().data, 0, size_t(buf.back().nbytes())), cudaSuccess);
    b.synchronize();
  }
  const auto t0 = Clock::now();
  const Status s = runner.run(
      [&](int r) {
        runner.tp_comm(r)->all_reduce(buf[size_t(r)]);  // both ranks: #1
        // Rank 1 stalls (a hung host thread) for 4 s before the second; rank 0 issues it
        // and then waits for its stream, as a decode step's sampling does.
        if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
        runner.tp_comm(r)->all_reduce(buf[size_t(r)]);
        runner.backend(r).synchronize();
      },
      /*watched_step=*/true);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%lld floats: failed after %.2f s: %s\n", (long long)n, waited, s.to_string().c_str());
  ASSERT_FALSE(s.ok()) << "the stalled step succeeded";
  EXPECT_NE(s.message().find("watchdog"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 1 made no progress"), std::string::npos) << s.message();
  // Rank 1 wakes after 4 s into an aborted world; the run ends then (or, had it stayed
  // stuck, within the runner's grace): never hung.
  EXPECT_LT(waited, 4.0 + runtime::ModelRunner::kStuckGrace.count() / 1000.0 + 5.0);
  const auto t1 = Clock::now();
  const Status again = runner.run([&](int r) { runner.tp_comm(r)->all_reduce(buf[size_t(r)]); });
  EXPECT_FALSE(again.ok()) << "a collective after the abort succeeded";
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t1).count(), 5.0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, NcclWatchdog, ::testing::Values(int64_t(256), int64_t(4) << 20),
                         [](const auto& info) { return info.param == 256 ? "decode_sized" : "nccl_16MiB"; });

#else

TEST(NcclWatchdog, NeedsNccl) { GTEST_SKIP() << "built without NCCL (KILN_HAVE_NCCL)"; }

#endif

}  // namespace
}  // namespace kiln
