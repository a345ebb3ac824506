// Engine (continuous batching over the scheduler, block manager and sampler) on the CPU
// reference. Its rows are computed independently with a fixed reduction order, so
// whatever else shares a step (other requests, chunked prefill, cached prefixes,
// preemption and recomputation), a request's tokens and logprobs are exactly those of
// the same request run alone.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine_test_util.h"

namespace kiln::runtime {
namespace {

using test::Key;
using test::Outputs;
using test::SampleOut;

// A mix of greedy and seeded sampling with every filter and penalty.
SamplingParams mixed_sampling(int32_t i) {
  SamplingParams p{.seed = 1000 + uint64_t(i), .logprobs = 2};
  if (i % 4 == 0) return p;  // greedy
  p.temperature = 0.6f + 0.1f * float(i % 7);
  if (i % 3 == 0) p.top_k = 20;
  if (i % 5 == 1) p.top_p = 0.9f;
  if (i % 6 == 2) p.min_p = 0.05f;
  if (i % 5 == 0) p = {.temperature = p.temperature, .seed = p.seed, .logprobs = 1, .repetition_penalty = 1.2f,
                       .presence_penalty = 0.5f, .frequency_penalty = 0.3f};
  return p;
}

void expect_same(const Outputs& got, const Outputs& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, w] : want) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << what << ": request " << key.first << " sample " << key.second << " missing";
    EXPECT_EQ(it->second.tokens, w.tokens) << what << ": request " << key.first << " sample " << key.second;
    EXPECT_EQ(it->second.logprobs, w.logprobs) << what << ": request " << key.first << " sample " << key.second;
    EXPECT_EQ(it->second.finish, w.finish) << what << ": request " << key.first;
    EXPECT_EQ(it->second.n_finish, 1) << what << ": request " << key.first;
  }
}

class EngineFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineFixture, BatchingDoesNotChangeAnyRequestsTokensOrLogprobs) {
  auto batched = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 64, .prefill_chunk = 16,
                                                 .max_num_seqs = 64, .max_num_batched_tokens = 256});
  auto solo = test::load_fixture(
      GetParam(), {.block_size = 4, .max_model_len = 64, .max_num_seqs = 1, .enable_prefix_caching = false});
  ASSERT_TRUE(batched && solo);
  std::vector<Request> requests;
  for (int32_t i = 0; i < 64; ++i) {
    requests.push_back({.prompt = test::random_tokens(1 + (i * 7) % 40, uint32_t(i)),
                        .sampling = mixed_sampling(i),
                        .max_tokens = 2 + i % 5,
                        .ignore_eos = i % 2 == 0});
  }
  const Outputs together = test::run_together(*batched, requests);
  Outputs alone;
  for (size_t i = 0; i < requests.size(); ++i) alone[{i, 0}] = test::run_alone(*solo, requests[i]);
  expect_same(together, alone, GetParam());
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(together.at({i, 0}).tokens.size(), size_t(requests[i].max_tokens)) << "request " << i;
  // The batch really was one: far fewer steps than the requests took one by one.
  EXPECT_LT(batched->stats().steps * 4, solo->stats().steps);
  EXPECT_EQ(batched->stats().generated_tokens, solo->stats().generated_tokens);
  EXPECT_EQ(batched->stats().kv_blocks_used, 0);
  EXPECT_EQ(solo->stats().kv_blocks_used, 0);
}

