#include "runtime/sampler.h"

#include <algorithm>
#include <string>

namespace kiln::runtime {

Status validate(const SamplingParams& p, int64_t vocab) {
  if (!(p.temperature >= 0.0f)) {
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
  return Status::Ok();
}

SampledToken Sampler::sample(ops::Backend& backend, const Tensor& logits) {
  KILN_CHECK_EQ(logits.rank(), 2) << "sampler: logits " << logits.shape;
  KILN_CHECK_EQ(logits.dim(0), 1) << "sampler: one row per sampler";
  const ops::SamplingParams params[1] = {op_params()};
  const float uniform[1] = {next_uniform()};
  const int32_t n_top = std::max(0, params_.logprobs);
  SampledToken out;
  out.top_ids.resize(size_t(n_top));
  out.top_logprobs.resize(size_t(n_top));
  backend.sample({.logits = logits,
                  .params = params,
                  .uniform = uniform,
                  .n_top = n_top,
                  .tokens = std::span<int32_t>(&out.token, 1),
                  .logprobs = params_.logprobs >= 0 ? std::span<float>(&out.logprob, 1) : std::span<float>(),
                  .top_ids = out.top_ids,
                  .top_logprobs = out.top_logprobs});
  return out;
}

}  // namespace kiln::runtime
