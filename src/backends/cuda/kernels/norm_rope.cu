// RMSNorm (fused residual add), RoPE (half / interleaved pairs, partial), and
// row stores into the paged KV cache (bf16 copies, or e4m3 rows with their scales).
#include <cmath>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/pdl.cuh"
#include "backends/cuda/kernels/kv_fp8.cuh"

namespace kiln::cuda {
namespace {

constexpr int kNormThreads = 256;
constexpr int kNormPer = 32;  // elements per thread held in registers: rows up to 8192

// kRowThreads threads per row (256: one row per block; 8, 16 or 32: a group of lanes per
// row, 256 / kRowThreads rows per block, for short rows such as Qwen3's per-head q / k
// norms: 2048 tokens x 32 heads of 128 took 284 us as 65,536 blocks, most threads idle).
// Each thread loads all its elements, residuals and weights first (kVec consecutive ones
// per load: 16-byte loads when the row is a multiple of 8), so the row's reads are in
// flight together rather than one dependent load per loop trip or a weight load after
// the reduction (a decode step's norms are latency-bound). The residual sum is rounded
// to bf16 before normalising, as the model's bf16 residual stream is stored. out may
// alias x: every element is read and written by one thread.
template <int kVec>
__device__ __forceinline__ void load_bf16(const bf16* p, float (&v)[kVec]) {
  if constexpr (kVec == 8) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const bf16* e = reinterpret_cast<const bf16*>(&q);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = to_f(e[j]);
  } else {
    v[0] = to_f(p[0]);
  }
}
template <int kVec>
__device__ __forceinline__ void store_bf16(bf16* p, const float (&v)[kVec]) {
  if constexpr (kVec == 8) {
    uint4 q;
    bf16* e = reinterpret_cast<bf16*>(&q);
#pragma unroll
    for (int j = 0; j < 8; ++j) e[j] = __float2bfloat16(v[j]);
    *reinterpret_cast<uint4*>(p) = q;
  } else {
    p[0] = __float2bfloat16(v[0]);
  }
}

// The sum over a row's kRowThreads threads, in every one of them.
template <int kRowThreads>
__device__ __forceinline__ float row_sum(float v) {
  if constexpr (kRowThreads <= 32) {
#pragma unroll
    for (int o = kRowThreads / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  } else {
    static_assert(kRowThreads == kNormThreads, "a row is a lane group or the whole block");
    __shared__ float partial[kNormThreads / 32];
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
      float p = threadIdx.x < kNormThreads / 32 ? partial[threadIdx.x] : 0.0f;
      p = warp_sum(p);
      if (threadIdx.x == 0) partial[0] = p;
    }
    __syncthreads();
    return partial[0];
  }
}

template <int kVec, int kRowThreads>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const bf16* x, bf16* residual, const float* weight,
                                                                bf16* out, int64_t rows, int64_t dim, float eps) {
  pdl_wait();  // a dependent launch (pdl.cuh)
  constexpr int kN = kNormPer / kVec;  // loads per thread
  const int t = int(threadIdx.x) % kRowThreads;
  const int64_t row = int64_t(blockIdx.x) * (kNormThreads / kRowThreads) + threadIdx.x / kRowThreads;
  // A lane group past the last row still takes part in the warp's shuffles: it reads nothing.
  const int64_t n = row < rows ? dim : 0;
  const bf16* xr = x + row * dim;
  bf16* rr = residual ? residual + row * dim : nullptr;
  float v[kN][kVec] = {}, r[kN][kVec] = {}, w[kN][kVec] = {};
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    const int64_t i = (t + int64_t(k) * kRowThreads) * kVec;
    if (i >= n) continue;
    load_bf16<kVec>(xr + i, v[k]);
    if (rr) load_bf16<kVec>(rr + i, r[k]);
    constexpr int kW = kVec == 8 ? 4 : 1;  // weights per load (fp32)
#pragma unroll
    for (int j = 0; j < kVec; j += kW) {
      if constexpr (kW == 4) {
        const float4 q = *reinterpret_cast<const float4*>(weight + i + j);
        w[k][j] = q.x, w[k][j + 1] = q.y, w[k][j + 2] = q.z, w[k][j + 3] = q.w;
      } else {
        w[k][j] = weight[i + j];
      }
    }
  }
  if (rr) {
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const int64_t i = (t + int64_t(k) * kRowThreads) * kVec;
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[k][j] = to_f(__float2bfloat16(r[k][j] + v[k][j]));
      if (i < n) store_bf16<kVec>(rr + i, v[k]);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kN; ++k)
