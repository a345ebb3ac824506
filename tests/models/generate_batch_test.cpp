// Engine::generate_batch on the CPU reference: every row of a step is computed on
// its own, so a batch must give exactly what separate generate calls give, whatever
// the batch size (padding rows included), the prompt lengths and the sampling.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

TEST(DecodeBucket, PowersOfTwoThenMultiplesOfEight) {
  const std::pair<int32_t, int32_t> cases[] = {{1, 1}, {2, 2}, {3, 4}, {5, 8}, {8, 8}, {9, 16}, {17, 24}, {64, 64}};
  for (auto [n, want] : cases) EXPECT_EQ(runtime::decode_bucket(n), want) << n;
}

class GenerateBatch : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerateBatch, EqualsSeparateGenerations) {
  auto e = runtime::Engine::load(testing::fixture_dir(GetParam()), cpu::make_cpu_backend(2),
                                 {.block_size = 4, .max_model_len = 96});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  runtime::Engine& engine = **e;
  // 5 prompts: a 5-row decode step padded to 8, sequences crossing 4-token blocks
  // at different steps, one prompt of a single token.
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 1, 4, 1, 5}, {9, 2, 6}, {5, 3, 5, 8, 9, 7, 9, 3, 2}, {8}, {4, 6, 2, 6, 4, 3}};
  for (const runtime::SamplingParams& sp :
       {runtime::SamplingParams{.logprobs = 2},
        runtime::SamplingParams{.temperature = 1.1f, .top_k = 40, .top_p = 0.9f, .seed = 11, .logprobs = 2}}) {
    auto batch = engine.generate_batch(prompts, 10, sp, /*ignore_eos=*/true);
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    ASSERT_EQ(batch->size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto one = engine.generate(prompts[i], 10, sp, /*ignore_eos=*/true);
      ASSERT_TRUE(one.ok());
      EXPECT_EQ((*batch)[i].tokens, one->tokens) << "prompt " << i << " temperature " << sp.temperature;
      ASSERT_EQ((*batch)[i].logprobs.size(), one->logprobs.size());
      for (size_t t = 0; t < one->logprobs.size(); ++t)
        EXPECT_EQ((*batch)[i].logprobs[t].logprob, one->logprobs[t].logprob) << "prompt " << i << " token " << t;
    }
  }
  // Blocks are returned: the cache takes the same batch again.
  EXPECT_TRUE(engine.generate_batch(prompts, 10, {}, true).ok());
}

TEST_P(GenerateBatch, BadPromptsAreAClearErrorAndStopsAreIndependent) {
  auto e = runtime::Engine::load(testing::fixture_dir(GetParam()), cpu::make_cpu_backend(1), {.max_model_len = 64});
  ASSERT_TRUE(e.ok());
  auto bad = (*e)->generate_batch({{1, 2}, {}}, 4, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE((*e)->generate_batch({}, 4, {}).ok());
  // Without ignore_eos a sequence may stop early; the others go on to max tokens.
  auto r = (*e)->generate_batch({{1, 2, 3}, {7, 7}}, 6, {});
  ASSERT_TRUE(r.ok());
  for (const auto& g : *r) EXPECT_TRUE(g.stopped_by_eos || g.tokens.size() == 6u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateBatch, ::testing::Values("llama", "qwen3_moe", "deepseek_v3", "gpt_oss"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
