// The token mask kernel (token_mask.h).
#include "backends/cuda/kernels/token_mask.h"

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {
namespace {

constexpr uint16_t kBf16MinusInf = 0xff80;

// One thread per 32-bit mask word: its 32 tokens of one row (blockIdx.y).
__global__ void apply_token_mask_kernel(uint16_t* logits, int vocab, const uint32_t* masks, int words) {
  const int w = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (w >= words) return;
  const int64_t row = blockIdx.y;
  const uint32_t bits = masks[row * words + w];
  if (bits == ~0u) return;
  uint16_t* at = logits + row * vocab;
  const int end = min(vocab, (w + 1) * 32);
  for (int t = w * 32; t < end; ++t)
    if (!((bits >> (t - w * 32)) & 1u)) at[t] = kBf16MinusInf;
}

}  // namespace

void launch_apply_token_mask(uint16_t* logits, int64_t n_rows, int64_t vocab, const uint32_t* masks, int64_t words,
                             cudaStream_t stream) {
  KILN_CHECK(vocab <= INT32_MAX && words == (vocab + 31) / 32 && n_rows <= 65535)
      << "token mask: " << n_rows << " rows of " << vocab << " tokens in " << words << " words";
  if (n_rows == 0) return;
  constexpr int kBlock = 256;
  const dim3 grid(unsigned((words + kBlock - 1) / kBlock), unsigned(n_rows));
  apply_token_mask_kernel<<<grid, kBlock, 0, stream>>>(logits, int(vocab), masks, int(words));
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
