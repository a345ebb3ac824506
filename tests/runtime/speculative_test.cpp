// Speculative decoding on the CPU reference (runtime/speculative.h, ngram_drafter.h): the
// n-gram drafter, verification's distribution at temperature > 0, and engines with n-gram drafts
// giving exactly the tokens and logprobs of engines without them.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "delegating_backend.h"
#include "engine_test_util.h"
#include "runtime/ngram_drafter.h"
#include "backends/cpu/cpu_backend.h"
#include "ops/sampling.h"
#include "runtime/adaptive_depth.h"
#include "runtime/speculative.h"

namespace kiln::runtime {
namespace {

using test::Outputs;

TEST(NgramDraft, ProposesWhatFollowedTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  // ... 7 8 9 | 1 2 3 4 | 7 8 9 | 5 6 | 8 9: "8 9" last followed by 5 (the latest), but
  // the 3-gram "7 8 9"? no: the suffix is "6 8 9", absent; "8 9" is found at 8..9.
  const std::vector<int32_t> t = {7, 8, 9, 1, 2, 3, 4, 7, 8, 9, 5, 6, 8, 9};
  EXPECT_EQ(ngram_draft(t, 3), (std::vector<int32_t>{5, 6, 8}));
  EXPECT_EQ(ngram_draft(t, 1), (std::vector<int32_t>{5}));
  // The 3-gram wins over a later 1-gram.
  const std::vector<int32_t> u = {1, 2, 3, 10, 11, 3, 12, 1, 2, 3};
  EXPECT_EQ(ngram_draft(u, 2), (std::vector<int32_t>{10, 11}));
  // Short continuations are cut at the end of the tokens.
  const std::vector<int32_t> v = {4, 5, 4};
  EXPECT_EQ(ngram_draft(v, 5), (std::vector<int32_t>{5, 4}));
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 3}, 3).empty());
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1}, 3).empty());
  EXPECT_TRUE(ngram_draft(t, 0).empty());
}

// Pearson's chi-square of counts against probabilities (cells with p > 0), and whether
// any count fell where p = 0.
struct ChiSquare {
  double stat = 0.0;
  int dof = 0;
  bool outside_support = false;
};
ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  ChiSquare c;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0) {
      c.outside_support = c.outside_support || counts[i] != 0;
      continue;
    }
    const double e = p[i] * double(n);
    c.stat += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++c.dof;
  }
  --c.dof;
  return c;
}
// The chi-square distribution's upper 0.001 quantiles, by degrees of freedom.
double chi_square_critical_0001(int dof) {
  static const double q[] = {0.0, 10.828, 13.816, 16.266, 18.467, 20.515};
  KILN_CHECK(dof >= 1 && dof <= 5) << "dof " << dof;
  return q[dof];
}

// Verification at temperature > 0 samples each row with the draw decoding would make
// there and keeps a draft while it equals the sampled token: over many seeds the first
// emitted token is distributed as p and the draft stands with probability p(draft).
// 100,000 seeds per case; the chi-square test fails at significance 0.001 (the seeds are
// fixed, so it passes or fails for good).
TEST(SpeculativeVerify, EmittedTokensFollowTheTargetDistributionForLikelyAndUnlikelyDrafts) {
  auto be = cpu::make_cpu_backend(1);
  const std::vector<float> logits = {2.0f, 1.2f, 0.3f, -0.5f, 1.0f, -2.0f};  // 6 tokens
  const int32_t vocab = int32_t(logits.size());
  Tensor rows = be->alloc(DType::kF32, {2, vocab});  // [last, d1]: the same logits twice
  std::vector<float> two(logits);
  two.insert(two.end(), logits.begin(), logits.end());
  struct Case {
    SamplingParams params;
    int32_t draft;
  };
  const std::vector<Case> cases = {
      {{.temperature = 1.0f}, 0},                 // the likeliest token (p ~ 0.45)
      {{.temperature = 1.0f}, 5},                 // an unlikely one (p ~ 0.012)
      {{.temperature = 0.7f, .top_k = 4}, 3},     // the least likely kept
      {{.temperature = 1.3f, .top_p = 0.8f}, 2},  // outside the kept set: never accepted
      {{.temperature = 1.0f, .min_p = 0.2f}, 1},
  };
  const int64_t n = 100000;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    Sampler probe(c.params);
    const ops::SamplingCandidates cand = ops::sampling_candidates(logits.data(), vocab, probe.op_params());
    std::vector<double> p(logits.size(), 0.0);
    for (size_t i = 0; i < cand.keep; ++i) p[size_t(cand.ids[i])] = cand.p[i] / cand.kept;
    std::vector<int64_t> counts(logits.size(), 0);
    int64_t accepted = 0;
    for (int64_t i = 0; i < n; ++i) {
      SamplingParams sp = c.params;
      sp.seed = 1000003 * ci + uint64_t(i);
      Sampler sampler(sp);
      be->from_host_f32(two.data(), rows);
      const int32_t draft[] = {c.draft};
      const Verification v = verify_drafts(*be, rows, sampler, draft);
      ASSERT_FALSE(v.tokens.empty());
      ++counts[size_t(v.tokens[0].token)];
      EXPECT_EQ(v.n_accepted == 1, v.tokens[0].token == c.draft);
      accepted += v.n_accepted;
    }
    const ChiSquare chi = chi_square(counts, p, n);
    EXPECT_FALSE(chi.outside_support) << "case " << ci;
    EXPECT_LT(chi.stat, chi_square_critical_0001(chi.dof)) << "case " << ci << ", " << chi.dof << " dof";
    // The acceptance rate is p(draft), within 5 standard deviations.
    const double pd = p[size_t(c.draft)], sd = std::sqrt(pd * (1.0 - pd) / double(n));
    EXPECT_NEAR(double(accepted) / double(n), pd, 5.0 * sd + 1e-12) << "case " << ci;
  }
}

