// DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) on the device: the indexer key's
// LayerNorm, the lightning indexer's scores and exact top-k (ops::DsaSelectArgs), and
// the compaction of a selection for the MLA kernels (ops::MlaArgs::selected).
//
// dsa_select in two kernels per chunk of query tokens:
//   dsa_scores_kernel: one CTA of 64 threads per (token, 64-key tile); the token's
//     queries, its head weights and the tile's keys (fp32, dequantized as the CPU does)
//     in shared memory; thread i scores key j0 + i over heads ascending, dims ascending,
//     with unfused multiplies and adds (__fmul_rn / __fadd_rn): the CPU reference's own
//     operations in its order, so the scores are bit-identical to the CPU's (its x86-64
//     build has no FMA contraction) and so are the selections. The score's
//     order-preserving uint32 key goes to scratch [tokens, context capacity].
//   dsa_topk_kernel: one CTA per token: a radix select (4 passes of 8 bits, shared-memory
//     histograms) finds the key T of the top_k-th largest score and how many keys equal
//     to T are taken; then a pass in ascending position order (block-wide prefix scans)
//     emits every position above T and the lowest positions at T until top_k are taken:
//     the tie rule of the contract (ties to the lower position, ascending output).
// Rows with p + 1 <= top_k are dense (0..p, then -1) and score nothing.
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/kv_fp8.cuh"
#include "backends/cuda/kernels/smem.cuh"

namespace kiln::cuda {
namespace {

constexpr int kNormThreads = 256;
constexpr int kScoreKeys = 64;     // keys per scores CTA (one per thread)
constexpr int kTopkThreads = 512;  // threads of a top-k CTA
constexpr int kTopkWarps = kTopkThreads / 32;
// The scores scratch holds at most this many keys; longer batches run in token chunks.
constexpr int64_t kMaxScoreKeys = int64_t(32) << 20;

// ---- LayerNorm -----------------------------------------------------------------

__device__ __forceinline__ float block_sum(float v, float* partial) {
  v = warp_sum(v);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < int(blockDim.x) / 32; ++w) total += partial[w];
  __syncthreads();  // partial may be reused by the next call
  return total;
}

// One CTA per row: mean, then the biased variance around it, then the output; every
// element is read and written by one thread (out may alias x).
__global__ void __launch_bounds__(kNormThreads)
    layer_norm_kernel(const bf16* x, const float* weight, const float* bias, bf16* out, int64_t dim, float eps) {
  __shared__ float partial[kNormThreads / 32];
  const bf16* v = x + int64_t(blockIdx.x) * dim;
  bf16* o = out + int64_t(blockIdx.x) * dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) sum += to_f(v[i]);
  const float mean = block_sum(sum, partial) / float(dim);
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) {
    const float d = to_f(v[i]) - mean;
    sq += d * d;
  }
  const float inv_std = 1.0f / sqrtf(block_sum(sq, partial) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) {
    const float y = (to_f(v[i]) - mean) * inv_std * weight[i] + (bias != nullptr ? bias[i] : 0.0f);
    o[i] = __float2bfloat16(y);
  }
}

// ---- the indexer's scores ------------------------------------------------------

// A float's uint32 whose unsigned order is the float order (-0 taken as +0).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float index_value(const bf16* row, int d, float) { return to_f(row[d]); }
__device__ __forceinline__ float index_value(const e4m3* row, int d, float scale) {
  return __fmul_rn(e4m3_to_float(reinterpret_cast<const uint8_t*>(row)[d]), scale);
}

struct ScoreParams {
  const bf16* q;          // [n_tokens, n_heads, d]
  const bf16* weights;    // [n_tokens, n_heads]
  const void* cache;      // [n_blocks, block_size, d] bf16 or e4m3
  const float* scale;     // e4m3: [n_blocks, block_size]; else nullptr
  uint32_t* keys;         // [chunk tokens, ctx_cap]
  DeviceBatch b;
  int t0, n_heads, d, top_k, ctx_cap;
  float q_scale, weight_scale;
};

// Shared memory: q [n_heads][d], w [n_heads], keys [kScoreKeys][d + 1] (fp32).
int score_smem_bytes(int n_heads, int d) { return (n_heads * d + n_heads + kScoreKeys * (d + 1)) * 4; }

