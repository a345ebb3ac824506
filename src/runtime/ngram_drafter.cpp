#include "runtime/ngram_drafter.h"

#include <algorithm>

namespace kiln::runtime {

std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int32_t k, int32_t max_n, int32_t min_n) {
  const int32_t len = int32_t(tokens.size());
  if (k < 1) return {};
  for (int32_t n = std::min(max_n, len - 1); n >= std::max(1, min_n); --n) {
    const auto suffix = tokens.subspan(size_t(len - n));
    // Latest first: the nearest context is the likeliest to repeat. i + n < len, so at
    // least one token follows the match.
    for (int32_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      const int32_t begin = i + n, end = std::min(len, begin + k);
      return {tokens.begin() + begin, tokens.begin() + end};
    }
  }
  return {};
}

}  // namespace kiln::runtime
