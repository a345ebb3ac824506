// Gated DeltaNet (ops::GatedDeltaNetArgs) and sigmoid_mul: the math of the CPU reference
// (backends/cpu/cpu_gdn.cpp) in fp32, in four launches per call:
//   1. gdn_conv_kernel, a block per token: the causal depthwise convolution over the
//      sequence's conv state and the step's inputs, SiLU, into x [T, channels] fp32; then
//      q and k L2-normalised per key head (q also by 1/sqrt(dk)) in place; g and beta per
//      value head into gb [T, 2 nv].
//   2. gdn_recurrent_kernel, a block per (column tile, value head, sequence): the delta
//      rule over the sequence's tokens in order. The columns of S [dk, dv] are
//      independent; a warp holds 8 columns, each split over 4 lanes of dk / 4 rows in
//      registers (sum over rows: two shuffles); o into o [T, nv dv] fp32.
//   3. gdn_norm_gate_kernel, a warp per (token, value head): rms_norm(o) * w * silu(z).
//   4. gdn_conv_state_kernel, a thread per (sequence, channel): the last conv_kernel - 1
//      inputs of the sequence into its conv state (after 1, which read the old state).
// State snapshots (speculative verify steps): where snapshots[t] >= 0, the state after
// token t also goes to that state row: 2 writes S there after t's update, 4 the conv
// window ending at t (before the sequence's own row is overwritten).
// Sequences whose first token of the step is at position 0 read zero states.
// No dynamic shared memory, no host synchronisation (CUDA graph capture).
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"

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

__global__ void __launch_bounds__(kConvThreads) gdn_conv_kernel(GdnParams p) {
  const Dims d = dims_of(p);
  const int64_t t = blockIdx.x;
  const int s = p.seq_of_token[t], q0 = p.q_start[s];
  const int64_t i = t - q0, km1 = p.conv_kernel - 1;
  const bool fresh = fresh_seq(p, s);
  const int64_t state_row = int64_t(p.state_slots[s]) * d.channels;
  float* x = p.x + t * d.channels;
  for (int64_t c = threadIdx.x; c < d.channels; c += blockDim.x) {
    // ext = [conv state (kernel - 1) | the sequence's inputs]; token i reads ext[i .. i + kernel).
    float acc = 0.0f;
    for (int64_t j = 0; j < p.conv_kernel; ++j) {
      const int64_t e = i + j;
      float v;
      if (e < km1) v = fresh ? 0.0f : conv_state_at(p, (state_row + c) * km1 + e);
      else v = raw_x(p, d, q0 + e - km1, c);
      acc += to_f(p.conv_weight[c * p.conv_kernel + j]) * v;
    }
    x[c] = silu_f(acc);
  }
  __syncthreads();  // the block's x writes are visible to the whole block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int kh = warp; kh < p.nk; kh += n_warps) {
    float* q = x + int64_t(kh) * p.dk;
    float* k = x + d.key_dim + int64_t(kh) * p.dk;
    float qq = 0.0f, kk = 0.0f;
    for (int e = lane; e < p.dk; e += 32) {
      qq += q[e] * q[e];
      kk += k[e] * k[e];
    }
    qq = warp_sum(qq);
    kk = warp_sum(kk);
    // transformers' l2norm: x * rsqrt(sum x^2 + 1e-6); q also by 1/sqrt(dk).
    const float qs = 1.0f / sqrtf(qq + 1e-6f) / sqrtf(float(p.dk)), ks = 1.0f / sqrtf(kk + 1e-6f);
    for (int e = lane; e < p.dk; e += 32) {  // each lane rescales the elements it summed
      q[e] *= qs;
      k[e] *= ks;
    }
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
  if (q1 <= q0) return;  // the whole block: no tokens of this sequence
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
  gdn_conv_kernel<<<p.n_tokens, kConvThreads, 0, stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
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

void launch_sigmoid_mul(const bf16* x, const bf16* gate, bf16* out, int64_t rows, int64_t n, int64_t gate_cols,
                        cudaStream_t stream) {
  if (rows * n == 0) return;
  sigmoid_mul_kernel<<<ceil_div(rows * n, 256), 256, 0, stream>>>(x, gate, out, rows, n, gate_cols);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