// A step's verifications in one call equal one call per sequence: tokens, logprobs, the
// accepted counts and each sampler's draws afterwards, for greedy and sampled rows,
// penalties counting the drafts before each row, and one sequence's rows masked (the
// others then get all-ones masks).
TEST(SpeculativeVerify, OneCallForAllSequencesEqualsOneCallEach) {
  auto be = cpu::make_cpu_backend(1);
  const int32_t vocab = 40;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const std::vector<SamplingParams> params = {
      {.temperature = 0.0f, .logprobs = 2},
      {.temperature = 0.9f, .seed = 11, .logprobs = 0},
      {.temperature = 0.0f, .repetition_penalty = 1.5f},
      {.temperature = 1.2f, .top_k = 6, .seed = 12, .presence_penalty = 0.5f, .frequency_penalty = 0.3f},
      {.temperature = 0.7f, .top_p = 0.9f, .seed = 13, .logprobs = 3},
  };
  std::vector<std::vector<int32_t>> drafts;
  std::vector<std::vector<float>> logits;
  for (size_t i = 0; i < params.size(); ++i) {
    const int32_t k = 1 + int32_t(i % 3);
    std::vector<float> l(size_t((k + 1) * vocab));
    for (float& x : l) x = normal(rng);
    std::vector<int32_t> d;
    // Drafts of each row's argmax for the first rows (they stand when greedy), then a miss.
    for (int32_t r = 0; r < k; ++r) {
      const auto row = l.begin() + long(r * vocab);
      d.push_back(r + 1 < k ? int32_t(std::max_element(row, row + vocab) - row) : (r * 7 + 3) % vocab);
    }
    drafts.push_back(d);
    logits.push_back(l);
  }
  // Sequence 3's rows may take only even tokens.
  const int64_t words = ops::token_mask_words(vocab);
  std::vector<uint32_t> even(size_t(int64_t(drafts[3].size() + 1) * words), 0);
  for (int64_t r = 0; r <= int64_t(drafts[3].size()); ++r)
    for (int32_t t = 0; t < vocab; t += 2) even[size_t(r * words + t / 32)] |= 1u << (t % 32);
  const auto allowed = [&](size_t i) { return i == 3 ? std::span<const uint32_t>(even) : std::span<const uint32_t>(); };
  const auto make_samplers = [&] {
    std::vector<Sampler> s;
    for (const SamplingParams& p : params) {
      s.emplace_back(p);
      for (int32_t t : {1, 2, 2, 5}) s.back().observe_generated(t);  // penalties have something to count
    }
    return s;
  };
  std::vector<Sampler> one = make_samplers(), all = make_samplers();
  std::vector<Verification> want;
  std::vector<float> flat;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor rows = be->alloc(DType::kF32, {int64_t(drafts[i].size() + 1), vocab});
    be->from_host_f32(logits[i].data(), rows);
    want.push_back(verify_drafts(*be, rows, one[i], drafts[i], allowed(i)));
    flat.insert(flat.end(), logits[i].begin(), logits[i].end());
  }
  Tensor rows = be->alloc(DType::kF32, {int64_t(flat.size() / vocab), vocab});
  be->from_host_f32(flat.data(), rows);
  std::vector<VerifyRows> seqs;
  for (size_t i = 0; i < params.size(); ++i)
    seqs.push_back({.sampler = &all[i], .draft = drafts[i], .allowed = allowed(i)});
  const std::vector<Verification> got = verify_drafts(*be, rows, seqs);
  ASSERT_EQ(got.size(), want.size());
  int32_t accepted = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].n_accepted, want[i].n_accepted) << "sequence " << i;
    accepted += got[i].n_accepted;
    ASSERT_EQ(got[i].tokens.size(), want[i].tokens.size()) << "sequence " << i;
    for (size_t t = 0; t < want[i].tokens.size(); ++t) {
      EXPECT_EQ(got[i].tokens[t].token, want[i].tokens[t].token) << "sequence " << i << " token " << t;
      EXPECT_EQ(got[i].tokens[t].logprob, want[i].tokens[t].logprob) << "sequence " << i << " token " << t;
      EXPECT_EQ(got[i].tokens[t].top_ids, want[i].tokens[t].top_ids) << "sequence " << i << " token " << t;
      EXPECT_EQ(got[i].tokens[t].top_logprobs, want[i].tokens[t].top_logprobs) << "sequence " << i << " token " << t;
      if (i == 3) {
        EXPECT_EQ(got[i].tokens[t].token % 2, 0) << "a masked row's token";
      }
    }
    EXPECT_EQ(all[i].next_uniform(), one[i].next_uniform()) << "sequence " << i << "'s draws afterwards";
  }
  EXPECT_GT(accepted, 0);  // some drafts stood, some did not
  EXPECT_LT(accepted, int32_t(drafts[0].size() + drafts[1].size() + drafts[2].size() + drafts[3].size() + drafts[4].size()));
}

