#include "runtime/speculative.h"

#include "core/check.h"

namespace kiln::runtime {

Verification verify_drafts(ops::Backend& backend, const Tensor& rows, Sampler& sampler, std::span<const int32_t> draft,
                           std::span<const uint32_t> allowed) {
  const int32_t k = int32_t(draft.size());
  KILN_CHECK_GE(k, 1) << "verify_drafts without drafts";
  KILN_CHECK_EQ(rows.dim(0), int64_t(k + 1)) << "verify_drafts: rows for " << k << " drafts";
  const size_t n = size_t(k + 1);
  // Row r is sampled as the sequence's next token would be once d1 .. dr were generated:
  // its penalties count them, and its draw is the one decoding would make for that token
  // (the sequence's next draws).
  const std::vector<float> uniform = sampler.peek_uniforms(n);
  SampleCall call;
  for (size_t r = 0; r < n; ++r) call.add(sampler, uniform[r], draft.first(r));
  std::vector<SampledToken> tokens = call.sample(backend, rows, allowed);
  Verification out;
  // Each row's token is exactly the one decoding would emit there (the same penalised
  // logits, the same draw; greedy: the argmax): a draft stands while it equals it, and
  // the first disagreeing row's token (or row k's) follows.
  size_t j = 0;
  while (j < size_t(k) && tokens[j].token == draft[j]) ++j;
  for (size_t r = 0; r <= j; ++r) out.tokens.push_back(std::move(tokens[r]));
  sampler.skip_uniforms(j + 1);
  out.n_accepted = int32_t(j);
  return out;
}

}  // namespace kiln::runtime
