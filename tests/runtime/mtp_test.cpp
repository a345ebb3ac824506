// Speculative decoding with MTP drafts (--speculative-method mtp, runtime/mtp_drafts.cpp)
// on the CPU reference: engines drafting with the checkpoint's multi-token prediction
// layer give exactly the tokens and logprobs of engines without drafts, under batching,
// chunked prefill, preemption, prefix caching and sampling. The fixtures' configs declare
// an MTP layer (num_nextn_predict_layers 1; added here for the DeepSeek sparse attention
// fixtures, whose MTP layer has an indexer of its own) that transformers does not save, so these
// engines load dummy weights (the same main-model weights with and without the layer:
// dummy tensors are seeded by name); the MTP layer's arithmetic against a reference is
// tested on the trained MTP demo model (models/mtp_demo_test.cpp).
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine_test_util.h"

namespace kiln::runtime {
namespace {

using test::Outputs;

// The fixture's config.json, with an MTP layer declared where transformers' config has
// none (the DSA fixtures: DeepSeek-V3.2 / GLM-5 checkpoints declare one).
std::string config_of(const std::string& fixture) {
  const std::string path = testing::fixture_dir(fixture) + "/config.json";
  nlohmann::json c = testing::read_json(path);
  if (c.value("num_nextn_predict_layers", 0) > 0) return path;
  c["num_nextn_predict_layers"] = 1;
  const std::string out = (std::filesystem::temp_directory_path() / ("kiln_mtp_" + fixture + ".json")).string();
  std::ofstream(out) << c.dump(1);
  return out;
}

EngineOptions with(EngineOptions o, SpeculativeMethod m, int32_t k, bool adaptive = false) {
  o.load_format = LoadFormat::kDummy;
  o.speculative_method = m;
  o.num_speculative_tokens = k;
  o.speculative_adaptive = adaptive;
  return o;
}

std::vector<Request> requests(int32_t n, float temperature) {
  std::vector<Request> out;
  for (int32_t i = 0; i < n; ++i) {
    SamplingParams p{.temperature = temperature, .seed = 7 + uint64_t(i), .logprobs = 2};
    if (i % 3 == 1) p.repetition_penalty = 1.3f;
    if (temperature > 0 && i % 2 == 0) p.top_k = 8;
    std::vector<int32_t> prompt = test::random_tokens(3 + i % 5, 100 + uint32_t(i));
    // Repeats, so the tiny random models loop and some drafts stand.
    for (int r = 0; r < 3; ++r) prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 3);
    out.push_back({.prompt = prompt, .sampling = p, .max_tokens = 12 + i % 7, .ignore_eos = i % 2 == 0});
  }
  return out;
}

void expect_same(const Outputs& got, const Outputs& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, w] : want) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << what << ": request " << key.first << " missing";
    EXPECT_EQ(it->second, w) << what << ": request " << key.first;
  }
}

class MtpFixture : public ::testing::TestWithParam<std::string> {};

// Greedy and sampled requests joining a running batch (prefill chunks beside drafted
// decodes), at a fixed depth of 3 and at an adaptive depth: the outputs of decoding
// without drafts; MTP drafts were made; every block is free at the end.
TEST_P(MtpFixture, OutputsEqualThoseWithoutDraftsUnderBatching) {
  const EngineOptions base{.block_size = 4, .max_model_len = 96, .prefill_chunk = 8, .max_num_seqs = 16,
                           .max_num_batched_tokens = 48};
  auto plain = test::load_engine(config_of(GetParam()), with(base, SpeculativeMethod::kOff, 0));
  ASSERT_TRUE(plain);
  for (float temperature : {0.0f, 0.7f}) {
    const std::vector<Request> rs = requests(10, temperature);
    const Outputs want = test::run_together(*plain, rs);
    for (bool adaptive : {false, true}) {
      auto mtp = test::load_engine(config_of(GetParam()), with(base, SpeculativeMethod::kMtp, 3, adaptive));
      ASSERT_TRUE(mtp);
      Outputs got;
      for (size_t i = 0; i < rs.size(); ++i) {  // a step after every second request joins
        ASSERT_TRUE(mtp->add_request(i, std::make_shared<const Request>(rs[i])).ok());
        if (i % 2 == 1) test::collect(got, mtp->step());
      }
      test::run_until_idle(*mtp, got);
      const std::string what = GetParam() + " T=" + std::to_string(temperature) + (adaptive ? " adaptive" : " fixed");
      expect_same(got, want, what);
      const EngineStats s = mtp->stats();
      EXPECT_GT(s.spec_draft_tokens, 0) << what;
      EXPECT_EQ(s.kv_blocks_used, 0) << what;
      std::printf("[ mtp      ] %s: %lld of %lld drafts accepted\n", what.c_str(), (long long)s.spec_accepted_tokens,
                  (long long)s.spec_draft_tokens);
    }
  }
}

