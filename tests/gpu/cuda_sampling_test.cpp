// The CUDA sample op against the CPU reference, both given the same bf16 logits.
//
// Tolerance, derived: the kernel's unnormalised probability e = exp((logit - max) / T) has
// an fp32 argument x with relative error <= 2^-23 (one subtraction, one division) and an
// fp32 exp of 2 ulp, so a relative error <= (|x| + 2) 2^-23 <= 2^-18 for every e it keeps
// (e >= 2^-41, |x| <= 28.4); the 2^-40 fixed-point rounding adds at most vocab * 2^-41 <=
// 2^-23 of the total mass (>= 1), and sums are exact. Every cumulative fraction the kernel
// compares (prefix mass / kept mass) is then within 2 * 2^-18 + 2^-23 < kSampleTol = 2^-16
// of the reference's (double). So a token may differ from the reference only where moving
// the draw by kSampleTol, top_p and min_p by kSampleTol relative, moves the reference's
// token: its position in the candidate order is monotone in the uniform and top_p and
// antitone in min_p, and the two extreme reference calls bound it. Logprobs: log Z has the
// same relative error, and both sides round to fp32 once: kSampleTol + 2^-23 |logprob|.
#include <algorithm>
#include <span>
#include <limits>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cuda/kernels/kernels.h"
#include "gpu/gpu_test_util.h"