#pragma unroll
    for (int j = 0; j < kVec; ++j) ss += v[k][j] * v[k][j];
  const float inv = rsqrtf(row_sum<kRowThreads>(ss) / float(dim) + eps);
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    const int64_t i = (t + int64_t(k) * kRowThreads) * kVec;
    if (i >= n) continue;
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[k][j] = v[k][j] * inv * w[k][j];
    store_bf16<kVec>(out + row * dim + i, v[k]);
  }
}

// One thread per (token, head, pair). The angle is computed in fp32 as
// transformers does (float(position) * inv_freq).
__global__ void rope_kernel(bf16* x, int64_t n_tokens, int64_t n_heads, int64_t d_head, const float* inv_freq,
                            int d_rot, float attention_factor, bool interleaved, const int32_t* positions) {
  pdl_wait();  // a dependent launch (pdl.cuh)
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

// Block (t, set): token t's row of set 0 or 1.
__global__ void store_rows_kernel(const StoreRowSet s0, const StoreRowSet s1, const int32_t* slot_mapping,
                                  int64_t cache_row_elems) {
  pdl_wait();  // a dependent launch (pdl.cuh)
  const StoreRowSet& s = blockIdx.y == 0 ? s0 : s1;
  const int64_t t = blockIdx.x;
  if (slot_mapping[t] < 0) return;  // a padding row (ops::kPadSlot): nothing to store
  bf16* dst = s.cache + int64_t(slot_mapping[t]) * cache_row_elems + s.col_offset;
  for (int64_t i = threadIdx.x; i < s.row_elems; i += blockDim.x) dst[i] = s.x[t * s.row_elems + i];
}

// One warp per head row of q, then of k: the per-head RMSNorm (where a weight is given),
// rounded to bf16 as rms_norm stores it, then RoPE on those values as rope reads them:
// the numbers of the two ops, in one launch for both tensors (a decode step had four).
// With a store (a bf16 cache), each key row also goes to its cache slot as written, and a
// third set of warps copies the value rows: kv_store's copy, without its launch.
struct QkNormRopeParams {
  bf16 *q, *k;
  const float *q_w, *k_w;
  int64_t n_tokens;
  int n_q_heads, n_k_heads, d_head, d_rot;
  float eps, attention_factor;
  bool interleaved;
  const float* inv_freq;
  const int32_t* positions;
  QkStore store;  // store.k_cache null: none
};
constexpr int kQkWarps = kNormThreads / 32;

__global__ void __launch_bounds__(kNormThreads) qk_norm_rope_kernel(const QkNormRopeParams p) {
  pdl_wait();  // a dependent launch (pdl.cuh)
  constexpr int kPer = kQkNormRopeMaxHead / 32;
  __shared__ float rounded[kQkWarps][kQkNormRopeMaxHead];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int n_v_heads = p.store.k_cache != nullptr ? p.n_k_heads : 0;
  const int heads = p.n_q_heads + p.n_k_heads + n_v_heads;
  const int64_t row = int64_t(blockIdx.x) * kQkWarps + warp;
  if (row >= p.n_tokens * heads) return;  // the whole warp: no block-wide barrier follows
  const int64_t t = row / heads;
  const int h = int(row % heads);
  const bool is_q = h < p.n_q_heads;
  const int kv_head = h - p.n_q_heads - (h >= p.n_q_heads + p.n_k_heads ? p.n_k_heads : 0);
  const int32_t slot = p.store.k_cache != nullptr && !is_q ? p.store.slot_mapping[t] : -1;
  const int64_t cache_at = (int64_t(slot) * p.n_k_heads + kv_head) * p.d_head;
  if (h >= p.n_q_heads + p.n_k_heads) {  // a value row: to its slot as it is
    if (slot < 0) return;  // a padding row (ops::kPadSlot): nothing to store
    const bf16* src = p.store.v + (t * p.n_k_heads + kv_head) * p.d_head;
    for (int i = lane; i < p.d_head; i += 32) p.store.v_cache[cache_at + i] = src[i];
    return;
  }
  bf16* x = is_q ? p.q + (t * p.n_q_heads + h) * p.d_head : p.k + (t * p.n_k_heads + kv_head) * p.d_head;
  bf16* cached = slot >= 0 ? p.store.k_cache + cache_at : nullptr;  // where this key row is also stored
  const float* w = is_q ? p.q_w : p.k_w;
  float e[kPer];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    e[j] = i < p.d_head ? to_f(x[i]) : 0.0f;
    ss += e[j] * e[j];
  }
  float* v = rounded[warp];
  const float inv = w ? rsqrtf(warp_sum(ss) / float(p.d_head) + p.eps) : 1.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    if (i < p.d_head) v[i] = w ? to_f(__float2bfloat16(e[j] * inv * w[i])) : e[j];
  }
  __syncwarp();  // every lane's reads of x are done and its values are in v
  const int half = p.d_rot / 2;
  const float pos = float(p.positions[t]);
  for (int i = lane; i < half; i += 32) {
    float s, c;
    sincosf(pos * p.inv_freq[i], &s, &c);
    c *= p.attention_factor;
    s *= p.attention_factor;
    const int a = p.interleaved ? 2 * i : i, b = p.interleaved ? 2 * i + 1 : i + half;
    const float x1 = v[a], x2 = v[b];
    const bf16 ya = __float2bfloat16(x1 * c - x2 * s), yb = __float2bfloat16(x2 * c + x1 * s);
    x[a] = ya;
    x[b] = yb;
    if (cached != nullptr) {
      cached[a] = ya;
      cached[b] = yb;
    }
  }
  // The dims past d_rot (partial rotary) take the normed values as they are (without a
  // norm, v holds x's own values).
  if (w != nullptr || cached != nullptr) {
    for (int i = p.d_rot + lane; i < p.d_head; i += 32) {
      const bf16 y = __float2bfloat16(v[i]);
      if (w != nullptr) x[i] = y;
      if (cached != nullptr) cached[i] = y;
    }
  }
}