// A cache too small for the batch: sequences are preempted and recomputed (the MTP
// layer's cache with them), with prefix caching on and off; then a second turn that takes
// the first turn's blocks from the prefix cache. Outputs as without drafts.
TEST_P(MtpFixture, OutputsEqualUnderPreemptionAndPrefixCaching) {
  const std::vector<Request> rs = requests(8, 0.0f);
  auto big = test::load_engine(config_of(GetParam()), with({.block_size = 4, .max_model_len = 64}, SpeculativeMethod::kOff, 0));
  ASSERT_TRUE(big);
  const Outputs want = test::run_together(*big, rs);
  // Bytes per token with the MTP layer's cache (the second turn's engine below).
  auto mtp = test::load_engine(config_of(GetParam()), with({.block_size = 4, .max_model_len = 96}, SpeculativeMethod::kMtp, 3));
  ASSERT_TRUE(mtp);
  const int64_t bytes_token = mtp->kv_cache_bytes() / mtp->kv_capacity_tokens();
  for (bool caching : {true, false}) {
    auto small = test::load_engine(config_of(GetParam()),
                                   with({.block_size = 4, .max_model_len = 48, .max_num_seqs = 16,
                                         .enable_prefix_caching = caching, .kv_cache_bytes = bytes_token * 48},
                                        SpeculativeMethod::kMtp, 2));
    ASSERT_TRUE(small);
    expect_same(test::run_together(*small, rs), want, GetParam() + (caching ? " caching" : " no caching"));
    EXPECT_GT(small->stats().preemptions, 0);
    EXPECT_GT(small->stats().spec_draft_tokens, 0);
    EXPECT_EQ(small->stats().kv_blocks_used, 0);
  }
  // Second turns over the first turns' cached blocks.
  const Outputs turn1 = test::run_together(*mtp, rs);
  expect_same(turn1, want, GetParam() + " turn 1");
  std::vector<Request> second;
  for (size_t i = 0; i < rs.size(); ++i) {
    Request r = rs[i];
    const std::vector<int32_t>& answer = turn1.at({i, 0}).tokens;
    r.prompt.insert(r.prompt.end(), answer.begin(), answer.end());
    r.max_tokens = 6;
    second.push_back(r);
  }
  const int64_t hits = mtp->stats().prefix_hit_tokens;
  const Outputs turn2 = test::run_together(*mtp, second, 100);
  EXPECT_GT(mtp->stats().prefix_hit_tokens, hits);
  expect_same(turn2, test::run_together(*big, second, 100), GetParam() + " turn 2");
  EXPECT_EQ(mtp->stats().kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpFixture,
                         ::testing::Values("glm4_moe", "deepseek_v3", "deepseek_v3_mla", "deepseek_v32", "glm_moe_dsa"),
                         [](const auto& info) { return info.param; });

TEST(Mtp, ModelsWithoutAnMtpLayerAreRefusedAtLoad) {
  auto r = Engine::load(testing::fixture_dir("qwen3_moe"), cpu::make_cpu_backend(1),
                        with({.block_size = 4, .max_model_len = 64}, SpeculativeMethod::kMtp, 2));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("multi-token prediction"), std::string::npos) << r.status().to_string();
  // A checkpoint that declares the layer but does not hold it names the missing tensor.
  EngineOptions real = with({.block_size = 4, .max_model_len = 64}, SpeculativeMethod::kMtp, 2);
  real.load_format = LoadFormat::kAuto;
  auto g = Engine::load(testing::fixture_dir("glm4_moe"), cpu::make_cpu_backend(1), real);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().to_string().find("model.layers.3."), std::string::npos) << g.status().to_string();
}

}  // namespace
}  // namespace kiln::runtime
