#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "core/log.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"

namespace kiln::runtime {

Sampler::Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}
Sampler::~Sampler() = default;
Sampler::Sampler(Sampler&&) noexcept = default;
Sampler& Sampler::operator=(Sampler&&) noexcept = default;

Status validate(const SamplingParams& p, int64_t vocab) {
  if (!(p.temperature >= 0.0f && std::isfinite(p.temperature))) {
    return invalid_argument("temperature must be >= 0 (got " + std::to_string(p.temperature) + ")");
  }
  if (p.top_k < 0) return invalid_argument("top_k must be >= 0 (got " + std::to_string(p.top_k) + ")");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return invalid_argument("top_p must be in (0, 1] (got " + std::to_string(p.top_p) + ")");
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return invalid_argument("min_p must be in [0, 1] (got " + std::to_string(p.min_p) + ")");
  }
  const int64_t max_logprobs = std::min<int64_t>(ops::kMaxTopLogprobs, vocab);
  if (p.logprobs < -1 || p.logprobs > max_logprobs) {
    return invalid_argument("logprobs must be -1 (none) or in [0, " + std::to_string(max_logprobs) + "] (got " +
                            std::to_string(p.logprobs) + ")");
  }
  if (!(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty))) {
    return invalid_argument("repetition_penalty must be > 0 (got " + std::to_string(p.repetition_penalty) + ")");
  }
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty)) {
    return invalid_argument("presence_penalty and frequency_penalty must be finite numbers");
  }
  return Status::Ok();
}

void Sampler::observe_prompt(std::span<const int32_t> tokens) {
  if (!params_.has_penalties()) return;
  for (int32_t t : tokens) seen_.try_emplace(t, 0);
}

void Sampler::observe_generated(int32_t token) {
  if (params_.has_penalties()) ++seen_[token];
  if (matcher_ == nullptr || std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end()) return;
  const std::vector<std::string>& bytes = *constraint_->token_bytes;
  // The mask allowed only tokens the grammar accepts; a token it does not (the engine's
  // test hook forcing outputs) leaves the matcher where it was.
  if (token < 0 || size_t(token) >= bytes.size() || !matcher_->accept(bytes[size_t(token)])) {
    KILN_LOG(kWarn, "structured output: token " << token << " does not follow the grammar; not advanced");
  }
}

// A constrained sequence's mask cache holds at most this many masks (each vocab / 8
// bytes: 4.7 MiB in all at a 151,936-token vocabulary).
constexpr size_t kMaskCacheEntries = 256;

void Sampler::constrain(std::shared_ptr<const OutputConstraint> c, std::vector<int32_t> end_ids) {
  matcher_ = std::make_unique<grammar::Matcher>(c->grammar);
  mask_cache_ = std::make_unique<grammar::MaskCache>(kMaskCacheEntries, c->shared_masks);
  constraint_ = std::move(c);
  end_ids_ = std::move(end_ids);
}

void Sampler::fill_mask(std::span<uint32_t> row) {
  KILN_CHECK(matcher_ != nullptr) << "fill_mask of an unconstrained sampler";
  const grammar::TokenMasker& masker = *constraint_->masker;
  KILN_CHECK_GE(row.size(), masker.mask_words()) << "token mask row";
  masker.fill_mask(*matcher_, row.data(), mask_cache_.get());
  const auto allow = [&](int32_t t) {
    if (t >= 0 && size_t(t) / 32 < row.size()) row[size_t(t) / 32] |= 1u << (t % 32);
  };
  if (matcher_->is_complete())
    for (int32_t t : end_ids_) allow(t);
  if (std::any_of(row.begin(), row.end(), [](uint32_t w) { return w != 0; })) return;
  for (int32_t t : end_ids_) allow(t);
  if (std::any_of(row.begin(), row.end(), [](uint32_t w) { return w != 0; })) return;
  KILN_LOG(kWarn, "structured output: no token continues the grammar and the sequence has no end id; unconstrained");
  std::fill(row.begin(), row.end(), ~0u);
}

bool Sampler::grammar_done() const {
  return matcher_ != nullptr && matcher_->is_complete() && !matcher_->can_continue();
}

size_t Sampler::grammar_prefix(std::span<const int32_t> draft) {
  if (matcher_ == nullptr) return draft.size();
  const std::vector<std::string>& bytes = *constraint_->token_bytes;
  size_t n = 0;
  for (; n < draft.size(); ++n) {
    const int32_t t = draft[n];
    if (t < 0 || size_t(t) >= bytes.size() || bytes[size_t(t)].empty() ||
        std::find(end_ids_.begin(), end_ids_.end(), t) != end_ids_.end() || !matcher_->accept(bytes[size_t(t)]))
      break;
  }
  matcher_->rollback(int(n));
  return n;
}

void Sampler::fill_draft_masks(std::span<const int32_t> draft, std::span<uint32_t> rows, size_t words) {
  KILN_CHECK_GE(rows.size(), (draft.size() + 1) * words) << "draft mask rows";
  const std::vector<std::string>& bytes = *constraint_->token_bytes;
  size_t accepted = 0;
  for (size_t i = 0; i <= draft.size(); ++i) {
    const std::span<uint32_t> row = rows.subspan(i * words, words);
    std::fill(row.begin(), row.end(), 0u);
    fill_mask(row);
    if (i == draft.size()) break;
    const int32_t t = draft[i];
    KILN_CHECK(t >= 0 && size_t(t) < bytes.size() && matcher_->accept(bytes[size_t(t)]))
        << "draft token " << t << " does not follow the grammar (grammar_prefix cuts drafts first)";
    ++accepted;
  }
  matcher_->rollback(int(accepted));
}