// Prompts that repeat themselves (a phrase four times, then a little noise), so that
// drafts are proposed from the start and accepted where the model continues the pattern.
std::vector<int32_t> repetitive_prompt(int32_t i) {
  const std::vector<int32_t> phrase = test::random_tokens(3 + i % 5, 500 + uint32_t(i));
  std::vector<int32_t> p;
  for (int r = 0; r < 4; ++r) p.insert(p.end(), phrase.begin(), phrase.end());
  const std::vector<int32_t> tail = test::random_tokens(i % 3, 900 + uint32_t(i));
  p.insert(p.end(), tail.begin(), tail.end());
  return p;
}

std::vector<Request> greedy_requests(int32_t n) {
  std::vector<Request> out;
  for (int32_t i = 0; i < n; ++i) {
    SamplingParams p{.seed = uint64_t(i), .logprobs = 2};
    if (i % 3 == 1) p.repetition_penalty = 1.3f;  // penalties count accepted drafts
    if (i % 5 == 2) p = {.seed = p.seed, .logprobs = -1, .presence_penalty = 0.4f, .frequency_penalty = 0.2f};
    out.push_back({.prompt = repetitive_prompt(i), .sampling = p, .max_tokens = 10 + i % 9,
                   .stop_token_ids = i % 4 == 3 ? std::vector<int32_t>{int32_t(7 * i % 320)} : std::vector<int32_t>{},
                   .ignore_eos = i % 2 == 0});
  }
  return out;
}

// Fixed depth K unless adaptive (runtime/adaptive_depth.h: the depth then depends on
// measured step times, so only outputs, not draft counts, are checked under it).
// Runs `requests` (ids 0, 1, ...) with a step after every second one is added, so that the
// later ones join while the earlier decode (drafted and undrafted rows in one step).
Outputs run_joining(Engine& e, const std::vector<Request>& requests) {
  Outputs got;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(e.add_request(i, std::make_shared<const Request>(requests[i])).ok()) << "request " << i;
    if (i % 2 == 1) test::collect(got, e.step());
  }
  test::run_until_idle(e, got);
  return got;
}

EngineOptions spec_options(EngineOptions o, int32_t k, bool adaptive = false) {
  o.speculative_method = SpeculativeMethod::kNgram;
  o.num_speculative_tokens = k;
  o.speculative_adaptive = adaptive;
  return o;
}

void expect_same(const Outputs& got, const Outputs& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, w] : want) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << what << ": request " << key.first << " missing";
    EXPECT_EQ(it->second.tokens, w.tokens) << what << ": request " << key.first;
    EXPECT_EQ(it->second.logprobs, w.logprobs) << what << ": request " << key.first;
    EXPECT_EQ(it->second.finish, w.finish) << what << ": request " << key.first;
    EXPECT_EQ(it->second.n_finish, 1) << what << ": request " << key.first;
  }
}

void report_acceptance(const std::string& what, const EngineStats& s) {
  std::printf("[ spec     ] %s: %lld of %lld drafted tokens accepted (%.1f%%) in %lld verifications\n", what.c_str(),
              (long long)s.spec_accepted_tokens, (long long)s.spec_draft_tokens,
              s.spec_draft_tokens > 0 ? 100.0 * double(s.spec_accepted_tokens) / double(s.spec_draft_tokens) : 0.0,
              (long long)s.spec_verified_seqs);
}

class SpeculativeFixture : public ::testing::TestWithParam<std::string> {};

