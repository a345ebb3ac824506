#include "runtime/speculative.h"

#include "core/check.h"

namespace kiln::runtime {

Verification verify_drafts(ops::Backend& backend, const Tensor& rows, Sampler& sampler, std::span<const int32_t> draft) {
  const int32_t k = int32_t(draft.size());
  KILN_CHECK_GE(k, 1) << "verify_drafts without drafts";
  KILN_CHECK_EQ(rows.dim(0), int64_t(k + 1)) << "verify_drafts: rows for " << k << " drafts";
  const size_t n = size_t(k + 1);
  const SamplingParams& sp = sampler.params();
  // Row r is sampled as the sequence's next token would be once d1 .. dr were generated:
  // its penalties count them.
  std::vector<ops::SamplingParams> params(n, sampler.op_params());
  // Row r's draw is the one decoding would make for that token (the sequence's next draws).
  const std::vector<float> uniform = sampler.peek_uniforms(n);
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
  // Each row's token is exactly the one decoding would emit there (the same penalised
  // logits, the same draw; greedy: the argmax): a draft stands while it equals it, and
  // the first disagreeing row's token (or row k's) follows.
  size_t j = 0;
  while (j < size_t(k) && tokens[j] == draft[j]) ++j;
  for (size_t r = 0; r <= j; ++r) emit(r, tokens[r], logprobs.empty() ? 0.0f : logprobs[r]);
  sampler.skip_uniforms(j + 1);
  out.n_accepted = int32_t(j);
  return out;
}

}  // namespace kiln::runtime