namespace kiln {
namespace {

constexpr double kSampleTol = 0x1p-16;

struct Outputs {
  std::vector<int32_t> tokens, top_ids;
  std::vector<float> logprobs, top_logprobs;
};

Outputs run_sample(ops::Backend& be, const Tensor& logits, const std::vector<ops::SamplingParams>& params,
                   const std::vector<float>& uniform, int n_top, std::span<const uint32_t> allowed = {}) {
  const size_t rows = params.size();
  Outputs o{std::vector<int32_t>(rows, -1), std::vector<int32_t>(rows * size_t(n_top), -1),
            std::vector<float>(rows, NAN), std::vector<float>(rows * size_t(n_top), NAN)};
  be.sample({.logits = logits, .params = params, .uniform = uniform, .n_top = n_top, .tokens = o.tokens,
             .logprobs = o.logprobs, .top_ids = o.top_ids, .top_logprobs = o.top_logprobs, .allowed = allowed});
  return o;
}

// Position of `id` in the candidate order (logit descending, ids ascending on ties).
int64_t position(const float* row, int64_t vocab, int32_t id) {
  int64_t n = 0;
  for (int64_t j = 0; j < vocab; ++j) n += row[j] > row[id] || (row[j] == row[id] && j < id);
  return n;
}

double log_sum_exp(const float* row, int64_t vocab) {
  const double m = *std::max_element(row, row + vocab);
  double s = 0.0;
  for (int64_t j = 0; j < vocab; ++j) s += std::exp(double(row[j]) - m);
  return m + std::log(s);
}

bool logprob_close(double got, double ref) {
  return got == ref || std::abs(got - ref) <= kSampleTol + std::abs(ref) * 0x1p-23;  // == : both -inf (masked)
}

class CudaSampling : public gpu_testing::GpuTest {
 protected:
  // Samples `logits` (host fp32 of bf16 values [rows, vocab]) on both backends and checks
  // the GPU's tokens against the reference's perturbation bounds, its logprobs, and its top
  // alternatives. Counts into *ambiguous the rows where the bounds differ (the draw or a
  // filter sits within the tolerance of a boundary) and into *differ those where the token
  // is not the reference's.
  // With token masks (`allowed`), the GPU samples the unmasked logits under the masks and
  // the reference is the CPU on the same logits with the masked ones set to -inf (the
  // masks' contract; the CPU's own masks are checked against that in cpu_sampling_test).
  void check(const Tensor& unmasked, const std::vector<ops::SamplingParams>& params, const std::vector<float>& uniform,
             int n_top, const std::string& what, int* ambiguous = nullptr, int* differ = nullptr,
             std::span<const uint32_t> allowed = {}) {
    const int64_t rows = unmasked.dim(0), vocab = unmasked.dim(1);
    const Tensor device = to_gpu(unmasked);
    const Outputs got = run_sample(*gpu_, device, params, uniform, n_top, allowed);
    Tensor logits = unmasked;
    std::vector<float> masked;
    if (!allowed.empty()) {
      masked.assign(unmasked.as<float>(), unmasked.as<float>() + rows * vocab);
      const size_t words = size_t(ops::token_mask_words(vocab));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < vocab; ++t)
          if (!ops::token_allowed(allowed.subspan(size_t(r) * words, words), t))
            masked[size_t(r * vocab + t)] = -std::numeric_limits<float>::infinity();
      logits = host_tensor(DType::kF32, {rows, vocab});
      std::copy(masked.begin(), masked.end(), logits.as<float>());
    }
    const Outputs ref = run_sample(*cpu_, logits, params, uniform, n_top);
    std::vector<ops::SamplingParams> p_lo = params, p_hi = params;
    std::vector<float> u_lo = uniform, u_hi = uniform;
    for (size_t r = 0; r < params.size(); ++r) {
      const ops::SamplingParams& p = params[r];
      if (p.top_p < 1.0f) {
        p_lo[r].top_p = float(p.top_p * (1.0 - kSampleTol));
        p_hi[r].top_p = float(std::min(1.0, p.top_p * (1.0 + kSampleTol)));
      }
      if (p.min_p > 0.0f) {
        p_lo[r].min_p = float(std::min(1.0, p.min_p * (1.0 + kSampleTol)));
        p_hi[r].min_p = float(p.min_p * (1.0 - kSampleTol));
      }
      u_lo[r] = float(std::max(0.0, uniform[r] - kSampleTol));
      u_hi[r] = float(std::min(1.0 - 0x1p-24, uniform[r] + kSampleTol));
    }
    const Outputs lo = run_sample(*cpu_, logits, p_lo, u_lo, n_top);
    const Outputs hi = run_sample(*cpu_, logits, p_hi, u_hi, n_top);
    for (int64_t r = 0; r < rows; ++r) {
      SCOPED_TRACE(::testing::Message() << what << " row " << r << " vocab " << vocab);
      const float* row = logits.as<float>() + r * vocab;
      const size_t ru = size_t(r);
      const int32_t g = got.tokens[ru];
      ASSERT_TRUE(g >= 0 && g < vocab) << "token " << g;
      const int64_t pos = position(row, vocab, g), a = position(row, vocab, lo.tokens[ru]),
                    b = position(row, vocab, hi.tokens[ru]);
      ASSERT_LE(a, b) << "the reference is not monotone";
      EXPECT_TRUE(a <= pos && pos <= b) << "token " << g << " at position " << pos << "; the reference's token "
                                        << ref.tokens[ru] << " at " << position(row, vocab, ref.tokens[ru])
                                        << ", within the tolerance [" << a << ", " << b << "]";
      if (a == b) {
        EXPECT_EQ(g, ref.tokens[ru]);
      }
      if (ambiguous) *ambiguous += a != b;
      if (differ) *differ += g != ref.tokens[ru];
      const double lse = log_sum_exp(row, vocab);
      EXPECT_TRUE(logprob_close(got.logprobs[ru], double(row[g]) - lse))
          << "logprob " << got.logprobs[ru] << " vs " << double(row[g]) - lse;
      for (int j = 0; j < n_top; ++j) {
        const size_t i = ru * size_t(n_top) + size_t(j);
        EXPECT_EQ(got.top_ids[i], ref.top_ids[i]) << "top " << j;
        EXPECT_TRUE(logprob_close(got.top_logprobs[i], ref.top_logprobs[i]))
            << "top " << j << " logprob " << got.top_logprobs[i] << " vs " << ref.top_logprobs[i];
      }
    }
  }