TEST_P(EngineFixture, PrefixCachingOnAndOffGiveTheSameOutputs) {
  Outputs out[2];
  EngineStats stats[2];
  const std::vector<int32_t> prefix = test::random_tokens(30, 7);
  for (bool caching : {true, false}) {
    auto e = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 64,
                                             .enable_prefix_caching = caching});
    ASSERT_TRUE(e);
    auto request = [&](int32_t i) {
      std::vector<int32_t> prompt = prefix;
      const std::vector<int32_t> suffix = test::random_tokens(1 + i % 9, 100 + uint32_t(i));
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      return Request{.prompt = prompt, .sampling = mixed_sampling(i), .max_tokens = 4};
    };
    // Three waves: the first computes the prefix, the later ones find it cached (the last
    // repeats the first wave's prompts: cached up to their last token).
    std::vector<Request> wave1, wave2, wave3;
    for (int32_t i = 0; i < 4; ++i) wave1.push_back(request(i));
    for (int32_t i = 4; i < 12; ++i) wave2.push_back(request(i));
    wave3 = wave1;
    wave3.push_back({.prompt = prefix, .max_tokens = 4});
    Outputs& o = out[caching ? 1 : 0];
    for (auto& [k, v] : test::run_together(*e, wave1, 0)) o[k] = v;
    for (auto& [k, v] : test::run_together(*e, wave2, 100)) o[k] = v;
    for (auto& [k, v] : test::run_together(*e, wave3, 200)) o[k] = v;
    stats[caching ? 1 : 0] = e->stats();
  }
  expect_same(out[1], out[0], GetParam());
  for (int32_t i = 0; i < 4; ++i) EXPECT_EQ(out[1].at({200 + i, 0}), out[1].at({i, 0})) << "repeat of " << i;
  // Wave 2: 8 prompts whose 28 leading tokens (7 blocks) are cached; wave 3 more.
  EXPECT_GE(stats[1].prefix_hit_tokens, 8 * 28);
  EXPECT_EQ(stats[0].prefix_hit_tokens, 0);
  EXPECT_LT(stats[1].computed_tokens, stats[0].computed_tokens) << "hits are not computed again";
  EXPECT_EQ(stats[1].prompt_tokens, stats[0].prompt_tokens);
  EXPECT_EQ(stats[1].kv_blocks_used, 0);
  EXPECT_EQ(stats[0].kv_blocks_used, 0);
}

TEST_P(EngineFixture, PreemptionForcedByASmallCacheDoesNotChangeOutputs) {
  std::vector<Request> requests;
  for (int32_t i = 0; i < 12; ++i) {
    requests.push_back({.prompt = test::random_tokens(8 + i, 300 + uint32_t(i)),
                        .sampling = mixed_sampling(i),
                        .max_tokens = 6 + i % 4});
  }
  auto big = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 48, .max_num_seqs = 16});
  ASSERT_TRUE(big);
  const Outputs want = test::run_together(*big, requests);
  EXPECT_EQ(big->stats().preemptions, 0);
  const int64_t bytes_token = big->kv_cache_bytes() / big->kv_capacity_tokens();
  for (bool caching : {true, false}) {
    // 12 blocks: room for one full-length sequence, not for twelve.
    auto small = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 48, .max_num_seqs = 16,
                                                 .enable_prefix_caching = caching, .kv_cache_bytes = bytes_token * 48});
    ASSERT_TRUE(small);
    ASSERT_EQ(small->stats().kv_blocks_total, 12);
    const Outputs got = test::run_together(*small, requests);
    expect_same(got, want, GetParam() + (caching ? " caching" : " no caching"));
    EXPECT_GT(small->stats().preemptions, 0);
    EXPECT_GT(small->stats().computed_tokens, big->stats().computed_tokens) << "preempted tokens are recomputed";
    EXPECT_EQ(small->stats().kv_blocks_used, 0);
  }
}

