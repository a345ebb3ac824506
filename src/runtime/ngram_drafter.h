// Prompt-lookup (n-gram) drafts for speculative decoding: no weights, only the sequence's
// own tokens. Strong where the output repeats its context (code editing, agent loops,
// quoting): the tokens that followed the most recent earlier occurrence of the sequence's
// last n tokens are proposed as its next ones, and the target model verifies them
// (runtime/speculative.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kiln::runtime {

// For n = max_n down to min_n: the latest start i < n_tokens - n with
// tokens[i, i + n) == tokens[n_tokens - n, n_tokens); the first n with such an i proposes
// tokens[i + n, min(i + n + k, n_tokens)) (never empty). Nothing when no suffix recurs or k < 1.
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int32_t k, int32_t max_n = 3, int32_t min_n = 1);

}  // namespace kiln::runtime
