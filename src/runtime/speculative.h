// Speculative decoding's verification: a sequence with drafts d1..dk runs k + 1 query rows
// [last, d1 .. dk] in one forward pass, and the rows' logits decide how many drafts stand.
//
//   greedy (temperature 0): d_i stands while it is the argmax of row i - 1 (penalties
//     applied as the sampler applies them, with d1 .. d_{i-1} counted as generated); then
//     the target's own token of the first disagreeing row (or of row k) follows. The
//     tokens and logprobs are exactly those of decoding one token per step.
//   temperature > 0: row i - 1 is sampled with exactly the draw decoding would make for
//     that token (the sequence's next uniforms, Sampler::peek_uniforms) on the same
//     penalised logits, and d_i stands while it equals the sampled token. So a draft
//     stands with probability p(d_i) (what rejection sampling against a point-mass draft
//     accepts with, Leviathan et al. 2023), and the emitted tokens and logprobs are the
//     ones decoding without speculation gives with the same seed, token for token, at
//     any draft length (so adaptive depth and batching never change a sampled result).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "ops/backend.h"
#include "runtime/sampler.h"

namespace kiln::runtime {

// kNgram: prompt lookup (runtime/ngram_drafter.h); kMtp: the checkpoint's multi-token
// prediction layer (model::MtpLayer), run after each step for the next one's drafts.
enum class SpeculativeMethod { kOff, kNgram, kMtp };

struct Verification {
  std::vector<SampledToken> tokens;  // 1 .. k + 1 emitted tokens, in order
  int32_t n_accepted = 0;            // drafts that stood (tokens.size() - 1)
};
// Verifies `draft` (k >= 1 tokens) against rows [k + 1, vocab] of the step's logits: the
// rows of [last, d1 .. dk] (penalised in place, as sample_rows does). Logprobs (the
// sampler's SamplingParams::logprobs) are those of each emitted token. The sampler's
// generator advances one draw per emitted token, as decoding's does; its penalty memory
// and matcher do not: the caller observes each emitted token it keeps. A constrained
// sampler's rows are masked by `allowed` (Sampler::fill_draft_masks of these drafts),
// so each row's token is what the constrained decoding would sample there.
Verification verify_drafts(ops::Backend& backend, const Tensor& rows, Sampler& sampler, std::span<const int32_t> draft,
                           std::span<const uint32_t> allowed = {});

// One sequence's part of a step's verification: its sampler, drafts and (constrained) masks.
struct VerifyRows {
  Sampler* sampler = nullptr;
  std::span<const int32_t> draft;     // k >= 1
  std::span<const uint32_t> allowed;  // (k + 1) mask rows, or empty: unconstrained
};
// verify_drafts for several sequences in one backend call (one sample launch and one
// read-back a step, not one per sequence): `rows` holds each sequence's k + 1 rows after
// the previous one's. Results in the order of `seqs`, each as verify_drafts gives it.
std::vector<Verification> verify_drafts(ops::Backend& backend, const Tensor& rows, std::span<const VerifyRows> seqs);

}  // namespace kiln::runtime
