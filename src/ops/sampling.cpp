#include "ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace kiln::ops {

SamplingCandidates sampling_candidates(const float* logits, int32_t vocab, const SamplingParams& params) {
  KILN_CHECK(vocab > 0 && params.temperature > 0.0f) << "sampling_candidates: " << vocab << " ids, temperature "
                                                      << params.temperature;
  SamplingCandidates c;
  const int32_t n = params.top_k > 0 && params.top_k < vocab ? params.top_k : vocab;
  c.ids.resize(size_t(vocab));
  std::iota(c.ids.begin(), c.ids.end(), 0);
  const auto by_logit_desc = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (n == vocab) std::sort(c.ids.begin(), c.ids.end(), by_logit_desc);
  else std::partial_sort(c.ids.begin(), c.ids.begin() + n, c.ids.end(), by_logit_desc);
  c.ids.resize(size_t(n));

  const double max_logit = logits[c.ids[0]];
  c.p.resize(c.ids.size());
  double sum = 0.0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    c.p[i] = std::exp((double(logits[c.ids[i]]) - max_logit) / double(params.temperature));
    sum += c.p[i];
  }
  for (double& x : c.p) x /= sum;

  c.keep = c.p.size();
  if (params.top_p < 1.0f) {  // the shortest prefix with cumulative >= top_p
    double cum = 0.0;
    for (size_t i = 0; i < c.p.size(); ++i) {
      cum += c.p[i];
      if (cum >= double(params.top_p)) {
        c.keep = i + 1;
        break;
      }
    }
  }
  if (params.min_p > 0.0f) {  // the prefix with p >= min_p * p_max, at least one token
    const double floor = double(params.min_p) * c.p[0];
    size_t m = 0;
    while (m < c.keep && c.p[m] >= floor) ++m;
    c.keep = std::max<size_t>(1, m);
  }
  for (size_t i = 0; i < c.keep; ++i) c.kept += c.p[i];
  return c;
}

}  // namespace kiln::ops