TEST_P(EngineFixture, SamplesOfOneRequestUseSeedPlusIndexAndShareThePrompt) {
  const std::vector<int32_t> prompt = test::random_tokens(13, 5);
  const Request r{.prompt = prompt, .sampling = {.temperature = 1.0f, .top_p = 0.95f, .seed = 77, .logprobs = 1},
                  .max_tokens = 6, .ignore_eos = true, .n = 4};
  auto off = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 64, .enable_prefix_caching = false});
  auto on = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 64});
  ASSERT_TRUE(off && on);
  Outputs singles;
  for (int32_t i = 0; i < 4; ++i) {
    Request one = r;
    one.n = 1;
    one.sampling.seed = 77 + uint64_t(i);
    singles[{1, i}] = test::run_alone(*off, one);
  }
  EXPECT_NE(singles.at({1, 0}).tokens, singles.at({1, 1}).tokens) << "the seeds differ, so do the samples";
  expect_same(test::run_together(*off, {r}, 1), singles, "no caching");

  ASSERT_TRUE(on->add_request(1, std::make_shared<const Request>(r)).ok());
  Outputs got;
  // Sample 0 prefills alone; a recurrent model's prefill stops once at the last full block
  // (12 tokens), whose state checkpoint the other samples resume from.
  const bool recurrent = GetParam() == "qwen3_next" || GetParam() == "qwen3_5_moe";
  if (recurrent) {
    test::collect(got, on->step());
    EXPECT_EQ(on->stats().kv_blocks_used, 3);
  }
  test::collect(got, on->step());
  EXPECT_EQ(on->stats().running, 1);
  EXPECT_EQ(on->stats().kv_blocks_used, 4);
  test::collect(got, on->step());  // the others take its 3 full prompt blocks
  EXPECT_EQ(on->stats().running, 4);
  EXPECT_EQ(on->stats().kv_blocks_used, 4 + 3) << "3 shared blocks, one private block per later sample";
  EXPECT_EQ(on->stats().prefix_hit_tokens, 3 * 12);
  test::run_until_idle(*on, got);
  expect_same(got, singles, "caching");
  EXPECT_EQ(on->stats().kv_blocks_used, 0);
  EXPECT_EQ(off->stats().kv_blocks_used, 0);
}

TEST_P(EngineFixture, GreedyPenalisedTokensAreTheArgmaxOfPenalisedLogits) {
  auto e = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 64});
  ASSERT_TRUE(e);
  const SamplingParams p{.logprobs = 0, .repetition_penalty = 1.3f, .presence_penalty = 0.4f,
                         .frequency_penalty = 0.6f};
  const std::vector<int32_t> prompt = {5, 17, 5, 42, 9, 17, 5};
  const SampleOut out = test::run_alone(*e, {.prompt = prompt, .sampling = p, .max_tokens = 8, .ignore_eos = true});
  ASSERT_EQ(out.tokens.size(), 8u);
  std::vector<int32_t> seq = prompt;
  for (size_t k = 0; k < out.tokens.size(); ++k) {
    auto logits = e->logits(seq);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    std::vector<float> x = logits->back();
    // PenaltyParams (ops/backend.h): n = times generated, 0 for prompt-only tokens.
    std::map<int32_t, int32_t> seen;
    for (int32_t t : prompt) seen.try_emplace(t, 0);
    for (size_t j = prompt.size(); j < seq.size(); ++j) ++seen[seq[j]];
    for (auto [t, n] : seen) {
      float v = x[size_t(t)];
      v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
      x[size_t(t)] = v - (p.frequency_penalty * float(n) + (n > 0 ? p.presence_penalty : 0.0f));
    }
    const int32_t want = int32_t(std::max_element(x.begin(), x.end()) - x.begin());  // first (lowest id) maximum
    EXPECT_EQ(out.tokens[k], want) << "token " << k;
    double sum = 0.0;
    for (float v : x) sum += std::exp(double(v) - double(x[size_t(want)]));
    EXPECT_NEAR(out.logprobs[k], -std::log(sum), 1e-4) << "logprob of the penalised logits, token " << k;
    seq.push_back(out.tokens[k]);
  }
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
}

