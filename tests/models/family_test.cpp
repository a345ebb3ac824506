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
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "formats/hf_config.h"
#include "models/registry.h"
#include "runtime/engine.h"
#include "temp_dir.h"

namespace kiln {
namespace {

constexpr double kLogitTolerance = 1e-4;

class Family : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<runtime::Engine> load(int32_t prefill_chunk, int32_t block_size = 16) {
    auto e = runtime::Engine::load(testing::fixture_dir(GetParam()), cpu::make_cpu_backend({.n_threads = 2}),
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
  // The 2026 fixtures add an 80-token prompt (xlong); the older ones stop at long.
  for (const std::string which : {"short", "long", "xlong"}) {
    if (!g.contains("prompt_" + which)) continue;
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
// most rows attend to a small selection of their context.
class Dsa : public Family {
 protected:
  std::vector<int32_t> prompt(const std::string& which) { return golden()["prompt_" + which].get<std::vector<int32_t>>(); }
};

// The whole 80-token prompt in one step, with blocks of 16 and of 4 (the indexer reads
// its keys through the block table), ties as torch breaks them.
TEST_P(Dsa, XlongLogitsMatchTransformers) {
  const auto ref = testing::golden_logits(GetParam(), "xlong");
  ASSERT_EQ(ref.size(), prompt("xlong").size());
  for (int32_t block : {16, 4}) {
    auto engine = load(0, block);
    ASSERT_TRUE(engine);
    auto got = engine->logits(prompt("xlong"));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const double err = testing::relative_error(*got, ref);
    EXPECT_LT(err, kLogitTolerance) << GetParam() << " block " << block;
    RecordProperty("max_rel_err_xlong_block" + std::to_string(block), std::to_string(err));
  }
}

// transformers' greedy golden, as it was made: the whole sequence recomputed per token.
TEST_P(Dsa, GreedyByRecomputeMatchesTransformers) {
  auto engine = load(0);
  ASSERT_TRUE(engine);
  for (const std::string which : {"short", "long"}) {
    std::vector<int32_t> seq = prompt(which), got;
    const auto expected = golden()["greedy_" + which].get<std::vector<int32_t>>();
    while (got.size() < expected.size()) {
      auto logits = engine->logits(seq);
      ASSERT_TRUE(logits.ok()) << logits.status().to_string();
      const auto& last = logits->back();
      got.push_back(int32_t(std::max_element(last.begin(), last.end()) - last.begin()));
      seq.push_back(got.back());
    }
    EXPECT_EQ(got, expected) << GetParam() << " " << which;
  }
}

// With the engine's own tie rule a row's selection depends on its scores alone: chunks of
// 5 or 7 over blocks of 4 give the whole prefill's logits.
TEST_P(Dsa, ChunkedPrefillEqualsWholePrefill) {
  auto whole = load(0, 16);
  ASSERT_TRUE(whole);
  for (const std::string which : {"long", "xlong"}) {
    auto want = whole->logits(prompt(which));
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    for (int32_t chunk : {5, 7}) {
      auto engine = load(chunk, 4);
      ASSERT_TRUE(engine);
      auto got = engine->logits(prompt(which));
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_LT(testing::relative_error(*got, *want), 1e-6) << GetParam() << " " << which << " chunk " << chunk;
    }
  }
}

// Decoding past the top-k: 12 greedy tokens after the 80-token prompt equal the argmax of
// the whole sequence's logits recomputed in one prefill (the decode rows select from the
// cache exactly as prefill rows do).
TEST_P(Dsa, DecodeEqualsPrefill) {
  auto engine = load(0, 16);
  ASSERT_TRUE(engine);
  for (const std::string which : {"long", "xlong"}) {
    auto gen = engine->generate(prompt(which), 12, {.temperature = 0.0f}, /*ignore_eos=*/true);
    ASSERT_TRUE(gen.ok()) << gen.status().to_string();
    std::vector<int32_t> all = prompt(which);
    all.insert(all.end(), gen->tokens.begin(), gen->tokens.end());
    auto logits = engine->logits(all);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    for (size_t k = 0; k < gen->tokens.size(); ++k) {
      const auto& row = (*logits)[prompt(which).size() - 1 + k];
      EXPECT_EQ(gen->tokens[k], int32_t(std::max_element(row.begin(), row.end()) - row.begin()))
          << which << " token " << k;
    }
  }
}

// GLM-5's "shared" indexer layers (indexer_types) reuse the top-k of the layer before:
// the glm_moe_dsa fixture with layer 1 shared loads without that layer's indexer (nor its
// index cache), keeps the dense rows (positions < top-k: every position is selected
// either way) and changes the sparse ones, and still prefills the same in chunks.
TEST(DsaShared, GlmSharedLayerReusesThePreviousSelection) {
  testing::TempDir dir("kiln_dsa_shared");
  const std::string src = testing::fixture_dir("glm_moe_dsa");
  nlohmann::json cfg = testing::read_json(src + "/config.json");
  cfg["indexer_types"] = {"full", "shared", "full"};
  std::ofstream(dir.file("config.json")) << cfg.dump(2);
  std::filesystem::create_symlink(src + "/model.safetensors", dir.file("model.safetensors"));

  auto config = formats::load_config(dir.path());
  auto ckpt = formats::Checkpoint::open(dir.path());
  ASSERT_TRUE(config.ok() && ckpt.ok());
  auto be = cpu::make_cpu_backend(1);
  model::WeightLoader loader(*ckpt, *be);
  auto lm = models::build_model(*config, loader);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  const auto layouts = lm->kv_layouts();
  EXPECT_EQ(layouts[0].d_index, 32);
  EXPECT_EQ(layouts[1].d_index, 0) << "a shared layer keeps no indexer keys";
  EXPECT_EQ(layouts[2].d_index, 32);
  EXPECT_NE(std::find(loader.unused().begin(), loader.unused().end(), "model.layers.1.self_attn.indexer.wk.weight"),
            loader.unused().end());

  const auto prompt = testing::read_json(src + "/golden.json")["prompt_xlong"].get<std::vector<int32_t>>();
  const auto engine = [](const std::string& d, int32_t chunk) {
    auto e = runtime::Engine::load(d, cpu::make_cpu_backend(2),
                                   {.block_size = 4, .max_model_len = 256, .prefill_chunk = chunk});
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  };
  auto shared = engine(dir.path(), 0), chunked = engine(dir.path(), 7), full = engine(src, 0);
  ASSERT_TRUE(shared && chunked && full);
  auto a = shared->logits(prompt), b = chunked->logits(prompt), c = full->logits(prompt);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_LT(testing::relative_error(*b, *a), 1e-6);
  const std::vector<std::vector<float>> dense_a(a->begin(), a->begin() + 8), dense_c(c->begin(), c->begin() + 8);
  EXPECT_EQ(dense_a, dense_c);
  EXPECT_GT(testing::relative_error(*a, *c), 1e-3) << "layer 1's own indexer or layer 0's: the same logits";
}

// KILN_DSA=dense (the benchmark baseline of scripts/gpu-2026-bench): no indexer, MLA over
// every position. While a context holds at most index_topk tokens the sparse model selects
// every position too, so the dense model's logits are the goldens' there (the short prompt,
// and the first top_k rows of xlong); past top_k they differ from the sparse model's, but
// stay finite, and decoding reads the whole cache as prefill does.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST_P(Dsa, DenseBaselineEqualsSparseWithinTopK) {
  const std::string dir = testing::fixture_dir(GetParam());
  const int64_t top_k = testing::read_json(dir + "/config.json")["index_topk"].get<int64_t>();
  auto sparse = load(0, 16);
  ASSERT_TRUE(sparse);
  std::unique_ptr<runtime::Engine> dense;
  {
    ScopedEnv env("KILN_DSA", "dense");
    dense = load(0, 16);
    // No indexer, so no index cache; the indexer's tensors are left unused.
    auto config = formats::load_config(dir);
    auto ckpt = formats::Checkpoint::open(dir);
    ASSERT_TRUE(config.ok() && ckpt.ok());
    auto be = cpu::make_cpu_backend(1);
    model::WeightLoader loader(*ckpt, *be);
    auto lm = models::build_model(*config, loader);
    ASSERT_TRUE(lm.ok()) << lm.status().to_string();
    for (const auto& l : lm->kv_layouts()) EXPECT_EQ(l.d_index, 0);
    EXPECT_NE(std::find(loader.unused().begin(), loader.unused().end(), "model.layers.0.self_attn.indexer.wk.weight"),
              loader.unused().end());
  }
  ASSERT_TRUE(dense);
  ASSERT_LE(int64_t(prompt("short").size()), top_k);
  auto d_short = dense->logits(prompt("short"));
  ASSERT_TRUE(d_short.ok()) << d_short.status().to_string();
  EXPECT_LT(testing::relative_error(*d_short, testing::golden_logits(GetParam(), "short")), kLogitTolerance);

  const auto xlong = prompt("xlong");
  ASSERT_GT(int64_t(xlong.size()), top_k);
  auto d = dense->logits(xlong), s = sparse->logits(xlong);
  ASSERT_TRUE(d.ok() && s.ok());
  for (const auto& row : *d)
    for (float v : row) ASSERT_TRUE(std::isfinite(v));
  const std::vector<std::vector<float>> d_head(d->begin(), d->begin() + top_k), s_head(s->begin(), s->begin() + top_k);
  EXPECT_LT(testing::relative_error(d_head, s_head), 1e-6) << "rows whose context is at most top_k";
  const std::vector<std::vector<float>> d_tail(d->begin() + top_k, d->end()), s_tail(s->begin() + top_k, s->end());
  EXPECT_GT(testing::relative_error(d_tail, s_tail), 1e-3) << "past top_k the dense baseline attends to more";

  // Decode past top_k on the dense model equals its own prefill's argmax.
  auto gen = dense->generate(xlong, 6, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(gen.ok()) << gen.status().to_string();
  std::vector<int32_t> all = xlong;
  all.insert(all.end(), gen->tokens.begin(), gen->tokens.end());
  auto logits = dense->logits(all);
  ASSERT_TRUE(logits.ok());
  for (size_t k = 0; k < gen->tokens.size(); ++k) {
    const auto& row = (*logits)[xlong.size() - 1 + k];
    EXPECT_EQ(gen->tokens[k], int32_t(std::max_element(row.begin(), row.end()) - row.begin())) << "token " << k;
  }
}

TEST(DsaDense, UnknownKilnDsaValueIsRefused) {
  ScopedEnv env("KILN_DSA", "off");
  auto e = runtime::Engine::load(testing::fixture_dir("deepseek_v32"), cpu::make_cpu_backend(1),
                                 {.block_size = 16, .max_model_len = 256});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().to_string().find("KILN_DSA=off"), std::string::npos) << e.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Dsa, ::testing::Values("deepseek_v32", "glm_moe_dsa"),
                         [](const auto& info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Fixtures, Family, ::testing::ValuesIn(testing::all_fixtures()),
                         [](const auto& info) { return info.param; });

// The 2026 families: also the 80-token prompt (longer than a Gated DeltaNet chunk of 64
// and ten times the DSA fixtures' top-k), in one pass and in chunks of 7 over blocks of 4.
class Family2026 : public Family {};

TEST_P(Family2026, LongerPromptMatchesTransformers) {
  const nlohmann::json g = golden();
  const auto prompt = g["prompt_xlong"].get<std::vector<int32_t>>();
  const auto ref = testing::golden_logits(GetParam(), "xlong");
  ASSERT_EQ(ref.size(), prompt.size());
  for (const auto& [chunk, block] : {std::pair{0, 16}, std::pair{7, 4}}) {
    auto engine = load(chunk, block);
    ASSERT_TRUE(engine);
    auto got = engine->logits(prompt);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_LT(testing::relative_error(*got, ref), kLogitTolerance) << GetParam() << " chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Hybrid, Family, ::testing::ValuesIn(testing::hybrid_fixtures()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Hybrid, Family2026, ::testing::ValuesIn(testing::hybrid_fixtures()),
                         [](const auto& info) { return info.param; });

// Quantized checkpoints in their shipped layouts (FP8 block / channel, NVFP4, INT4,
// MXFP4) against transformers run in fp32 on the dequantized weights: the same
// bound, since kiln dequantizes exactly the same values (formats/quant.h).
INSTANTIATE_TEST_SUITE_P(Quantized, Family, ::testing::ValuesIn(testing::quant_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