// Greedy outputs (tokens, logprobs, finish reasons, with penalties, stop ids and
// max_tokens) with n-gram drafts equal those without, with requests of one batch at
// different stages (prefill chunks beside drafted and undrafted decodes); drafts were
// both accepted and rejected; every block is free at the end.
TEST_P(SpeculativeFixture, GreedyOutputsEqualThoseWithoutSpeculationUnderBatching) {
  const EngineOptions base{.block_size = 4, .max_model_len = 64, .prefill_chunk = 8, .max_num_seqs = 16,
                           .max_num_batched_tokens = 48};
  auto plain = test::load_fixture(GetParam(), base);
  auto spec = test::load_fixture(GetParam(), spec_options(base, 3));
  ASSERT_TRUE(plain && spec);
  const std::vector<Request> requests = greedy_requests(12);
  const Outputs want = test::run_together(*plain, requests);
  const Outputs got = run_joining(*spec, requests);
  expect_same(got, want, GetParam());
  const EngineStats s = spec->stats();
  report_acceptance(GetParam(), s);
  // (The Gated DeltaNet fixtures' random weights never repeat themselves, so no n-gram draft
  // of theirs stands: SpeculativeRecurrent below drafts them from an oracle.)
  if (GetParam() != "qwen3_next" && GetParam() != "qwen3_5_moe") {
    EXPECT_GT(s.spec_accepted_tokens, 0) << "no draft was accepted";
  }
  EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens) << "no draft was rejected";
  EXPECT_EQ(s.generated_tokens, plain->stats().generated_tokens);
  EXPECT_EQ(s.kv_blocks_used, 0);
  // Steps by kind: every step counted once; steps with drafts and no prefill are verify
  // steps (none without drafts), each computing more tokens than it has sequences.
  EXPECT_EQ(s.decode_steps.steps + s.verify_steps.steps + s.mixed_steps.steps, s.steps);
  EXPECT_EQ(s.decode_steps.tokens + s.verify_steps.tokens + s.mixed_steps.tokens, s.computed_tokens);
  EXPECT_EQ(plain->stats().verify_steps.steps, 0);
  EXPECT_GT(s.verify_steps.steps, 0) << "every draft verified beside a prefill chunk";
  EXPECT_GT(s.verify_steps.tokens, s.verify_steps.steps);
}

// A KV cache of 12 blocks for 8 requests: sequences are preempted (drafts dropped,
// recomputed later) and the outputs are still those of a large cache without drafts.
TEST_P(SpeculativeFixture, GreedyOutputsEqualUnderPreemption) {
  const std::vector<Request> requests = greedy_requests(8);
  auto big = test::load_fixture(GetParam(), {.block_size = 4, .max_model_len = 48, .max_num_seqs = 16});
  ASSERT_TRUE(big);
  const Outputs want = test::run_together(*big, requests);
  const int64_t bytes_token = big->kv_cache_bytes() / big->kv_capacity_tokens();
  for (bool caching : {true, false}) {
    auto small = test::load_fixture(
        GetParam(), spec_options({.block_size = 4, .max_model_len = 48, .max_num_seqs = 16,
                                  .enable_prefix_caching = caching, .kv_cache_bytes = bytes_token * 48},
                                 4));
    ASSERT_TRUE(small);
    const Outputs got = test::run_together(*small, requests);
    expect_same(got, want, GetParam() + (caching ? " caching" : " no caching"));
    EXPECT_GT(small->stats().preemptions, 0);
    EXPECT_GT(small->stats().spec_draft_tokens, 0);
    EXPECT_EQ(small->stats().kv_blocks_used, 0);
  }
}

// A second turn (the first turn's prompt and answer, then more) takes the first turn's
// blocks from the prefix cache after its drafts were rolled back: the hashes cover only
// accepted tokens, so it gets what an engine without caching or drafts computes.
TEST_P(SpeculativeFixture, PrefixCacheHitsAfterRollbacksAreCorrect) {
  const EngineOptions base{.block_size = 4, .max_model_len = 96};
  auto spec = test::load_fixture(GetParam(), spec_options(base, 3));
  EngineOptions off = base;
  off.enable_prefix_caching = false;
  auto plain = test::load_fixture(GetParam(), off);
  ASSERT_TRUE(spec && plain);
  std::vector<Request> first = greedy_requests(4);
  for (Request& r : first) r.stop_token_ids.clear(), r.ignore_eos = true, r.max_tokens = 16;
  const Outputs turn1 = test::run_together(*spec, first);
  expect_same(turn1, test::run_together(*plain, first), GetParam() + " turn 1");
  std::vector<Request> second;
  for (size_t i = 0; i < first.size(); ++i) {
    Request r = first[i];
    const std::vector<int32_t>& answer = turn1.at({i, 0}).tokens;
    r.prompt.insert(r.prompt.end(), answer.begin(), answer.end());
    const std::vector<int32_t> more = test::random_tokens(5, 77 + uint32_t(i));
    r.prompt.insert(r.prompt.end(), more.begin(), more.end());
    r.max_tokens = 8;
    second.push_back(r);
  }
  const int64_t hits_before = spec->stats().prefix_hit_tokens;
  const Outputs turn2 = test::run_together(*spec, second, 100);
  EXPECT_GT(spec->stats().prefix_hit_tokens - hits_before, int64_t(4 * 16)) << "the first turns were cached";
  expect_same(turn2, test::run_together(*plain, second, 100), GetParam() + " turn 2");
  EXPECT_EQ(spec->stats().kv_blocks_used, 0);
}

