#include "runtime/speculative.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "ops/sampling.h"

namespace kiln::runtime {
namespace {

// log_softmax(logits)[token], in the sample op's order of operations (double, the maximum
// subtracted, a sequential sum), so a logprob computed here equals the op's.
float log_softmax_at(std::span<const float> logits, int32_t token) {
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x) - max_logit);
  return float(double(logits[size_t(token)]) - (max_logit + std::log(sum)));
}

}  // namespace

double TargetDistribution::prob(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return probs[i];
  return 0.0;
}

int32_t TargetDistribution::draw(double u) const {
  double cum = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cum += probs[i];
    if (u < cum) return ids[i];
  }
  return ids.back();
}

TargetDistribution target_distribution(std::span<const float> logits, const ops::SamplingParams& params) {
  const int32_t vocab = int32_t(logits.size());
  KILN_CHECK_GT(vocab, 0) << "target_distribution: empty row";
  TargetDistribution out;
  if (!(params.temperature > 0.0f)) {
    out.ids = {int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    out.probs = {1.0};
    return out;
  }
  // The sample op's candidates and filters (ops/sampling.h), renormalised over the kept.
  const ops::SamplingCandidates c = ops::sampling_candidates(logits.data(), vocab, params);
  out.ids.assign(c.ids.begin(), c.ids.begin() + long(c.keep));
  out.probs.resize(c.keep);
  for (size_t i = 0; i < c.keep; ++i) out.probs[i] = c.p[i] / c.kept;
  return out;
}

DraftVerdict accept_or_resample(const TargetDistribution& p, int32_t draft, const std::function<float()>& uniform) {
  const double p_draft = p.prob(draft);
  if (double(uniform()) < p_draft) return {.accepted = true, .token = draft};
  // The residual max(p - onehot(draft), 0): p without the draft, renormalised.
  const double rest = 1.0 - p_draft;
  const double target = double(uniform()) * rest;
  double cum = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    if (p.ids[i] == draft) continue;
    last = p.ids[i];
    cum += p.probs[i];
    if (target < cum) return {.accepted = false, .token = p.ids[i]};
  }
  // Rounding left the target at the very end (or p was the draft alone, which u < 1
  // always accepts): the last candidate that is not the draft.
  return {.accepted = false, .token = last >= 0 ? last : draft};
}

Verification verify_drafts(ops::Backend& backend, const Tensor& rows, Sampler& sampler, std::span<const int32_t> draft) {
  const int32_t k = int32_t(draft.size());
  KILN_CHECK_GE(k, 1) << "verify_drafts without drafts";
  KILN_CHECK_EQ(rows.dim(0), int64_t(k + 1)) << "verify_drafts: rows for " << k << " drafts";
  const size_t n = size_t(k + 1), vocab = size_t(rows.dim(1));
  const SamplingParams& sp = sampler.params();
  // Row r is sampled as the sequence's next token would be once d1 .. dr were generated:
  // its penalties count them.
  std::vector<ops::SamplingParams> params(n, sampler.op_params());
  std::vector<float> uniform(n, 0.0f);  // greedy needs none; other draws are made below
  std::vector<ops::PenaltyParams> penalties;
  std::vector<int32_t> penalty_start, penalty_tokens, penalty_counts;
  if (sp.has_penalties()) {
    penalty_start.push_back(0);
    for (size_t r = 0; r < n; ++r) {
      penalties.push_back({.repetition = sp.repetition_penalty, .presence = sp.presence_penalty,
                           .frequency = sp.frequency_penalty});
      sampler.penalty_list(penalty_tokens, penalty_counts, draft.first(r));
      penalty_start.push_back(int32_t(penalty_tokens.size()));
    }
  }
  const int32_t n_top = std::max(0, sp.logprobs);
  std::vector<int32_t> tokens(n), top_ids(n * size_t(n_top));
  std::vector<float> logprobs(sp.logprobs >= 0 ? n : 0), top_logprobs(n * size_t(n_top));
  backend.sample({.logits = rows,
                  .params = params,
                  .uniform = uniform,
                  .n_top = n_top,
                  .tokens = tokens,
                  .logprobs = logprobs,
                  .top_ids = top_ids,
                  .top_logprobs = top_logprobs,
                  .penalties = penalties,
                  .penalty_start = penalty_start,
                  .penalty_tokens = penalty_tokens,
                  .penalty_counts = penalty_counts});
  Verification out;
  const auto emit = [&](size_t r, int32_t token, float logprob) {
    SampledToken t{.token = token};
    if (sp.logprobs >= 0) {
      t.logprob = logprob;
      const auto first = long(r * size_t(n_top));
      t.top_ids.assign(top_ids.begin() + first, top_ids.begin() + first + n_top);
      t.top_logprobs.assign(top_logprobs.begin() + first, top_logprobs.begin() + first + n_top);
    }
    out.tokens.push_back(std::move(t));
  };
  if (!(sp.temperature > 0.0f)) {  // greedy: the op's argmax of each row
    size_t j = 0;
    while (j < size_t(k) && tokens[j] == draft[j]) ++j;
    for (size_t r = 0; r <= j; ++r) emit(r, tokens[r], logprobs.empty() ? 0.0f : logprobs[r]);
    out.n_accepted = int32_t(j);
    return out;
  }
  std::vector<float> host(n * vocab);  // the penalised logits
  backend.to_host_f32(rows, host.data());
  const auto row = [&](size_t r) { return std::span<const float>(host.data() + r * vocab, vocab); };
  const auto next_uniform = [&sampler] { return sampler.next_uniform(); };
  for (size_t r = 0; r < size_t(k); ++r) {
    const DraftVerdict v = accept_or_resample(target_distribution(row(r), params[r]), draft[r], next_uniform);
    emit(r, v.token, sp.logprobs >= 0 ? log_softmax_at(row(r), v.token) : 0.0f);
    if (!v.accepted) return out;
    ++out.n_accepted;
  }
  const int32_t bonus = target_distribution(row(size_t(k)), params[size_t(k)]).draw(double(sampler.next_uniform()));
  emit(size_t(k), bonus, sp.logprobs >= 0 ? log_softmax_at(row(size_t(k)), bonus) : 0.0f);
  return out;
}

}  // namespace kiln::runtime
