// Speculative decoding's verification: a sequence with drafts d1..dk runs k + 1 query rows
// [last, d1 .. dk] in one forward pass, and the rows' logits decide how many drafts stand.
//
//   greedy (temperature 0): d_i stands while it is the argmax of row i - 1 (penalties
//     applied as the sampler applies them, with d1 .. d_{i-1} counted as generated); then
//     the target's own token of the first disagreeing row (or of row k) follows. The
//     tokens and logprobs are exactly those of decoding one token per step.
//   temperature > 0: rejection sampling against a point-mass draft (Leviathan et al.
//     2023, Chen et al. 2023): with p row i - 1's final distribution (the sample op's:
//     penalties, temperature, top-k, top-p, min-p), d_i stands with probability p(d_i);
//     otherwise the token is drawn from p with d_i removed, renormalised (max(p - onehot,
//     0)), and verification stops; if all k stand, one more token is drawn from row k.
//     Each emitted token is distributed exactly as p, drawn with the sequence's seeded
//     generator (reproducible, not the same draws as without speculation).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "ops/backend.h"
#include "runtime/sampler.h"

namespace kiln::runtime {

enum class SpeculativeMethod { kOff, kNgram };

// The sample op's final distribution of one row (ops::SampleArgs): the kept candidates in
// candidate order (logit descending, ids ascending on ties) and their probabilities,
// renormalised over the kept ones. Greedy (temperature <= 0): the argmax with p = 1.
struct TargetDistribution {
  std::vector<int32_t> ids;
  std::vector<double> probs;
  double prob(int32_t id) const;
  // The candidate at which the cumulative probability first exceeds u (in [0, 1)), as
  // the sample op draws.
  int32_t draw(double u) const;
};
TargetDistribution target_distribution(std::span<const float> logits, const ops::SamplingParams& p);

struct DraftVerdict {
  bool accepted = false;
  int32_t token = 0;  // the draft when accepted, else the resampled token
};
// One draft against p: uniform() is called once to accept (u < p(draft)), and once more
// to resample from max(p - onehot(draft), 0) renormalised when rejected.
DraftVerdict accept_or_resample(const TargetDistribution& p, int32_t draft, const std::function<float()>& uniform);

struct Verification {
  std::vector<SampledToken> tokens;  // 1 .. k + 1 emitted tokens, in order
  int32_t n_accepted = 0;            // drafts that stood (tokens.size() - 1)
};
// Verifies `draft` (k >= 1 tokens) against rows [k + 1, vocab] of the step's logits: the
// rows of [last, d1 .. dk] (penalised in place, as sample_rows does). Logprobs (the
// sampler's SamplingParams::logprobs) are those of each emitted token. The sampler is
// not advanced: the caller observes each emitted token it keeps.
Verification verify_drafts(ops::Backend& backend, const Tensor& rows, Sampler& sampler, std::span<const int32_t> draft);

}  // namespace kiln::runtime
