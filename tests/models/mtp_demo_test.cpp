// The MTP demo model (models/kiln-mtp-demo: a GLM-4.5-architecture model with its
// multi-token prediction layer, trained on the demo corpus by scripts/demo/train_mtp.py):
// the MTP layer's logits against the training script's reference implementation (fp32 on
// the saved bf16 weights, as vLLM's glm4_moe_mtp computes the layer), whole and in prefill
// chunks; and speculative decoding with its drafts: real acceptance, outputs exactly those
// of decoding without drafts.
#include <map>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "models/fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

using runtime::Engine;
using runtime::EngineOptions;
using runtime::SpeculativeMethod;

const char* kModel = "kiln_mtp_demo";

std::vector<std::vector<float>> golden_rows(const std::string& key) {
  auto file = formats::SafetensorsFile::open(testing::fixture_dir(kModel) + "/golden.safetensors");
  EXPECT_TRUE(file.ok());
  if (!file.ok()) return {};
  const formats::TensorInfo* info = (*file)->find(key);
  EXPECT_NE(info, nullptr) << key;
  if (info == nullptr) return {};
  Tensor t = (*file)->get(*info);
  std::vector<float> flat(size_t(t.numel()));
  to_f32(t, flat.data());
  std::vector<std::vector<float>> rows;
  for (int64_t r = 0; r < t.dim(0); ++r) rows.emplace_back(flat.begin() + r * t.dim(1), flat.begin() + (r + 1) * t.dim(1));
  return rows;
}