template <typename T>
__global__ void __launch_bounds__(kScoreKeys) dsa_scores_kernel(const ScoreParams p) {
  extern __shared__ float sm[];
  const int t = p.t0 + int(blockIdx.x), pos = p.b.positions[t];
  const int j0 = int(blockIdx.y) * kScoreKeys;
  if (pos + 1 <= p.top_k || j0 > pos) return;  // dense row, or a tile past the row
  float* q_s = sm;
  float* w_s = q_s + p.n_heads * p.d;
  float* k_s = w_s + p.n_heads;
  const int dp = p.d + 1;  // padded key rows: thread i reads row i without bank conflicts
  const bf16* q = p.q + int64_t(t) * p.n_heads * p.d;
  for (int e = int(threadIdx.x); e < p.n_heads * p.d; e += kScoreKeys) q_s[e] = to_f(q[e]);
  for (int h = int(threadIdx.x); h < p.n_heads; h += kScoreKeys)
    w_s[h] = __fmul_rn(to_f(p.weights[int64_t(t) * p.n_heads + h]), p.weight_scale);
  const int s = p.b.seq_of_token[t];
  const int32_t* table = p.b.block_table + int64_t(s) * p.b.max_blocks;
  const T* cache = static_cast<const T*>(p.cache);
  for (int e = int(threadIdx.x); e < kScoreKeys * p.d; e += kScoreKeys) {
    const int r = e / p.d, c = e % p.d, j = j0 + r;
    float v = 0.0f;
    if (j <= pos) {
      const int64_t slot = int64_t(table[j / p.b.block_size]) * p.b.block_size + j % p.b.block_size;
      v = index_value(cache + slot * p.d, c, kIsFp8<T> ? p.scale[slot] : 1.0f);
    }
    k_s[r * dp + c] = v;
  }
  __syncthreads();
  const int i = int(threadIdx.x), j = j0 + i;
  if (j > pos) return;
  const float* k = k_s + i * dp;
  float score = 0.0f;
  for (int h = 0; h < p.n_heads; ++h) {
    const float* qh = q_s + h * p.d;
    float dot = 0.0f;
    for (int c = 0; c < p.d; ++c) dot = __fadd_rn(dot, __fmul_rn(qh[c], k[c]));
    score = __fadd_rn(score, __fmul_rn(w_s[h], fmaxf(__fmul_rn(p.q_scale, dot), 0.0f)));
  }
  p.keys[int64_t(blockIdx.x) * p.ctx_cap + j] = order_key(score);
}

// ---- exact top-k ---------------------------------------------------------------

// The exclusive prefix sum of v over the CTA (kTopkThreads threads), and the total.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_totals, int& total) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) warp_totals[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kTopkWarps ? warp_totals[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    if (lane < kTopkWarps) warp_totals[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const int before = warp > 0 ? warp_totals[warp - 1] : 0;
  total = warp_totals[kTopkWarps - 1];
  __syncthreads();  // warp_totals is reused by the next scan
  return before + inc - v;
}

__global__ void __launch_bounds__(kTopkThreads)
    dsa_topk_kernel(const uint32_t* keys, int32_t* selected, DeviceBatch b, int t0, int top_k, int ctx_cap) {
  __shared__ int hist[256];
  __shared__ int warp_totals[32];
  __shared__ uint32_t s_prefix;
  __shared__ int s_need;
  const int t = t0 + int(blockIdx.x), n = b.positions[t] + 1;
  int32_t* out = selected + int64_t(t) * top_k;
  if (n <= top_k) {  // dense: every position, then -1
    for (int i = int(threadIdx.x); i < top_k; i += kTopkThreads) out[i] = i < n ? i : -1;
    return;
  }
  const uint32_t* row = keys + int64_t(blockIdx.x) * ctx_cap;
  // Radix select from the top byte: the prefix of T's bits decided so far and how many
  // of the keys with that prefix are still to be taken.
  uint32_t prefix = 0, mask = 0;
  int need = top_k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = int(threadIdx.x); i < 256; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    for (int j = int(threadIdx.x); j < n; j += kTopkThreads) {
      const uint32_t u = row[j];
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, digit = 0;
      for (digit = 255; digit > 0; --digit) {
        if (above + hist[digit] >= need) break;
        above += hist[digit];
      }
      s_prefix = prefix | (uint32_t(digit) << shift);
      s_need = need - above;
    }
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    mask |= 255u << shift;
  }
  // prefix = T; `need` of the keys equal to T are taken (the lowest positions), and all
  // top_k - need keys above T.
  int eq_base = 0, out_base = 0;
  for (int c0 = 0; c0 < n; c0 += kTopkThreads) {
    const int j = c0 + int(threadIdx.x);
    const uint32_t u = j < n ? row[j] : 0u;
    const bool gt = j < n && u > prefix, eq = j < n && u == prefix;
    int eq_total = 0, taken_total = 0;
    const int eq_rank = block_exclusive_scan(eq ? 1 : 0, warp_totals, eq_total);
    const bool take = gt || (eq && eq_base + eq_rank < need);
    const int rank = block_exclusive_scan(take ? 1 : 0, warp_totals, taken_total);
    if (take) out[out_base + rank] = j;
    eq_base += eq_total;
    out_base += taken_total;
  }
}