  std::vector<float> uniforms(int64_t rows) {
    std::uniform_real_distribution<float> d(0.0f, 1.0f);
    std::vector<float> u(static_cast<size_t>(rows));
    for (float& x : u) x = std::min(d(rng_), 1.0f - 0x1p-24f);
    return u;
  }
};

struct Mix {
  const char* name;
  ops::SamplingParams params;
};

const Mix kMixes[] = {
    {"greedy", {}},
    {"temperature 0.7", {.temperature = 0.7f}},
    {"temperature 1.3", {.temperature = 1.3f}},
    {"top-k 1", {.temperature = 1.0f, .top_k = 1}},
    {"top-k 50", {.temperature = 1.0f, .top_k = 50}},
    {"top-p 0.9", {.temperature = 1.0f, .top_p = 0.9f}},
    {"min-p 0.05", {.temperature = 1.0f, .min_p = 0.05f}},
    {"combined", {.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .min_p = 0.05f}},
};

TEST_F(CudaSampling, TokensAndLogprobsMatchCpuAtModelVocabularies) {
  int ambiguous = 0, differ = 0, total = 0;
  for (int64_t vocab : {1000, 151936, 201088}) {
    for (int64_t rows : {1, 3, 17}) {
      // Random logits over [-8, 8]; every third row peaked (a few tokens well above the
      // rest, as a confident model produces), so the filters cut at different depths.
      Tensor logits = random({rows, vocab}, 8.0f);
      for (int64_t r = 0; r < rows; r += 3)
        for (int k = 0; k < 5; ++k) logits.as<float>()[r * vocab + (k * 7919 + r) % vocab] = 12.0f + float(k);
      for (const Mix& m : kMixes) {
        const std::vector<ops::SamplingParams> params(size_t(rows), m.params);
        const std::string what = std::string(m.name) + ", " + std::to_string(rows) + " rows";
        check(logits, params, uniforms(rows), 8, what, &ambiguous, &differ);
        total += int(rows);
        if (HasFatalFailure()) return;
      }
    }
  }
  // At vocab 2e5 a flat row gives each token ~1e-5 of the mass: the tolerance window often
  // spans a boundary, though the kernel almost always lands on the reference's token.
  RecordProperty("rows_within_tolerance_of_a_boundary", std::to_string(ambiguous) + " of " + std::to_string(total));
  RecordProperty("rows_with_another_token", std::to_string(differ) + " of " + std::to_string(total));
}

TEST_F(CudaSampling, ManyExactTiesResolveByAscendingId) {
  // Logits on a grid of 0.5 in [-4, 4]: ~9,000 ids share each value at vocab 151936, so
  // every filter and every draw lands inside a tie, and the top-20 is all ties.
  const int64_t rows = 5, vocab = 151936;
  Tensor logits = host_tensor(DType::kF32, {rows, vocab});
  std::normal_distribution<float> d(0.0f, 1.5f);
  for (int64_t i = 0; i < logits.numel(); ++i)
    logits.as<float>()[i] = std::clamp(std::round(d(rng_) * 2.0f) / 2.0f, -4.0f, 4.0f);
  for (const Mix& m : kMixes) {
    const std::vector<ops::SamplingParams> params(size_t(rows), m.params);
    check(logits, params, uniforms(rows), 20, std::string("ties, ") + m.name);
    if (HasFatalFailure()) return;
  }
  // Greedy: the lowest id holding the maximum.
  const Outputs g = run_sample(*gpu_, to_gpu(logits), std::vector<ops::SamplingParams>(size_t(rows)),
                               std::vector<float>(size_t(rows), 0.5f), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.as<float>() + r * vocab;
    EXPECT_EQ(g.tokens[size_t(r)], int32_t(std::max_element(row, row + vocab) - row)) << r;
  }
}

TEST_F(CudaSampling, OddSmallAndLargeVocabularies) {
  // Odd vocabularies: row starts are not 16-byte aligned (the scalar load path); a
  // vocabulary smaller than one thread's share; and one past 16 tiles of 16384, where the
  // kernel's segments span two tiles.
  for (int64_t vocab : {21, 999, 4097, 100003, 300007}) {
    const int64_t rows = 3;
    Tensor logits = random({rows, vocab}, 6.0f);
    for (const Mix& m : kMixes) {
      const std::vector<ops::SamplingParams> params(size_t(rows), m.params);
      check(logits, params, uniforms(rows), std::min<int>(20, int(vocab)), std::to_string(vocab) + " " + m.name);
      if (HasFatalFailure()) return;
    }
  }
}

// A row over a cluster of 2, 4 or 8 blocks (launch_sample's choice while the batch leaves
// SMs idle) gives the one-block result bit for bit: its sums are integer sums, merged
// over the cluster. Every mix, with and without logprobs and alternatives, ties, odd and
// small vocabularies (blocks of the cluster with no elements), several rows.
TEST_F(CudaSampling, ClustersGiveTheOneBlockResultBitForBit) {
  struct Env {  // KILN_SAMPLE_CLUSTER for the scope
    explicit Env(const char* v) {
      if (const char* was = std::getenv("KILN_SAMPLE_CLUSTER")) before = was;
      setenv("KILN_SAMPLE_CLUSTER", v, 1);
    }
    ~Env() { before.empty() ? unsetenv("KILN_SAMPLE_CLUSTER") : setenv("KILN_SAMPLE_CLUSTER", before.c_str(), 1); }
    std::string before;
  };
  int major = 0, device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "thread-block clusters need SM 9.0+";
  int fits = 1;  // the largest cluster this device runs (8 on a whole H100 / H200 / SM120 card)
  {
    Env e("8");
    fits = cuda::sample_cluster_size(1, 201088);
  }
  // (A whole SM 9.0+ GPU, or even one GPC of it, holds 8: fewer means the rule is broken.)
  ASSERT_GE(fits, 2) << "sample_cluster_size found no cluster of this kernel that fits";
  RecordProperty("largest_cluster", std::to_string(fits));
  std::vector<std::string> sizes;
  for (int c = 2; c <= fits; c *= 2) sizes.push_back(std::to_string(c));
  int compared = 0;
  for (int64_t vocab : {int64_t(999), int64_t(128256), int64_t(151936), int64_t(201088), int64_t(300007)}) {
    for (int64_t rows : {int64_t(1), int64_t(3)}) {
      Tensor host = random({rows, vocab}, 8.0f);
      if (vocab == 151936) {  // ties: every filter and draw inside a run of equal logits
        for (int64_t i = 0; i < host.numel(); ++i) host.as<float>()[i] = std::round(host.as<float>()[i]);
      }
      for (int64_t r = 0; r < rows; r += 2)
        for (int k = 0; k < 5; ++k) host.as<float>()[r * vocab + (k * 7919 + r) % vocab] = 12.0f + float(k);
      const Tensor logits = to_gpu(host);
      for (const Mix& m : kMixes) {
        const std::vector<ops::SamplingParams> params(size_t(rows), m.params);
        const std::vector<float> u = uniforms(rows);
        for (int n_top : {0, 20}) {
          Outputs one;
          {
            Env e("1");
            one = run_sample(*gpu_, logits, params, u, n_top);
          }
          for (const std::string& c : sizes) {
            Env e(c.c_str());
            const Outputs got = run_sample(*gpu_, logits, params, u, n_top);
            SCOPED_TRACE(::testing::Message() << m.name << ", vocab " << vocab << ", " << rows << " rows, n_top "
                                              << n_top << ", cluster " << c);
            EXPECT_EQ(got.tokens, one.tokens);
            EXPECT_EQ(got.top_ids, one.top_ids);
            for (size_t i = 0; i < one.logprobs.size(); ++i)  // (NaN where not asked: compared as bits)
              EXPECT_EQ(std::memcmp(&got.logprobs[i], &one.logprobs[i], sizeof(float)), 0) << "logprob " << i;
            for (size_t i = 0; i < one.top_logprobs.size(); ++i)
              EXPECT_EQ(std::memcmp(&got.top_logprobs[i], &one.top_logprobs[i], sizeof(float)), 0) << "top " << i;
            ++compared;
            if (HasFailure()) return;
          }
        }
        // Tokens alone (no logprobs buffer): greedy rows take the kernel's early return.
        std::vector<int32_t> one(static_cast<size_t>(rows)), got(static_cast<size_t>(rows));
        {
          Env e("1");
          gpu_->sample({.logits = logits, .params = params, .uniform = u, .tokens = one});
        }
        for (const std::string& c : sizes) {
          Env e(c.c_str());
          gpu_->sample({.logits = logits, .params = params, .uniform = u, .tokens = got});
          EXPECT_EQ(got, one) << m.name << ", tokens only, vocab " << vocab << ", cluster " << c;
        }
      }
    }
  }
  RecordProperty("cluster_runs_compared", std::to_string(compared));
}

TEST_F(CudaSampling, IsDeterministicAndRecordsItsTime) {
  const int64_t rows = 17, vocab = 201088;
  const Tensor logits = to_gpu(random({rows, vocab}, 8.0f));
  const std::vector<ops::SamplingParams> params(size_t(rows), kMixes[7].params);
  const std::vector<float> u = uniforms(rows);
  const Outputs a = run_sample(*gpu_, logits, params, u, 20), b = run_sample(*gpu_, logits, params, u, 20);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.logprobs, b.logprobs);
  EXPECT_EQ(a.top_ids, b.top_ids);
  EXPECT_EQ(a.top_logprobs, b.top_logprobs);
  // Wall time of one call (upload of the parameters, the kernel, the copy back).
  for (int64_t n : {int64_t(1), rows}) {
    const Tensor part = logits.slice0(0, n);
    const std::vector<ops::SamplingParams> p(size_t(n), kMixes[7].params);
    const std::vector<float> un(u.begin(), u.begin() + n);
    const int reps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) run_sample(*gpu_, part, p, un, 20);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
    RecordProperty("us_per_call_vocab_201088_rows_" + std::to_string(n), std::to_string(us));
  }
}

