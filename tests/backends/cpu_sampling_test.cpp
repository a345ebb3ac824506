// The CPU reference of the sample op (ops::SampleArgs) and the runtime Sampler over it.
// Expectations come from hand-made logits whose probabilities are known, or from
// double-precision loops written here, never from the backend itself.
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <random>
#include <set>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using ops::SamplingParams;

// One row of host logits as an f32 [1, vocab] tensor.
Tensor row_tensor(std::vector<float> v) {
  return make_tensor(DType::kF32, {1, int64_t(v.size())}, v);
}

// logits = log(p): softmax at temperature 1 gives p back (to fp32 rounding, ~1e-7).
std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> v;
  for (double x : p) v.push_back(float(std::log(x)));
  return v;
}

int32_t sample_one(ops::Backend& be, const Tensor& logits, const SamplingParams& p, float u) {
  int32_t token = -1;
  const SamplingParams params[1] = {p};
  const float uniform[1] = {u};
  be.sample({.logits = logits, .params = params, .uniform = uniform, .tokens = std::span<int32_t>(&token, 1)});
  return token;
}

// The tokens a row can yield: every draw over a fine grid of uniforms (and the largest one).
std::set<int32_t> drawable(ops::Backend& be, const Tensor& logits, const SamplingParams& p) {
  std::set<int32_t> out;
  for (int i = 0; i < 2000; ++i) out.insert(sample_one(be, logits, p, float(i) / 2000.0f));
  out.insert(sample_one(be, logits, p, 1.0f - 0x1p-24f));
  return out;
}

// log_softmax in double.
std::vector<double> log_softmax(const std::vector<float>& v) {
  const double m = *std::max_element(v.begin(), v.end());
  double s = 0.0;
  for (float x : v) s += std::exp(double(x) - m);
  std::vector<double> out;
  for (float x : v) out.push_back(double(x) - m - std::log(s));
  return out;
}

TEST(CpuSampling, GreedyTakesTheLowestIdAmongTiedMaxima) {
  auto be = make_cpu_backend(1);
  EXPECT_EQ(sample_one(*be, row_tensor({1.0f, 3.0f, 2.0f, 3.0f}), {}, 0.5f), 1);
  EXPECT_EQ(sample_one(*be, row_tensor({-1.0f, -0.0f, 0.0f}), {}, 0.5f), 1);  // -0 and +0 tie
  EXPECT_EQ(sample_one(*be, row_tensor({2.0f, 2.0f, 2.0f}), {.temperature = 0.0f, .top_k = 2}, 0.9f), 0);
  // Filters do not apply to greedy rows; -inf is just the smallest logit.
  EXPECT_EQ(sample_one(*be, row_tensor({-INFINITY, 0.5f, 0.25f}), {.top_p = 0.1f, .min_p = 0.9f}, 0.99f), 1);
}

TEST(CpuSampling, TopKOfOneIsGreedyAtAnyTemperatureAndDraw) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> v = random_values(rng, 257, 4.0f);
    for (float& x : v) x = round_to(DType::kBF16, x);  // bf16: ties at the maximum happen
    if (trial % 2) v[200] = *std::max_element(v.begin(), v.end());
    const Tensor t = row_tensor(v);
    const int32_t greedy = sample_one(*be, t, {}, 0.0f);
    for (float u : {0.0f, 0.3f, 0.999f})
      for (float temp : {0.5f, 1.0f, 2.0f})
        EXPECT_EQ(sample_one(*be, t, {.temperature = temp, .top_k = 1}, u), greedy) << trial;
  }
}