// The fixture's longest golden prompt (the 2026 fixtures' 80-token prompt_xlong, else
// prompt_long), alone and as n = 2 samples sharing its blocks: greedy tokens and logprobs
// as without drafts, over positions past the sliding windows and DSA's top-k.
TEST_P(SpeculativeFixture, LongestGoldenPromptGivesTheSameGreedyOutputs) {
  const nlohmann::json golden = testing::read_json(testing::fixture_dir(GetParam()) + "/golden.json");
  const std::vector<int32_t> prompt =
      golden[golden.contains("prompt_xlong") ? "prompt_xlong" : "prompt_long"].get<std::vector<int32_t>>();
  const EngineOptions base{.block_size = 8, .max_model_len = 128};
  auto plain = test::load_fixture(GetParam(), base);
  auto spec = test::load_fixture(GetParam(), spec_options(base, 4));
  ASSERT_TRUE(plain && spec);
  const std::vector<Request> requests = {
      {.prompt = prompt, .sampling = {.logprobs = 3}, .max_tokens = 24, .ignore_eos = true},
      {.prompt = prompt, .sampling = {.logprobs = 0, .repetition_penalty = 1.1f}, .max_tokens = 24, .n = 2}};
  expect_same(test::run_together(*spec, requests), test::run_together(*plain, requests), GetParam() + " longest prompt");
  report_acceptance(GetParam() + " longest prompt", spec->stats());
  EXPECT_GT(spec->stats().spec_draft_tokens, 0);
  EXPECT_EQ(spec->stats().kv_blocks_used, 0);
}

// Adaptive depth: whatever depths the policy picks from this machine's timings (its
// warm-up runs K-token drafts, then k = 0 or probes on the compute-bound reference),
// greedy outputs equal those without speculation, over a batch joining mid-way and the
// fixture's longest golden prompt.
TEST_P(SpeculativeFixture, GreedyOutputsEqualUnderAdaptiveDepth) {
  const EngineOptions base{.block_size = 4, .max_model_len = 128, .prefill_chunk = 8, .max_num_seqs = 16,
                           .max_num_batched_tokens = 48};
  auto plain = test::load_fixture(GetParam(), base);
  auto spec = test::load_fixture(GetParam(), spec_options(base, 3, /*adaptive=*/true));
  ASSERT_TRUE(plain && spec);
  std::vector<Request> requests = greedy_requests(8);
  const nlohmann::json golden = testing::read_json(testing::fixture_dir(GetParam()) + "/golden.json");
  requests.push_back({.prompt = golden[golden.contains("prompt_xlong") ? "prompt_xlong" : "prompt_long"]
                                    .get<std::vector<int32_t>>(),
                      .sampling = {.logprobs = 2},
                      .max_tokens = 40,
                      .ignore_eos = true});
  const Outputs want = test::run_together(*plain, requests);
  const Outputs got = run_joining(*spec, requests);
  expect_same(got, want, GetParam() + " adaptive");
  const EngineStats s = spec->stats();
  report_acceptance(GetParam() + " adaptive", s);
  std::printf("[ spec     ] %s adaptive: mean depth %.2f over %lld steps with drafts\n", GetParam().c_str(),
              double(s.spec_depth_total) / double(std::max<int64_t>(1, s.spec_depth_steps)),
              (long long)s.spec_depth_steps);
  EXPECT_GT(s.spec_depth_steps, 0);
  EXPECT_LE(s.spec_depth_total, 3 * s.spec_depth_steps);
  EXPECT_EQ(s.generated_tokens, plain->stats().generated_tokens);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpeculativeFixture,
                         ::testing::Values("llama", "qwen3", "qwen3_moe", "glm4_moe", "deepseek_v3", "kimi_k2",
                                           "gpt_oss", "gpt_oss_d64", "deepseek_v3_mla", "minimax_m2",
                                           "deepseek_v32", "glm_moe_dsa", "qwen3_next", "qwen3_5_moe"),
                         [](const auto& info) { return info.param; });