void Sampler::penalty_list(std::vector<int32_t>& tokens, std::vector<int32_t>& counts,
                           std::span<const int32_t> then_generated) const {
  std::unordered_map<int32_t, int32_t> with_drafts;
  if (!then_generated.empty()) {
    with_drafts = seen_;
    for (int32_t t : then_generated) ++with_drafts[t];
  }
  const std::unordered_map<int32_t, int32_t>& seen = then_generated.empty() ? seen_ : with_drafts;
  const size_t begin = tokens.size();
  for (const auto& [t, n] : seen) tokens.push_back(t);
  std::sort(tokens.begin() + long(begin), tokens.end());  // a fixed order: the same list for the same history
  for (size_t i = begin; i < tokens.size(); ++i) counts.push_back(seen.at(tokens[i]));
}

SampledToken Sampler::sample(ops::Backend& backend, const Tensor& logits) {
  KILN_CHECK_EQ(logits.rank(), 2) << "sampler: logits " << logits.shape;
  KILN_CHECK_EQ(logits.dim(0), 1) << "sampler: one row per sampler";
  Sampler* self[1] = {this};
  return std::move(sample_rows(backend, logits, self).front());
}

std::vector<uint32_t> token_masks(std::span<Sampler* const> samplers, int64_t vocab, int max_threads) {
  std::vector<size_t> rows;  // the constrained ones
  for (size_t r = 0; r < samplers.size(); ++r)
    if (samplers[r]->constrained()) rows.push_back(r);
  if (rows.empty()) return {};
  const size_t words = size_t(ops::token_mask_words(vocab));
  std::vector<uint32_t> masks(samplers.size() * words, ~0u);
  const auto fill = [&](size_t first, size_t step) {
    for (size_t i = first; i < rows.size(); i += step) {
      const std::span<uint32_t> row(masks.data() + rows[i] * words, words);
      std::fill(row.begin(), row.end(), 0u);
      samplers[rows[i]]->fill_mask(row);
    }
  };
  const size_t n_threads = std::min<size_t>(rows.size(), size_t(std::max(1, max_threads)));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < n_threads; ++t) helpers.emplace_back(fill, t, n_threads);
  fill(0, n_threads);
  for (std::thread& h : helpers) h.join();
  return masks;
}

void SampleCall::add(const Sampler& s, float uniform, std::span<const int32_t> then_generated) {
  const SamplingParams& p = s.params();
  params_.push_back(s.op_params());
  uniform_.push_back(uniform);
  n_logprobs_.push_back(p.logprobs);
  // Every row gets an entry (an empty list without penalties); unused when no row has any.
  penalties_.push_back({.repetition = p.repetition_penalty, .presence = p.presence_penalty,
                        .frequency = p.frequency_penalty});
  if (p.has_penalties()) {
    s.penalty_list(penalty_tokens_, penalty_counts_, then_generated);
    any_penalties_ = true;
  }
  penalty_start_.push_back(int32_t(penalty_tokens_.size()));
}

std::vector<SampledToken> SampleCall::sample(ops::Backend& backend, const Tensor& logits,
                                             std::span<const uint32_t> allowed) {
  const size_t n = params_.size();
  KILN_CHECK_EQ(logits.rank(), 2) << "sampler: logits " << logits.shape;
  KILN_CHECK_EQ(logits.dim(0), int64_t(n)) << "sampler: one row per sampled row";
  const int32_t n_top = std::max(0, *std::max_element(n_logprobs_.begin(), n_logprobs_.end()));
  const bool any_logprobs = std::any_of(n_logprobs_.begin(), n_logprobs_.end(), [](int32_t k) { return k >= 0; });
  std::vector<int32_t> tokens(n), top_ids(n * size_t(n_top));
  std::vector<float> logprobs(any_logprobs ? n : 0), top_logprobs(n * size_t(n_top));
  ops::SampleArgs a{.logits = logits,
                    .params = params_,
                    .uniform = uniform_,
                    .n_top = n_top,
                    .tokens = tokens,
                    .logprobs = logprobs,
                    .top_ids = top_ids,
                    .top_logprobs = top_logprobs,
                    .allowed = allowed};
  if (any_penalties_) {
    a.penalties = penalties_;
    a.penalty_start = penalty_start_;
    a.penalty_tokens = penalty_tokens_;
    a.penalty_counts = penalty_counts_;
  }
  backend.sample(a);
  std::vector<SampledToken> out(n);
  for (size_t r = 0; r < n; ++r) {
    out[r].token = tokens[r];
    const int32_t k = n_logprobs_[r];
    if (k < 0) continue;
    out[r].logprob = logprobs[r];
    const auto first = long(r * size_t(n_top));
    out[r].top_ids.assign(top_ids.begin() + first, top_ids.begin() + first + k);
    out[r].top_logprobs.assign(top_logprobs.begin() + first, top_logprobs.begin() + first + k);
  }
  return out;
}

std::vector<SampledToken> sample_rows(ops::Backend& backend, const Tensor& logits,
                                      std::span<Sampler* const> samplers, std::vector<uint32_t> masks) {
  KILN_CHECK_EQ(logits.dim(0), int64_t(samplers.size())) << "sampler: one row per sampler";
  SampleCall call;
  for (Sampler* s : samplers) call.add(*s, s->next_uniform());
  // Structured output: a mask per row, all ones for the rows without a constraint.
  const std::vector<uint32_t> allowed = masks.empty() ? token_masks(samplers, logits.dim(1)) : std::move(masks);
  KILN_CHECK(allowed.empty() || allowed.size() == samplers.size() * size_t(ops::token_mask_words(logits.dim(1))))
      << "sample_rows: token masks of " << allowed.size() << " words for " << samplers.size() << " rows";
  return call.sample(backend, logits, allowed);
}

}  // namespace kiln::runtime
