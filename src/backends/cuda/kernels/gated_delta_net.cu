// Gated DeltaNet (ops::GatedDeltaNetArgs) and sigmoid_mul: the math of the CPU reference
// (backends/cpu/cpu_gdn.cpp) in fp32, in five launches per call (seven for prompts):
//   1. gdn_conv_kernel, a thread per (token, 4 channels): the causal depthwise convolution
//      over the sequence's conv state and the step's inputs, SiLU, into x [T, channels]
//      fp32; then gdn_qk_norm_kernel, a block per token: q and k L2-normalised per key
//      head (q also by 1/sqrt(dk)) in place; g and beta per value head into gb [T, 2 nv].
//   2. gdn_recurrent_kernel, a block per (column tile, value head, sequence): the delta
//      rule over the sequence's tokens in order. The columns of S [dk, dv] are
//      independent; a warp holds 8 columns, each split over 4 lanes of dk / 4 rows in
//      registers (sum over rows: two shuffles); o into o [T, nv dv] fp32.
//   3. gdn_norm_gate_kernel, a warp per (token, value head): rms_norm(o) * w * silu(z).
//   4. gdn_conv_state_kernel, a thread per (sequence, channel): the last conv_kernel - 1
//      inputs of the sequence into its conv state (after 1, which read the old state).
//   2'. A sequence with at least chunk_min_tokens rows in the step (a prompt) takes the
//      chunked form instead of 2, transformers' torch_chunk_gated_delta_rule in chunks of
//      kGdnChunk = 64 rows: gdn_chunk_prep_kernel, a block per (chunk, value head), the
//      chunk-local part (all chunks at once): with G the cumulative log decay in the chunk,
//      A = -beta_i k_i.k_j e^(G_i - G_j) below the diagonal, X = (I - A)^-1 by forward
//      substitution, w = X (beta k e^G), u = X (beta v), P = q_i.k_j e^(G_i - G_j) on and
//      below it; then gdn_chunk_state_kernel, a block per (32 columns of S, value head,
//      sequence), walks the chunks in order: v' = u - w S, o = (q e^G) S + P v',
//      S = e^(G_last) S + (k e^(G_last - G))^T v'. The same sums as 2 regrouped (fp32
//      throughout); the columns of S stay independent, as in 2.
// State snapshots (speculative verify steps): where snapshots[t] >= 0, the state after
// token t also goes to that state row: 2 writes S there after t's update, 4 the conv
// window ending at t (before the sequence's own row is overwritten).
// Sequences whose first token of the step is at position 0 read zero states.
// Only the chunked kernels use shared memory (dynamic, gdn_chunk_smem_bytes); no host
// synchronisation (CUDA graph capture).
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/smem.cuh"