// Sampling at temperature > 0 with drafts gives exactly the tokens and logprobs of decoding
// without them (same seeds), at fixed and adaptive depth, with every filter and penalty;
// stop conditions honoured, blocks freed.
TEST(Speculative, SampledOutputsEqualThoseWithoutSpeculation) {
  std::vector<Request> requests;
  for (int32_t i = 0; i < 10; ++i) {
    // Low temperatures: the tiny random models then loop as they do greedily, so drafts
    // are proposed and often accepted.
    SamplingParams p{.temperature = 0.05f + 0.05f * float(i % 4), .seed = 40 + uint64_t(i), .logprobs = 1};
    if (i % 3 == 0) p.top_k = 5;
    if (i % 3 == 1) p.top_p = 0.8f;
    if (i % 4 == 2) p.min_p = 0.1f;
    if (i % 5 == 4) p.repetition_penalty = 1.2f;
    requests.push_back({.prompt = repetitive_prompt(i), .sampling = p, .max_tokens = 20, .ignore_eos = true});
  }
  // Fixed depth 3, adaptive depth, and no speculation: the same tokens and logprobs.
  Outputs out[3];
  EngineStats stats[3];
  const EngineOptions base{.block_size = 4, .max_model_len = 64};
  const EngineOptions options[3] = {spec_options(base, 3), spec_options(base, 3, /*adaptive=*/true), base};
  for (int run = 0; run < 3; ++run) {
    auto e = test::load_fixture("qwen3", options[run]);
    ASSERT_TRUE(e);
    out[run] = test::run_together(*e, requests);
    stats[run] = e->stats();
    EXPECT_EQ(stats[run].kv_blocks_used, 0);
  }
  report_acceptance("qwen3 sampled", stats[0]);
  EXPECT_GT(stats[0].spec_accepted_tokens, 0);
  EXPECT_LT(stats[0].spec_accepted_tokens, stats[0].spec_draft_tokens) << "some drafts were rejected";
  for (size_t i = 0; i < requests.size(); ++i) {
    const test::SampleOut& o = out[0].at({i, 0});
    EXPECT_EQ(o, out[1].at({i, 0})) << "request " << i << ", adaptive depth";
    EXPECT_EQ(o, out[2].at({i, 0})) << "request " << i << ", without speculation";
    EXPECT_EQ(o.tokens.size(), 20u) << "request " << i;
    EXPECT_EQ(o.finish, FinishReason::kLength);
    for (float lp : o.logprobs) EXPECT_LE(lp, 0.0f);
  }
}

// Gated DeltaNet models keep a recurrent state that a verify step advances over every
// draft; the state after the last draft that stood is restored from the step's snapshots.
// The fixtures' random weights never repeat themselves, so n-gram drafts never stand there
// (the tests above): here an oracle drafts the plain run's own next tokens, the j-th of a
// step's k drafts wrong in turn (j = 1 .. k, or none), so every count of accepted drafts
// occurs. Greedy requests with penalties, stop ids and lengths (greedy_requests) in one
// batch with prefill chunks, prefix caching on, then their second halves again over the
// cached prefixes: the tokens and logprobs of decoding without drafts. llama (no recurrent
// layer) as the control.
TEST(SpeculativeRecurrent, TheStateAfterTheLastAcceptedDraftIsRestored) {
  for (const char* fixture : {"qwen3_next", "qwen3_5_moe", "llama"}) {
    EngineOptions base{.block_size = 4, .max_model_len = 64, .prefill_chunk = 8, .max_num_seqs = 16,
                       .max_num_batched_tokens = 48};
    base.state_checkpoints = 256;  // every block boundary's state kept
    const std::vector<Request> requests = greedy_requests(10);
    auto plain = test::load_fixture(fixture, base);
    ASSERT_TRUE(plain);
    const Outputs want = test::run_together(*plain, requests);
    // Request i's whole text: its prompt and the tokens it emitted.
    std::map<uint64_t, std::vector<int32_t>> text;
    for (const auto& [key, out] : want) {
      std::vector<int32_t>& t = text[key.first];
      t = requests[size_t(key.first)].prompt;
      t.insert(t.end(), out.tokens.begin(), out.tokens.end());
    }
    int calls = 0;
    EngineOptions o = spec_options(base, 3);
    o.speculative_test_drafter = [&](uint64_t id, std::span<const int32_t> tokens, int32_t k) {
      std::vector<int32_t> d;
      const std::vector<int32_t>& t = text.at(id % 1000);
      for (size_t p = tokens.size(); p < t.size() && int32_t(d.size()) < k; ++p) d.push_back(t[p]);
      const int32_t wrong = calls++ % (k + 1);  // 0: none
      if (wrong > 0 && wrong <= int32_t(d.size())) d[size_t(wrong - 1)] = (d[size_t(wrong - 1)] + 1) % 300;
      return d;
    };
    auto spec = test::load_fixture(fixture, o);
    ASSERT_TRUE(spec);
    expect_same(test::run_together(*spec, requests), want, std::string(fixture) + ", oracle drafts");
    const EngineStats s = spec->stats();
    report_acceptance(std::string(fixture) + ", oracle drafts", s);
    EXPECT_GT(s.spec_accepted_tokens, s.spec_draft_tokens / 4) << fixture;
    EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens) << fixture;
    EXPECT_EQ(s.kv_blocks_used, 0) << fixture;
    // The same requests again (ids 1000 + i): their prompts' cached blocks resume from the
    // state checkpoints the first run wrote, some of them after restores.
    const Outputs again = test::run_together(*spec, requests, 1000);
    Outputs shifted;
    for (const auto& [key, out] : again) shifted[{key.first - 1000, key.second}] = out;
    expect_same(shifted, want, std::string(fixture) + ", oracle drafts over cached prefixes");
    EXPECT_GT(spec->stats().prefix_hit_tokens, 0) << fixture;
  }
}

