// What a sampled token is drawn from (ops::SampleArgs at temperature > 0), defined once for
// the CPU reference's sample op and speculative decoding's rejection sampler
// (runtime/speculative.h): the top_k best ids (every id when top_k is 0), logit descending
// and ids ascending on ties (+0 and -0 tie); p = softmax(logit / temperature) over them in
// double precision; kept: top-p's shortest prefix whose cumulative p reaches top_p, then
// min-p's prefix with p >= min_p * p[0] (at least one token).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/backend.h"

namespace kiln::ops {

struct SamplingCandidates {
  std::vector<int32_t> ids;  // the top_k candidates, in candidate order
  std::vector<double> p;     // their probabilities, normalised over all of them
  size_t keep = 0;           // the kept prefix of ids
  double kept = 0.0;         // p summed over it (sequentially)
};
// params.temperature must be > 0 (greedy is the argmax, no candidates).
SamplingCandidates sampling_candidates(const float* logits, int32_t vocab, const SamplingParams& params);

}  // namespace kiln::ops
