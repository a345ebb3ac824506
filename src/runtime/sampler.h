// Token sampling through the backend's sample op (ops::SampleArgs): penalties on the
// tokens a sequence has seen, then greedy at temperature 0, otherwise temperature, top-k,
// top-p and min-p filtering, then a draw. Each sequence has its own Sampler: its seeded
// generator draws the uniform of each token on the host (same seed, same logits -> same
// tokens, whatever else is in the batch), and its counts feed the penalties. Only token ids
// and logprobs leave the device.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/backend.h"

namespace kiln::grammar {
class CompiledGrammar;
class Matcher;
class MaskCache;
class SharedMaskCache;
class TokenMasker;
}  // namespace kiln::grammar

namespace kiln::runtime {

// Structured output: the grammar every sample of a request follows, with the model's
// vocabulary as the grammar engine needs it (the caller builds both: src/grammar and
// Tokenizer::token_bytes). The masker is built without an end-of-sequence id: the sampler
// allows the sequence's own end ids once the output is complete.
struct OutputConstraint {
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  std::shared_ptr<const grammar::TokenMasker> masker;
  std::shared_ptr<const std::vector<std::string>> token_bytes;  // id -> bytes ("" for specials)
  // Masks shared by every sequence of this grammar (and by later requests where the caller
  // keeps it with the compiled grammar); null: each sequence's own cache only.
  std::shared_ptr<grammar::SharedMaskCache> shared_masks;
};

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  int32_t logprobs = -1;     // -1: none; 0..ops::kMaxTopLogprobs: the chosen token's
                             // logprob and that many top alternatives
  float repetition_penalty = 1.0f;  // 1: off; on prompt and generated tokens
  float presence_penalty = 0.0f;    // 0: off; on generated tokens
  float frequency_penalty = 0.0f;   // 0: off; on generated tokens, per occurrence

  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// invalid_argument unless temperature >= 0, top_k >= 0, top_p in (0, 1], min_p in
// [0, 1], logprobs in [-1, min(kMaxTopLogprobs, vocab)], repetition_penalty > 0 and the
// penalties are finite.
[[nodiscard]] Status validate(const SamplingParams& p, int64_t vocab);

// One sampled token, with its logprobs when SamplingParams::logprobs >= 0.
struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;              // log_softmax(logits)[token]
  std::vector<int32_t> top_ids;      // [logprobs] logprob descending, ids ascending on ties
  std::vector<float> top_logprobs;   // [logprobs]
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  ~Sampler();
  Sampler(Sampler&&) noexcept;
  Sampler& operator=(Sampler&&) noexcept;

  // Samples one token from logits [1, vocab] (backend activation tensor) on `backend`.
  SampledToken sample(ops::Backend& backend, const Tensor& logits);

  // The next draw in [0, 1): the top 24 bits of one generator output, exact in fp32
  // (so the value the backend sees is the value drawn). One per sampled token.
  float next_uniform() { return float(rng_() >> 40) * 0x1p-24f; }
  // The next n draws without taking them, and taking n (speculative verification: the
  // draws of the tokens it emits are exactly those decoding one token per step makes).
  std::vector<float> peek_uniforms(size_t n) const {
    std::mt19937_64 ahead = rng_;
    std::vector<float> u(n);
    for (float& x : u) x = float(ahead() >> 40) * 0x1p-24f;
    return u;
  }
  void skip_uniforms(size_t n) {
    for (size_t i = 0; i < n; ++i) rng_();
  }

  // The per-row parameters of the sample op.
  ops::SamplingParams op_params() const {
    return {.temperature = params_.temperature, .top_k = params_.top_k, .top_p = params_.top_p,
            .min_p = params_.min_p};
  }
  const SamplingParams& params() const { return params_; }

  // The penalties' memory: tokens of the prompt, then each generated token.
  void observe_prompt(std::span<const int32_t> tokens);
  void observe_generated(int32_t token);
  // Appends this sequence's penalty list (distinct seen tokens, ascending, with their
  // generated counts) for the sample op; `then_generated` counted as generated after what
  // was observed (speculative drafts, runtime/speculative.h).
  void penalty_list(std::vector<int32_t>& tokens, std::vector<int32_t>& counts,
                    std::span<const int32_t> then_generated = {}) const;