// A backend whose first two steps of each batch shape are slow (as a GPU's first, eager
// run and its CUDA graph recording are) and which says so through one_time_steps() when
// `tell` is set.
class SlowFirstShapes final : public testing::DelegatingBackend {
 public:
  explicit SlowFirstShapes(bool tell) : DelegatingBackend(cpu::make_cpu_backend(1)), tell_(tell) {}
  Tensor run_step(const ops::BatchMeta& b, uint64_t key, const std::function<Tensor()>& ops) override {
    if (seen_[{b.n_tokens(), b.n_seqs(), int32_t(b.logit_rows.size())}]++ < 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kSlowMs));
      ++one_time_;
    }
    return inner_->run_step(b, key, ops);
  }
  int64_t one_time_steps() const override { return tell_ ? one_time_ : 0; }
  static constexpr int kSlowMs = 150;

 private:
  bool tell_;
  int64_t one_time_ = 0;
  std::map<std::tuple<int32_t, int32_t, int32_t>, int> seen_;
};

// Steps with a one-time cost (ops::Backend::one_time_steps) stay out of the depth policy's
// step-cost line: with the backend telling, the line prices a decode step of the batch at
// what the CPU takes (a few ms on this fixture); untold, the warm-up's slow first steps of
// each shape (150 ms) put it far above (the control).
TEST(SpeculativeDepth, OneTimeStepsStayOutOfTheStepCostLine) {
  std::vector<Request> requests;
  for (int32_t i = 0; i < 4; ++i) requests.push_back({.prompt = repetitive_prompt(i), .max_tokens = 24, .ignore_eos = true});
  for (bool tell : {true, false}) {
    auto e = Engine::load(testing::fixture_dir("llama"), std::make_unique<SlowFirstShapes>(tell),
                          spec_options({.block_size = 4, .max_model_len = 64, .max_num_seqs = 4}, 3, /*adaptive=*/true));
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    const Outputs out = test::run_together(**e, requests);
    ASSERT_EQ(out.size(), requests.size());
    const AdaptiveDepth* depth = (*e)->speculation_depth();
    ASSERT_NE(depth, nullptr);
    const StepCostModel line = depth->cost_model(4);
    ASSERT_TRUE(line.known) << "decode and verify steps were timed";
    const double decode_ms = 1e3 * line.seconds(4.0);
    std::printf("backend %s its one-time steps: a decode step of 4 rows priced at %.1f ms\n", tell ? "tells" : "hides",
                decode_ms);
    if (tell) EXPECT_LT(decode_ms, SlowFirstShapes::kSlowMs / 5.0);
    else EXPECT_GT(decode_ms, SlowFirstShapes::kSlowMs / 5.0) << "the control: slow first steps priced in";
  }
}

// A backend that records every step's shape: (rows, sequences, logit rows).
class ShapeRecorder final : public testing::DelegatingBackend {
 public:
  ShapeRecorder() : DelegatingBackend(cpu::make_cpu_backend(1)) {}
  Tensor run_step(const ops::BatchMeta& b, uint64_t key, const std::function<Tensor()>& ops) override {
    shapes.emplace_back(b.n_tokens(), b.n_seqs(), int32_t(b.logit_rows.size()));
    return inner_->run_step(b, key, ops);
  }
  std::vector<std::tuple<int32_t, int32_t, int32_t>> shapes;
};

