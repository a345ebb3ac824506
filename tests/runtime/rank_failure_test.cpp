// A rank that dies mid-step (here: rank 1's backend throws in its MoE op) must stop
// the step on every rank with an error naming it, never hang the others in a collective:
// Engine throws EngineFailure; AsyncEngine ends the requests in flight, reports the
// failure and refuses new requests (kiln serve then exits with it).
#include <atomic>
#include <chrono>
#include <thread>

#include "delegating_backend.h"
#include "engine_test_util.h"
#include "runtime/async_engine.h"

namespace kiln::runtime {
namespace {

using namespace std::chrono_literals;

// The CPU reference, except that moe() throws once `fail` is set.
class FailingBackend final : public testing::DelegatingBackend {
 public:
  explicit FailingBackend(std::atomic<bool>& fail) : DelegatingBackend(cpu::make_cpu_backend(1)), fail_(fail) {}
  void moe(const ops::MoeArgs& a) override {
    if (fail_.load()) throw std::runtime_error("injected device fault");
    inner_->moe(a);
  }

 private:
  std::atomic<bool>& fail_;
};

std::unique_ptr<Engine> load_two_ranks(std::atomic<bool>& fail) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  backends.push_back(cpu::make_cpu_backend(1));
  backends.push_back(std::make_unique<FailingBackend>(fail));
  auto e = Engine::load(testing::fixture_dir("qwen3_moe"), std::move(backends),
                        {.max_model_len = 256, .parallel = {.tensor_parallel = 2}});
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(RankFailure, EngineStepFailsNamingTheRank) {
  std::atomic<bool> fail{false};
  auto engine = load_two_ranks(fail);
  ASSERT_TRUE(engine);
  ASSERT_TRUE(engine->logits({1, 2, 3}).ok());
  fail = true;
  try {
    (void)engine->logits({1, 2, 3, 4});
    FAIL() << "the step did not fail";
  } catch (const EngineFailure& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 failed: injected device fault"), std::string::npos) << e.what();
  }
}

TEST(RankFailure, AsyncEngineEndsRequestsAndRefusesNewOnes) {
  std::atomic<bool> fail{false};
  auto engine = load_two_ranks(fail);
  ASSERT_TRUE(engine);
  AsyncEngine async(std::move(engine));
  auto s = async.submit({.prompt = {1, 2, 3}, .max_tokens = 200, .ignore_eos = true});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::vector<StreamEvent> events;
  (*s)->next(events, 5s);  // at least one token: the ranks run
  ASSERT_FALSE(events.empty());
  fail = true;
  const auto deadline = Clock::now() + 10s;
  while (!(*s)->done() && Clock::now() < deadline) (*s)->next(events, 20ms);
  ASSERT_TRUE((*s)->done()) << "the request did not end after the rank failed";
  EXPECT_EQ(events.back().finish, FinishReason::kCancelled);
  EXPECT_NE(async.failure().find("rank 1 failed"), std::string::npos) << async.failure();
  auto again = async.submit({.prompt = {1, 2}, .max_tokens = 2});
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("the engine failed"), std::string::npos) << again.status().to_string();
}

}  // namespace
}  // namespace kiln::runtime
