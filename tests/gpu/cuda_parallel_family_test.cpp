// Every family fixture, bf16 and quantized, split over several GPUs (NCCL) against the
// same fixture on one GPU: TP2, TP2 with expert parallelism, PP2 (and TP2 x PP2, TP4
// where 4 GPUs are visible), with a bf16 and an e4m3 KV cache. Prefill logits within
// cuda_family_test's bound (2e-2 x max|logit|: the ranks change bf16 roundings, the
// split GEMMs' sums and NCCL's bf16 all-reduce, not the math), and greedy decoding of
// a continuous batch (decode steps replayed as CUDA graphs) the same tokens as one GPU,
// or diverging only at a near-tie of the one-GPU logits. Each load has a time limit:
// a layout that hangs fails here instead of stalling the suite (the ranks' watchdog).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>

#include <gtest/gtest.h>

#include "backends/cuda/cuda_backend.h"
#include "cli/common.h"
#include "gpu/gpu_test_util.h"
#include "models/fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

constexpr double kTol = 2e-2;
constexpr double kNearTie = 5e-2;  // cuda_family_test's margin for a greedy divergence

struct Layout {
  const char* name;
  runtime::ParallelConfig parallel;
  bool fp8_kv = false;
};

const Layout kLayouts[] = {
    {"tp2", {.tensor_parallel = 2}},
    {"tp2_ep", {.tensor_parallel = 2, .expert_parallel = true}},
    {"pp2", {.pipeline_parallel = 2}},
    {"tp2_fp8kv", {.tensor_parallel = 2}, true},
    {"pp2_fp8kv", {.pipeline_parallel = 2}, true},
    {"tp2_pp2", {.tensor_parallel = 2, .pipeline_parallel = 2}},
    {"tp4", {.tensor_parallel = 4}},
    {"tp4_ep", {.tensor_parallel = 4, .expert_parallel = true}},
};

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

Result<std::unique_ptr<runtime::Engine>> load(const std::string& dir, const Layout& l) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < l.parallel.world(); ++r) {
    KILN_ASSIGN_OR_RETURN(auto be, cuda::make_cuda_backend({.device = r, .smem_cap = gpu_testing::smem_cap()}));
    backends.push_back(std::move(be));
  }
  runtime::EngineOptions opt{.block_size = 16,
                             .max_model_len = 256,
                             .max_num_seqs = 8,
                             .kv_cache_bytes = int64_t(64) << 20,
                             .kv_cache_dtype = l.fp8_kv ? runtime::KvCacheDtype::kFp8 : runtime::KvCacheDtype::kBf16};
  opt.parallel = l.parallel;
  opt.parallel.watchdog_seconds = 60;
#ifdef KILN_HAVE_NCCL
  opt.comms = cli::cuda_comm_world;
#endif
  return runtime::Engine::load(dir, std::move(backends), opt);
}


class CudaParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CudaParallel, SameLogitsAndTokensAsOneGpu) {
#ifndef KILN_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#endif
  const std::string fixture = std::get<0>(GetParam());
  const Layout& layout = kLayouts[std::get<1>(GetParam())];
  if (visible_gpus() < layout.parallel.world()) {
    GTEST_SKIP() << layout.name << " needs " << layout.parallel.world() << " GPUs, " << visible_gpus() << " visible";
  }
  const std::string dir = testing::fixture_dir(fixture);
  const nlohmann::json config = testing::read_json(dir + "/config.json");
  const int64_t heads = config["num_attention_heads"].get<int64_t>();
  const auto t0 = std::chrono::steady_clock::now();
  auto many = load(dir, layout);
  if (heads % layout.parallel.tensor_parallel != 0) {
    ASSERT_FALSE(many.ok()) << fixture << " loaded " << heads << " heads over " << layout.name;
    return;
  }
  ASSERT_TRUE(many.ok()) << many.status().to_string();
  Layout single = layout;
  single.parallel = {};
  auto one = load(dir, single);
  ASSERT_TRUE(one.ok()) << one.status().to_string();

  const nlohmann::json g = testing::read_json(dir + "/golden.json");
  const auto prompt = g["prompt_long"].get<std::vector<int32_t>>();
  auto want = (*one)->logits(prompt);
  auto have = (*many)->logits(prompt);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  ASSERT_TRUE(have.ok()) << have.status().to_string();
  const double err = testing::relative_error(*have, *want);
  EXPECT_LT(err, kTol) << fixture << " " << layout.name;

  const std::vector<std::vector<int32_t>> prompts = {
      prompt, g["prompt_short"].get<std::vector<int32_t>>(),
      std::vector<int32_t>(prompt.begin(), prompt.begin() + long(prompt.size() / 2))};
  auto a = (*one)->generate_batch(prompts, 8, {.temperature = 0.0f}, /*ignore_eos=*/true);
  auto b = (*many)->generate_batch(prompts, 8, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& got = (*b)[i].tokens;
    const auto& ref = (*a)[i].tokens;
    if (got == ref) continue;
    const gpu_testing::Divergence d = gpu_testing::first_divergence(**one, prompts[i], got, ref);
    EXPECT_LT(d.margin, kNearTie) << fixture << " " << layout.name << " prompt " << i << ": greedy diverged at step "
                                  << d.at << " with a top-2 margin of " << d.top2_gap;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s %s: max rel err %.3g vs one GPU, %.1f s\n", fixture.c_str(), layout.name, err, secs);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParallel,
                         ::testing::Combine(::testing::ValuesIn(testing::every_fixture()),
                                            ::testing::Range(0, int(std::size(kLayouts)))),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + kLayouts[std::get<1>(info.param)].name;
                         });

}  // namespace
}  // namespace kiln