// Everything at once: shared prefixes, n > 1, chunked prefill under a small token
// budget, and a cache so small that sequences are preempted and recomputed. Each sample
// still equals its own n = 1 request (seed + i) run alone without caching.
TEST_P(EngineFixture, EverythingTogetherEqualsEachSampleAlone) {
  auto solo = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 40, .max_num_seqs = 1,
                                              .enable_prefix_caching = false});
  ASSERT_TRUE(solo);
  const int64_t bytes_token = solo->kv_cache_bytes() / solo->kv_capacity_tokens();
  std::vector<Request> requests;
  for (int32_t i = 0; i < 16; ++i) {
    std::vector<int32_t> prompt = test::random_tokens(6 + 4 * (i % 4), 40 + uint32_t(i % 3));  // 3 shared prefixes
    const std::vector<int32_t> tail = test::random_tokens(1 + i % 5, 500 + uint32_t(i));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    requests.push_back({.prompt = prompt, .sampling = mixed_sampling(i + 1), .max_tokens = 3 + i % 4,
                        .n = 1 + i % 3});
  }
  Outputs want;
  for (size_t i = 0; i < requests.size(); ++i) {
    for (int32_t k = 0; k < requests[i].n; ++k) {
      Request one = requests[i];
      one.n = 1;
      one.sampling.seed += uint64_t(k);
      want[{i, k}] = test::run_alone(*solo, one);
    }
  }
  // Block sizes that do and do not divide the chunk, the prompts and the cache.
  for (int32_t bs : {1, 3, 4, 16}) {
    const int32_t n_blocks = (40 + bs - 1) / bs;  // one full-length sequence
    auto busy = test::load_fixture(GetParam(), {.block_size = bs, .max_model_len = 40, .prefill_chunk = 5,
                                                .max_num_seqs = 6, .max_num_batched_tokens = 12,
                                                .kv_cache_bytes = bytes_token * bs * n_blocks});
    ASSERT_TRUE(busy);
    ASSERT_EQ(busy->stats().kv_blocks_total, n_blocks);
    const std::string what = GetParam() + " block size " + std::to_string(bs);
    expect_same(test::run_together(*busy, requests), want, what);
    const EngineStats st = busy->stats();
    EXPECT_GT(st.preemptions, 0) << what;
    EXPECT_GT(st.prefix_hit_tokens, 0) << what;
    EXPECT_EQ(st.kv_blocks_used, 0) << what;
    EXPECT_EQ(st.running + st.waiting, 0) << what;
  }
}

TEST_P(EngineFixture, CancellingTheFirstSampleBeforeItRunsReleasesItsSiblings) {
  auto e = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 64});
  ASSERT_TRUE(e);
  const Request r{.prompt = test::random_tokens(10, 3), .sampling = {.temperature = 1.0f, .seed = 9},
                  .max_tokens = 4, .n = 3};
  Outputs want;
  for (int32_t k = 1; k < 3; ++k) {
    Request one = r;
    one.n = 1;
    one.sampling.seed += uint64_t(k);
    want[{1, k}] = test::run_alone(*e, one);
  }
  ASSERT_TRUE(e->add_request(1, std::make_shared<const Request>(r)).ok());
  e->cancel(1, 0);  // the others waited for its prompt blocks
  Outputs got;
  test::run_until_idle(*e, got);
  expect_same(got, want, GetParam());
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
}

// Every family, with MLA and the sliding window also at the target models' head sizes,
// and DeepSeek sparse attention (top-8 of prompts up to 40 tokens: the indexer's cache is
// shared, preempted and recomputed with the latent's).
INSTANTIATE_TEST_SUITE_P(Fixtures, EngineFixture,
                         ::testing::Values("llama", "qwen3", "qwen3_moe", "glm4_moe", "deepseek_v3", "kimi_k2",
                                           "gpt_oss", "gpt_oss_d64", "deepseek_v3_mla", "minimax_m2",
                                           "deepseek_v32", "glm_moe_dsa"),
                         [](const auto& info) { return info.param; });
// Gated DeltaNet hybrids: a recurrent state per sequence beside the paged KV cache.
INSTANTIATE_TEST_SUITE_P(Recurrent, EngineFixture, ::testing::Values("qwen3_next", "qwen3_5_moe"),
                         [](const auto& info) { return info.param; });

// Gated DeltaNet hybrids' prefix caching (runtime/state_cache.h): a conversation's second
// turn (the first turn's prompt and answer, then a new message) resumes from the state
// checkpointed at the last block boundary of the first turn, its answer included, and
// gives exactly what computing it all again gives (tokens and logprobs).
class RecurrentPrefix : public ::testing::TestWithParam<std::string> {};