namespace kiln::cuda {
namespace {

constexpr int kConvThreads = 256;
constexpr int kColsPerWarp = 8;     // columns of S per warp
constexpr int kRowGroups = 4;       // lanes per column (32 / kColsPerWarp)
constexpr int kRecWarps = 2;        // warps per recurrent block
constexpr int kNormWarps = 8;       // (token, head) pairs per norm block

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f(float x) { return x * sigmoid_f(x); }
// torch.nn.functional.softplus (beta 1, threshold 20), as the reference.
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

struct Dims {
  int64_t key_dim, value_dim, channels, r, width;  // width: a grouped key head's qkv columns
};
__device__ __forceinline__ Dims dims_of(const GdnParams& p) {
  Dims d;
  d.key_dim = int64_t(p.nk) * p.dk;
  d.value_dim = int64_t(p.nv) * p.dv;
  d.channels = 2 * d.key_dim + d.value_dim;
  d.r = p.nv / p.nk;
  d.width = 2 * int64_t(p.dk) + 2 * d.r * p.dv;
  return d;
}

// Channel c of [q | k | v] of token t, as the step's projection holds it.
__device__ __forceinline__ float raw_x(const GdnParams& p, const Dims& d, int64_t t, int64_t c) {
  const bf16* row = p.qkv + t * p.qkv_cols;
  if (!p.grouped) return to_f(row[c]);
  if (c < d.key_dim) return to_f(row[(c / p.dk) * d.width + c % p.dk]);
  if (c < 2 * d.key_dim) {
    c -= d.key_dim;
    return to_f(row[(c / p.dk) * d.width + p.dk + c % p.dk]);
  }
  c -= 2 * d.key_dim;
  const int64_t rdv = d.r * p.dv;
  return to_f(row[(c / rdv) * d.width + 2 * p.dk + c % rdv]);
}

// z of value channel vc (head vc / dv) of token t.
__device__ __forceinline__ float z_of(const GdnParams& p, const Dims& d, int64_t t, int64_t vc) {
  if (!p.grouped) return to_f(p.z[t * d.value_dim + vc]);
  const int64_t rdv = d.r * p.dv;
  return to_f(p.qkv[t * p.qkv_cols + (vc / rdv) * d.width + 2 * p.dk + rdv + vc % rdv]);
}

__device__ __forceinline__ float conv_state_at(const GdnParams& p, int64_t i) {
  return p.conv_state_bf16 ? to_f(static_cast<const bf16*>(p.conv_state)[i]) : static_cast<const float*>(p.conv_state)[i];
}

// Whether sequence s starts in this step (its first token at position 0): zero states.
__device__ __forceinline__ bool fresh_seq(const GdnParams& p, int s) {
  const int q0 = p.q_start[s];
  return p.q_start[s + 1] > q0 && p.positions[q0] == 0;
}

// Thread per (token, kConvChannels channels): the causal convolution and SiLU into x. (A
// thread's loads wait on its sequence's bounds, read through seq_of_token; several
// channels a thread keep that chain off the critical path.)
constexpr int kConvChannels = 4;
__global__ void __launch_bounds__(kConvThreads) gdn_conv_kernel(GdnParams p) {
  const Dims d = dims_of(p);
  const int64_t t = blockIdx.y, c0 = (int64_t(blockIdx.x) * kConvThreads + threadIdx.x) * kConvChannels;
  if (c0 >= d.channels) return;
  const int s = p.seq_of_token[t], q0 = p.q_start[s];
  const int64_t i = t - q0, km1 = p.conv_kernel - 1;
  const bool fresh = fresh_seq(p, s);
  const int64_t state_row = int64_t(p.state_slots[s]) * d.channels;
  float acc[kConvChannels] = {};
  // ext = [conv state (kernel - 1) | the sequence's inputs]; token i reads ext[i .. i + kernel).
  for (int64_t j = 0; j < p.conv_kernel; ++j) {
    const int64_t e = i + j;
#pragma unroll
    for (int u = 0; u < kConvChannels; ++u) {
      const int64_t c = c0 + u;
      if (c >= d.channels) break;
      float v;
      if (e < km1) v = fresh ? 0.0f : conv_state_at(p, (state_row + c) * km1 + e);
      else v = raw_x(p, d, q0 + e - km1, c);
      acc[u] += to_f(p.conv_weight[c * p.conv_kernel + j]) * v;
    }
  }
#pragma unroll
  for (int u = 0; u < kConvChannels; ++u)
    if (c0 + u < d.channels) p.x[t * d.channels + c0 + u] = silu_f(acc[u]);
}

// Block per token: q and k L2-normalised per key head (q also by 1/sqrt(dk)) in place,
// a warp per head; g and beta per value head into gb [T, 2 nv].
__global__ void __launch_bounds__(kConvThreads) gdn_qk_norm_kernel(GdnParams p) {
  const Dims d = dims_of(p);
  const int64_t t = blockIdx.x;
  float* x = p.x + t * d.channels;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int kh = warp; kh < 2 * p.nk; kh += n_warps) {  // q heads, then k heads
    float* v = x + int64_t(kh) * p.dk;
    float ss = 0.0f;
    for (int e = lane; e < p.dk; e += 32) ss += v[e] * v[e];
    ss = warp_sum(ss);
    // transformers' l2norm: x * rsqrt(sum x^2 + 1e-6); q also by 1/sqrt(dk).
    const float scale = 1.0f / sqrtf(ss + 1e-6f) / (kh < p.nk ? sqrtf(float(p.dk)) : 1.0f);
    for (int e = lane; e < p.dk; e += 32) v[e] *= scale;  // each lane rescales the elements it summed
  }
  for (int h = threadIdx.x; h < p.nv; h += blockDim.x) {
    float bv, av;
    if (p.grouped) {
      const int64_t at = t * 2 * p.nv + (h / d.r) * 2 * d.r + h % d.r;
      bv = to_f(p.b[at]);
      av = to_f(p.b[at + d.r]);
    } else {
      bv = to_f(p.b[t * p.nv + h]);
      av = to_f(p.a[t * p.nv + h]);
    }
    p.gb[t * 2 * p.nv + h] = -expf(p.a_log[h]) * softplus_f(av + p.dt_bias[h]);
    p.gb[t * 2 * p.nv + p.nv + h] = sigmoid_f(bv);
  }
}

// R rows of S per lane: dk <= kRowGroups * R.
template <int R>
__global__ void __launch_bounds__(kRecWarps * 32) gdn_recurrent_kernel(GdnParams p) {
  const Dims d = dims_of(p);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int jj = lane % kColsPerWarp, g = lane / kColsPerWarp;  // column in the warp, row group
  const int64_t j = int64_t(blockIdx.x) * kRecWarps * kColsPerWarp + warp * kColsPerWarp + jj;
  const int h = blockIdx.y, s = blockIdx.z, kh = h / int(d.r);
  const int q0 = p.q_start[s], q1 = p.q_start[s + 1];
  if (q1 <= q0 || gdn_chunked(q1 - q0, p.chunk_min_tokens)) return;  // the whole block: none, or chunked
  const bool fresh = p.positions[q0] == 0, col = j < p.dv;
  float* S = p.recurrent_state + (int64_t(p.state_slots[s]) * p.nv + h) * p.dk * p.dv;  // [dk, dv]
  float st[R], kr[R];
#pragma unroll
  for (int m = 0; m < R; ++m) {
    const int i = g + kRowGroups * m;
    st[m] = (!fresh && col && i < p.dk) ? S[int64_t(i) * p.dv + j] : 0.0f;
  }
  for (int64_t t = q0; t < q1; ++t) {
    const float* xt = p.x + t * d.channels;
    const float* q = xt + int64_t(kh) * p.dk;
    const float* k = xt + d.key_dim + int64_t(kh) * p.dk;
    const float decay = expf(p.gb[t * 2 * p.nv + h]), beta = p.gb[t * 2 * p.nv + p.nv + h];
    float mem = 0.0f;
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const int i = g + kRowGroups * m;
      kr[m] = i < p.dk ? k[i] : 0.0f;
      st[m] *= decay;
      mem += st[m] * kr[m];
    }
    mem += __shfl_xor_sync(0xffffffffu, mem, 8);   // the 4 row groups of this column
    mem += __shfl_xor_sync(0xffffffffu, mem, 16);
    const float v = col ? xt[2 * d.key_dim + int64_t(h) * p.dv + j] : 0.0f;
    const float delta = beta * (v - mem);
    float o = 0.0f;
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const int i = g + kRowGroups * m;
      st[m] += kr[m] * delta;
      o += st[m] * (i < p.dk ? q[i] : 0.0f);
    }
    o += __shfl_xor_sync(0xffffffffu, o, 8);
    o += __shfl_xor_sync(0xffffffffu, o, 16);
    if (col && g == 0) p.o[t * d.value_dim + int64_t(h) * p.dv + j] = o;
    if (p.snapshots != nullptr && p.snapshots[t] >= 0) {
      float* snap = p.recurrent_state + (int64_t(p.snapshots[t]) * p.nv + h) * p.dk * p.dv;
#pragma unroll
      for (int m = 0; m < R; ++m) {
        const int i = g + kRowGroups * m;
        if (col && i < p.dk) snap[int64_t(i) * p.dv + j] = st[m];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < R; ++m) {
    const int i = g + kRowGroups * m;
    if (col && i < p.dk) S[int64_t(i) * p.dv + j] = st[m];
  }
}

// ---- the chunked form ------------------------------------------------------------------

constexpr int kChunkThreads = 256;
// Columns of S per gdn_chunk_state_kernel block: 32 (4 blocks per head at dv 128). 16 (twice
// the blocks, each rereading the chunk's rows) was slower on the H200: 2,184 vs 1,754 us
// for a 4,096-row prompt at Qwen3.5's shapes.
constexpr int kStateCols = 32;
constexpr int kLd = kGdnChunkMaxHead + 4;       // leading dimension of a chunk's rows of q, k, v, w
constexpr int kSq = kGdnChunk + 4;              // of the chunk's square matrices (A, X, P)
constexpr int kRowRegs = kGdnChunk * kGdnChunkMaxHead / 4 / kChunkThreads;  // float4s per thread
static_assert(kLd % 4 == 0 && kSq % 4 == 0, "float4 rows");

// The kernels' dynamic shared memory (their layouts are at each kernel).
int chunk_prep_smem() { return 4 * (2 * kGdnChunk * kLd + kGdnChunk * kSq + 2 * kGdnChunk); }
// The state kernel's, for C columns of S per block.
int chunk_state_smem(int dk, int cols) {
  return 4 * (dk * (cols + 1) + kGdnChunk * kLd + kGdnChunk * (cols + 1) + kGdnChunk * kSq + kGdnChunk);
}

// A chunk's rows (up to 64 x 128 fp32) in flight in registers: fetch issues every load
// at once (one memory latency per chunk, hidden behind the compute that runs until
// store); rows past len and columns past n read as 0. Row i starts at base + i * stride
// + 4 c4 (16-byte aligned: n, stride and base offsets are multiples of 4 floats).
struct ChunkRows {
  static constexpr int kRowChunks = kGdnChunkMaxHead / 4;  // float4s of a row
  float4 v[kRowRegs];

