// Speculative decoding with MTP drafts (--speculative-method mtp, runtime/mtp_drafts.cpp)
// on the CPU reference: engines drafting with the checkpoint's multi-token prediction
// layer give exactly the tokens and logprobs of engines without drafts, under batching,
// chunked prefill, preemption, prefix caching and sampling. The fixtures' configs declare
// an MTP layer (num_nextn_predict_layers 1; added here for the DeepSeek sparse attention
// fixtures, whose MTP layer has an indexer of its own, and as mtp_num_hidden_layers for the
// Gated DeltaNet hybrids, whose verify steps also restore their recurrent state) that
// transformers does not save, so these
// engines load dummy weights (the same main-model weights with and without the layer:
// dummy tensors are seeded by name); the MTP layer's arithmetic against a reference is
// tested on the trained MTP demo model (models/mtp_demo_test.cpp).
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "engine_test_util.h"
#include "formats/safetensors.h"

namespace kiln::runtime {
namespace {

using test::Outputs;

// The fixture's config.json, with an MTP layer declared where transformers' config has
// none (the DSA fixtures: DeepSeek-V3.2 / GLM-5 checkpoints declare one).
std::string config_of(const std::string& fixture) {
  const std::string path = testing::fixture_dir(fixture) + "/config.json";
  nlohmann::json c = testing::read_json(path);
  if (c.value("num_nextn_predict_layers", 0) > 0) return path;
  // Qwen3-Next / Qwen3.5 name it mtp_num_hidden_layers (their layer under mtp.).
  c[c.value("model_type", "").starts_with("qwen3_") ? "mtp_num_hidden_layers" : "num_nextn_predict_layers"] = 1;
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
                         ::testing::Values("glm4_moe", "deepseek_v3", "deepseek_v3_mla", "deepseek_v32", "glm_moe_dsa",
                                           "qwen3_next", "qwen3_5_moe"),
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

// Qwen3-Next's MTP layer as its checkpoints store it (vLLM's qwen3_next_mtp reads the same
// names): mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm and a gated
// full-attention layer mtp.layers.0. The fixture's checkpoint with such tensors added (its
// last full-attention layer's weights as the MTP layer's, a patterned fc, the model's final
// norm as the three norms) and mtp_num_hidden_layers 1: loaded from those names for
// --speculative-method mtp (a missing one fails the load), skipped without it, the MTP
// logits those of the reference (transformers has no Qwen3-Next MTP: the golden is its
// decoder layer wired as vLLM's qwen3_next_mtp, scripts/fixtures/qwen3_next_mtp_golden.py),
// and greedy outputs with MTP drafts those of decoding without.
TEST(Mtp, Qwen3NextCheckpointsMtpLayerLoadsFromItsNames) {
  const std::string src = testing::fixture_dir("qwen3_next");
  nlohmann::json config = testing::read_json(src + "/config.json");
  config["mtp_num_hidden_layers"] = 1;
  const int64_t d = config["hidden_size"].get<int64_t>(), n_layers = config["num_hidden_layers"].get<int64_t>();
  const int64_t interval = config.value("full_attention_interval", int64_t(4));
  int64_t full = -1;
  for (int64_t i = 0; i < n_layers; ++i)
    if ((i + 1) % interval == 0) full = i;
  ASSERT_GE(full, 0) << "the fixture has no full-attention layer";
  auto ckpt = formats::Checkpoint::open(src);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::string layer = "model.layers." + std::to_string(full) + ".";
  for (const std::string& name : ckpt->names()) {
    auto t = ckpt->get(name);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tensors.emplace_back(name, *t);
    if (name.starts_with(layer)) tensors.emplace_back("mtp.layers.0." + name.substr(layer.size()), *t);
    if (name == "model.norm.weight")
      for (const char* n : {"mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"})
        tensors.emplace_back(n, *t);
  }
  Tensor fc = host_tensor(DType::kF32, {d, 2 * d});
  for (int64_t i = 0; i < fc.numel(); ++i) fc.as<float>()[i] = float((i * 7919) % 61 - 30) / 512.0f;  // exact in bf16
  tensors.emplace_back("mtp.fc.weight", fc);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kiln_qwen3_next_mtp";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(formats::write_safetensors((dir / "model.safetensors").string(), tensors).ok());
  std::ofstream(dir / "config.json") << config.dump(1);
  for (const auto& f : std::filesystem::directory_iterator(src))
    if (f.path().filename().string().starts_with("tokenizer"))
      std::filesystem::copy_file(f.path(), dir / f.path().filename(), std::filesystem::copy_options::overwrite_existing);

  EngineOptions base{.block_size = 4, .max_model_len = 64, .prefill_chunk = 8};
  auto plain = Engine::load(dir.string(), cpu::make_cpu_backend(1), base);  // the mtp.* tensors skipped
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EngineOptions o = base;
  o.speculative_method = SpeculativeMethod::kMtp;
  o.num_speculative_tokens = 2;
  o.speculative_adaptive = false;
  auto mtp = Engine::load(dir.string(), cpu::make_cpu_backend(1), o);
  ASSERT_TRUE(mtp.ok()) << mtp.status().to_string();
  const std::vector<int32_t> prompt = {5, 17, 3, 99, 42, 7, 8, 120, 64};
  auto logits = (*mtp)->mtp_logits(prompt);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  ASSERT_EQ(logits->size(), prompt.size() - 1);
  for (const auto& row : *logits)
    for (float x : row) ASSERT_TRUE(std::isfinite(x));
  EXPECT_NE((*logits)[0], (*logits)[1]);
  // The reference (scripts/fixtures/qwen3_next_mtp_golden.py: transformers' Qwen3-Next
  // decoder layer and norms wired as vLLM's qwen3_next_mtp, fp32, these weights and prompt).
  const nlohmann::json golden = testing::read_json(src + "/mtp_golden.json");
  ASSERT_EQ(golden["prompt"].get<std::vector<int32_t>>(), prompt);
  const auto want = golden["mtp_logits"].get<std::vector<std::vector<float>>>();
  const double err = testing::relative_error(*logits, want);
  std::printf("qwen3_next MTP logits vs the reference: max |a-b| / max|ref| = %.3g\n", err);
  EXPECT_LT(err, 1e-4);
  const std::vector<Request> rs = requests(6, 0.0f);
  expect_same(test::run_together(**mtp, rs), test::run_together(**plain, rs), "qwen3_next with its MTP layer");
  EXPECT_GT((*mtp)->stats().spec_draft_tokens, 0);
}

}  // namespace
}  // namespace kiln::runtime