TEST(CpuSampling, EachFilterKeepsTheExpectedPrefix) {
  auto be = make_cpu_backend(1);
  // p = 0.1, 0.4, 0.2, 0.3 at temperature 1: the candidate order is 1, 3, 2, 0.
  const Tensor t = row_tensor(log_probs({0.1, 0.4, 0.2, 0.3}));
  auto kept = [&](const SamplingParams& p) { return drawable(*be, t, p); };
  using S = std::set<int32_t>;
  EXPECT_EQ(kept({.temperature = 1.0f}), (S{0, 1, 2, 3}));
  EXPECT_EQ(kept({.temperature = 1.0f, .top_k = 2}), (S{1, 3}));
  EXPECT_EQ(kept({.temperature = 1.0f, .top_k = 4}), (S{0, 1, 2, 3}));
  EXPECT_EQ(kept({.temperature = 1.0f, .top_k = 9}), (S{0, 1, 2, 3}));  // > vocab: off
  // top-p: the shortest prefix with cumulative >= top_p (0.4, 0.7, 0.9, 1.0).
  EXPECT_EQ(kept({.temperature = 1.0f, .top_p = 0.3f}), (S{1}));
  EXPECT_EQ(kept({.temperature = 1.0f, .top_p = 0.65f}), (S{1, 3}));
  EXPECT_EQ(kept({.temperature = 1.0f, .top_p = 0.75f}), (S{1, 3, 2}));
  // top-p after top-k renormalises over the top-k: 0.4/0.9, 0.7/0.9 = 0.78 >= 0.75.
  EXPECT_EQ(kept({.temperature = 1.0f, .top_k = 3, .top_p = 0.75f}), (S{1, 3}));
  // min-p: p >= min_p * p_max (0.4): 0.6 -> >= 0.24; 0.3 -> >= 0.12; 1 -> the maximum only.
  EXPECT_EQ(kept({.temperature = 1.0f, .min_p = 0.6f}), (S{1, 3}));
  EXPECT_EQ(kept({.temperature = 1.0f, .min_p = 0.3f}), (S{1, 3, 2}));
  EXPECT_EQ(kept({.temperature = 1.0f, .min_p = 1.0f}), (S{1}));
  // Temperature 2 flattens p to sqrt(p) / sum: 0.632, 0.548, 0.447, 0.316 of the maximum
  // in candidate order, so min-p 0.6 now keeps three.
  EXPECT_EQ(kept({.temperature = 2.0f, .min_p = 0.6f}), (S{1, 3, 2}));
  // All three: top-k 3, then top-p 0.99 of those keeps 3, then min-p 0.6 keeps 2.
  EXPECT_EQ(kept({.temperature = 1.0f, .top_k = 3, .top_p = 0.99f, .min_p = 0.6f}), (S{1, 3}));
}

TEST(CpuSampling, DrawsJustBelowAndAboveACumulativeBoundary) {
  auto be = make_cpu_backend(1);
  // Candidate order 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1): boundaries at 0.4, 0.7, 0.9.
  const Tensor t = row_tensor(log_probs({0.1, 0.4, 0.2, 0.3}));
  const SamplingParams p{.temperature = 1.0f};
  const float eps = 1e-5f;
  EXPECT_EQ(sample_one(*be, t, p, 0.0f), 1);
  EXPECT_EQ(sample_one(*be, t, p, 0.4f - eps), 1);
  EXPECT_EQ(sample_one(*be, t, p, 0.4f + eps), 3);
  EXPECT_EQ(sample_one(*be, t, p, 0.7f - eps), 3);
  EXPECT_EQ(sample_one(*be, t, p, 0.7f + eps), 2);
  EXPECT_EQ(sample_one(*be, t, p, 0.9f - eps), 2);
  EXPECT_EQ(sample_one(*be, t, p, 0.9f + eps), 0);
  EXPECT_EQ(sample_one(*be, t, p, 1.0f - 0x1p-24f), 0);
  // The draw scales with the kept mass: top-k 2 keeps 0.7, the boundary is 0.4 / 0.7.
  const SamplingParams k2{.temperature = 1.0f, .top_k = 2};
  EXPECT_EQ(sample_one(*be, t, k2, float(0.4 / 0.7) - eps), 1);
  EXPECT_EQ(sample_one(*be, t, k2, float(0.4 / 0.7) + eps), 3);
  // Tied logits: equal shares, in ascending id order (ids 1 and 2 tie behind 0).
  const Tensor tied = row_tensor(log_probs({0.5, 0.25, 0.25}));
  EXPECT_EQ(sample_one(*be, tied, p, 0.75f - eps), 1);
  EXPECT_EQ(sample_one(*be, tied, p, 0.75f + eps), 2);
}