TEST_P(RecurrentPrefix, SecondTurnResumesFromTheFirstTurnsStateExactly) {
  SampleOut want[2], got[2];
  EngineStats stats[2];
  for (bool caching : {false, true}) {
    auto e = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 96, .prefill_chunk = 6,
                                             .enable_prefix_caching = caching});
    ASSERT_TRUE(e);
    SampleOut* out = caching ? got : want;
    const Request turn1{.prompt = test::random_tokens(19, 31),
                        .sampling = {.temperature = 0.8f, .seed = 5, .logprobs = 0},
                        .max_tokens = 10,
                        .ignore_eos = true};
    out[0] = test::run_alone(*e, turn1, 1);
    Request turn2 = turn1;
    turn2.prompt.insert(turn2.prompt.end(), out[0].tokens.begin(), out[0].tokens.end());
    const std::vector<int32_t> message = test::random_tokens(7, 32);
    turn2.prompt.insert(turn2.prompt.end(), message.begin(), message.end());
    out[1] = test::run_alone(*e, turn2, 2);
    stats[caching ? 1 : 0] = e->stats();
  }
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(got[1], want[1]) << "the second turn from the checkpoint vs computed again";
  // The first turn computed 19 + 10 tokens: its last full block ends at token 28, and the
  // second turn (36 tokens) resumes there.
  EXPECT_EQ(stats[1].prefix_hit_tokens, 28);
  EXPECT_EQ(stats[0].prefix_hit_tokens, 0);
  EXPECT_EQ(stats[0].computed_tokens - stats[1].computed_tokens, 28);
  EXPECT_EQ(stats[1].kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RecurrentPrefix, ::testing::Values("qwen3_next", "qwen3_5_moe"),
                         [](const auto& info) { return info.param; });

TEST(Engine, PenaltiesChangeGreedyOutput) {
  auto e = test::load_fixture("llama", {.block_size = 4, .max_model_len = 64});
  ASSERT_TRUE(e);
  int32_t differ = 0;
  for (uint32_t seed = 0; seed < 4; ++seed) {
    const std::vector<int32_t> prompt = test::random_tokens(6, 900 + seed);
    const SampleOut plain = test::run_alone(*e, {.prompt = prompt, .max_tokens = 12, .ignore_eos = true});
    const SampleOut penalised = test::run_alone(
        *e, {.prompt = prompt, .sampling = {.repetition_penalty = 1.5f, .presence_penalty = 1.0f,
                                             .frequency_penalty = 1.0f},
             .max_tokens = 12, .ignore_eos = true});
    differ += plain.tokens != penalised.tokens;
  }
  EXPECT_GT(differ, 0);
}

TEST(Engine, CancelEndsARequestOrOneSampleAndFreesTheirBlocks) {
  auto e = test::load_fixture("llama", {.block_size = 4, .max_model_len = 64, .max_num_seqs = 5,
                                        .enable_prefix_caching = false});
  ASSERT_TRUE(e);
  auto req = [](uint32_t seed, int32_t n) {
    return std::make_shared<const Request>(Request{.prompt = test::random_tokens(9, seed),
                                                   .sampling = {.temperature = 0.9f, .seed = seed},
                                                   .max_tokens = 20, .ignore_eos = true, .n = n});
  };
  ASSERT_TRUE(e->add_request(1, req(1, 1)).ok());
  ASSERT_TRUE(e->add_request(2, req(2, 1)).ok());
  ASSERT_TRUE(e->add_request(3, req(3, 3)).ok());
  ASSERT_TRUE(e->add_request(4, req(4, 1)).ok());  // waits: 5 sequences run at most
  Outputs out;
  for (int i = 0; i < 3; ++i) test::collect(out, e->step());
  EXPECT_EQ(e->stats().running, 5);
  EXPECT_EQ(e->stats().waiting, 1);
  const int32_t used = e->stats().kv_blocks_used;
  EXPECT_EQ(used, 5 * 3) << "12 tokens each";

  e->cancel(4);  // still waiting
  EXPECT_FALSE(e->has_request(4));
  EXPECT_EQ(e->stats().waiting, 0);
  e->cancel(1);
  EXPECT_FALSE(e->has_request(1));
  EXPECT_EQ(e->stats().kv_blocks_used, used - 3);
  e->cancel(3, 1);
  EXPECT_TRUE(e->has_request(3)) << "samples 0 and 2 go on";
  EXPECT_EQ(e->stats().kv_blocks_used, used - 6);
  EXPECT_EQ(e->stats().running, 3);
  e->cancel(12345);  // unknown: nothing happens
  const Outputs before = out;
  test::run_until_idle(*e, out);
  EXPECT_EQ(out.at({1, 0}).tokens, before.at({1, 0}).tokens) << "nothing after a cancel";
  EXPECT_EQ(out.at({3, 1}).tokens, before.at({3, 1}).tokens);
  EXPECT_EQ(out.count({4, 0}), 0u);
  for (Key k : {Key{2, 0}, Key{3, 0}, Key{3, 2}}) {
    EXPECT_EQ(out.at(k).tokens.size(), 20u) << k.first << "/" << k.second;
    EXPECT_EQ(out.at(k).finish, FinishReason::kLength);
  }
  EXPECT_FALSE(e->has_request(3));
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
  // The survivors were not disturbed.
  EXPECT_EQ(test::run_alone(*e, *req(2, 1)).tokens, out.at({2, 0}).tokens);
}