// Penalties (repetition, presence, frequency) rewrite the listed logits in place before
// sampling: each rewritten bf16 logit is the formula of ops::apply_penalty on the stored
// value, rounded once to bf16, and greedy then picks the reference's token.
// Structured output's token masks at the model vocabularies: dense masks (half the
// tokens), sparse ones (a handful, as a JSON grammar allows after `{"`), and a single
// allowed token, under every sampling mix: the GPU's tokens, logprobs and alternatives are
// the CPU's on the logits with the masked ones at -inf, and never a masked token.
TEST_F(CudaSampling, TokenMasksSampleTheConstrainedDistribution) {
  for (int64_t vocab : {int64_t(151936), int64_t(201088), int64_t(1000)}) {
    const int64_t rows = int64_t(std::size(kMixes)) * 3;
    const Tensor logits = random({rows, vocab}, 8.0f);
    const size_t words = size_t(ops::token_mask_words(vocab));
    std::vector<uint32_t> allowed(size_t(rows) * words, 0u);
    std::vector<ops::SamplingParams> params;
    std::uniform_int_distribution<int64_t> any_token(0, vocab - 1);
    for (int64_t r = 0; r < rows; ++r) {
      params.push_back(kMixes[size_t(r) % std::size(kMixes)].params);
      uint32_t* row = allowed.data() + size_t(r) * words;
      const int kind = int(r / int64_t(std::size(kMixes)));
      if (kind == 0) {  // dense: every other word's bits
        for (size_t w = 0; w < words; ++w) row[w] = w % 2 == 0 ? 0x5555aaaau : 0u;
        row[0] |= 1u;
      } else {  // sparse (12 tokens) or one token
        for (int k = 0; k < (kind == 1 ? 12 : 1); ++k) {
          const int64_t t = any_token(rng_);
          row[size_t(t / 32)] |= 1u << (t % 32);
        }
      }
    }
    int ambiguous = 0, differ = 0;
    check(logits, params, uniforms(rows), 5, "masked vocab " + std::to_string(vocab), &ambiguous, &differ, allowed);
    std::printf("token masks, vocab %lld: %d of %lld rows near a boundary, %d differ\n", (long long)vocab, ambiguous,
                (long long)rows, differ);
  }
}

