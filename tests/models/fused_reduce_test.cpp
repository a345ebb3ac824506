// The model's side of the fused sum + residual add + norm (Communicator::
// all_reduce_add_rms_norm, which NCCL's one-shot path takes on GPUs; the kernel's own
// tests are in tests/gpu/nccl_comm_test.cpp), on the CPU: a tensor-parallel communicator
// that says yes and does the same ops itself (its all_reduce, then the rank's backend
// rms_norm with the residual) is asked once after every attention block and every MLP
// block but a pipeline stage's last (whose output the stage hands on; TP2, TP2 with
// expert parallelism, TP2 x PP2), i.e. 2 x layers
// per forward pass on a last stage, one fewer before it; and the logits and greedy tokens
// are exactly those of the in-process communicator, which declines. (That equality holds
// the model to passing the fused call what it passes the two separate ops; the layer
// structure itself is checked against transformers by parallel_test.cpp.) A layer whose
// end stopped calling it (a wrong next norm, the final norm left out) fails the count.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "wrapped_comms.h"

namespace kiln {
namespace {

// Forwards everything to `inner`; fuses the layer's end with the rank's backend.
class FusingComm final : public comm::Communicator {
 public:
  FusingComm(comm::Communicator* inner, ops::Backend* backend, std::atomic<int64_t>* calls)
      : inner_(inner), backend_(backend), calls_(calls) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "fusing " + inner_->name(); }
  void all_reduce(Tensor& t) override { inner_->all_reduce(t); }
  bool all_reduce_add_rms_norm(Tensor& t, Tensor& residual, const Tensor& weight, Tensor& out, float eps) override {
    inner_->all_reduce(t);
    backend_->after_collective(t);
    backend_->rms_norm({.x = t, .weight = weight, .residual = residual, .out = out, .eps = eps});
    calls_->fetch_add(1);
    return true;
  }
  void all_gather(const Tensor& in, Tensor& out) override { inner_->all_gather(in, out); }
  void reduce_scatter(const Tensor& in, Tensor& out) override { inner_->reduce_scatter(in, out); }
  void all_to_all(const Tensor& in, Tensor& out) override { inner_->all_to_all(in, out); }
  void broadcast(Tensor& t, int root) override { inner_->broadcast(t, root); }
  void send(const Tensor& t, int peer) override { inner_->send(t, peer); }
  void recv(Tensor& t, int peer) override { inner_->recv(t, peer); }
  void abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  comm::Communicator* inner_;
  ops::Backend* backend_;
  std::atomic<int64_t>* calls_;
};

struct FusedCalls {
  std::atomic<int64_t> per_rank[8] = {};
};

// local_comm_world with every tensor-parallel communicator wrapped in a FusingComm.
runtime::CommFactory fusing_world(std::shared_ptr<FusedCalls> calls) {
  return testing::wrapped_tp_world([calls](comm::Communicator* inner, ops::Backend* backend, int r) {
    return std::make_unique<FusingComm>(inner, backend, &calls->per_rank[r]);
  });
}

class FusedReduce : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(FusedReduce, GivesWhatTheSeparateSumAndNormGive) {
  const std::string fixture = std::get<0>(GetParam());
  const runtime::ParallelConfig layout = testing::kTpLayouts[std::get<1>(GetParam())].parallel;
  const bool pipeline = layout.pipeline_parallel > 1;
  const nlohmann::json config = testing::read_json(testing::fixture_dir(fixture) + "/config.json");
  const int64_t layers = config["num_hidden_layers"].get<int64_t>();
  auto calls = std::make_shared<FusedCalls>();
  auto fused = testing::load_cpu_ranks(fixture, layout, fusing_world(calls));
  auto plain = testing::load_cpu_ranks(fixture, layout, {});
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  for (auto& n : calls->per_rank) n = 0;  // what loading ran (its measured step) aside

  const nlohmann::json g = testing::read_json(testing::fixture_dir(fixture) + "/golden.json");
  const auto prompt = g["prompt_long"].get<std::vector<int32_t>>();
  auto want = (*plain)->logits(prompt);
  auto got = (*fused)->logits(prompt);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(*got, *want) << fixture << ": the fused call changed the logits";
  // One forward pass: every block's sum is fused on every rank, but a first stage's last
  // MLP output (handed on whole to the next stage).
  for (int r = 0; r < layout.world(); ++r) {
    const int64_t stage_layers = pipeline ? layers * (r / 2 + 1) / 2 - layers * (r / 2) / 2 : layers;
    const int64_t expect = 2 * stage_layers - (pipeline && r / 2 == 0 ? 1 : 0);
    const int64_t n = calls->per_rank[r].load();
    EXPECT_TRUE(n > 0 && n % expect == 0) << "rank " << r << ": " << n << " fused calls, not a multiple of " << expect;
  }
  const std::vector<std::vector<int32_t>> prompts = {prompt, g["prompt_short"].get<std::vector<int32_t>>()};
  auto want_tokens = (*plain)->generate_batch(prompts, 6, {.temperature = 0.0f}, /*ignore_eos=*/true);
  auto got_tokens = (*fused)->generate_batch(prompts, 6, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(want_tokens.ok() && got_tokens.ok());
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ((*got_tokens)[i].tokens, (*want_tokens)[i].tokens) << "prompt " << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FusedReduce,
                         ::testing::Combine(::testing::Values("llama", "qwen3_moe"),
                                            ::testing::Range(0, testing::kTpLayoutCount)),
                         testing::TpLayoutName());
INSTANTIATE_TEST_SUITE_P(Mla, FusedReduce,
                         ::testing::Combine(::testing::Values("deepseek_v3_mla"),
                                            ::testing::Range(0, testing::kTp2LayoutCount)),
                         testing::TpLayoutName());

}  // namespace
}  // namespace kiln
