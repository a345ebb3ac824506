// --load-format dummy: a model from config.json alone, its weights made on the backend by
// fill_random; the same seed gives the same model every time; --num-layers cuts depth;
// the shipped configs/ parse with the published dimensions.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "ops/random.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

using runtime::LoadFormat;

std::unique_ptr<runtime::Engine> dummy(const std::string& config, int64_t num_layers = 0) {
  auto e = runtime::Engine::load(config, cpu::make_cpu_backend(2),
                                 {.max_model_len = 64, .max_num_seqs = 2, .load_format = LoadFormat::kDummy,
                                  .num_layers = num_layers});
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

class DummyLoad : public ::testing::TestWithParam<std::string> {};

TEST_P(DummyLoad, GivesTheSameFiniteModelEveryTimeAndNotTheCheckpoints) {
  const std::string dir = testing::fixture_dir(GetParam());
  auto a = dummy(dir), b = dummy(dir + "/config.json");  // a directory or the config file
  ASSERT_TRUE(a && b);
  const std::vector<int32_t> prompt = {5, 17, 100, 42, 7, 9};
  auto la = a->logits(prompt), lb = b->logits(prompt);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb) << "seeded by tensor name: the same weights on every load";
  std::set<float> distinct;
  for (const auto& row : *la)
    for (float x : row) {
      ASSERT_TRUE(std::isfinite(x));
      distinct.insert(x);
    }
  EXPECT_GT(distinct.size(), la->size() * 10) << "logits that say something";
  auto real = runtime::Engine::load(dir, cpu::make_cpu_backend(2), {.max_model_len = 64, .max_num_seqs = 2});
  ASSERT_TRUE(real.ok());
  auto lr = (*real)->logits(prompt);
  ASSERT_TRUE(lr.ok());
  EXPECT_NE(*la, *lr) << "not the checkpoint's weights";
  auto g = a->generate(prompt, 8, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->tokens.size(), 8u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DummyLoad, ::testing::Values("llama", "qwen3_moe", "glm4_moe", "deepseek_v3", "gpt_oss",
                                                                 "minimax_m2"),
                         [](const auto& info) { return info.param; });

TEST(DummyLoad, NumLayersCutsDepth) {
  auto e = dummy(testing::fixture_dir("qwen3_moe"), 1);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->config().n_layers, 1);
  EXPECT_TRUE(e->logits({1, 2, 3}).ok());
  // A cut works on a real checkpoint too: the later layers' tensors go unused.
  auto real = runtime::Engine::load(testing::fixture_dir("gpt_oss"), cpu::make_cpu_backend(1),
                                    {.max_model_len = 64, .max_num_seqs = 1, .num_layers = 2});
  ASSERT_TRUE(real.ok()) << real.status().to_string();
  EXPECT_EQ((*real)->config().n_layers, 2);
  // A hybrid cut before its first full-attention layer keeps no KV cache at all (it once
  // divided by its zero bytes per token); its logits are those of the whole checkpoint's
  // first layers, so they differ from the uncut model's.
  for (const std::string fixture : {"qwen3_next", "qwen3_5_moe"}) {
    auto cut = runtime::Engine::load(testing::fixture_dir(fixture), cpu::make_cpu_backend(1),
                                     {.max_model_len = 64, .max_num_seqs = 2, .num_layers = 1});
    ASSERT_TRUE(cut.ok()) << fixture << ": " << cut.status().to_string();
    auto whole = runtime::Engine::load(testing::fixture_dir(fixture), cpu::make_cpu_backend(1),
                                       {.max_model_len = 64, .max_num_seqs = 2});
    ASSERT_TRUE(whole.ok());
    auto lc = (*cut)->logits({1, 2, 3, 4, 5}), lw = (*whole)->logits({1, 2, 3, 4, 5});
    ASSERT_TRUE(lc.ok() && lw.ok()) << fixture;
    for (float x : lc->back()) ASSERT_TRUE(std::isfinite(x)) << fixture;
    EXPECT_NE(*lc, *lw) << fixture;
    auto g = (*cut)->generate({1, 2, 3}, 6, {.temperature = 0.0f}, /*ignore_eos=*/true);
    ASSERT_TRUE(g.ok()) << fixture << ": " << g.status().to_string();
    EXPECT_EQ(g->tokens.size(), 6u) << fixture;
  }
}