// One warp per (token, group) row: absmax, scale, codes (ops/kv_quant.h via kv_fp8.cuh).
constexpr int kStoreWarps = 4;
__global__ void __launch_bounds__(32 * kStoreWarps)
    store_rows_e4m3_kernel(const bf16* x, uint8_t* cache, float* scales, const int32_t* slot_mapping, int64_t n_rows,
                           int n_groups, int64_t group_elems, int64_t cache_row_elems, int64_t col_offset,
                           int scales_per_slot, int scale_offset) {
  pdl_wait();  // a dependent launch (pdl.cuh)
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
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = dim % 8 == 0 && aligned(x) && aligned(out) && aligned(weight) && (!residual || aligned(residual));
  // Threads per row: the fewest of 8 / 16 / 32 that hold the row (kNormPer elements
  // each), else a block per row.
  const int64_t loads = vec ? dim / 8 : dim, per_thread = vec ? kNormPer / 8 : kNormPer;
  const auto launch = [&](auto kernel, int row_threads) {
    const int64_t per_block = kNormThreads / row_threads;
    launch_dependent(kernel, unsigned(ceil_div(rows, per_block)), kNormThreads, 0, stream, x, residual, weight, out,
                     rows, dim, eps);
  };
  if (vec && loads <= 8 * per_thread) launch(rms_norm_kernel<8, 8>, 8);
  else if (vec && loads <= 16 * per_thread) launch(rms_norm_kernel<8, 16>, 16);
  else if (vec && loads <= 32 * per_thread) launch(rms_norm_kernel<8, 32>, 32);
  else if (vec) launch(rms_norm_kernel<8, kNormThreads>, kNormThreads);
  else if (loads <= 32 * per_thread) launch(rms_norm_kernel<1, 32>, 32);
  else launch(rms_norm_kernel<1, kNormThreads>, kNormThreads);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_rope(bf16* x, int64_t n_tokens, int64_t n_heads, int64_t d_head, const float* inv_freq, int d_rot,
                 float attention_factor, bool interleaved, const int32_t* positions, cudaStream_t stream) {
  const int64_t n = n_tokens * n_heads * (d_rot / 2);
  if (n == 0) return;
  launch_dependent(rope_kernel, ceil_div(n, 256), 256, 0, stream, x, n_tokens, n_heads, d_head, inv_freq, d_rot,
                   attention_factor, interleaved, positions);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_qk_norm_rope(bf16* q, bf16* k, const float* q_norm, const float* k_norm, int64_t n_tokens, int n_q_heads,
                         int n_k_heads, int d_head, float eps, const float* inv_freq, int d_rot,
                         float attention_factor, bool interleaved, const int32_t* positions, const QkStore& store,
                         cudaStream_t stream) {
  KILN_CHECK(d_head <= kQkNormRopeMaxHead && d_rot <= d_head && d_rot % 2 == 0)
      << "qk_norm_rope: head size " << d_head << ", rotary " << d_rot << " (heads up to " << kQkNormRopeMaxHead << ")";
  KILN_CHECK(store.k_cache == nullptr || (store.v != nullptr && store.v_cache != nullptr && store.slot_mapping != nullptr))
      << "qk_norm_rope: a store needs v, both caches and the slot mapping";
  const int64_t rows = n_tokens * (n_q_heads + n_k_heads * (store.k_cache != nullptr ? 2 : 1));
  if (rows == 0) return;
  const QkNormRopeParams p{.q = q, .k = k, .q_w = q_norm, .k_w = k_norm, .n_tokens = n_tokens,
                           .n_q_heads = n_q_heads, .n_k_heads = n_k_heads, .d_head = d_head, .d_rot = d_rot,
                           .eps = eps, .attention_factor = attention_factor, .interleaved = interleaved,
                           .inv_freq = inv_freq, .positions = positions, .store = store};
  launch_dependent(qk_norm_rope_kernel, unsigned(ceil_div(rows, kQkWarps)), kNormThreads, 0, stream, p);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_store_rows(const StoreRowSet* sets, int n_sets, const int32_t* slot_mapping, int64_t n_tokens,
                       int64_t cache_row_elems, cudaStream_t stream) {
  KILN_CHECK(n_sets == 1 || n_sets == 2) << "store_rows: " << n_sets << " sets";
  if (n_tokens == 0) return;
  launch_dependent(store_rows_kernel, dim3(unsigned(n_tokens), unsigned(n_sets)), 128, 0, stream, sets[0],
                   sets[n_sets - 1], slot_mapping, cache_row_elems);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_store_rows_e4m3(const bf16* x, uint8_t* cache, float* scales, const int32_t* slot_mapping,
                            int64_t n_tokens, int n_groups, int64_t group_elems, int64_t cache_row_elems,
                            int64_t col_offset, int scales_per_slot, int scale_offset, cudaStream_t stream) {
  const int64_t n_rows = n_tokens * n_groups;
  if (n_rows == 0) return;
  launch_dependent(store_rows_e4m3_kernel, ceil_div(n_rows, kStoreWarps), 32 * kStoreWarps, 0, stream, x, cache, scales,
                   slot_mapping, n_rows, n_groups, group_elems, cache_row_elems, col_offset, scales_per_slot,
                   scale_offset);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
