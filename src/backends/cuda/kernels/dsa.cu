// DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) on the device: the indexer key's
// LayerNorm, the lightning indexer's scores and exact top-k (ops::DsaSelectArgs), and
// the compaction of a selection for the MLA kernels (ops::MlaArgs::selected).
//
// dsa_select per chunk of query tokens, parallel over keys so that a decode step of one
// to eight tokens fills the GPU (one CTA per token ran the top-k of a 32k context on one
// SM: 365 us on an H200):
//   dsa_scores_kernel: one CTA of 256 threads per (token, 64-key tile); the token's
//     queries, its head weights and the tile's keys (fp32, dequantized as the CPU does)
//     in shared memory. The dots are a small GEMM over registers (a thread: 4 keys x 4
//     heads, float4 loads), each dot one chain over dims ascending; the terms
//     w[h] * relu(scale * dot) go to shared memory and one thread per key sums them over
//     heads ascending. Every multiply and add is unfused (__fmul_rn / __fadd_rn): the CPU
//     reference's own operations in its order, so the scores are bit-identical to the
//     CPU's (its x86-64 build has no FMA contraction) and so are the selections. The
//     score's order-preserving uint32 key goes to scratch [tokens, context capacity].
//   the top-k over slices: grid (tokens, parts), each CTA one slice of the row's keys
//     (dsa_select_plan: about 1,024 keys, fewer parts when many tokens fill the GPU).
//     dsa_radix_pass_kernel x 4 (8 bits each, from the top): slice histograms merged in
//     global memory by atomics; the last CTA to arrive picks the digit of the key T of
//     the top_k-th largest score and how many keys equal to T are still to take. Then
//     dsa_count_kernel counts each slice's keys above and at T, and dsa_emit_kernel
//     writes each taken position at its rank (keys above T before it, plus those at T
//     before it up to the count taken): ties to the lower position, ascending output,
//     the contract's rule, whatever the slicing.
// Rows with p + 1 <= top_k are dense (0..p, then -1) and score nothing. No kernel reads
// anything on the host: the launches depend on the batch shape only (decode graphs).
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/kv_fp8.cuh"
#include "backends/cuda/kernels/smem.cuh"

