// Structured output's token masks on the logits (ops::SampleArgs::allowed), before the
// sample kernel: a logit whose bit is clear becomes -inf (bf16 0xff80), in place.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace kiln::cuda {

// logits [n_rows, vocab] bf16 (as uint16_t bits); masks [n_rows, words] (device memory),
// words = ops::token_mask_words(vocab).
void launch_apply_token_mask(uint16_t* logits, int64_t n_rows, int64_t vocab, const uint32_t* masks, int64_t words,
                             cudaStream_t stream);

}  // namespace kiln::cuda