TEST(CpuSampling, DrawsOverAGridOfUniformsFollowTheKeptDistribution) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(11);
  std::vector<float> v = random_values(rng, 50, 2.0f);
  const Tensor t = row_tensor(v);
  const SamplingParams p{.temperature = 0.8f, .top_k = 20};
  // Expected: softmax(v / 0.8) over the 20 largest (no ties in random fp32 values).
  std::vector<int32_t> order(v.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[size_t(a)] > v[size_t(b)]; });
  std::vector<double> expected(v.size(), 0.0);
  double sum = 0.0;
  for (int i = 0; i < 20; ++i) sum += std::exp(double(v[size_t(order[size_t(i)])]) / 0.8);
  for (int i = 0; i < 20; ++i) {
    const size_t id = size_t(order[size_t(i)]);
    expected[id] = std::exp(double(v[id]) / 0.8) / sum;
  }
  const int n = 20000;
  std::vector<double> freq(v.size(), 0.0);
  for (int i = 0; i < n; ++i) freq[size_t(sample_one(*be, t, p, (float(i) + 0.5f) / float(n)))] += 1.0 / n;
  // A grid of n draws places each token's share to within one grid step.
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(freq[i], expected[i], 1.5 / n) << "token " << i;
}

TEST(CpuSampling, LogprobsAreLogSoftmaxOfTheRawLogits) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(5);
  const int rows = 3, vocab = 1000;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<float> v = random_values(rng, rows * vocab, 8.0f);
    const Tensor t = make_tensor(dt, {rows, vocab}, v);  // rounds v to dt
    const std::vector<SamplingParams> params = {
        {}, {.temperature = 0.5f, .top_k = 5}, {.temperature = 2.0f, .top_p = 0.5f}};
    const std::vector<float> uniform = {0.1f, 0.5f, 0.9f};
    std::vector<int32_t> tokens(rows);
    std::vector<float> lp(rows);
    be->sample({.logits = t, .params = params, .uniform = uniform, .tokens = tokens, .logprobs = lp});
    for (int r = 0; r < rows; ++r) {
      const std::vector<float> row(v.begin() + r * vocab, v.begin() + (r + 1) * vocab);
      const std::vector<double> ref = log_softmax(row);
      // Temperature and filters change the draw, never the reported distribution.
      const double want = ref[size_t(tokens[size_t(r)])];
      EXPECT_NEAR(lp[size_t(r)], want, 1e-6 * (1.0 + std::abs(want))) << dtype_name(dt) << " row " << r;
    }
  }
}

TEST(CpuSampling, TopAlternativesAreInCandidateOrderWithTiesByAscendingId) {
  auto be = make_cpu_backend(1);
  const std::vector<float> v = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f, 0.0f, 2.0f};
  const Tensor t = row_tensor(v);
  const std::vector<double> ref = log_softmax(v);
  const SamplingParams params[1] = {{.temperature = 1.0f}};
  const float uniform[1] = {0.5f};
  int32_t token = -1;
  std::vector<int32_t> ids(4);
  std::vector<float> lps(4);
  be->sample({.logits = t, .params = params, .uniform = uniform, .n_top = 4, .tokens = std::span<int32_t>(&token, 1),
              .top_ids = ids, .top_logprobs = lps});
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 2, 4}));
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(lps[size_t(j)], ref[size_t(ids[size_t(j)])], 1e-6);
  EXPECT_EQ(lps[0], lps[1]);
  EXPECT_GT(lps[1], lps[2]);
}

TEST(CpuSampling, RowsAreIndependentOfEachOtherAndOfTheThreadCount) {
  std::mt19937 rng(9);
  const int rows = 17, vocab = 3001;
  std::vector<float> v = random_values(rng, rows * vocab, 5.0f);
  const Tensor t = make_tensor(DType::kBF16, {rows, vocab}, v);
  std::vector<SamplingParams> params;
  std::vector<float> uniform;
  for (int r = 0; r < rows; ++r) {
    params.push_back({.temperature = r % 3 ? 0.7f + 0.1f * float(r) : 0.0f, .top_k = r % 4 ? 0 : 40,
                      .top_p = r % 5 ? 1.0f : 0.9f, .min_p = r % 2 ? 0.05f : 0.0f});
    uniform.push_back(float(r) / float(rows));
  }
  std::vector<int32_t> a(rows), b(rows), ids_a(rows * 3), ids_b(rows * 3);
  std::vector<float> lp_a(rows), lp_b(rows), top_a(rows * 3), top_b(rows * 3);
  make_cpu_backend(1)->sample({.logits = t, .params = params, .uniform = uniform, .n_top = 3, .tokens = a,
                               .logprobs = lp_a, .top_ids = ids_a, .top_logprobs = top_a});
  make_cpu_backend(4)->sample({.logits = t, .params = params, .uniform = uniform, .n_top = 3, .tokens = b,
                               .logprobs = lp_b, .top_ids = ids_b, .top_logprobs = top_b});
  EXPECT_EQ(a, b);
  EXPECT_EQ(lp_a, lp_b);
  EXPECT_EQ(ids_a, ids_b);
  EXPECT_EQ(top_a, top_b);
  auto one = make_cpu_backend(1);
  for (int r = 0; r < rows; ++r) {
    const std::vector<float> row(v.begin() + r * vocab, v.begin() + (r + 1) * vocab);
    EXPECT_EQ(sample_one(*one, row_tensor(row), params[size_t(r)], uniform[size_t(r)]), a[size_t(r)]) << r;
  }
}