  __device__ __forceinline__ void fetch(const float* base, int64_t stride, int len, int n) {
#pragma unroll
    for (int r = 0; r < kRowRegs; ++r) {
      const int idx = threadIdx.x + kChunkThreads * r, i = idx / kRowChunks, c = 4 * (idx % kRowChunks);
      v[r] = (i < len && c < n) ? *reinterpret_cast<const float4*>(base + i * stride + c)
                                : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  // R[i][c] = row i, column c times scale(i).
  template <typename Scale>
  __device__ __forceinline__ void store(float* R, const Scale& scale) const {
#pragma unroll
    for (int r = 0; r < kRowRegs; ++r) {
      const int idx = threadIdx.x + kChunkThreads * r, i = idx / kRowChunks, c = 4 * (idx % kRowChunks);
      const float s = scale(i);
      *reinterpret_cast<float4*>(R + i * kLd + c) = make_float4(v[r].x * s, v[r].y * s, v[r].z * s, v[r].w * s);
    }
  }
};
__device__ __forceinline__ float one(int) { return 1.0f; }

// The chunk this block of gdn_chunk_prep_kernel takes: its sequence, first row and length
// (the chunked sequences' chunks in order). False past the last.
__device__ __forceinline__ bool find_chunk(const GdnParams& p, int idx, int& s, int& t0, int& len) {
  for (int i = 0; i < p.n_seqs; ++i) {
    const int q0 = p.q_start[i], n = p.q_start[i + 1] - q0;
    if (!gdn_chunked(n, p.chunk_min_tokens)) continue;
    const int nc = (n + kGdnChunk - 1) / kGdnChunk;
    if (idx < nc) {
      s = i;
      t0 = q0 + idx * kGdnChunk;
      len = min(kGdnChunk, n - idx * kGdnChunk);
      return true;
    }
    idx -= nc;
  }
  return false;
}

// The inclusive sum of g over the chunk's rows (0 past len) into G[0..64), and beta into
// B: one warp.
__device__ __forceinline__ void chunk_decay(const GdnParams& p, int t0, int len, int h, float* G, float* B) {
  const int lane = threadIdx.x & 31;
  float g[2];
  for (int half = 0; half < 2; ++half) {
    const int i = lane + 32 * half;
    g[half] = i < len ? p.gb[int64_t(t0 + i) * 2 * p.nv + h] : 0.0f;
    B[i] = i < len ? p.gb[int64_t(t0 + i) * 2 * p.nv + p.nv + h] : 0.0f;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float v = __shfl_up_sync(0xffffffffu, g[half], o);
      if (lane >= o) g[half] += v;
    }
  }
  G[lane] = g[0];
  G[lane + 32] = g[1] + __shfl_sync(0xffffffffu, g[0], 31);
}

// Block (chunk, value head): A, X, P, w and u of one chunk. Shared memory: R1 [64][kLd]
// (k; then beta k e^G; then beta v), R2 [64][kLd] (q; then X [64][kSq]), A [64][kSq],
// G and B [64].
__global__ void __launch_bounds__(kChunkThreads) gdn_chunk_prep_kernel(GdnParams p) {
  extern __shared__ __align__(16) float sm[];
  int s, t0, len;
  if (!find_chunk(p, blockIdx.x, s, t0, len)) return;
  const Dims d = dims_of(p);
  const int h = blockIdx.y, kh = h / int(d.r), tid = threadIdx.x;
  float* R1 = sm;
  float* R2 = R1 + kGdnChunk * kLd;
  float* A = R2 + kGdnChunk * kLd;
  float* G = A + kGdnChunk * kSq;
  float* B = G + kGdnChunk;
  const float* x0 = p.x + int64_t(t0) * d.channels;
  {
    ChunkRows k, q;
    k.fetch(x0 + d.key_dim + int64_t(kh) * p.dk, d.channels, len, p.dk);
    q.fetch(x0 + int64_t(kh) * p.dk, d.channels, len, p.dk);
    if (tid < 32) chunk_decay(p, t0, len, h, G, B);
    k.store(R1, one);
    q.store(R2, one);
  }
  ChunkRows v;  // in flight until the product that needs it
  v.fetch(x0 + 2 * d.key_dim + int64_t(h) * p.dv, d.channels, len, p.dv);
  __syncthreads();
  if (tid < len) p.gcum[int64_t(t0 + tid) * p.nv + h] = G[tid];

  // A and P: a 4 x 4 tile per thread, rows 4 ti + a, columns tj + 16 b.
  {
    const int ti = tid / 16, tj = tid % 16;
    float kk[4][4] = {}, qk[4][4] = {};
    for (int c = 0; c < p.dk; c += 4) {
      float4 ki[4], qi[4], kj[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        ki[a] = *reinterpret_cast<const float4*>(R1 + (4 * ti + a) * kLd + c);
        qi[a] = *reinterpret_cast<const float4*>(R2 + (4 * ti + a) * kLd + c);
        kj[a] = *reinterpret_cast<const float4*>(R1 + (tj + 16 * a) * kLd + c);
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          kk[a][b] += ki[a].x * kj[b].x + ki[a].y * kj[b].y + ki[a].z * kj[b].z + ki[a].w * kj[b].w;
          qk[a][b] += qi[a].x * kj[b].x + qi[a].y * kj[b].y + qi[a].z * kj[b].z + qi[a].w * kj[b].w;
        }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int i = 4 * ti + a, j = tj + 16 * b;
        const float decay = i >= j ? expf(G[i] - G[j]) : 0.0f;  // G falls: i >= j never overflows
        A[i * kSq + j] = i > j ? -B[i] * kk[a][b] * decay : 0.0f;
        if (i < len) p.pmat[(int64_t(t0 + i) * p.nv + h) * kGdnChunk + j] = qk[a][b] * decay;
      }
  }
  __syncthreads();  // q is dead: X takes its rows

  // X = (I - A)^-1, column j by the 4 lanes tid = 4 j + part: X[i][j] = [i == j] +
  // sum over j <= m < i of A[i][m] X[m][j], row after row; a column needs only its own
  // rows, so the lanes of one warp sync among themselves. Meanwhile k becomes beta k e^G.
  float* X = R2;
  {
    const int j = tid / 4, part = tid % 4;
    for (int i = 0; i < kGdnChunk; ++i) {
      float acc = 0.0f;
      for (int m = j + part; m < i; m += 4) acc += A[i * kSq + m] * X[m * kSq + j];
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      if (part == 0) X[i * kSq + j] = i > j ? acc : (i == j ? 1.0f : 0.0f);
      __syncwarp();
    }
  }
  for (int e = tid; e < kGdnChunk * kGdnChunkMaxHead / 4; e += kChunkThreads) {
    const int i = e / (kGdnChunkMaxHead / 4), c = 4 * (e % (kGdnChunkMaxHead / 4));
    float4* r = reinterpret_cast<float4*>(R1 + i * kLd + c);
    const float sc = B[i] * expf(G[i]);
    *r = make_float4(r->x * sc, r->y * sc, r->z * sc, r->w * sc);
  }
  __syncthreads();

  // out[i][c] = sum over m < len of X[i][m] R1[m][c]: 8 rows x 4 columns per thread.
  const auto product = [&](int n_cols, float* out) {
    const int ti = tid / 32, tj = tid % 32;
    float acc[8][4] = {};
    for (int m = 0; m < len; m += 4) {
      float4 xm[8];
#pragma unroll
      for (int a = 0; a < 8; ++a) xm[a] = *reinterpret_cast<const float4*>(X + (8 * ti + a) * kSq + m);
#pragma unroll
      for (int mm = 0; mm < 4; ++mm) {
        float rm[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) rm[b] = R1[(m + mm) * kLd + tj + 32 * b];
#pragma unroll
        for (int a = 0; a < 8; ++a) {
          const float xa = mm == 0 ? xm[a].x : mm == 1 ? xm[a].y : mm == 2 ? xm[a].z : xm[a].w;
#pragma unroll
          for (int b = 0; b < 4; ++b) acc[a][b] += xa * rm[b];
        }
      }
    }
#pragma unroll
    for (int a = 0; a < 8; ++a)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int i = 8 * ti + a, c = tj + 32 * b;
        if (i < len && c < n_cols) out[(int64_t(t0 + i) * p.nv + h) * n_cols + c] = acc[a][b];
      }
  };
  product(p.dk, p.w);  // (X rows past len and R1 rows past len are 0; m runs to len rounded up)
  __syncthreads();     // R1 takes beta v
  v.store(R1, [&](int i) { return B[i]; });
  __syncthreads();
  product(p.dv, p.u);
}

// acc[a][b] += sum over k < n of A[(4 ti + a) lda + k] B[k ldb + tj + 16 b]: a thread's 4 x kB
// tile of A B, A's rows read as float4 (lda a multiple of 4; k runs to n rounded up to 4,
// so A's and B's rows past n must hold zeros or lie in bounds).
template <int kB>
__device__ __forceinline__ void mac_rows(const float* A, int lda, const float* B, int ldb, int n, int ti, int tj,
                                         float (&acc)[4][kB]) {
  for (int k = 0; k < n; k += 4) {
    float4 a4[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) a4[a] = *reinterpret_cast<const float4*>(A + (4 * ti + a) * lda + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      float bv[kB];
#pragma unroll
      for (int b = 0; b < kB; ++b) bv[b] = B[(k + kk) * ldb + tj + 16 * b];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const float av = kk == 0 ? a4[a].x : kk == 1 ? a4[a].y : kk == 2 ? a4[a].z : a4[a].w;
#pragma unroll
        for (int b = 0; b < kB; ++b) acc[a][b] += av * bv[b];
      }
    }
  }
}