// ---- selections for MLA ----------------------------------------------------------

// One warp per token: the valid entries (0 <= j <= p) of selected[t, :] in their order,
// and their count; a row without any attends to its own position.
__global__ void dsa_compact_kernel(const int32_t* selected, int top_k, const int32_t* positions, int n_tokens,
                                   int32_t* list, int32_t* count) {
  const int t = int(blockIdx.x) * 4 + int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (t >= n_tokens) return;
  const int p = positions[t];
  const int32_t* in = selected + int64_t(t) * top_k;
  int32_t* o = list + int64_t(t) * top_k;
  int n = 0;
  for (int base = 0; base < top_k; base += 32) {
    const int i = base + lane;
    const int j = i < top_k ? in[i] : -1;
    const bool valid = j >= 0 && j <= p;
    const unsigned ballot = __ballot_sync(0xffffffffu, valid);
    if (valid) o[n + __popc(ballot & ((1u << lane) - 1u))] = j;
    n += __popc(ballot);
  }
  if (lane == 0) {
    if (n == 0) o[0] = p;
    count[t] = n > 0 ? n : 1;
  }
}

}  // namespace

void launch_layer_norm(const bf16* x, const float* weight, const float* bias, bf16* out, int64_t rows, int64_t dim,
                       float eps, cudaStream_t stream) {
  if (rows == 0) return;
  layer_norm_kernel<<<unsigned(rows), kNormThreads, 0, stream>>>(x, weight, bias, out, dim, eps);
  KILN_CUDA_LAUNCH_CHECK();
}

int dsa_score_smem_bytes(int n_heads, int d_index) { return score_smem_bytes(n_heads, d_index); }

size_t dsa_select_scratch_keys(const DeviceBatch& b) {
  const int64_t ctx_cap = int64_t(b.max_blocks) * b.block_size;
  if (b.n_tokens == 0 || ctx_cap == 0) return 0;
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(b.n_tokens, kMaxScoreKeys / ctx_cap));
  return size_t(chunk * ctx_cap);
}

void launch_dsa_select(const bf16* q, const bf16* weights, const DsaIndexCacheView& cache, int32_t* selected,
                       uint32_t* scratch, const DeviceBatch& b, int n_heads, int d_index, int top_k, float scale,
                       float weight_scale, int smem_cap, cudaStream_t stream) {
  if (b.n_tokens == 0) return;
  KILN_CHECK(!cache.fp8 || cache.scale != nullptr) << "dsa_select: e4m3 index cache without scales";
  const int smem = score_smem_bytes(n_heads, d_index);
  KILN_CHECK(smem <= smem_cap) << "dsa_select: " << n_heads << " index heads of " << d_index << " need " << smem
                               << " bytes of shared memory (cap " << smem_cap << ")";
  const int ctx_cap = b.max_blocks * b.block_size;
  KILN_CHECK(ctx_cap > 0) << "dsa_select: a batch without block tables";
  const int64_t chunk = int64_t(dsa_select_scratch_keys(b)) / ctx_cap;
  ScoreParams p{};
  p.q = q;
  p.weights = weights;
  p.cache = cache.data;
  p.scale = cache.scale;
  p.keys = scratch;
  p.b = b;
  p.n_heads = n_heads;
  p.d = d_index;
  p.top_k = top_k;
  p.ctx_cap = ctx_cap;
  p.q_scale = scale;
  p.weight_scale = weight_scale;
  const auto scores = cache.fp8 ? dsa_scores_kernel<e4m3> : dsa_scores_kernel<bf16>;
  prepare_smem(scores, smem);
  for (int64_t t0 = 0; t0 < b.n_tokens; t0 += chunk) {
    const int n = int(std::min<int64_t>(chunk, b.n_tokens - t0));
    p.t0 = int(t0);
    scores<<<dim3(unsigned(n), unsigned(ceil_div(ctx_cap, kScoreKeys))), kScoreKeys, smem, stream>>>(p);
    KILN_CUDA_LAUNCH_CHECK();
    dsa_topk_kernel<<<unsigned(n), kTopkThreads, 0, stream>>>(scratch, selected, b, int(t0), top_k, ctx_cap);
    KILN_CUDA_LAUNCH_CHECK();
  }
}

void launch_dsa_compact(const int32_t* selected, int top_k, const DeviceBatch& b, int32_t* list, int32_t* count,
                        cudaStream_t stream) {
  if (b.n_tokens == 0) return;
  dsa_compact_kernel<<<ceil_div(b.n_tokens, 4), 128, 0, stream>>>(selected, top_k, b.positions, b.n_tokens, list,
                                                                 count);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