  // Structured output: from now on every sample follows c's grammar (a matcher advanced by
  // each generated token); end_ids (the sequence's end-of-sequence and stop ids) are
  // allowed exactly when the output so far is complete.
  void constrain(std::shared_ptr<const OutputConstraint> c, std::vector<int32_t> end_ids);
  bool constrained() const { return matcher_ != nullptr; }
  // The next sample's token mask into row (ops::SampleArgs::allowed, zeroed by the caller,
  // at least the masker's words). If no token fits, which a vocabulary holding every
  // single byte never meets, the end ids; with none of those either, every token (logged).
  // Memoized in this sampler's own mask cache (grammar/token_mask.h), so samplers of
  // different sequences may fill their masks on different threads at once.
  void fill_mask(std::span<uint32_t> row);
  // The constrained output is complete and nothing may follow it: the sequence ends.
  bool grammar_done() const;
  // Speculative drafts of a constrained sequence: how many leading tokens of `draft` the
  // grammar takes from where the matcher stands (a token of no bytes, an end id or one the
  // grammar rejects ends the run); all of them when unconstrained. The matcher is left
  // where it was.
  size_t grammar_prefix(std::span<const int32_t> draft);
  // The masks of the rows verifying `draft` (grammar_prefix of all of it): row i
  // (token_mask_words(vocab) words at rows[i * words]) is the mask after draft[0, i), as
  // fill_mask would give it once those were generated. The matcher is left where it was.
  void fill_draft_masks(std::span<const int32_t> draft, std::span<uint32_t> rows, size_t words);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> seen_;  // token -> times generated (0: prompt only)
  std::shared_ptr<const OutputConstraint> constraint_;
  std::unique_ptr<grammar::Matcher> matcher_;  // null: unconstrained
  std::unique_ptr<grammar::MaskCache> mask_cache_;
  std::vector<int32_t> end_ids_;
};

// Structured output: the token masks of the next sample of `samplers` over a vocabulary
// of `vocab` ids (rows of ops::token_mask_words(vocab) words, all ones for unconstrained
// samplers), or empty when none is constrained. The constrained rows are filled on up to
// `max_threads` threads. The engine computes them while the step's forward pass runs.
std::vector<uint32_t> token_masks(std::span<Sampler* const> samplers, int64_t vocab, int max_threads = 4);

// The rows of one sample op call (ops::SampleArgs) and what each asks for; add() a row at a
// time, then sample(). Shared by sample_rows and speculative verification.
class SampleCall {
 public:
  // A row sampled with `s`'s parameters and draw `uniform`; its penalties (when it has
  // any) count `then_generated` as generated after what `s` observed.
  void add(const Sampler& s, float uniform, std::span<const int32_t> then_generated = {});
  // Row r of logits [rows added, vocab] (penalised in place), masked by `allowed` (rows of
  // ops::token_mask_words(vocab) words, or empty): its token, and its logprob and the top
  // alternatives its sampler asks for.
  std::vector<SampledToken> sample(ops::Backend& backend, const Tensor& logits, std::span<const uint32_t> allowed = {});

 private:
  std::vector<ops::SamplingParams> params_;
  std::vector<float> uniform_;
  std::vector<int32_t> n_logprobs_;  // per row, -1: none
  std::vector<ops::PenaltyParams> penalties_;
  std::vector<int32_t> penalty_start_{0}, penalty_tokens_, penalty_counts_;
  bool any_penalties_ = false;
};

// Samples row r of logits [samplers.size(), vocab] with samplers[r], all rows in one
// backend call; each sampler draws its own uniform. Rows whose sampler has penalties
// get them (the logits are penalised in place). `masks`: token_masks of these samplers
// computed beforehand, or empty to compute them here.
std::vector<SampledToken> sample_rows(ops::Backend& backend, const Tensor& logits, std::span<Sampler* const> samplers,
                                      std::vector<uint32_t> masks = {});

}  // namespace kiln::runtime