// Token masks (structured output): sampling under a mask is sampling the same logits with
// the masked tokens at -inf -- the token, its logprob (of the constrained distribution) and
// the alternatives, bit for bit -- and never yields a masked token; greedy takes the best
// allowed token. Masks dense, sparse, a single token, and all ones (unconstrained).
TEST(CpuSampling, TokenMasksSampleTheLogitsWithTheMaskedAtMinusInfinity) {
  std::mt19937 rng(21);
  const int rows = 24, vocab = 1003;  // not a multiple of 32: the last word is partial
  const size_t words = size_t(ops::token_mask_words(vocab));
  std::vector<float> v = random_values(rng, rows * vocab, 5.0f);
  const Tensor t = make_tensor(DType::kF32, {rows, vocab}, v);
  std::vector<uint32_t> allowed(rows * words, 0u);
  std::vector<float> masked = v;
  std::vector<SamplingParams> params;
  std::vector<float> uniform;
  std::uniform_int_distribution<int> token(0, vocab - 1);
  for (int r = 0; r < rows; ++r) {
    uint32_t* row = allowed.data() + size_t(r) * words;
    switch (r % 4) {
      case 0: for (size_t w = 0; w < words; ++w) row[w] = 0xa5a5f00fu; break;  // dense
      case 1: for (int k = 0; k < 9; ++k) { const int x = token(rng); row[x / 32] |= 1u << (x % 32); } break;
      case 2: { const int x = token(rng); row[x / 32] |= 1u << (x % 32); } break;  // one token
      default: for (size_t w = 0; w < words; ++w) row[w] = ~0u;                 // unconstrained
    }
    for (int i = 0; i < vocab; ++i)
      if (!ops::token_allowed(std::span<const uint32_t>(row, words), i))
        masked[size_t(r * vocab + i)] = -std::numeric_limits<float>::infinity();
    params.push_back({.temperature = r % 3 ? 0.6f + 0.2f * float(r % 5) : 0.0f, .top_k = r % 5 ? 0 : 20,
                      .top_p = r % 7 ? 1.0f : 0.8f, .min_p = r % 2 ? 0.02f : 0.0f});
    uniform.push_back(float(r) / float(rows));
  }
  const Tensor pre = make_tensor(DType::kF32, {rows, vocab}, masked);
  std::vector<int32_t> a(rows), b(rows), ids_a(rows * 4), ids_b(rows * 4);
  std::vector<float> lp_a(rows), lp_b(rows), top_a(rows * 4), top_b(rows * 4);
  auto be = make_cpu_backend(2);
  be->sample({.logits = t, .params = params, .uniform = uniform, .n_top = 4, .tokens = a, .logprobs = lp_a,
              .top_ids = ids_a, .top_logprobs = top_a, .allowed = allowed});
  be->sample({.logits = pre, .params = params, .uniform = uniform, .n_top = 4, .tokens = b, .logprobs = lp_b,
              .top_ids = ids_b, .top_logprobs = top_b});
  EXPECT_EQ(a, b);
  EXPECT_EQ(lp_a, lp_b);
  EXPECT_EQ(ids_a, ids_b);
  EXPECT_EQ(top_a, top_b);
  for (int r = 0; r < rows; ++r) {
    const std::span<const uint32_t> row(allowed.data() + size_t(r) * words, words);
    EXPECT_TRUE(ops::token_allowed(row, a[size_t(r)])) << "row " << r << " sampled masked token " << a[size_t(r)];
    EXPECT_TRUE(std::isfinite(lp_a[size_t(r)])) << "row " << r;
    if (params[size_t(r)].temperature == 0.0f) {  // greedy: the best allowed token
      int best = -1;
      for (int i = 0; i < vocab; ++i)
        if (ops::token_allowed(row, i) && (best < 0 || v[size_t(r * vocab + i)] > v[size_t(r * vocab + best)])) best = i;
      EXPECT_EQ(a[size_t(r)], best) << "row " << r;
    }
    if (r % 4 == 2) {
      EXPECT_EQ(lp_a[size_t(r)], 0.0f) << "a single allowed token has probability 1";
    }
  }
}

