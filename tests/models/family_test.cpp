// Every model family against transformers: logits and greedy tokens of the
// fixtures made by scripts/fixtures/make_fixtures.py (fp32 reference on the
// exact saved weights).
//
// Tolerance: the acceptance bound max|a-b|/max|ref| < 1e-4. Both sides compute
// in fp32 from identical weights; the difference comes from summation order
// and transcendental functions, ~1e-6 relative here, so 1e-4 leaves room for
// larger reductions without hiding a wrong formula (a wrong rope, scale or
// routing shows up as 1e-2 or more).
#include <algorithm>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

constexpr double kLogitTolerance = 1e-4;

class Family : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<runtime::Engine> load(int32_t prefill_chunk, int32_t block_size = 16) {
    auto e = runtime::Engine::load(testing::fixture_dir(GetParam()), cpu::make_cpu_backend(2),
                                   {.block_size = block_size, .max_model_len = 256,
                                    .prefill_chunk = prefill_chunk});
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  nlohmann::json golden() { return testing::read_json(testing::fixture_dir(GetParam()) + "/golden.json"); }
};

TEST_P(Family, LogitsMatchTransformers) {
  auto engine = load(0);
  ASSERT_TRUE(engine);
  const nlohmann::json g = golden();
  for (const std::string which : {"short", "long"}) {
    const auto prompt = g["prompt_" + which].get<std::vector<int32_t>>();
    const auto ref = testing::golden_logits(GetParam(), which);
    ASSERT_EQ(ref.size(), prompt.size());
    auto got = engine->logits(prompt);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const double err = testing::relative_error(*got, ref);
    EXPECT_LT(err, kLogitTolerance) << GetParam() << " " << which;
    RecordProperty("max_rel_err_" + which, std::to_string(err));
  }
}

// Chunked prefill with small blocks: later chunks read earlier tokens through
// the block table (the decode path), with blocks of 4 scattered by the allocator.
TEST_P(Family, ChunkedPrefillThroughPagedCacheMatches) {
  auto engine = load(5, 4);
  ASSERT_TRUE(engine);
  const nlohmann::json g = golden();
  const auto prompt = g["prompt_long"].get<std::vector<int32_t>>();
  auto got = engine->logits(prompt);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_LT(testing::relative_error(*got, testing::golden_logits(GetParam(), "long")), kLogitTolerance);
}

TEST_P(Family, GreedyTokensMatchTransformers) {
  auto engine = load(0);
  ASSERT_TRUE(engine);
  const nlohmann::json g = golden();
  for (const std::string which : {"short", "long"}) {
    const auto prompt = g["prompt_" + which].get<std::vector<int32_t>>();
    const auto expected = g["greedy_" + which].get<std::vector<int32_t>>();
    // The goldens continue past end-of-sequence ids (transformers greedy without stopping).
    auto got = engine->generate(prompt, int32_t(expected.size()), {.temperature = 0.0f}, /*ignore_eos=*/true);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(got->tokens, expected) << GetParam() << " " << which;
  }
}

// DeepSeek sparse attention (index_topk 8): the 80-token prompt is ten times the top-k, so
// most rows attend to a small selection of their context; whole, and in chunks of 7 over
// blocks of 4 (the indexer reads earlier chunks' keys through the block table).
class Dsa : public Family {};

TEST_P(Dsa, XlongLogitsMatchTransformers) {
  const auto prompt = golden()["prompt_xlong"].get<std::vector<int32_t>>();
  const auto ref = testing::golden_logits(GetParam(), "xlong");
  ASSERT_EQ(ref.size(), prompt.size());
  for (const auto& [chunk, block] : {std::pair{0, 16}, std::pair{7, 4}}) {
    auto engine = load(chunk, block);
    ASSERT_TRUE(engine);
    auto got = engine->logits(prompt);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const double err = testing::relative_error(*got, ref);
    EXPECT_LT(err, kLogitTolerance) << GetParam() << " chunk " << chunk << " block " << block;
    RecordProperty("max_rel_err_xlong_chunk" + std::to_string(chunk), std::to_string(err));
  }
}

// Decoding past the top-k: 12 greedy tokens after the 80-token prompt equal the argmax of
// the whole sequence's logits recomputed in one prefill (the decode rows select from the
// cache exactly as prefill rows do).
TEST_P(Dsa, XlongDecodeEqualsPrefill) {
  auto engine = load(0);
  ASSERT_TRUE(engine);
  const auto prompt = golden()["prompt_xlong"].get<std::vector<int32_t>>();
  auto gen = engine->generate(prompt, 12, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(gen.ok()) << gen.status().to_string();
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), gen->tokens.begin(), gen->tokens.end());
  auto logits = engine->logits(all);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  for (size_t k = 0; k < gen->tokens.size(); ++k) {
    const auto& row = (*logits)[prompt.size() - 1 + k];
    EXPECT_EQ(gen->tokens[k], int32_t(std::max_element(row.begin(), row.end()) - row.begin())) << "token " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Dsa, ::testing::Values("deepseek_v32", "glm_moe_dsa"),
                         [](const auto& info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Fixtures, Family, ::testing::ValuesIn(testing::all_fixtures()),
                         [](const auto& info) { return info.param; });

// Quantized checkpoints in their shipped layouts (FP8 block / channel, NVFP4, INT4,
// MXFP4) against transformers run in fp32 on the dequantized weights: the same
// bound, since kiln dequantizes exactly the same values (formats/quant.h).
INSTANTIATE_TEST_SUITE_P(Quantized, Family, ::testing::ValuesIn(testing::quant_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