// Block (C columns of S, value head, sequence): the chunks of a chunked sequence in
// order. Shared memory: S [dk][C + 1] of this block's columns, R [64][kLd] (w, then q e^G,
// then k e^(G_last - G)), V [64][C + 1] (v'), P [64][kSq], G [64]. Each chunk's next rows
// are in flight in registers during the compute before the rows are stored.
template <int C>
__global__ void __launch_bounds__(kChunkThreads) gdn_chunk_state_kernel(GdnParams p) {
  constexpr int kB = C / 16, kL = C + 1;  // column groups of a thread's tile; S's and v''s leading dimension
  extern __shared__ __align__(16) float sm[];
  const int h = blockIdx.y, s = blockIdx.z, tid = threadIdx.x;
  const int q0 = p.q_start[s], n = p.q_start[s + 1] - q0;
  if (!gdn_chunked(n, p.chunk_min_tokens)) return;
  const Dims d = dims_of(p);
  const int kh = h / int(d.r), j0 = blockIdx.x * C;
  const bool fresh = p.positions[q0] == 0;
  float* S = sm;
  float* R = S + p.dk * kL;
  float* V = R + kGdnChunk * kLd;
  float* P = V + kGdnChunk * kL;
  float* G = P + kGdnChunk * kSq;
  float* state = p.recurrent_state + (int64_t(p.state_slots[s]) * p.nv + h) * p.dk * p.dv;
  for (int e = tid; e < p.dk * C; e += kChunkThreads) {
    const int k = e / C, j = e % C;
    S[k * kL + j] = (!fresh && j0 + j < p.dv) ? state[int64_t(k) * p.dv + j0 + j] : 0.0f;
  }
  const int ti = tid / 16, tj = tid % 16;  // v' and o: rows 4 ti + a, columns tj + 16 b (b < kB)
  const float* xq = p.x + int64_t(kh) * p.dk;
  const float* xk = p.x + d.key_dim + int64_t(kh) * p.dk;
  const int64_t wrow = int64_t(p.nv) * p.dk;
  ChunkRows rows;  // w of the chunk at t0, fetched during the previous chunk
  float4 prow[kGdnChunk * kGdnChunk / 4 / kChunkThreads];
  float g_next = 0.0f;
  const auto fetch_w = [&](int t0, int len) {
    rows.fetch(p.w + int64_t(t0) * wrow + int64_t(h) * p.dk, wrow, len, p.dk);
#pragma unroll
    for (int r = 0; r < int(sizeof(prow) / sizeof(prow[0])); ++r) {
      const int idx = tid + kChunkThreads * r, i = idx / (kGdnChunk / 4), m = 4 * (idx % (kGdnChunk / 4));
      prow[r] = i < len ? *reinterpret_cast<const float4*>(p.pmat + (int64_t(t0 + i) * p.nv + h) * kGdnChunk + m)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    g_next = tid < len ? p.gcum[int64_t(t0 + tid) * p.nv + h] : 0.0f;
  };
  fetch_w(q0, min(kGdnChunk, n));
  for (int t0 = q0; t0 < q0 + n; t0 += kGdnChunk) {
    const int len = min(kGdnChunk, q0 + n - t0);
    rows.store(R, one);
#pragma unroll
    for (int r = 0; r < int(sizeof(prow) / sizeof(prow[0])); ++r) {
      const int idx = tid + kChunkThreads * r, i = idx / (kGdnChunk / 4), m = 4 * (idx % (kGdnChunk / 4));
      *reinterpret_cast<float4*>(P + i * kSq + m) = prow[r];
    }
    if (tid < kGdnChunk) G[tid] = g_next;
    __syncthreads();
    rows.fetch(xq + int64_t(t0) * d.channels, d.channels, len, p.dk);  // q, stored after v'
    // v' = u - w S
    {
      float acc[4][kB] = {};
      mac_rows<kB>(R, kLd, S, kL, p.dk, ti, tj, acc);
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < kB; ++b) {
          const int i = 4 * ti + a, j = tj + 16 * b;
          const float u = (i < len && j0 + j < p.dv) ? p.u[(int64_t(t0 + i) * p.nv + h) * p.dv + j0 + j] : 0.0f;
          V[i * kL + j] = i < len ? u - acc[a][b] : 0.0f;
        }
    }
    __syncthreads();
    rows.store(R, [&](int i) { return expf(G[i]); });  // q e^G
    __syncthreads();
    rows.fetch(xk + int64_t(t0) * d.channels, d.channels, len, p.dk);  // k, stored after o
    // o = (q e^G) S + P v'
    {
      float acc[4][kB] = {};
      mac_rows<kB>(R, kLd, S, kL, p.dk, ti, tj, acc);
      mac_rows<kB>(P, kSq, V, kL, len, ti, tj, acc);  // (P and v' rows past len are 0)
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < kB; ++b) {
          const int i = 4 * ti + a, j = j0 + tj + 16 * b;
          if (i < len && j < p.dv) p.o[int64_t(t0 + i) * d.value_dim + int64_t(h) * p.dv + j] = acc[a][b];
        }
    }
    __syncthreads();
    const float g_last = G[len - 1];
    rows.store(R, [&](int i) { return i < len ? expf(g_last - G[i]) : 0.0f; });  // k e^(G_last - G)
    __syncthreads();
    if (t0 + kGdnChunk < q0 + n) fetch_w(t0 + kGdnChunk, min(kGdnChunk, q0 + n - t0 - kGdnChunk));
    // S = e^(G_last) S + (k e^(G_last - G))^T v': rows 8 tk + a of S, columns tj + 16 b.
    {
      const int tk = tid / 16;
      const float keep = expf(g_last);
      float acc[8][kB];
#pragma unroll
      for (int a = 0; a < 8; ++a) {
        const int k = 8 * tk + a;
#pragma unroll
        for (int b = 0; b < kB; ++b) acc[a][b] = k < p.dk ? keep * S[k * kL + tj + 16 * b] : 0.0f;
      }
      for (int i = 0; i < len; ++i) {
        float vv[kB];
#pragma unroll
        for (int b = 0; b < kB; ++b) vv[b] = V[i * kL + tj + 16 * b];
        const float4 ka = *reinterpret_cast<const float4*>(R + i * kLd + 8 * tk);
        const float4 kb = *reinterpret_cast<const float4*>(R + i * kLd + 8 * tk + 4);
        const float kv[8] = {ka.x, ka.y, ka.z, ka.w, kb.x, kb.y, kb.z, kb.w};
#pragma unroll
        for (int a = 0; a < 8; ++a)
#pragma unroll
          for (int b = 0; b < kB; ++b) acc[a][b] += kv[a] * vv[b];
      }
#pragma unroll
      for (int a = 0; a < 8; ++a) {
        const int k = 8 * tk + a;
        if (k < p.dk)
#pragma unroll
          for (int b = 0; b < kB; ++b) S[k * kL + tj + 16 * b] = acc[a][b];
      }
    }
    __syncthreads();  // S complete; R, V, P free for the next chunk
  }
  for (int e = tid; e < p.dk * C; e += kChunkThreads) {
    const int k = e / C, j = e % C;
    if (j0 + j < p.dv) state[int64_t(k) * p.dv + j0 + j] = S[k * kL + j];
  }
}

