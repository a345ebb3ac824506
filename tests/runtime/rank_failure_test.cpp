// A rank that dies mid-step (here: rank 1's backend throws in its MoE op) must stop
// the step on every rank with an error naming it, never hang the others in a collective:
// Engine throws EngineFailure; AsyncEngine ends the requests in flight, reports the
// failure and refuses new requests (kiln serve then exits with it).
#include <atomic>
#include <chrono>
#include <thread>

#include "engine_test_util.h"
#include "runtime/async_engine.h"

namespace kiln::runtime {
namespace {

using namespace std::chrono_literals;

// The CPU reference, except that moe() throws once `fail` is set.
class FailingBackend final : public ops::Backend {
 public:
  explicit FailingBackend(std::atomic<bool>& fail) : inner_(cpu::make_cpu_backend(1)), fail_(fail) {}
  std::string name() const override { return "failing-cpu"; }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  Tensor alloc(DType d, Shape s) override { return inner_->alloc(d, s); }
  Tensor upload(const Tensor& t) override { return inner_->upload(t); }
  void to_host_f32(const Tensor& t, float* out) override { inner_->to_host_f32(t, out); }
  void from_host_f32(const float* src, Tensor& t) override { inner_->from_host_f32(src, t); }
  Result<formats::QuantizedTensor> upload_quantized(const formats::QuantizedTensor& q) override {
    return inner_->upload_quantized(q);
  }
  Status supports_kv_cache(DType d) const override { return inner_->supports_kv_cache(d); }
  void embedding(const ops::EmbeddingArgs& a) override { inner_->embedding(a); }
  void rms_norm(const ops::RmsNormArgs& a) override { inner_->rms_norm(a); }
  void linear(const ops::LinearArgs& a) override { inner_->linear(a); }
  void rope(const ops::RopeArgs& a) override { inner_->rope(a); }
  void kv_store(const ops::KvStoreArgs& a) override { inner_->kv_store(a); }
  void attention(const ops::AttentionArgs& a) override { inner_->attention(a); }
  void mla_store(const ops::MlaStoreArgs& a) override { inner_->mla_store(a); }
  void mla_attention(const ops::MlaArgs& a) override { inner_->mla_attention(a); }
  void glu(const ops::GluArgs& a) override { inner_->glu(a); }
  void add(const ops::AddArgs& a) override { inner_->add(a); }
  void slice_columns(const ops::SliceColumnsArgs& a) override { inner_->slice_columns(a); }
  void moe(const ops::MoeArgs& a) override {
    if (fail_.load()) throw std::runtime_error("injected device fault");
    inner_->moe(a);
  }
  void sample(const ops::SampleArgs& a) override { inner_->sample(a); }
  void fill_random(const ops::FillRandomArgs& a) override { inner_->fill_random(a); }

 private:
  std::unique_ptr<ops::Backend> inner_;
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
