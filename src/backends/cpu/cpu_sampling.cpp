// The reference of ops::SampleArgs: the candidates sorted by logit (descending, ids
// ascending on ties), filtered and drawn from in double precision, one row per task.
// Every number is a plain sequential loop, so a row's result depends only on its logits,
// parameters and uniform.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_internal.h"
#include "ops/sampling.h"

namespace kiln::cpu {
namespace {

// The candidate order: logit descending, id ascending on ties (+0 and -0 tie).
struct ByLogitDesc {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// ids of the first n candidates in candidate order.
std::vector<int32_t> first_candidates(const float* logits, int32_t vocab, int32_t n) {
  std::vector<int32_t> ids(size_t(vocab), 0);
  std::iota(ids.begin(), ids.end(), 0);
  if (n == vocab) std::sort(ids.begin(), ids.end(), ByLogitDesc{logits});
  else std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), ByLogitDesc{logits});
  ids.resize(size_t(n));
  return ids;
}

// The sampled token of one row (ops::SampleArgs, the CPU Sampler's algorithm): the
// candidates of ops/sampling.h, drawn where u * kept falls in their cumulative sum.
int32_t sample_row(const float* logits, int32_t vocab, const ops::SamplingParams& params, float uniform) {
  if (!(params.temperature > 0.0f)) {  // greedy: the first maximum is the lowest id
    return int32_t(std::max_element(logits, logits + vocab) - logits);
  }
  const ops::SamplingCandidates c = ops::sampling_candidates(logits, vocab, params);
  const double target = double(uniform) * c.kept;
  double cum = 0.0;
  for (size_t i = 0; i < c.keep; ++i) {
    cum += c.p[i];
    if (target < cum) return c.ids[i];
  }
  return c.ids[c.keep - 1];
}

// log(sum_i exp(logits[i])), shifted by the maximum.
double log_sum_exp(const float* logits, int32_t vocab) {
  const double max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - max_logit);
  return max_logit + std::log(sum);
}

}  // namespace

void CpuBackend::sample(const ops::SampleArgs& a) {
  ops::check_sample_args(a);
  KILN_CHECK(a.logits.device == Device::kHost) << "cpu backend: logits are not in host memory";
  check_float_dtype(a.logits, "logits");
  KILN_CHECK(a.penalties.empty() || a.logits.dtype == DType::kF32) << "cpu backend: penalised logits must be f32";
  const int64_t n_rows = a.logits.dim(0);
  const int32_t vocab = int32_t(a.logits.dim(1));
  const int32_t n_top = a.n_top;
  pool_.parallel_for(n_rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(size_t(vocab), 0.0f);
    for (int64_t r = r0; r < r1; ++r) {
      for (int32_t i = 0; i < vocab; ++i) row[size_t(i)] = load_f32(a.logits, r * vocab + i);
      const size_t ru = size_t(r);
      if (!a.penalties.empty()) {
        for (int32_t e = a.penalty_start[ru]; e < a.penalty_start[ru + 1]; ++e) {
          const int32_t tok = a.penalty_tokens[size_t(e)];
          float x = ops::apply_penalty(row[size_t(tok)], a.penalties[ru], a.penalty_counts[size_t(e)]);
          if (bf16_activations_) x = bf16_to_f32(f32_to_bf16(x));  // as a bf16 pipeline stores it
          row[size_t(tok)] = x;
          a.logits.as<float>()[r * vocab + tok] = x;
        }
      }
      if (!a.allowed.empty()) {  // structured output: the constrained distribution
        const size_t words = size_t(ops::token_mask_words(vocab));
        const auto mask = a.allowed.subspan(ru * words, words);
        for (int32_t i = 0; i < vocab; ++i)
          if (!ops::token_allowed(mask, i)) row[size_t(i)] = -std::numeric_limits<float>::infinity();
      }
      const int32_t tok = sample_row(row.data(), vocab, a.params[ru], a.uniform[ru]);
      a.tokens[ru] = tok;
      if (a.logprobs.empty() && n_top == 0) continue;
      const double lse = log_sum_exp(row.data(), vocab);
      if (!a.logprobs.empty()) a.logprobs[ru] = float(double(row[size_t(tok)]) - lse);
      if (n_top == 0) continue;
      const std::vector<int32_t> top = first_candidates(row.data(), vocab, n_top);
      for (int32_t j = 0; j < n_top; ++j) {
        a.top_ids[ru * size_t(n_top) + size_t(j)] = top[size_t(j)];
        a.top_logprobs[ru * size_t(n_top) + size_t(j)] = float(double(row[size_t(top[size_t(j)])]) - lse);
      }
    }
  });
}

}  // namespace kiln::cpu
