// Tensor-parallel steps as two micro-batches whose sums overlap the other's work
// (model::CausalLM::micro_batch_rows, Communicator::start_all_reduce), on the CPU: a
// tensor-parallel communicator that says overlap pays and holds every started sum back
// until it is finished, so a model that read or wrote a tensor between start and finish,
// or never finished a sum, computes something else. With micro-batches from 2 rows (a
// prompt's rows split mid-sequence; decode steps of two sequences, one a side) the logits
// and greedy tokens must be exactly those of whole steps, at TP2, TP2 with expert
// parallelism and TP2 x PP2, for GQA (Llama, Qwen3-MoE, GLM-4 MoE, gpt-oss with its
// sinks and sliding window) and MLA (DeepSeek-V3). On GPUs
// the same path runs with NCCL's sums on a stream of their own (tests/gpu).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <memory>

#include "ops/batch.h"
#include "wrapped_comms.h"

namespace kiln {
namespace {

TEST(SplitRows, SplitsTheSequenceOnTheCut) {
  // Sequence 0: a decode row at position 9; sequence 1: a 5-row chunk at positions 3..7
  // (keys 0..7 after the step); sequence 2: 2 rows at 0..1. Cut after row 3.
  ops::BatchMeta b;
  b.positions = {9, 3, 4, 5, 6, 7, 0, 1};
  b.slot_mapping = {109, 203, 204, 205, 206, 207, 300, 301};
  b.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  b.q_start = {0, 1, 6, 8};
  b.context_len = {10, 8, 2};
  b.max_blocks_per_seq = 2;
  b.block_size = 16;
  b.block_table = {6, 7, 12, 13, 18, 19};
  b.logit_rows = {0, 5, 7};
  const auto [a, c] = ops::split_rows(b, 3);
  EXPECT_EQ(a.positions, (std::vector<int32_t>{9, 3, 4}));
  EXPECT_EQ(a.slot_mapping, (std::vector<int32_t>{109, 203, 204}));
  EXPECT_EQ(a.q_start, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(a.context_len, (std::vector<int32_t>{10, 5}));  // keys 0..4 stored by then
  EXPECT_EQ(a.block_table, (std::vector<int32_t>{6, 7, 12, 13}));
  EXPECT_EQ(c.positions, (std::vector<int32_t>{5, 6, 7, 0, 1}));
  EXPECT_EQ(c.q_start, (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(c.context_len, (std::vector<int32_t>{8, 2}));
  EXPECT_EQ(c.block_table, (std::vector<int32_t>{12, 13, 18, 19}));
  for (const ops::BatchMeta* m : {&a, &c}) {
    EXPECT_EQ(m->max_blocks_per_seq, 2);
    EXPECT_EQ(m->block_size, 16);
    EXPECT_TRUE(m->token_ids.empty() && m->logit_rows.empty());
  }
  // A cut on a sequence boundary puts each sequence on one side only.
  const auto [d, e] = ops::split_rows(b, 6);
  EXPECT_EQ(d.context_len, (std::vector<int32_t>{10, 8}));
  EXPECT_EQ(e.context_len, (std::vector<int32_t>{2}));
  EXPECT_EQ(e.q_start, (std::vector<int32_t>{0, 2}));
}

struct SumLog {
  std::atomic<int64_t> started{0}, finished{0}, most_unfinished{0}, collectives_with_sums_out{0};
};

// Forwards to `inner`; holds each started sum back until it is finished.
class DeferringComm final : public comm::Communicator {
 public:
  DeferringComm(comm::Communicator* inner, SumLog* log) : inner_(inner), log_(log) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "deferring " + inner_->name(); }
  bool overlap_pays() const override { return true; }
  int start_all_reduce(Tensor& t) override {
    pending_.push_back(t);
    log_->started.fetch_add(1);
    const int64_t open = int64_t(pending_.size());
    for (int64_t m = log_->most_unfinished.load(); open > m && !log_->most_unfinished.compare_exchange_weak(m, open);) {
    }
    return next_++;
  }
  void finish_all_reduce(int ticket) override {
    EXPECT_LT(ticket, next_);
    while (done_ <= ticket) {
      EXPECT_FALSE(pending_.empty());
      inner_->all_reduce(pending_.front());
      pending_.pop_front();
      ++done_;
      log_->finished.fetch_add(1);
    }
  }
  void all_reduce(Tensor& t) override { outside(), inner_->all_reduce(t); }
  void all_gather(const Tensor& in, Tensor& out) override { outside(), inner_->all_gather(in, out); }
  void reduce_scatter(const Tensor& in, Tensor& out) override { outside(), inner_->reduce_scatter(in, out); }
  void all_to_all(const Tensor& in, Tensor& out) override { outside(), inner_->all_to_all(in, out); }
  void broadcast(Tensor& t, int root) override { outside(), inner_->broadcast(t, root); }
  void send(const Tensor& t, int peer) override { inner_->send(t, peer); }
  void recv(Tensor& t, int peer) override { inner_->recv(t, peer); }
  void abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  void outside() {
    if (!pending_.empty()) log_->collectives_with_sums_out.fetch_add(1);
  }
  comm::Communicator* inner_;
  SumLog* log_;
  std::deque<Tensor> pending_;
  int next_ = 0, done_ = 0;
};

// local_comm_world with every tensor-parallel communicator wrapped in a DeferringComm.
runtime::CommFactory deferring_world(std::shared_ptr<SumLog> log) {
  return testing::wrapped_tp_world([log](comm::Communicator* inner, ops::Backend*, int) {
    return std::make_unique<DeferringComm>(inner, log.get());
  });
}

class MicroBatches : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(MicroBatches, GiveWhatWholeStepsGive) {
  const std::string fixture = std::get<0>(GetParam());
  runtime::ParallelConfig whole = testing::kTpLayouts[std::get<1>(GetParam())].parallel;
  whole.micro_batch_rows = 0;
  runtime::ParallelConfig split = whole;
  split.micro_batch_rows = 2;
  auto log = std::make_shared<SumLog>();
  auto plain = testing::load_cpu_ranks(fixture, whole, {});
  auto micro = testing::load_cpu_ranks(fixture, split, deferring_world(log));
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  ASSERT_TRUE(micro.ok()) << micro.status().to_string();

  const nlohmann::json g = testing::read_json(testing::fixture_dir(fixture) + "/golden.json");
  const auto prompt = g["prompt_long"].get<std::vector<int32_t>>();
  ASSERT_GE(prompt.size(), 4u);
  auto want = (*plain)->logits(prompt);
  auto got = (*micro)->logits(prompt);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(*got, *want) << fixture << ": micro-batches changed the logits";
  const std::vector<std::vector<int32_t>> prompts = {prompt, g["prompt_short"].get<std::vector<int32_t>>()};
  auto want_tokens = (*plain)->generate_batch(prompts, 6, {.temperature = 0.0f}, /*ignore_eos=*/true);
  auto got_tokens = (*micro)->generate_batch(prompts, 6, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(want_tokens.ok() && got_tokens.ok());
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ((*got_tokens)[i].tokens, (*want_tokens)[i].tokens) << "prompt " << i;

  // Every block's sum went through start / finish, two micro-batches' at a time at most,
  // each finished, and no other collective ran while one was out.
  EXPECT_GT(log->started.load(), 0);
  EXPECT_EQ(log->finished.load(), log->started.load());
  EXPECT_EQ(log->most_unfinished.load(), 2);
  EXPECT_EQ(log->collectives_with_sums_out.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MicroBatches,
                         ::testing::Combine(::testing::Values("llama", "qwen3_moe", "glm4_moe", "gpt_oss"),
                                            ::testing::Range(0, testing::kTpLayoutCount)),
                         testing::TpLayoutName());
INSTANTIATE_TEST_SUITE_P(Mla, MicroBatches,
                         ::testing::Combine(::testing::Values("deepseek_v3_mla"),
                                            ::testing::Range(0, testing::kTp2LayoutCount)),
                         testing::TpLayoutName());

// Where micro-batches apply by default: the config's own value, else KILN_MICRO_BATCH_ROWS,
// else 1,024 rows where the group's sums cross the host's bus, else none.
TEST(MicroBatches, RowsResolveFromTheConfigTheEnvironmentAndTheGroup) {
  ::unsetenv("KILN_MICRO_BATCH_ROWS");
  EXPECT_EQ(runtime::resolve_micro_batch_rows({}, true), 1024);
  EXPECT_EQ(runtime::resolve_micro_batch_rows({}, false), 0);
  EXPECT_EQ(runtime::resolve_micro_batch_rows({.micro_batch_rows = 0}, true), 0);
  EXPECT_EQ(runtime::resolve_micro_batch_rows({.micro_batch_rows = 64}, false), 64);
  ::setenv("KILN_MICRO_BATCH_ROWS", "0", 1);
  EXPECT_EQ(runtime::resolve_micro_batch_rows({}, true), 0);
  ::setenv("KILN_MICRO_BATCH_ROWS", "2048", 1);
  EXPECT_EQ(runtime::resolve_micro_batch_rows({}, false), 2048);
  EXPECT_EQ(runtime::resolve_micro_batch_rows({.micro_batch_rows = 0}, true), 0);
  ::unsetenv("KILN_MICRO_BATCH_ROWS");
}

// Layers that keep a step whole: a started sum never happens (Qwen3-Next: Gated DeltaNet).
TEST(MicroBatches, RecurrentLayersKeepTheStepWhole) {
  runtime::ParallelConfig p{.tensor_parallel = 2, .micro_batch_rows = 2};
  auto log = std::make_shared<SumLog>();
  auto micro = testing::load_cpu_ranks("qwen3_next", p, deferring_world(log));
  ASSERT_TRUE(micro.ok()) << micro.status().to_string();
  const nlohmann::json g = testing::read_json(testing::fixture_dir("qwen3_next") + "/golden.json");
  auto got = (*micro)->logits(g["prompt_long"].get<std::vector<int32_t>>());
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(log->started.load(), 0);
}

}  // namespace
}  // namespace kiln