TEST_F(CudaSampling, PenaltiesRewriteTheListedLogitsExactly) {
  const int64_t rows = 4, vocab = 5000;
  Tensor logits = random({rows, vocab}, 6.0f);
  std::vector<ops::PenaltyParams> penalties = {
      {.repetition = 1.3f}, {.presence = 0.7f, .frequency = 0.4f}, {}, {.repetition = 0.8f, .frequency = -0.5f}};
  std::vector<int32_t> start = {0}, tokens, counts;
  std::mt19937 rng(7);
  for (int64_t r = 0; r < rows; ++r) {
    // The row's current best tokens among them, so the penalties move the argmax.
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int32_t j = 0; j < vocab; ++j) order[size_t(j)] = j;
    const float* row = logits.as<float>() + r * vocab;
    std::partial_sort(order.begin(), order.begin() + 6, order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    std::vector<int32_t> seen(order.begin(), order.begin() + 6);
    for (int k = 0; k < 30; ++k) seen.push_back(int32_t(rng() % vocab));
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      tokens.push_back(t);
      counts.push_back(int32_t(rng() % 4));
    }
    start.push_back(int32_t(tokens.size()));
  }
  const std::vector<ops::SamplingParams> greedy(static_cast<size_t>(rows));
  const std::vector<float> uniform(size_t(rows), 0.5f);
  auto run = [&](ops::Backend& be, Tensor& t) {
    std::vector<int32_t> out(size_t(rows), -1);
    be.sample({.logits = t, .params = greedy, .uniform = uniform, .tokens = out, .penalties = penalties,
               .penalty_start = start, .penalty_tokens = tokens, .penalty_counts = counts});
    return out;
  };
  Tensor device = to_gpu(logits);
  Tensor host = host_tensor(DType::kF32, logits.shape);  // the CPU reference penalises its copy in place
  std::copy(logits.as<float>(), logits.as<float>() + logits.numel(), host.as<float>());
  const std::vector<int32_t> got = run(*gpu_, device), want = run(*cpu_, host);
  EXPECT_EQ(got, want);
  const std::vector<float> after = from_gpu(device);
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t e = start[size_t(r)]; e < start[size_t(r + 1)]; ++e) {
      const int64_t at = r * vocab + tokens[size_t(e)];
      const float want_logit =
          gpu_testing::bf16_round(ops::apply_penalty(logits.as<float>()[at], penalties[size_t(r)], counts[size_t(e)]));
      EXPECT_EQ(after[size_t(at)], want_logit) << "row " << r << " token " << tokens[size_t(e)];
    }
  }
  // Unlisted logits are untouched.
  std::vector<bool> listed(static_cast<size_t>(rows * vocab), false);
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t e = start[size_t(r)]; e < start[size_t(r + 1)]; ++e) listed[size_t(r * vocab + tokens[size_t(e)])] = true;
  int64_t changed = 0;
  for (int64_t i = 0; i < rows * vocab; ++i) changed += !listed[size_t(i)] && after[size_t(i)] != logits.as<float>()[i];
  EXPECT_EQ(changed, 0);
}

}  // namespace
}  // namespace kiln
