// The ranks' watchdog (runtime/model_runner.h, comm/progress.h) on the in-process
// group: a rank that stalls while another waits in a collective makes the step fail
// within the timeout with an error naming the stalled rank and the operation, instead
// of hanging; a rank that never comes back leaves the runner failed, not hung; ranks
// that are slow but keep moving are left alone.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "runtime/model_runner.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<runtime::ModelRunner> make_runner(double timeout_s) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < 2; ++r) backends.push_back(cpu::make_cpu_backend(1));
  auto runner = runtime::ModelRunner::create(std::move(backends),
                                             {.tensor_parallel = 2, .watchdog_seconds = timeout_s}, nullptr);
  KILN_CHECK(runner.ok()) << runner.status().to_string();
  return std::move(runner).value();
}

// A gate the stalled rank waits at until the test opens it (or `limit` passes).
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void wait(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait_for(lock, limit, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(m);
      open = true;
    }
    cv.notify_all();
  }
};

TEST(Watchdog, StalledRankFailsTheStepNamingRankAndOperation) {
  auto runner = make_runner(0.3);
  const auto t0 = Clock::now();
  const Status s = runner->run(
      [&](int r) {
        Tensor t = host_tensor(DType::kF32, {4});
        for (int i = 0; i < 4; ++i) t.as<float>()[i] = 1.0f;
        runner->tp_comm(r)->all_reduce(t);  // both ranks: #1
        // Rank 1 stalls before the second for 2 s, then finds the world aborted.
        if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
        runner->tp_comm(r)->all_reduce(t);
      },
      /*watched_step=*/true);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  const std::string& m = s.message();
  EXPECT_NE(m.find("watchdog: rank 1 made no progress"), std::string::npos) << m;
  EXPECT_NE(m.find("past all_reduce #1"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 0 waiting in all_reduce #2"), std::string::npos) << m;
  EXPECT_LT(waited, 5.0) << m;
  // The world stays failed: the next step fails at once with the same reason.
  const Status again = runner->run([&](int r) {
    Tensor t = host_tensor(DType::kF32, {1});
    runner->tp_comm(r)->all_reduce(t);
  });
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.message().find("watchdog"), std::string::npos) << again.message();
}

TEST(Watchdog, RankThatNeverReturnsLeavesTheRunnerFailedNotHung) {
  auto runner = make_runner(0.2);
  Gate gate;
  const auto t0 = Clock::now();
  const Status s = runner->run(
      [&](int r) {
        if (r == 1) {
          gate.wait(std::chrono::seconds(60));  // stuck outside any collective
          return;
        }
        Tensor t = host_tensor(DType::kF32, {1});
        runner->tp_comm(r)->all_reduce(t);
      },
      /*watched_step=*/true);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1 made no progress"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("did not return"), std::string::npos) << s.message();
  EXPECT_LT(waited, 0.2 + runtime::ModelRunner::kStuckGrace.count() / 1000.0 + 3.0);
  const Status again = runner->run([](int) {});
  EXPECT_FALSE(again.ok());
  gate.release();
}

TEST(Watchdog, SlowRanksThatKeepMovingAreLeftAlone) {
  auto runner = make_runner(0.3);
  const Status s = runner->run(
      [&](int r) {
        for (int i = 0; i < 12; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(r == 1 ? 100 : 10));  // 1.2 s in all
          Tensor t = host_tensor(DType::kF32, {1});
          t.as<float>()[0] = float(r);
          runner->tp_comm(r)->all_reduce(t);
          ASSERT_EQ(t.as<float>()[0], 1.0f);
        }
      },
      /*watched_step=*/true);
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace kiln