namespace kiln::cuda {
namespace {

constexpr int kNormThreads = 256;
constexpr int kScoreKeys = 64;       // keys per scores CTA
constexpr int kScoreThreads = 256;   // threads of a scores CTA
constexpr int kScoreKeyTile = 4;     // keys per thread in the dots (x 4 heads)
constexpr int kSelectThreads = 256;  // threads of a top-k CTA (one per histogram bin)
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int kEmitRun = 4;          // consecutive keys per thread in the emit
// Top-k slices: about this many keys per CTA, unless the chunk's tokens alone give this
// many CTAs (prefill): 1,024 keys is 4 loads per thread per pass, and 1,024 CTAs fill
// the 132 SMs of an H200 (or 188 of an RTX PRO 6000) several times over.
constexpr int kSliceKeys = 1024;
constexpr int kSelectTargetCtas = 1024;
// The scores scratch holds at most this many keys; longer batches run in token chunks.
constexpr int64_t kMaxScoreKeys = int64_t(32) << 20;
static_assert(kScoreKeys % kScoreKeyTile == 0 && kScoreKeys <= kScoreThreads);
static_assert(kSelectThreads == 256, "the last CTA of a radix pass holds one bin per thread");
static_assert(kSelectThreads * kEmitRun < (1 << 16), "the emit scans two 16-bit counts in one int");

// Per chunk row, the top-k's global words after the keys: the radix passes' histograms
// [4][256] and tickets [4] (zeroed by the scores kernel), state [4][2] (T's prefix and
// the count still to take at T after each pass, written by the pass's last CTA) and
// counts [parts][2] (keys above T and equal to T per slice, from dsa_count_kernel).
constexpr int kMetaZeroed = 4 * 256 + 4;
__host__ __device__ constexpr int64_t meta_words(int parts) { return 1040 + 2 * int64_t(parts); }
struct SelectMeta {
  int32_t *hist, *ticket, *state, *counts;
  __device__ SelectMeta(int32_t* meta, int row, int parts) {
    int32_t* m = meta + int64_t(row) * meta_words(parts);
    hist = m;
    ticket = m + 1024;
    state = m + 1028;
    counts = m + 1040;
  }
};

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
// Eight consecutive values from c (c % 8 == 0, the row 16-byte (bf16) or 8-byte (e4m3)
// aligned), dequantized exactly as index_value does.
__device__ __forceinline__ void index_values8(const bf16* row, int c, float, float* v) {
  const uint4 raw = *reinterpret_cast<const uint4*>(row + c);
  const bf16* h = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = to_f(h[i]);
}
__device__ __forceinline__ void index_values8(const e4m3* row, int c, float scale, float* v) {
  const uint2 raw = *reinterpret_cast<const uint2*>(reinterpret_cast<const uint8_t*>(row) + c);
  const uint8_t* code = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(e4m3_to_float(code[i]), scale);
}

struct ScoreParams {
  const bf16* q;          // [n_tokens, n_heads, d]
  const bf16* weights;    // [n_tokens, n_heads]
  const void* cache;      // [n_blocks, block_size, d] bf16 or e4m3
  const float* scale;     // e4m3: [n_blocks, block_size]; else nullptr
  uint32_t* keys;         // [chunk tokens, ctx_cap]
  int32_t* meta;          // [chunk tokens, meta_words(parts)]: zeroed here (see SelectMeta)
  DeviceBatch b;
  int t0, n_heads, d, top_k, ctx_cap, parts;
  bool vec8;              // d % 8 == 0 and q, cache 16-byte aligned: 8-value loads
  float q_scale, weight_scale;
};

// Shared memory (fp32) of a scores CTA, padded so that float4 loads stay aligned and
// conflict-free: q [h_pad][d_pad] (zero padded: a padded column adds +0 * +0 to a dot that
// is never -0, which leaves it unchanged), keys [kScoreKeys][k_stride] (k_stride / 4
// odd: eight consecutive key rows hit eight distinct 16-byte bank groups), terms
// [kScoreKeys][h_pad + 1] and w [h_pad].
struct ScoreLayout {
  int d_pad, h_pad, k_stride, t_stride;
  __host__ __device__ explicit ScoreLayout(int n_heads, int d)
      : d_pad((d + 3) / 4 * 4),
        h_pad((n_heads + 3) / 4 * 4),
        k_stride(4 * ((d_pad / 4) | 1)),
        t_stride(h_pad + 1) {}
  __host__ __device__ int q_off() const { return 0; }
  __host__ __device__ int k_off() const { return h_pad * d_pad; }
  __host__ __device__ int t_off() const { return k_off() + kScoreKeys * k_stride; }
  __host__ __device__ int w_off() const { return t_off() + kScoreKeys * t_stride; }
  __host__ __device__ int bytes() const { return (w_off() + h_pad) * 4; }
};

// One CTA per (token, kScoreKeys-key tile). The dots q[h] . k[j] are a small GEMM: thread
// (kg, hg) holds kScoreKeyTile keys (kg + 16 i) x 4 heads (4 hg + e) in registers, each
// dot its own chain over d ascending; then each term w[h] * relu(q_scale * dot) goes to
// shared memory and thread j sums its key's terms over heads ascending. Per key, every
// fp32 operation and its order is the CPU reference's (unfused __fmul_rn / __fadd_rn).
template <typename T>
__global__ void __launch_bounds__(kScoreThreads) dsa_scores_kernel(const ScoreParams p) {
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int row = int(blockIdx.x), t = p.t0 + row, pos = p.b.positions[t], tid = int(threadIdx.x);
  if (blockIdx.y == 0) {  // the top-k's histograms and tickets start at zero
    int32_t* m = p.meta + int64_t(row) * meta_words(p.parts);
    for (int i = tid; i < kMetaZeroed; i += kScoreThreads) m[i] = 0;
  }
  const int j0 = int(blockIdx.y) * kScoreKeys;
  if (pos + 1 <= p.top_k || j0 > pos) return;  // dense row, or a tile past the row
  const ScoreLayout L(p.n_heads, p.d);
  float* q_s = sm + L.q_off();
  float* k_s = sm + L.k_off();
  float* t_s = sm + L.t_off();
  float* w_s = sm + L.w_off();
  const bf16* q = p.q + int64_t(t) * p.n_heads * p.d;
  for (int h = tid; h < L.h_pad; h += kScoreThreads)
    w_s[h] = h < p.n_heads ? __fmul_rn(to_f(p.weights[int64_t(t) * p.n_heads + h]), p.weight_scale) : 0.0f;
  const int s = p.b.seq_of_token[t];
  const int32_t* table = p.b.block_table + int64_t(s) * p.b.max_blocks;
  const T* cache = static_cast<const T*>(p.cache);
  if (p.vec8) {  // d == d_pad, d % 8 == 0
    const int row8 = p.d / 8;
    for (int e = tid; e < L.h_pad * row8; e += kScoreThreads) {
      const int h = e / row8, c = (e % row8) * 8;
      float v[8];
      if (h < p.n_heads) {
        index_values8(q + int64_t(h) * p.d, c, 1.0f, v);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
      }
      float4* dst = reinterpret_cast<float4*>(q_s + h * L.d_pad + c);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    for (int e = tid; e < kScoreKeys * row8; e += kScoreThreads) {
      const int r = e / row8, c = (e % row8) * 8, j = j0 + r;
      float v[8];
      if (j <= pos) {
        const int64_t slot = int64_t(table[j / p.b.block_size]) * p.b.block_size + j % p.b.block_size;
        index_values8(cache + slot * p.d, c, kIsFp8<T> ? p.scale[slot] : 1.0f, v);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
      }
      float4* dst = reinterpret_cast<float4*>(k_s + r * L.k_stride + c);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  } else {
    for (int e = tid; e < L.h_pad * L.d_pad; e += kScoreThreads) {
      const int h = e / L.d_pad, c = e % L.d_pad;
      q_s[e] = h < p.n_heads && c < p.d ? to_f(q[h * p.d + c]) : 0.0f;
    }
    for (int e = tid; e < kScoreKeys * L.d_pad; e += kScoreThreads) {
      const int r = e / L.d_pad, c = e % L.d_pad, j = j0 + r;
      float v = 0.0f;
      if (j <= pos && c < p.d) {
        const int64_t slot = int64_t(table[j / p.b.block_size]) * p.b.block_size + j % p.b.block_size;
        v = index_value(cache + slot * p.d, c, kIsFp8<T> ? p.scale[slot] : 1.0f);
      }
      k_s[r * L.k_stride + c] = v;
    }
  }
  __syncthreads();
  constexpr int kKeyGroups = kScoreKeys / kScoreKeyTile;
  const int n_items = kKeyGroups * (L.h_pad / 4);
  for (int item = tid; item < n_items; item += kScoreThreads) {
    const int kg = item % kKeyGroups, h0 = (item / kKeyGroups) * 4;
    float acc[kScoreKeyTile][4];
#pragma unroll
    for (int i = 0; i < kScoreKeyTile; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
    const float* kr = k_s + kg * L.k_stride;
    const float* qr = q_s + h0 * L.d_pad;
    for (int c = 0; c < L.d_pad; c += 4) {
      float4 kv[kScoreKeyTile], qv[4];
#pragma unroll
      for (int i = 0; i < kScoreKeyTile; ++i)
        kv[i] = *reinterpret_cast<const float4*>(kr + i * kKeyGroups * L.k_stride + c);
#pragma unroll
      for (int e = 0; e < 4; ++e) qv[e] = *reinterpret_cast<const float4*>(qr + e * L.d_pad + c);
#pragma unroll
      for (int i = 0; i < kScoreKeyTile; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // columns c, c + 1, c + 2, c + 3 in order
          acc[i][e] = __fadd_rn(acc[i][e], __fmul_rn(qv[e].x, kv[i].x));
          acc[i][e] = __fadd_rn(acc[i][e], __fmul_rn(qv[e].y, kv[i].y));
          acc[i][e] = __fadd_rn(acc[i][e], __fmul_rn(qv[e].z, kv[i].z));
          acc[i][e] = __fadd_rn(acc[i][e], __fmul_rn(qv[e].w, kv[i].w));
        }
    }
#pragma unroll
    for (int i = 0; i < kScoreKeyTile; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        t_s[(kg + i * kKeyGroups) * L.t_stride + h0 + e] =
            __fmul_rn(w_s[h0 + e], fmaxf(__fmul_rn(p.q_scale, acc[i][e]), 0.0f));
  }
  __syncthreads();
  const int j = j0 + tid;
  if (tid >= kScoreKeys || j > pos) return;
  const float* terms = t_s + tid * L.t_stride;
  float score = 0.0f;
  for (int h = 0; h < p.n_heads; ++h) score = __fadd_rn(score, terms[h]);
  p.keys[int64_t(row) * p.ctx_cap + j] = order_key(score);
}

// ---- exact top-k ---------------------------------------------------------------

// The exclusive prefix sum of v over the CTA (kSelectThreads threads) in thread order,
// and the total.
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
    int w = lane < kSelectWarps ? warp_totals[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    if (lane < kSelectWarps) warp_totals[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const int before = warp > 0 ? warp_totals[warp - 1] : 0;
  total = warp_totals[kSelectWarps - 1];
  __syncthreads();  // warp_totals is reused by the next scan
  return before + inc - v;
}

// The sum of v over the CTA, in every thread.
__device__ __forceinline__ int block_sum_int(int v, int* warp_totals) {
  int total = 0;
  block_exclusive_scan(v, warp_totals, total);
  return total;
}

// Keys [a, e) of a row of n split in `parts` slices: slice c of every kernel below.
__device__ __forceinline__ void slice_of(int n, int parts, int c, int& a, int& e) {
  const int per = (n + parts - 1) / parts;
  a = min(n, c * per);
  e = min(n, a + per);
}

struct SelectParams {
  const uint32_t* keys;  // [chunk tokens, ctx_cap]
  int32_t* meta;         // [chunk tokens, meta_words(parts)]
  int32_t* selected;     // [n_tokens, top_k]
  DeviceBatch b;
  int t0, top_k, ctx_cap, parts;
};

// Radix-select pass `pass` (bits 31 - 8 pass .. 24 - 8 pass) of the key T of the top_k-th
// largest score. Grid (tokens, parts): each CTA counts, by this pass's digit, the keys
// of its slice whose higher digits equal T's decided prefix (warp-aggregated
// shared-memory atomics), and adds its nonzero bins to the row's global histogram; the
// CTA that arrives last (ticket after a fence: every other CTA's additions are visible)
// picks the digit from the merged histogram and records the new prefix and how many keys
// of that prefix are still to be taken.
__global__ void __launch_bounds__(kSelectThreads) dsa_radix_pass_kernel(const SelectParams p, int pass) {
  __shared__ int hist[256];
  __shared__ int warp_totals[kSelectWarps];
  __shared__ bool s_last;
  const int row = int(blockIdx.x), n = p.b.positions[p.t0 + row] + 1, tid = int(threadIdx.x);
  if (n <= p.top_k) return;  // dense
  SelectMeta m(p.meta, row, p.parts);
  const int shift = 24 - 8 * pass;
  uint32_t prefix = 0, mask = 0;
  int need = p.top_k;
  if (pass > 0) {
    prefix = uint32_t(m.state[2 * (pass - 1)]);
    need = m.state[2 * (pass - 1) + 1];
    mask = ~0u << (shift + 8);
  }
  for (int i = tid; i < 256; i += kSelectThreads) hist[i] = 0;
  __syncthreads();
  int a = 0, e = 0;
  slice_of(n, p.parts, int(blockIdx.y), a, e);
  const uint32_t* keys = p.keys + int64_t(row) * p.ctx_cap;
  for (int base = a; base < e; base += kSelectThreads) {  // uniform trip count: whole warps
    const int j = base + tid;
    const uint32_t u = j < e ? keys[j] : 0u;
    const bool hit = j < e && (u & mask) == prefix;
    const unsigned hits = __ballot_sync(0xffffffffu, hit);
    if (hit) {
      const int bin = int((u >> shift) & 255u);
      const unsigned peers = __match_any_sync(hits, bin);
      if (int(threadIdx.x % 32) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
  }
  __syncthreads();
  int* ghist = m.hist + 256 * pass;
  for (int i = tid; i < 256; i += kSelectThreads)
    if (hist[i] != 0) atomicAdd(&ghist[i], hist[i]);
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(&m.ticket[pass], 1) == p.parts - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Thread i holds bin 255 - i: its exclusive prefix is the count above that digit.
  const int bin = 255 - tid, count = __ldcg(&ghist[bin]);
  int total = 0;
  const int above = block_exclusive_scan(count, warp_totals, total);
  if (above < need && above + count >= need) {  // exactly one bin (the total is >= need)
    m.state[2 * pass] = int32_t(prefix | (uint32_t(bin) << shift));
    m.state[2 * pass + 1] = need - above;
  }
}

// Per slice, the keys above T and equal to T (counts for the emit's offsets).
__global__ void __launch_bounds__(kSelectThreads) dsa_count_kernel(const SelectParams p) {
  __shared__ int warp_totals[kSelectWarps];
  const int row = int(blockIdx.x), n = p.b.positions[p.t0 + row] + 1;
  if (n <= p.top_k) return;
  SelectMeta m(p.meta, row, p.parts);
  const uint32_t kth = uint32_t(m.state[6]);
  int a = 0, e = 0;
  slice_of(n, p.parts, int(blockIdx.y), a, e);
  const uint32_t* keys = p.keys + int64_t(row) * p.ctx_cap;
  int gt = 0, eq = 0;
  for (int j = a + int(threadIdx.x); j < e; j += kSelectThreads) {
    const uint32_t u = keys[j];
    gt += u > kth;
    eq += u == kth;
  }
  gt = block_sum_int(gt, warp_totals);
  eq = block_sum_int(eq, warp_totals);
  if (threadIdx.x == 0) {
    m.counts[2 * blockIdx.y] = gt;
    m.counts[2 * blockIdx.y + 1] = eq;
  }
}

// The selection in ascending position order: a taken key j (above T, or equal to T among
// the first `need` such) goes to out[gt_before(j) + min(eq_before(j), need)], where
// gt_before / eq_before count the keys above / equal to T at positions below j; so the
// taken keys fill 0..top_k - 1 in position order, ties going to the lower positions.
// Each CTA starts from the counts of the slices before its own and walks its slice in
// tiles, each thread a run of kEmitRun consecutive keys (one block scan per tile).
// Dense rows: 0..p, then -1.
__global__ void __launch_bounds__(kSelectThreads) dsa_emit_kernel(const SelectParams p) {
  __shared__ int warp_totals[kSelectWarps];
  const int row = int(blockIdx.x), t = p.t0 + row, n = p.b.positions[t] + 1, tid = int(threadIdx.x);
  int32_t* out = p.selected + int64_t(t) * p.top_k;
  if (n <= p.top_k) {
    for (int i = int(blockIdx.y) * kSelectThreads + tid; i < p.top_k; i += p.parts * kSelectThreads)
      out[i] = i < n ? i : -1;
    return;
  }
  SelectMeta m(p.meta, row, p.parts);
  const uint32_t kth = uint32_t(m.state[6]);
  const int need = m.state[7];
  int gt_sum = 0, eq_sum = 0;
  for (int c = tid; c < int(blockIdx.y); c += kSelectThreads) {
    gt_sum += m.counts[2 * c];
    eq_sum += m.counts[2 * c + 1];
  }
  int gt_base = block_sum_int(gt_sum, warp_totals), eq_base = block_sum_int(eq_sum, warp_totals);
  int a = 0, e = 0;
  slice_of(n, p.parts, int(blockIdx.y), a, e);
  const uint32_t* keys = p.keys + int64_t(row) * p.ctx_cap;
  for (int base = a; base < e; base += kSelectThreads * kEmitRun) {
    const int r0 = base + tid * kEmitRun;
    uint32_t u[kEmitRun];
    int gt = 0, eq = 0;
#pragma unroll
    for (int i = 0; i < kEmitRun; ++i) {
      u[i] = r0 + i < e ? keys[r0 + i] : 0u;
      gt += r0 + i < e && u[i] > kth;
      eq += r0 + i < e && u[i] == kth;
    }
    // Both counts in one scan: a tile holds at most kSelectThreads * kEmitRun < 2^16 keys.
    int total = 0;
    const int before = block_exclusive_scan(gt | (eq << 16), warp_totals, total);
    int g = gt_base + (before & 0xffff), eqn = eq_base + (before >> 16);
#pragma unroll
    for (int i = 0; i < kEmitRun; ++i) {
      if (r0 + i >= e) break;
      if (u[i] > kth) {
        out[g + min(eqn, need)] = r0 + i;
        ++g;
      } else if (u[i] == kth) {
        if (eqn < need) out[g + eqn] = r0 + i;
        ++eqn;
      }
    }
    gt_base += total & 0xffff;
    eq_base += total >> 16;
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

int dsa_score_smem_bytes(int n_heads, int d_index) { return ScoreLayout(n_heads, d_index).bytes(); }

DsaSelectPlan dsa_select_plan(const DeviceBatch& b) {
  const int64_t ctx_cap = int64_t(b.max_blocks) * b.block_size;
  if (b.n_tokens == 0 || ctx_cap == 0) return {};
  DsaSelectPlan plan;
  plan.chunk = int(std::max<int64_t>(1, std::min<int64_t>(b.n_tokens, kMaxScoreKeys / ctx_cap)));
  // Slices of about kSliceKeys keys, fewer when the chunk's tokens alone fill the GPU.
  plan.parts = std::max(1, std::min(ceil_div(ctx_cap, kSliceKeys), ceil_div(kSelectTargetCtas, plan.chunk)));
  plan.scratch_words = size_t(plan.chunk) * size_t(ctx_cap + meta_words(plan.parts));
  return plan;
}

void launch_dsa_select(const bf16* q, const bf16* weights, const DsaIndexCacheView& cache, int32_t* selected,
                       uint32_t* scratch, const DeviceBatch& b, int n_heads, int d_index, int top_k, float scale,
                       float weight_scale, int smem_cap, cudaStream_t stream) {
  if (b.n_tokens == 0) return;
  KILN_CHECK(!cache.fp8 || cache.scale != nullptr) << "dsa_select: e4m3 index cache without scales";
  const int smem = dsa_score_smem_bytes(n_heads, d_index);
  KILN_CHECK(smem <= smem_cap) << "dsa_select: " << n_heads << " index heads of " << d_index << " need " << smem
                               << " bytes of shared memory (cap " << smem_cap << ")";
  const int ctx_cap = b.max_blocks * b.block_size;
  KILN_CHECK(ctx_cap > 0) << "dsa_select: a batch without block tables";
  const DsaSelectPlan plan = dsa_select_plan(b);
  uint32_t* keys = scratch;
  int32_t* meta = reinterpret_cast<int32_t*>(scratch + int64_t(plan.chunk) * ctx_cap);
  const auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  ScoreParams p{};
  p.q = q;
  p.weights = weights;
  p.cache = cache.data;
  p.scale = cache.scale;
  p.keys = keys;
  p.meta = meta;
  p.b = b;
  p.n_heads = n_heads;
  p.d = d_index;
  p.top_k = top_k;
  p.ctx_cap = ctx_cap;
  p.parts = plan.parts;
  p.vec8 = d_index % 8 == 0 && aligned16(q) && aligned16(cache.data);
  p.q_scale = scale;
  p.weight_scale = weight_scale;
  SelectParams sp{.keys = keys, .meta = meta, .selected = selected, .b = b, .t0 = 0, .top_k = top_k,
                  .ctx_cap = ctx_cap, .parts = plan.parts};
  const auto scores = cache.fp8 ? dsa_scores_kernel<e4m3> : dsa_scores_kernel<bf16>;
  prepare_smem(scores, smem);
  for (int t0 = 0; t0 < b.n_tokens; t0 += plan.chunk) {
    const int n = std::min(plan.chunk, b.n_tokens - t0);
    p.t0 = sp.t0 = t0;
    scores<<<dim3(unsigned(n), unsigned(ceil_div(ctx_cap, kScoreKeys))), kScoreThreads, smem, stream>>>(p);
    KILN_CUDA_LAUNCH_CHECK();
    const dim3 grid(unsigned(n), unsigned(plan.parts));
    for (int pass = 0; pass < 4; ++pass) {
      dsa_radix_pass_kernel<<<grid, kSelectThreads, 0, stream>>>(sp, pass);
      KILN_CUDA_LAUNCH_CHECK();
    }
    dsa_count_kernel<<<grid, kSelectThreads, 0, stream>>>(sp);
    KILN_CUDA_LAUNCH_CHECK();
    dsa_emit_kernel<<<grid, kSelectThreads, 0, stream>>>(sp);
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
