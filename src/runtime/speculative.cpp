#include "runtime/speculative.h"

#include <algorithm>

#include "core/check.h"

namespace kiln::runtime {

Verification verify_drafts(ops::Backend& backend, const Tensor& rows, Sampler& sampler, std::span<const int32_t> draft,
                           std::span<const uint32_t> allowed) {
  const VerifyRows one{.sampler = &sampler, .draft = draft, .allowed = allowed};
  return std::move(verify_drafts(backend, rows, std::span(&one, 1))[0]);
}

std::vector<Verification> verify_drafts(ops::Backend& backend, const Tensor& rows, std::span<const VerifyRows> seqs) {
  const int64_t words = ops::token_mask_words(rows.dim(1));
  const bool masked = std::any_of(seqs.begin(), seqs.end(), [](const VerifyRows& v) { return !v.allowed.empty(); });
  // Row r of a sequence is sampled as its next token would be once d1 .. dr were
  // generated: its penalties count them, and its draw is the one decoding would make for
  // that token (the sequence's next draws).
  SampleCall call;
  std::vector<uint32_t> allowed;  // with any constrained sequence: a mask for every row, all ones where unconstrained
  int64_t n_rows = 0;
  for (const VerifyRows& v : seqs) {
    const size_t k = v.draft.size();
    KILN_CHECK_GE(k, size_t(1)) << "verify_drafts without drafts";
    const std::vector<float> uniform = v.sampler->peek_uniforms(k + 1);
    for (size_t r = 0; r <= k; ++r) call.add(*v.sampler, uniform[r], v.draft.first(r));
    n_rows += int64_t(k + 1);
    if (!masked) continue;
    if (v.allowed.empty()) {
      allowed.resize(allowed.size() + (k + 1) * size_t(words), ~0u);
    } else {
      KILN_CHECK_EQ(v.allowed.size(), (k + 1) * size_t(words)) << "verify_drafts: token masks for " << k << " drafts";
      allowed.insert(allowed.end(), v.allowed.begin(), v.allowed.end());
    }
  }
  KILN_CHECK_EQ(rows.dim(0), n_rows) << "verify_drafts: rows for " << seqs.size() << " sequences' drafts";
  std::vector<SampledToken> tokens = call.sample(backend, rows, allowed);
  std::vector<Verification> out(seqs.size());
  size_t first = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::span<const int32_t> draft = seqs[i].draft;
    // Each row's token is exactly the one decoding would emit there (the same penalised
    // logits, the same draw; greedy: the argmax): a draft stands while it equals it, and
    // the first disagreeing row's token (or row k's) follows.
    size_t j = 0;
    while (j < draft.size() && tokens[first + j].token == draft[j]) ++j;
    for (size_t r = 0; r <= j; ++r) out[i].tokens.push_back(std::move(tokens[first + r]));
    seqs[i].sampler->skip_uniforms(j + 1);
    out[i].n_accepted = int32_t(j);
    first += draft.size() + 1;
  }
  return out;
}

}  // namespace kiln::runtime