// A copy of a fixture whose config.json names an end-of-sequence id.
std::string fixture_with_eos(const std::string& name, int32_t eos) {
  namespace fs = std::filesystem;
  const fs::path src = testing::fixture_dir(name);
  const fs::path dir = fs::path(::testing::TempDir()) / ("kiln_eos_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::json config = testing::read_json((src / "config.json").string());
  config["eos_token_id"] = eos;
  std::ofstream(dir / "config.json") << config.dump();
  fs::remove(dir / "model.safetensors");
  fs::create_symlink(fs::absolute(src / "model.safetensors"), dir / "model.safetensors");
  return dir.string();
}

TEST(Engine, StopsAtMaxTokensStopTokensAndEosUnlessIgnored) {
  auto e = test::load_fixture("llama", {.block_size = 4, .max_model_len = 64});
  ASSERT_TRUE(e);
  const std::vector<int32_t> prompt = {11, 22, 33, 44, 55};
  const SampleOut ref = test::run_alone(*e, {.prompt = prompt, .max_tokens = 12});
  ASSERT_EQ(ref.tokens.size(), 12u) << "the fixture has no eos id";
  EXPECT_EQ(ref.finish, FinishReason::kLength);
  EXPECT_EQ(ref.n_finish, 1) << "only the last token carries the finish";
  // A token whose first occurrence is not the first token.
  size_t k = 1;
  while (k < ref.tokens.size() &&
         std::find(ref.tokens.begin(), ref.tokens.begin() + long(k), ref.tokens[k]) != ref.tokens.begin() + long(k))
    ++k;
  ASSERT_LT(k, ref.tokens.size()) << "the reference repeats one token";
  const int32_t stop = ref.tokens[k];
  const std::vector<int32_t> head(ref.tokens.begin(), ref.tokens.begin() + long(k) + 1);

  const SampleOut stopped = test::run_alone(*e, {.prompt = prompt, .max_tokens = 12, .stop_token_ids = {stop, 319}});
  EXPECT_EQ(stopped.tokens, head) << "the stop id is the last token";
  EXPECT_EQ(stopped.finish, FinishReason::kStopToken);

  const SampleOut three = test::run_alone(*e, {.prompt = prompt, .max_tokens = 3});
  EXPECT_EQ(three.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + 3));
  EXPECT_EQ(three.finish, FinishReason::kLength);

  const std::string eos_dir = fixture_with_eos("llama", stop);
  auto with_eos = test::load_engine(eos_dir, {.block_size = 4, .max_model_len = 64});
  std::filesystem::remove_all(eos_dir);  // loaded: the weights stay mapped
  ASSERT_TRUE(with_eos);
  ASSERT_EQ(with_eos->eos_token_ids(), std::vector<int32_t>{stop});
  const SampleOut eos = test::run_alone(*with_eos, {.prompt = prompt, .max_tokens = 12});
  EXPECT_EQ(eos.tokens, head) << "the eos id is the last token";
  EXPECT_EQ(eos.finish, FinishReason::kEos);
  const SampleOut ignored = test::run_alone(*with_eos, {.prompt = prompt, .max_tokens = 12, .ignore_eos = true});
  EXPECT_EQ(ignored.tokens, ref.tokens);
  EXPECT_EQ(ignored.finish, FinishReason::kLength);
  // A stop id still stops a request that ignores eos.
  const SampleOut both = test::run_alone(
      *with_eos, {.prompt = prompt, .max_tokens = 12, .stop_token_ids = {stop}, .ignore_eos = true});
  EXPECT_EQ(both.finish, FinishReason::kStopToken);
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
  EXPECT_EQ(with_eos->stats().kv_blocks_used, 0);
}

