#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace kiln::runtime {

int32_t Sampler::sample(std::span<const float> logits) {
  const int32_t vocab = int32_t(logits.size());
  if (params_.temperature <= 0.0f) {
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates sorted by logit (descending, ids ascending on ties: deterministic).
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (params_.top_k > 0 && params_.top_k < vocab) ids.resize(size_t(params_.top_k));

  const float max_logit = logits[ids[0]];
  std::vector<double> p(ids.size());
  double sum = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    p[i] = std::exp(double(logits[ids[i]] - max_logit) / params_.temperature);
    sum += p[i];
  }
  for (double& x : p) x /= sum;

  size_t keep = p.size();
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {
    const double floor = params_.min_p * p[0];
    size_t n = 0;
    while (n < keep && p[n] >= floor) ++n;
    keep = std::max<size_t>(1, n);
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  const double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace kiln::runtime
