// Token sampling from fp32 logits: greedy at temperature 0, otherwise
// temperature, then top-k, top-p and min-p filtering, then a draw from a
// seeded generator (same seed, same logits -> same token).
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace kiln::runtime {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace kiln::runtime