TEST(Engine, ForcedOutputIsEmittedInPlaceOfSamplesAndFedBack) {
  auto e = test::load_fixture("qwen3", {.block_size = 4, .max_model_len = 64});
  ASSERT_TRUE(e);
  const std::vector<int32_t> prompt = {7, 8, 9};
  const std::vector<int32_t> forced = {300, 1, 150};
  const SampleOut out = test::run_alone(*e, {.prompt = prompt, .max_tokens = 6, .forced_output = forced});
  ASSERT_EQ(out.tokens.size(), 6u);
  EXPECT_EQ(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + 3), forced);
  // The model saw the forced tokens: what follows is the continuation of prompt + forced.
  std::vector<int32_t> extended = prompt;
  extended.insert(extended.end(), forced.begin(), forced.end());
  const SampleOut cont = test::run_alone(*e, {.prompt = extended, .max_tokens = 3});
  EXPECT_EQ(std::vector<int32_t>(out.tokens.begin() + 3, out.tokens.end()), cont.tokens);
  // A forced token that is a stop id ends the sample.
  const SampleOut stopped =
      test::run_alone(*e, {.prompt = prompt, .max_tokens = 6, .stop_token_ids = {1}, .forced_output = forced});
  EXPECT_EQ(stopped.tokens, (std::vector<int32_t>{300, 1}));
  EXPECT_EQ(stopped.finish, FinishReason::kStopToken);
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
}

// A forced token (the server's test hook) is reported with its own logprob, not the one
// of the token that was sampled: here the least likely token.
TEST(Engine, ForcedTokensCarryTheirOwnLogprob) {
  auto e = test::load_fixture("llama", {.block_size = 4, .max_model_len = 64});
  ASSERT_TRUE(e);
  const std::vector<int32_t> prompt = {7, 8, 9};
  auto logits = e->logits(prompt);
  ASSERT_TRUE(logits.ok());
  const std::vector<float>& x = logits->back();
  const int32_t least = int32_t(std::min_element(x.begin(), x.end()) - x.begin());
  const float top = *std::max_element(x.begin(), x.end());
  double sum = 0.0;
  for (float v : x) sum += std::exp(double(v) - double(top));
  const double want = double(x[size_t(least)]) - double(top) - std::log(sum);
  const SampleOut out = test::run_alone(
      *e, {.prompt = prompt, .sampling = {.logprobs = 0}, .max_tokens = 1, .forced_output = {least}});
  ASSERT_EQ(out.tokens, std::vector<int32_t>{least});
  EXPECT_NEAR(out.logprobs[0], want, 1e-4) << "the logprob of token " << least << ", not of the sampled token";
}

TEST(Engine, RejectsInvalidRequestsWithInvalidArgument) {
  auto e = test::load_fixture("llama", {.block_size = 4, .max_model_len = 32});
  ASSERT_TRUE(e);
  const std::vector<Request> bad = {
      {.prompt = {}},
      {.prompt = {1, 320}},
      {.prompt = {1, -1}},
      {.prompt = std::vector<int32_t>(30, 1), .max_tokens = 3},  // 33 > max_model_len
      {.prompt = {1}, .max_tokens = 0},
      {.prompt = {1}, .n = 0},
      {.prompt = {1}, .sampling = {.temperature = -1.0f}},
      {.prompt = {1}, .sampling = {.top_p = 0.0f}},
      {.prompt = {1}, .stop_token_ids = {400}},
      {.prompt = {1}, .forced_output = {-2}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const Status s = e->add_request(i, std::make_shared<const Request>(bad[i]));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "case " << i << ": " << s.to_string();
    EXPECT_FALSE(e->has_request(i));
  }
  EXPECT_TRUE(e->idle());
  EXPECT_TRUE(e->add_request(100, std::make_shared<const Request>(Request{.prompt = std::vector<int32_t>(29, 1),
                                                                           .max_tokens = 3}))
                  .ok())
      << "exactly max_model_len";
  Outputs out;
  test::run_until_idle(*e, out);
  EXPECT_EQ(out.at({100, 0}).tokens.size(), 3u);
}

}  // namespace
}  // namespace kiln::runtime