TEST(DummyLoad, FillRandomIsTheSharedFormulaWithTheAskedMoments) {
  auto be = cpu::make_cpu_backend(2);
  Tensor t = be->alloc(DType::kF32, {100000});
  be->fill_random({.out = t, .seed = 7, .mean = 0.5f, .stddev = 2.0f});
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = t.as<float>()[i];
    ASSERT_EQ(x, 0.5f + 2.0f * ops::unit_normal(7, uint64_t(i))) << i;
    sum += x;
    sq += (double(x) - 0.5) * (double(x) - 0.5);
  }
  EXPECT_NEAR(sum / double(t.numel()), 0.5, 0.02);
  EXPECT_NEAR(std::sqrt(sq / double(t.numel())), 2.0, 0.02);
}

TEST(ShippedConfigs, ParseWithThePublishedDimensions) {
  struct Want {
    const char* file;
    const char* architecture;
    int64_t d_model, n_layers, n_experts, vocab;
  } wants[] = {
      {"gpt-oss-20b", "GptOssForCausalLM", 2880, 24, 32, 201088},
      {"gpt-oss-120b", "GptOssForCausalLM", 2880, 36, 128, 201088},
      {"Qwen3-30B-A3B", "Qwen3MoeForCausalLM", 2048, 48, 128, 151936},
      {"GLM-4.5-Air", "Glm4MoeForCausalLM", 4096, 46, 128, 151552},
      {"DeepSeek-V3-5L", "DeepseekV3ForCausalLM", 7168, 5, 256, 129280},
      {"MiniMax-M2", "MiniMaxM2ForCausalLM", 3072, 62, 256, 200064},
      {"Qwen3-Next-80B-A3B", "Qwen3NextForCausalLM", 2048, 48, 512, 151936},
      {"Qwen3-Next-80B-A3B-FP8", "Qwen3NextForCausalLM", 2048, 48, 512, 151936},
      {"Qwen3.5-35B-A3B", "Qwen3_5MoeForConditionalGeneration", 2048, 40, 256, 248320},
      {"GLM-5", "GlmMoeDsaForCausalLM", 6144, 78, 256, 154880},
      {"DeepSeek-V3.2", "DeepseekV32ForCausalLM", 7168, 61, 256, 129280},
      {"GLM-5-FP8", "GlmMoeDsaForCausalLM", 6144, 78, 256, 154880},
      {"DeepSeek-V3.2-FP8", "DeepseekV32ForCausalLM", 7168, 61, 256, 129280},
      {"Qwen3.5-397B-A17B", "Qwen3_5MoeForConditionalGeneration", 4096, 60, 512, 248320},
  };
  for (const Want& w : wants) {
    const std::string path = std::string(KILN_SOURCE_DIR) + "/configs/" + w.file + ".json";
    const std::string text = testing::read_text_file(path);
    auto c = formats::parse_config(text, path);
    ASSERT_TRUE(c.ok()) << w.file << ": " << c.status().to_string();
    EXPECT_EQ(c->architecture, w.architecture) << w.file;
    EXPECT_EQ(c->d_model, w.d_model) << w.file;
    EXPECT_EQ(c->n_layers, w.n_layers) << w.file;
    EXPECT_EQ(c->n_experts, w.n_experts) << w.file;
    EXPECT_EQ(c->vocab_size, w.vocab) << w.file;
  }
}

}  // namespace
}  // namespace kiln