__global__ void __launch_bounds__(kNormWarps * 32) gdn_norm_gate_kernel(GdnParams p) {
  const Dims d = dims_of(p);
  const int lane = threadIdx.x & 31;
  const int64_t pair = int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5);
  if (pair >= int64_t(p.n_tokens) * p.nv) return;  // the whole warp
  const int64_t t = pair / p.nv, h = pair % p.nv;
  const float* o = p.o + t * d.value_dim + h * p.dv;
  float ss = 0.0f;
  for (int j = lane; j < p.dv; j += 32) ss += o[j] * o[j];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(p.dv) + p.norm_eps);
  for (int j = lane; j < p.dv; j += 32)
    p.out[t * d.value_dim + h * p.dv + j] =
        __float2bfloat16(o[j] * inv * p.norm_weight[j] * silu_f(z_of(p, d, t, h * p.dv + j)));
}

__global__ void __launch_bounds__(kConvThreads) gdn_conv_state_kernel(GdnParams p) {
  const Dims d = dims_of(p);
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int s = blockIdx.y;
  const int q0 = p.q_start[s], n = p.q_start[s + 1] - q0;
  if (c >= d.channels || n == 0) return;
  const bool fresh = p.positions[q0] == 0;
  const int64_t km1 = p.conv_kernel - 1, at = (int64_t(p.state_slots[s]) * d.channels + c) * km1;
  // The state after token i is ext[i + 1 .. i + kernel) of ext = [old state | inputs].
  const auto window = [&](int64_t i, float* w) {
    for (int64_t e = 0; e < km1; ++e) {
      const int64_t idx = i + 1 + e;
      w[e] = idx < km1 ? (fresh ? 0.0f : conv_state_at(p, at + idx)) : raw_x(p, d, q0 + idx - km1, c);
    }
  };
  const auto store = [&](int64_t row_at, const float* w) {
    for (int64_t e = 0; e < km1; ++e) {
      if (p.conv_state_bf16) static_cast<bf16*>(p.conv_state)[row_at + e] = __float2bfloat16(w[e]);
      else static_cast<float*>(p.conv_state)[row_at + e] = w[e];
    }
  };
  float next[kGdnMaxConvKernel - 1];
  if (p.snapshots != nullptr)  // snapshot rows are not the sequence's own: they read its old state
    for (int64_t i = 0; i < n; ++i)
      if (const int32_t row = p.snapshots[q0 + i]; row >= 0) {
        window(i, next);
        store((int64_t(row) * d.channels + c) * km1, next);
      }
  window(n - 1, next);  // read it all before writing any of it
  store(at, next);
}