// ---- the runtime Sampler ------------------------------------------------------

TEST(RuntimeSampler, SameSeedSameTokensAndTheDrawIsTheSeededUniform) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(2);
  const Tensor t = row_tensor(random_values(rng, 500, 3.0f));
  const runtime::SamplingParams p{.temperature = 1.0f, .top_p = 0.95f, .seed = 42};
  runtime::Sampler a(p), b(p), c({.temperature = 1.0f, .top_p = 0.95f, .seed = 43});
  std::mt19937_64 gen(42);
  std::vector<int32_t> ta, tc;
  for (int i = 0; i < 64; ++i) {
    const int32_t tok = a.sample(*be, t).token;
    EXPECT_EQ(b.sample(*be, t).token, tok) << i;
    // The draw is the top 24 bits of the seeded generator, passed to the sample op.
    const float u = float(gen() >> 40) * 0x1p-24f;
    EXPECT_EQ(sample_one(*be, t, a.op_params(), u), tok) << i;
    ta.push_back(tok);
    tc.push_back(c.sample(*be, t).token);
  }
  EXPECT_NE(ta, tc);
  EXPECT_GT(std::set<int32_t>(ta.begin(), ta.end()).size(), 5u);  // it does sample
}

TEST(RuntimeSampler, ReturnsLogprobsOnlyWhenAsked) {
  auto be = make_cpu_backend(1);
  const std::vector<float> v = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  const Tensor t = row_tensor(v);
  const std::vector<double> ref = log_softmax(v);
  runtime::Sampler none({}), zero({.logprobs = 0}), three({.logprobs = 3});
  const runtime::SampledToken n = none.sample(*be, t), z = zero.sample(*be, t), s = three.sample(*be, t);
  EXPECT_EQ(n.token, 1);
  EXPECT_TRUE(n.top_ids.empty());
  EXPECT_NEAR(z.logprob, ref[1], 1e-6);
  EXPECT_TRUE(z.top_ids.empty());
  EXPECT_EQ(s.top_ids, (std::vector<int32_t>{1, 3, 4}));
  ASSERT_EQ(s.top_logprobs.size(), 3u);
  EXPECT_NEAR(s.top_logprobs[2], ref[4], 1e-6);
}

TEST(RuntimeSampler, InvalidParametersAreRejectedWithTheirName) {
  struct Case {
    runtime::SamplingParams p;
    const char* expect;
  } cases[] = {
      {{.temperature = -0.5f}, "temperature"},
      {{.temperature = NAN}, "temperature"},
      {{.top_k = -1}, "top_k"},
      {{.top_p = 0.0f}, "top_p"},
      {{.top_p = 1.5f}, "top_p"},
      {{.min_p = -0.1f}, "min_p"},
      {{.min_p = 2.0f}, "min_p"},
      {{.logprobs = 21}, "logprobs"},
      {{.logprobs = -2}, "logprobs"},
  };
  for (const Case& c : cases) {
    const Status s = runtime::validate(c.p, 1000);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.expect;
    EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
  }
  EXPECT_FALSE(runtime::validate({.logprobs = 5}, 4).ok());  // more alternatives than the vocabulary
  EXPECT_TRUE(runtime::validate({.temperature = 0.7f, .top_k = 50, .top_p = 1.0f, .min_p = 1.0f, .logprobs = 20},
                                1000).ok());
}

}  // namespace
}  // namespace kiln::cpu