std::unique_ptr<Engine> load(EngineOptions o, SpeculativeMethod m, int32_t k) {
  o.speculative_method = m;
  o.num_speculative_tokens = k;
  o.speculative_adaptive = false;
  auto e = Engine::load(testing::fixture_dir(kModel), cpu::make_cpu_backend(1), o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Row t of the MTP layer's logits (given h_t and the prompt's token t + 1) within 1e-4 of the
// reference's, for the 30-token chat and the 80-token document, in one pass and in prefill
// chunks of 7 (the layer's KV cache carried across chunks).
TEST(MtpDemo, MtpLogitsMatchTheReference) {
  const nlohmann::json golden = testing::read_json(testing::fixture_dir(kModel) + "/golden.json");
  for (int32_t chunk : {0, 7}) {
    auto e = load({.block_size = 4, .max_model_len = 256, .prefill_chunk = chunk}, SpeculativeMethod::kMtp, 1);
    ASSERT_TRUE(e);
    for (const char* which : {"short", "long"}) {
      const std::vector<int32_t> prompt = golden[std::string("prompt_") + which].get<std::vector<int32_t>>();
      auto got = e->mtp_logits(prompt);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      const auto want = golden_rows(std::string("mtp_logits_") + which);
      ASSERT_EQ(got->size(), prompt.size() - 1);
      ASSERT_EQ(want.size(), prompt.size() - 1);
      const double err = testing::relative_error(*got, want);
      EXPECT_LT(err, 1e-4) << which << " chunk " << chunk;
      std::printf("[ mtp demo ] MTP logits %s, chunk %d: max rel err %.2e\n", which, chunk, err);
    }
  }
}

// Under tensor parallelism (TP2, TP2 with expert parallelism, TP4 on the CPU group) the MTP
// layer is sharded like the others (eh_proj whole on every rank): the same logits.
TEST(MtpDemo, MtpLogitsUnderTensorParallelism) {
  const nlohmann::json golden = testing::read_json(testing::fixture_dir(kModel) + "/golden.json");
  const std::vector<int32_t> prompt = golden["prompt_long"].get<std::vector<int32_t>>();
  const auto want = golden_rows("mtp_logits_long");
  for (const runtime::ParallelConfig p : {runtime::ParallelConfig{.tensor_parallel = 2},
                                          runtime::ParallelConfig{.tensor_parallel = 2, .expert_parallel = true},
                                          runtime::ParallelConfig{.tensor_parallel = 4}}) {
    std::vector<std::unique_ptr<ops::Backend>> backends;
    for (int r = 0; r < p.world(); ++r) backends.push_back(cpu::make_cpu_backend({.n_threads = 1}));
    auto e = Engine::load(testing::fixture_dir(kModel), std::move(backends),
                          {.block_size = 4, .max_model_len = 256, .prefill_chunk = 16,
                           .speculative_method = SpeculativeMethod::kMtp, .num_speculative_tokens = 2, .parallel = p});
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    auto got = (*e)->mtp_logits(prompt);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const double err = testing::relative_error(*got, want);
    EXPECT_LT(err, 1e-4) << "tp " << p.tensor_parallel << (p.expert_parallel ? " ep" : "");
    std::printf("[ mtp demo ] MTP logits at tp %d%s: max rel err %.2e\n", p.tensor_parallel,
                p.expert_parallel ? " + ep" : "", err);
  }
}

// Greedy and sampled requests: the goldens' prompts and their prefixes, n = 2.
std::vector<runtime::Request> demo_requests(const nlohmann::json& golden, int32_t max_tokens) {
  std::vector<runtime::Request> requests;
  for (const char* which : {"short", "long"}) {
    const std::vector<int32_t> p = golden[std::string("prompt_") + which].get<std::vector<int32_t>>();
    for (size_t cut : {p.size(), p.size() * 2 / 3}) {
      const std::vector<int32_t> prompt(p.begin(), p.begin() + long(cut));
      requests.push_back({.prompt = prompt, .sampling = {.logprobs = 1}, .max_tokens = max_tokens, .ignore_eos = true});
      requests.push_back({.prompt = prompt, .sampling = {.temperature = 0.7f, .top_p = 0.9f, .seed = cut, .logprobs = 1},
                          .max_tokens = max_tokens, .ignore_eos = true, .n = 2});
    }
  }
  return requests;
}

using Tokens = std::map<std::pair<uint64_t, int32_t>, std::vector<std::pair<int32_t, float>>>;
Tokens run_all(Engine& e, const std::vector<runtime::Request>& requests) {
  Tokens out;
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_TRUE(e.add_request(i, std::make_shared<const runtime::Request>(requests[i])).ok());
  for (int steps = 0; !e.idle() && steps < 5000; ++steps)
    for (const runtime::StepOutput& o : e.step()) out[{o.request_id, o.sample_index}].push_back({o.token.token, o.token.logprob});
  return out;
}

// The outputs of decoding `requests` without drafts (empty if the model did not load).
Tokens without_drafts(const EngineOptions& base, const std::vector<runtime::Request>& requests) {
  auto plain = load(base, SpeculativeMethod::kOff, 0);
  return plain ? run_all(*plain, requests) : Tokens{};
}

double acceptance(const runtime::EngineStats& s) {
  return double(s.spec_accepted_tokens) / double(std::max<int64_t>(1, s.spec_draft_tokens));
}

// The requests above with 1 and 3 MTP drafts a step: the tokens and logprobs of decoding
// without drafts, and drafts accepted at the rate the training log estimates (bound: half
// of its first-draft estimate).
TEST(MtpDemo, DraftsAreAcceptedAndOutputsEqualThoseWithout) {
  const nlohmann::json golden = testing::read_json(testing::fixture_dir(kModel) + "/golden.json");
  const nlohmann::json log = testing::read_json(testing::fixture_dir(kModel) + "/train_log.json");
  const std::vector<runtime::Request> requests = demo_requests(golden, 40);
  const EngineOptions base{.block_size = 4, .max_model_len = 256, .prefill_chunk = 16};
  const Tokens want = without_drafts(base, requests);
  ASSERT_FALSE(want.empty());
  const double estimate = log.at("acceptance_draft1").get<double>();
  for (int32_t k : {1, 3}) {
    auto mtp = load(base, SpeculativeMethod::kMtp, k);
    ASSERT_TRUE(mtp);
    EXPECT_EQ(run_all(*mtp, requests), want) << "k " << k;
    const runtime::EngineStats s = mtp->stats();
    std::printf("[ mtp demo ] k %d: %lld of %lld drafts accepted (%.1f%%), %.2f tokens per verification "
                "(training log's first-draft estimate %.1f%%)\n",
                k, (long long)s.spec_accepted_tokens, (long long)s.spec_draft_tokens, 100.0 * acceptance(s),
                1.0 + double(s.spec_accepted_tokens) / double(std::max<int64_t>(1, s.spec_verified_seqs)), 100.0 * estimate);
    if (k == 1) {
      EXPECT_GT(acceptance(s), 0.5 * estimate);
    }
    EXPECT_EQ(s.kv_blocks_used, 0);
  }
}

// With one rank, a chained MTP pass reads its tokens where the previous pass's argmax left
// them (no wait between passes); with several, each pass's drafts go through the host. The
// two give the same drafts (same ops on the same values: only where the token ids come
// from differs), so exactly as many stand, and the outputs of decoding without drafts,
// in batches of several sequences with n = 2, greedy and sampled.
TEST(MtpDemo, DraftsChainedOnTheDeviceAreThoseOfTheHostChain) {
  const nlohmann::json golden = testing::read_json(testing::fixture_dir(kModel) + "/golden.json");
  const std::vector<runtime::Request> requests = demo_requests(golden, 40);
  EngineOptions base{.block_size = 4, .max_model_len = 256, .prefill_chunk = 16};
  const Tokens want = without_drafts(base, requests);
  ASSERT_FALSE(want.empty());
  std::map<bool, runtime::EngineStats> stats;
  for (bool on_device : {true, false}) {
    base.mtp_chain_on_device = on_device;
    auto mtp = load(base, SpeculativeMethod::kMtp, 3);
    ASSERT_TRUE(mtp);
    EXPECT_EQ(run_all(*mtp, requests), want) << "on device " << on_device;
    stats[on_device] = mtp->stats();
    const runtime::EngineStats& s = stats[on_device];
    std::printf("[ mtp demo ] chained %s: %lld of %lld drafts accepted, %lld chained passes after %lld drafting steps\n",
                on_device ? "on the device" : "through the host", (long long)s.spec_accepted_tokens,
                (long long)s.spec_draft_tokens, (long long)s.mtp_chained_passes, (long long)s.mtp_draft_steps);
    EXPECT_EQ(s.kv_blocks_used, 0);
  }
  EXPECT_GT(stats[true].mtp_chained_passes, 20);
  EXPECT_EQ(stats[true].mtp_chained_passes, stats[false].mtp_chained_passes);
  EXPECT_EQ(stats[true].spec_draft_tokens, stats[false].spec_draft_tokens);
  EXPECT_EQ(stats[true].spec_accepted_tokens, stats[false].spec_accepted_tokens);
  EXPECT_GT(stats[true].spec_accepted_tokens, stats[true].spec_draft_tokens / 4);
}

// While the depth policy plans no drafts, the MTP layer's passes wait: decode steps keep
// their hidden rows and the next pass runs over them first. A schedule of depths (one
// step in four drafts, the others plan none) run with deferred passes and with a pass
// after every step (mtp_deferred_steps = 0): the outputs are those of decoding without
// drafts, rows were deferred, and the drafts, which read the MTP KV the deferred passes
// wrote, are the same ones: exactly as many stand (one rank, and two).
TEST(MtpDemo, DeferredMtpPassesGiveTheDraftsOfAPassEveryStep) {
  const nlohmann::json golden = testing::read_json(testing::fixture_dir(kModel) + "/golden.json");
  const std::vector<runtime::Request> requests = demo_requests(golden, 48);
  const EngineOptions base{.block_size = 4, .max_model_len = 256, .prefill_chunk = 16};
  const Tokens want = without_drafts(base, requests);
  ASSERT_FALSE(want.empty());
  std::map<int32_t, runtime::EngineStats> stats;
  for (int32_t deferred : {16, 0}) {
    EngineOptions o = base;
    o.speculative_method = SpeculativeMethod::kMtp;
    o.num_speculative_tokens = 2;
    o.speculative_depth_schedule = [](int64_t step) { return step % 4 == 0 ? 2 : 0; };
    o.mtp_deferred_steps = deferred;
    auto e = Engine::load(testing::fixture_dir(kModel), cpu::make_cpu_backend(1), o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(run_all(**e, requests), want) << "deferred steps " << deferred;
    stats[deferred] = (*e)->stats();
    const runtime::EngineStats& s = stats[deferred];
    std::printf("[ mtp demo ] deferred steps %d: %lld of %lld drafts accepted (%.1f%%) over %lld steps; %lld rows "
                "deferred, %lld deferred passes\n",
                deferred, (long long)s.spec_accepted_tokens, (long long)s.spec_draft_tokens, 100.0 * acceptance(s),
                (long long)s.steps, (long long)s.mtp_deferred_rows, (long long)s.mtp_flushes);
    EXPECT_EQ(s.kv_blocks_used, 0);
  }
  // The adaptive policy itself, its governor switching every 2 steps between speculation
  // on (MTP passes deferred while it plans no drafts) and off (no MTP pass at all, what
  // was deferred run first): the outputs of decoding without drafts.
  EngineOptions o = base;
  o.speculative_method = SpeculativeMethod::kMtp;
  o.num_speculative_tokens = 2;
  o.speculative_governor_window = 2;
  auto governed = Engine::load(testing::fixture_dir(kModel), cpu::make_cpu_backend(1), o);
  ASSERT_TRUE(governed.ok()) << governed.status().to_string();
  EXPECT_EQ(run_all(**governed, requests), want) << "governed";
  const runtime::EngineStats g = (*governed)->stats();
  std::printf("[ mtp demo ] governed: %lld of %lld drafts accepted; %lld rows deferred, %lld deferred passes\n",
              (long long)g.spec_accepted_tokens, (long long)g.spec_draft_tokens, (long long)g.mtp_deferred_rows,
              (long long)g.mtp_flushes);
  EXPECT_EQ(g.kv_blocks_used, 0);
  // Two ranks (the kept rows copied on each): deferred passes and a pass every step again
  // accept the same drafts and give the same outputs.
  std::map<int32_t, std::pair<Tokens, runtime::EngineStats>> tp2;
  for (int32_t deferred : {16, 0}) {
    EngineOptions t = o;
    t.speculative_governor_window = 32;
    t.speculative_depth_schedule = [](int64_t step) { return step % 4 == 0 ? 2 : 0; };
    t.mtp_deferred_steps = deferred;
    t.parallel = {.tensor_parallel = 2};
    std::vector<std::unique_ptr<ops::Backend>> backends;
    for (int r = 0; r < 2; ++r) backends.push_back(cpu::make_cpu_backend({.n_threads = 1}));
    auto e = Engine::load(testing::fixture_dir(kModel), std::move(backends), t);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    tp2[deferred] = {run_all(**e, requests), (*e)->stats()};
  }
  EXPECT_EQ(tp2[16].first, tp2[0].first) << "tp 2";
  EXPECT_GT(tp2[16].second.mtp_deferred_rows, 150);
  EXPECT_EQ(tp2[16].second.spec_accepted_tokens, tp2[0].second.spec_accepted_tokens) << "tp 2";
  EXPECT_EQ(tp2[16].second.spec_draft_tokens, tp2[0].second.spec_draft_tokens) << "tp 2";
  EXPECT_GT(stats[16].mtp_deferred_rows, 150);
  EXPECT_GT(stats[16].mtp_flushes, 10);
  EXPECT_EQ(stats[0].mtp_deferred_rows, 0);
  EXPECT_GT(stats[16].spec_accepted_tokens, 20);
  EXPECT_EQ(stats[16].spec_draft_tokens, stats[0].spec_draft_tokens);
  EXPECT_EQ(stats[16].spec_accepted_tokens, stats[0].spec_accepted_tokens);
}

}  // namespace
}  // namespace kiln