__global__ void sigmoid_mul_kernel(const bf16* x, const bf16* gate, bf16* out, int64_t rows, int64_t n,
                                   int64_t gate_cols) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  const int64_t r = i / n, c = i % n;
  const float gv = to_f(gate[r * gate_cols + (gate_cols == 1 ? 0 : c)]);
  out[i] = __float2bfloat16(to_f(x[i]) * sigmoid_f(gv));
}

}  // namespace

void launch_gated_delta_net(const GdnParams& p, cudaStream_t stream) {
  if (p.n_tokens == 0 || p.n_seqs == 0) return;
  const int64_t channels = 2 * int64_t(p.nk) * p.dk + int64_t(p.nv) * p.dv;
  gdn_conv_kernel<<<dim3(ceil_div(channels, kConvThreads * kConvChannels), p.n_tokens), kConvThreads, 0, stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  gdn_qk_norm_kernel<<<p.n_tokens, kConvThreads, 0, stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  if (p.n_chunks > 0) {
    const int prep = chunk_prep_smem();
    prepare_smem(gdn_chunk_prep_kernel, prep);
    gdn_chunk_prep_kernel<<<dim3(p.n_chunks, p.nv), kChunkThreads, prep, stream>>>(p);
    KILN_CUDA_LAUNCH_CHECK();
    const int state = chunk_state_smem(p.dk, kStateCols);
    prepare_smem(gdn_chunk_state_kernel<kStateCols>, state);
    gdn_chunk_state_kernel<kStateCols>
        <<<dim3(ceil_div(p.dv, kStateCols), p.nv, p.n_seqs), kChunkThreads, state, stream>>>(p);
    KILN_CUDA_LAUNCH_CHECK();
  }
  const dim3 rec_grid(ceil_div(p.dv, kRecWarps * kColsPerWarp), p.nv, p.n_seqs);
  if (p.dk <= kRowGroups * 8) gdn_recurrent_kernel<8><<<rec_grid, kRecWarps * 32, 0, stream>>>(p);
  else if (p.dk <= kRowGroups * 32) gdn_recurrent_kernel<32><<<rec_grid, kRecWarps * 32, 0, stream>>>(p);
  else gdn_recurrent_kernel<64><<<rec_grid, kRecWarps * 32, 0, stream>>>(p);  // dk <= kGdnMaxDk
  KILN_CUDA_LAUNCH_CHECK();
  gdn_norm_gate_kernel<<<ceil_div(int64_t(p.n_tokens) * p.nv, kNormWarps), kNormWarps * 32, 0, stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  gdn_conv_state_kernel<<<dim3(ceil_div(channels, kConvThreads), p.n_seqs), kConvThreads, 0, stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
}

int32_t gdn_chunk_count(const int32_t* q_start, int32_t n_seqs, int32_t chunk_min_tokens) {
  int32_t n = 0;
  for (int32_t s = 0; s < n_seqs; ++s) {
    const int32_t rows = q_start[s + 1] - q_start[s];
    if (gdn_chunked(rows, chunk_min_tokens)) n += (rows + kGdnChunk - 1) / kGdnChunk;
  }
  return n;
}

int64_t gdn_chunk_smem_bytes(int dk) { return std::max(chunk_prep_smem(), chunk_state_smem(dk, kStateCols)); }

void launch_sigmoid_mul(const bf16* x, const bf16* gate, bf16* out, int64_t rows, int64_t n, int64_t gate_cols,
                        cudaStream_t stream) {
  if (rows * n == 0) return;
  sigmoid_mul_kernel<<<ceil_div(rows * n, 256), 256, 0, stream>>>(x, gate, out, rows, n, gate_cols);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