// n greedy requests on the llama fixture, without drafts and then with K = 3 oracle drafts
// (the tokens decoding emitted, request i at most max_drafts(i) of them) on a backend that
// records every step's shape: the tokens must be the same. Returns the shapes and the
// drafts accepted.
struct OracleRun {
  std::vector<std::tuple<int32_t, int32_t, int32_t>> shapes;
  int64_t accepted = 0;
};
OracleRun run_with_oracle_drafts(int32_t n, const std::function<int32_t(uint64_t)>& max_drafts,
                                 const std::string& what) {
  const EngineOptions base{.block_size = 4, .max_model_len = 64, .max_num_seqs = 4, .max_num_batched_tokens = 48};
  std::vector<Request> requests;
  for (int32_t i = 0; i < n; ++i)
    requests.push_back({.prompt = repetitive_prompt(i), .max_tokens = 20, .ignore_eos = true});
  auto plain = test::load_fixture("llama", base);
  EXPECT_TRUE(plain);
  if (!plain) return {};
  const Outputs want = test::run_together(*plain, requests);
  std::map<uint64_t, std::vector<int32_t>> text;  // request i's prompt and emitted tokens
  for (const auto& [key, out] : want) {
    std::vector<int32_t>& t = text[key.first];
    t = requests[size_t(key.first)].prompt;
    t.insert(t.end(), out.tokens.begin(), out.tokens.end());
  }
  EngineOptions o = spec_options(base, 3);
  o.speculative_test_drafter = [&](uint64_t id, std::span<const int32_t> tokens, int32_t k) {
    std::vector<int32_t> d;
    const std::vector<int32_t>& t = text.at(id);
    for (size_t p = tokens.size(); p < t.size() && int32_t(d.size()) < std::min(k, max_drafts(id)); ++p)
      d.push_back(t[p]);
    return d;
  };
  auto recorder = std::make_unique<ShapeRecorder>();
  const ShapeRecorder* shapes = recorder.get();
  auto spec = Engine::load(testing::fixture_dir("llama"), std::move(recorder), o);
  EXPECT_TRUE(spec.ok()) << spec.status().to_string();
  if (!spec.ok()) return {};
  expect_same(test::run_together(**spec, requests), want, what);
  return {.shapes = shapes->shapes, .accepted = (*spec)->stats().spec_accepted_tokens};
}

// A verify step in which every sequence verifies the same number of drafts runs padded to
// decode_bucket(n) sequences of K + 1 rows (build_step_batch), like a decode step, and the
// tokens are those of decoding without drafts: three requests with 3 oracle drafts a step,
// padded to four sequences of 4 rows, every row a logit row.
TEST(SpeculativeBatch, UniformVerifyStepsRunPaddedAndGiveTheSameTokens) {
  const OracleRun run = run_with_oracle_drafts(3, [](uint64_t) { return 3; }, "llama, oracle drafts");
  const auto n_padded = std::count(run.shapes.begin(), run.shapes.end(), std::make_tuple(16, 4, 16));
  std::printf("%zu steps, %td verify steps padded to 4 sequences of 4 rows\n", run.shapes.size(), n_padded);
  EXPECT_GT(n_padded, 0) << "no verify step of 3 sequences padded to 4 of 4 rows";
  EXPECT_EQ(std::count(run.shapes.begin(), run.shapes.end(), std::make_tuple(12, 3, 12)), 0)
      << "a uniform verify step of 3 sequences ran unpadded";
  EXPECT_GT(run.accepted, 0);
}

// Verify steps whose sequences verify different numbers of drafts run padded too (each
// sequence to K + 1 rows, build_step_batch's pad_any_verify), and the tokens are those of
// decoding without drafts: request i's oracle proposes 3 - i tokens (3, 2, 1 and none).
TEST(SpeculativeBatch, VerifyStepsOfDifferentDraftCountsRunPaddedAndGiveTheSameTokens) {
  const OracleRun run = run_with_oracle_drafts(4, [](uint64_t id) { return 3 - int32_t(id); },
                                               "llama, oracle drafts of 3, 2, 1 and no tokens");
  int64_t padded = 0, unpadded = 0;
  for (const auto& [rows, seqs, logit_rows] : run.shapes) {
    // Decode steps, and those that run prompts (a logit row a sequence at most), aside:
    // in a step whose sequences all decode every row is a logit row.
    if (rows == seqs || logit_rows != rows) continue;
    const bool bucketed = seqs == decode_bucket(seqs) && rows % seqs == 0;
    (bucketed ? padded : unpadded) += 1;
    if (!bucketed) std::printf("an unpadded verify step: %d rows, %d sequences, %d logit rows\n", rows, seqs, logit_rows);
  }
  std::printf("%zu steps, %lld verify steps padded\n", run.shapes.size(), (long long)padded);
  EXPECT_GT(padded, 0);
  EXPECT_EQ(unpadded, 0) << "a verify step of sequences that all decode ran unpadded";
  EXPECT_GT(run.accepted, 0);
}

TEST(Speculative, ZeroDraftTokensAreRefusedAtLoad) {
  auto z = Engine::load(testing::fixture_dir("llama"), cpu::make_cpu_backend(1),
                        spec_options({.block_size = 4, .max_model_len = 64}, 0));
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("num-speculative-tokens"), std::string::npos) << z.status().to_string();
}

}  // namespace
}  // namespace kiln::runtime
