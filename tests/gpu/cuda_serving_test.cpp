// The serving engine on the CUDA backend: the KV cache sized from the GPU's free memory,
// and a continuous batch of 64 requests (prefill chunks and decodes mixed in one step,
// decode-only steps replayed from CUDA graphs at bucketed sizes, sampling on the GPU)
// giving every request the greedy tokens it gets alone.
#include <algorithm>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "backends/cuda/cuda_backend_impl.h"
#include "gpu_test_util.h"
#include "models/fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

using gpu_testing::smem_cap;

TEST(CudaServing, KvCacheIsSizedFromFreeMemory) {
  auto be = cuda::make_cuda_backend({.smem_cap = smem_cap()});
  if (!be.ok()) GTEST_SKIP() << be.status().to_string();
  const int64_t before = (*be)->memory_info()->available;
  auto e = runtime::Engine::load(testing::fixture_dir("qwen3_moe_d128"), std::move(be).value(),
                                 {.max_model_len = 4096, .max_num_seqs = 64, .gpu_memory_utilization = 0.5f});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const int64_t kv = (*e)->kv_cache_bytes();
  // Half of what was free after the weights and the activation peak: a little under half
  // of what was free before loading (the fixture's weights and activations are small).
  EXPECT_GT(kv, int64_t(0.45 * double(before)));
  EXPECT_LE(kv, int64_t(0.5 * double(before)));
  EXPECT_GE((*e)->kv_capacity_tokens(), 64 * 4096);
  std::printf("KV cache %.1f GiB = %lld tokens, of %.1f GiB available\n", double(kv) / (1 << 30),
              (long long)(*e)->kv_capacity_tokens(), double(before) / (1 << 30));
}

class CudaServingBatch : public ::testing::TestWithParam<std::string> {};

// Steps until every request finished, collecting each request's tokens.
void drain(runtime::Engine& e, std::map<uint64_t, std::vector<int32_t>>& tokens) {
  while (!e.idle())
    for (runtime::StepOutput& o : e.step()) tokens[o.request_id].push_back(o.token.token);
}

TEST_P(CudaServingBatch, SixtyFourRequestsEqualEachAlone) {
  auto be = cuda::make_cuda_backend({.smem_cap = smem_cap()});
  if (!be.ok()) GTEST_SKIP() << be.status().to_string();
  const std::string dir = testing::fixture_dir(GetParam());
  // Prefix caching off: "alone" recomputes every prompt, as the batch did. A small token
  // budget makes long prompts prefill in chunks beside other sequences' decodes.
  auto loaded = runtime::Engine::load(dir, std::move(be).value(),
                                      {.max_model_len = 512, .max_num_seqs = 64, .max_num_batched_tokens = 256,
                                       .enable_prefix_caching = false, .kv_cache_bytes = int64_t(256) << 20});
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  runtime::Engine& engine = **loaded;
  const int64_t vocab = engine.config().vocab_size;
  std::mt19937 rng(99);
  std::vector<std::shared_ptr<runtime::Request>> requests;
  for (int i = 0; i < 64; ++i) {
    auto r = std::make_shared<runtime::Request>();
    const int n = 1 + int(rng() % 120);
    for (int t = 0; t < n; ++t) r->prompt.push_back(int32_t(rng() % uint32_t(vocab)));
    r->max_tokens = 12 + i % 9;
    r->ignore_eos = true;
    requests.push_back(r);
  }
  std::map<uint64_t, std::vector<int32_t>> together, alone;
  for (size_t i = 0; i < requests.size(); ++i) ASSERT_TRUE(engine.add_request(i, requests[i]).ok());
  drain(engine, together);
  const auto* cuda = dynamic_cast<const cuda::CudaBackend*>(&engine.backend());
  ASSERT_NE(cuda, nullptr);
  EXPECT_GT(cuda->graph_replays(), 5) << "decode steps did not replay recorded graphs";
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(engine.add_request(1000 + i, requests[i]).ok());
    drain(engine, alone);
  }
  int equal = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(together[i], alone[1000 + i]) << GetParam() << " request " << i << " (prompt of "
                                            << requests[i]->prompt.size() << " tokens)";
    equal += together[i] == alone[1000 + i];
  }
  std::printf("%s: %d of 64 batched requests equal alone; %lld graph replays\n", GetParam().c_str(), equal,
              (long long)cuda->graph_replays());
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaServingBatch,
                         ::testing::Values("llama", "qwen3_moe_d128", "gpt_oss_d64", "deepseek_v3_mla"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
