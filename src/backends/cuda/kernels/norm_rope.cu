// RMSNorm (fused residual add), RoPE (half / interleaved pairs, partial), and
// row stores into the paged KV cache (bf16 copies, or e4m3 rows with their scales).
#include <cmath>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/kv_fp8.cuh"

namespace kiln::cuda {
namespace {

constexpr int kNormThreads = 256;
constexpr int kNormPer = 32;  // elements per thread held in registers: rows up to 8192

// One block per row. Each thread loads all its elements (and residuals) first, so
// the row's DRAM reads are in flight together rather than one dependent load per
// loop trip (a decode step's norms are latency-bound). The residual sum is
// rounded to bf16 before normalising, as the model's bf16 residual stream is
// stored. out may alias x: every element is read and written by one thread.
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const bf16* x, bf16* residual, const float* weight, bf16* out, int64_t dim, float eps) {
  const int64_t row = blockIdx.x;
  const bf16* xr = x + row * dim;
  bf16* rr = residual ? residual + row * dim : nullptr;
  float v[kNormPer];
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kNormThreads;
    v[k] = i < dim ? to_f(xr[i]) : 0.0f;
  }
  if (rr) {
    float r[kNormPer];
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int64_t i = threadIdx.x + int64_t(k) * kNormThreads;
      r[k] = i < dim ? to_f(rr[i]) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int64_t i = threadIdx.x + int64_t(k) * kNormThreads;
      const bf16 sum = __float2bfloat16(r[k] + v[k]);
      v[k] = to_f(sum);
      if (i < dim) rr[i] = sum;
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) ss += v[k] * v[k];
  __shared__ float partial[kNormThreads / 32];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float p = threadIdx.x < kNormThreads / 32 ? partial[threadIdx.x] : 0.0f;
    p = warp_sum(p);
    if (threadIdx.x == 0) partial[0] = p;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / float(dim) + eps);
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kNormThreads;
    if (i < dim) out[row * dim + i] = __float2bfloat16(v[k] * inv * weight[i]);
  }
}

// One thread per (token, head, pair). The angle is computed in fp32 as
// transformers does (float(position) * inv_freq).
__global__ void rope_kernel(bf16* x, int64_t n_tokens, int64_t n_heads, int64_t d_head, const float* inv_freq,
                            int d_rot, float attention_factor, bool interleaved, const int32_t* positions) {
  const int half = d_rot / 2;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * n_heads * half) return;
  const int i = int(idx % half);
  const int64_t th = idx / half, t = th / n_heads;
  const float angle = float(positions[t]) * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  c *= attention_factor;
  s *= attention_factor;
  bf16* head = x + th * d_head;
  const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
  const float x1 = to_f(head[a]), x2 = to_f(head[b]);
  head[a] = __float2bfloat16(x1 * c - x2 * s);
  head[b] = __float2bfloat16(x2 * c + x1 * s);
}

__global__ void store_rows_kernel(const bf16* x, bf16* cache, const int32_t* slot_mapping, int64_t row_elems,
                                  int64_t cache_row_elems, int64_t col_offset) {
  const int64_t t = blockIdx.x;
  if (slot_mapping[t] < 0) return;  // a padding row (ops::kPadSlot): nothing to store
  bf16* dst = cache + int64_t(slot_mapping[t]) * cache_row_elems + col_offset;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) dst[i] = x[t * row_elems + i];
}

// One warp per (token, group) row: absmax, scale, codes (ops/kv_quant.h via kv_fp8.cuh).
constexpr int kStoreWarps = 4;
__global__ void __launch_bounds__(32 * kStoreWarps)
    store_rows_e4m3_kernel(const bf16* x, uint8_t* cache, float* scales, const int32_t* slot_mapping, int64_t n_rows,
                           int n_groups, int64_t group_elems, int64_t cache_row_elems, int64_t col_offset,
                           int scales_per_slot, int scale_offset) {
  const int64_t w = int64_t(blockIdx.x) * kStoreWarps + threadIdx.x / 32;  // = t * n_groups + g
  const int lane = int(threadIdx.x) % 32;
  if (w >= n_rows) return;
  const int64_t t = w / n_groups;
  const int g = int(w % n_groups);
  const int32_t slot = slot_mapping[t];
  if (slot < 0) return;  // a padding row (ops::kPadSlot): nothing to store
  const bf16* src = x + w * group_elems;
  float absmax = 0.0f;
  for (int64_t i = lane; i < group_elems; i += 32) absmax = fmaxf(absmax, fabsf(to_f(src[i])));
  const float scale = kv_row_scale(warp_max(absmax));
  uint8_t* dst = cache + int64_t(slot) * cache_row_elems + col_offset + g * group_elems;
  for (int64_t i = lane; i < group_elems; i += 32) dst[i] = kv_quantize(to_f(src[i]), scale);
  if (lane == 0) scales[int64_t(slot) * scales_per_slot + scale_offset + g] = scale;
}

}  // namespace

void launch_rms_norm(const bf16* x, bf16* residual, const float* weight, bf16* out, int64_t rows, int64_t dim,
                     float eps, cudaStream_t stream) {
  if (rows == 0) return;
  KILN_CHECK(dim <= int64_t(kNormPer) * kNormThreads) << "rms_norm: rows of " << dim << " (supported up to "
                                                     << kNormPer * kNormThreads << ")";
  rms_norm_kernel<<<unsigned(rows), kNormThreads, 0, stream>>>(x, residual, weight, out, dim, eps);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_rope(bf16* x, int64_t n_tokens, int64_t n_heads, int64_t d_head, const float* inv_freq, int d_rot,
                 float attention_factor, bool interleaved, const int32_t* positions, cudaStream_t stream) {
  const int64_t n = n_tokens * n_heads * (d_rot / 2);
  if (n == 0) return;
  rope_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(x, n_tokens, n_heads, d_head, inv_freq, d_rot,
                                                     attention_factor, interleaved, positions);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_store_rows(const bf16* x, bf16* cache, const int32_t* slot_mapping, int64_t n_tokens, int64_t row_elems,
                       int64_t cache_row_elems, int64_t col_offset, cudaStream_t stream) {
  if (n_tokens == 0) return;
  store_rows_kernel<<<unsigned(n_tokens), 128, 0, stream>>>(x, cache, slot_mapping, row_elems, cache_row_elems,
                                                            col_offset);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_store_rows_e4m3(const bf16* x, uint8_t* cache, float* scales, const int32_t* slot_mapping,
                            int64_t n_tokens, int n_groups, int64_t group_elems, int64_t cache_row_elems,
                            int64_t col_offset, int scales_per_slot, int scale_offset, cudaStream_t stream) {
  const int64_t n_rows = n_tokens * n_groups;
  if (n_rows == 0) return;
  store_rows_e4m3_kernel<<<ceil_div(n_rows, kStoreWarps), 32 * kStoreWarps, 0, stream>>>(
      x, cache, scales, slot_mapping, n_rows, n_groups, group_elems, cache_row_elems, col_offset, scales_per_slot,
      scale_offset);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
