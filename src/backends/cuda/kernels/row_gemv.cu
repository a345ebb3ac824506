// Linears of a few activation rows (one decode stream: one row) over plain bf16 weights,
// on the CUDA cores. At one row a linear is a pure stream of its weight: every weight
// byte is used once, in one multiply-add a row, so the tensor cores buy nothing and what
// decides the time is how many bytes are in flight from the first instruction on. The
// tensor-core GEMV (quant_gemv.cu) stages the activation rows in shared memory and keeps
// one or two 128-input blocks a warp in flight; here nothing is staged and every lane asks
// for its weight chunks at once.
//
// A CTA's 4 warps make groups of kOut weight rows; a group's kSplit warps each take a
// 1/kSplit slice of K, each lane 16-byte chunks of it (8 inputs) lane, lane + 32, ...,
// kLoads chunks of each row in flight; the slices' sums meet in shared memory and are
// added in slice order. Dense linears (up to kGemvParts of one input, as the GEMV's: a
// layer's q, k and v): 2 rows a CTA over its 4 warps. A one-stream MoE layer's bf16
// experts (tiles of one row): the up's gate and up rows, the GLU applied, then the down,
// which asks for its weights before the up has finished (launch_moe_row_gemv). One H200, `kiln bench op --only "linear (graph) Qwen3"` (weights
// 4x the L2, graph-replayed), us at 1 / 2 / 4 rows, the tensor-core GEMV -> this kernel:
// Qwen3-30B-A3B q / k / v 10.0 / 10.5 / 10.9 -> 7.3 / 8.2 / 10.3, o 9.1 / 10.0 / 10.9 ->
// 6.5 / 6.8 / 9.0; a TP2 rank's q / k / v 7.0 / 7.1 / 7.9 -> 4.9 / 5.3 / 6.2, o 6.1 / 6.1 /
// 6.4 -> 4.0 / 4.1 / 5.7 (a plain read of the q / k / v bytes: 6.3 us). Served at one
// stream: Qwen3-30B-A3B +8.6%, gpt-oss-20b +4.1% (docs/perf/multi-gpu.md, thirtieth section).
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/pdl.cuh"
#include "backends/cuda/kernels/quant_decode.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;  // a CTA's
constexpr int kLoads = 4;  // 16-byte chunks of each weight row a lane has in flight

// What a launch computes: dense linears (up to kGemvParts of one input), or a MoE layer's
// up (gate and up rows, then the GLU) or down product over align's tile table.
enum RowKind { kDense, kUp, kDown };

struct RowGemvParams {
  GemvPart parts[kGemvParts];  // dense
  int cta_end[kGemvParts];     // dense: CTAs of parts 0..i
  int n_parts;
  const bf16* x;  // dense, up: [tokens, K]; down: the up's act [sorted rows, K]
  int K;
  const int4* tiles;  // MoE: (expert, first sorted row, rows), expert < 0: a dead tile
  const int32_t* perm;
  const QuantExpert* experts;
  int top_k, d_ff, n_out;  // n_out: the down's (d_model)
  MoeShape s;
  bf16* act;  // up: [sorted rows, d_ff]
  float* y;   // down: [pairs, d_model]
};

// The sum of 8 products of a weight chunk and the matching activations (as float pairs).
__device__ __forceinline__ float dot8(const uint4& w, const float2 (&x)[4], float acc) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
    acc = fmaf(f.x, x[i].x, acc);
    acc = fmaf(f.y, x[i].y, acc);
  }
  return acc;
}

// A CTA's kWarps warps make kWarps / kSplit groups of kOut weight rows; a group's kSplit
// warps each take a 1/kSplit slice of K. kRows: the most activation rows (a MoE tile may
// have fewer: the rest read its last row and are not stored). Up: weight rows are fused
// columns f = 2i + h (gate, up of output i), kOut even.
template <int kKind, int kRows, int kOut, int kSplit>
__global__ void __launch_bounds__(32 * kWarps) row_gemv_kernel(const RowGemvParams p) {
  constexpr int kGroups = kWarps / kSplit;
  static_assert(kKind != kUp || kOut % 2 == 0, "an up group holds gate and up of its outputs");
  // A MoE down starts streaming its weights before the up (the kernel before it) has
  // completed: it reads the tile table and perm align wrote two kernels back and weights
  // no kernel writes (as quant_gemv.cu's). The others wait first: the up reads the tiles
  // align just wrote, and a dense linear cannot know that the kernel before it did not
  // write its weights (a dummy load's fill, a test's).
  constexpr bool kPrefetch = kKind == kDown;
  if (!kPrefetch) pdl_wait();
  __shared__ float partial[kWarps][kOut][kRows];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int group = warp / kSplit, slice = warp % kSplit;
  int rows = kRows, row0 = 0, n_out;
  const QuantExpert* ew = nullptr;
  GemvPart part = p.parts[0];
  int o_base;  // the CTA's first weight row
  if constexpr (kKind == kDense) {
    // This CTA's part (constant indices: the fields come straight from the parameter bank).
    int pi = 0, cta0 = 0;
#pragma unroll
    for (int i = 1; i < kGemvParts; ++i)
      if (i < p.n_parts && int(blockIdx.x) >= p.cta_end[i - 1]) pi = i, cta0 = p.cta_end[i - 1];
#pragma unroll
    for (int i = 1; i < kGemvParts; ++i)
      if (pi == i) part = p.parts[i];
    n_out = int(part.n_out);
    o_base = (int(blockIdx.x) - cta0) * kGroups * kOut;
  } else {
    const int4 tile = p.tiles[blockIdx.y];
    if (tile.x < 0) return;
    ew = p.experts + tile.x, row0 = tile.y, rows = tile.z;
    n_out = kKind == kUp ? 2 * p.d_ff : p.n_out;
    o_base = int(blockIdx.x) * kGroups * kOut;
  }
  const int o0 = o_base + group * kOut;
  const int nc = p.K / 8, per = (nc + kSplit - 1) / kSplit;
  const int c_begin = slice * per, c_end = min(nc, c_begin + per);
  const uint4* w[kOut];
#pragma unroll
  for (int j = 0; j < kOut; ++j) {  // (a row past the end reads the last one, not stored)
    const int f = min(o0 + j, n_out - 1);
    if constexpr (kKind == kDense) {
      w[j] = reinterpret_cast<const uint4*>(part.w.codes) + int64_t(f) * nc;
    } else {
      const QuantRowRef r = quant_row(QuantMat{}, ew, kKind == kUp, p.s.interleaved, p.d_ff, f);
      w[j] = reinterpret_cast<const uint4*>(r.m.codes) + int64_t(r.row) * nc;
    }
  }
  const uint4* x[kRows];
#pragma unroll
  for (int n = 0; n < kRows; ++n) {
    const int r = min(n, rows - 1);
    const int64_t src = kKind == kDense ? r : kKind == kUp ? p.perm[row0 + r] / p.top_k : row0 + r;
    x[n] = reinterpret_cast<const uint4*>(p.x) + src * nc;
  }

  float acc[kOut][kRows] = {};
  bool waited = !kPrefetch;
  for (int c0 = c_begin + lane; c0 < c_end; c0 += 32 * kLoads) {
    uint4 wv[kOut][kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
#pragma unroll
      for (int j = 0; j < kOut; ++j)
        wv[j][u] = c0 + 32 * u < c_end ? __ldcs(w[j] + c0 + 32 * u) : make_uint4(0, 0, 0, 0);
    if (!waited) pdl_wait(), waited = true;  // the activations are the previous kernel's
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      if (c0 + 32 * u >= c_end) continue;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const uint4 xr = __ldg(x[n] + c0 + 32 * u);
        const uint32_t words[4] = {xr.x, xr.y, xr.z, xr.w};
        float2 xf[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) xf[i] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
#pragma unroll
        for (int j = 0; j < kOut; ++j) acc[j][n] = dot8(wv[j][u], xf, acc[j][n]);
      }
    }
  }
  if (!waited) pdl_wait();  // (a slice without chunks; the writes below need the wait)
#pragma unroll
  for (int j = 0; j < kOut; ++j)
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      float v = acc[j][n];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) partial[warp][j][n] = v;
    }
  __syncthreads();
  // One thread per (group, output, row): the slices added in order, then the output.
  constexpr int kPer = kKind == kUp ? kOut / 2 : kOut;  // outputs a group
  const int t = int(threadIdx.x);
  if (t >= kGroups * kPer * kRows) return;
  const int g = t / (kPer * kRows), q = t / kRows % kPer, n = t % kRows;
  if (n >= rows) return;
  const auto sum = [&](int j) {
    float v = 0.0f;
#pragma unroll
    for (int s = 0; s < kSplit; ++s) v += partial[g * kSplit + s][j][n];
    return v;
  };
  const int o = o_base + g * kOut + (kKind == kUp ? 2 * q : q);
  if (o >= n_out) return;
  if constexpr (kKind == kDense) {
    part.out[int64_t(n) * n_out + o] = __float2bfloat16(sum(q) + (part.bias ? part.bias[o] : 0.0f));
  } else if constexpr (kKind == kUp) {
    const int i = o / 2;
    p.act[int64_t(row0 + n) * p.d_ff + i] = __float2bfloat16(glu_output(
        sum(2 * q), sum(2 * q + 1), ew->gate_up_bias, p.s.interleaved, i, p.d_ff, p.s.glu_kind, p.s.alpha, p.s.limit));
  } else {
    p.y[int64_t(p.perm[row0 + n]) * p.n_out + o] = sum(q) + (ew->down_bias ? ew->down_bias[o] : 0.0f);
  }
}

// The most rows these kernels take (0: none, the tensor-core GEMV at every row count).
std::atomic<int> max_rows{[] {
  const char* v = std::getenv("KILN_ROW_GEMV_ROWS");
  return v && *v ? std::clamp(std::atoi(v), 0, kRowGemvMaxRows) : kRowGemvDefaultRows;
}()};

// kernel<1..4> by the rows.
template <int kKind, int kOut, int kSplit>
void launch_rows(int rows, dim3 grid, const RowGemvParams& p, cudaStream_t stream) {
  void (*kernel)(RowGemvParams) = rows == 1   ? row_gemv_kernel<kKind, 1, kOut, kSplit>
                                 : rows == 2 ? row_gemv_kernel<kKind, 2, kOut, kSplit>
                                 : rows == 3 ? row_gemv_kernel<kKind, 3, kOut, kSplit>
                                             : row_gemv_kernel<kKind, 4, kOut, kSplit>;
  launch_dependent(kernel, grid, dim3(32 * kWarps), 0, stream, p);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace

int bf16_row_gemv_rows() { return max_rows.load(std::memory_order_relaxed); }

void set_bf16_row_gemv_rows(int n) { max_rows.store(std::clamp(n, 0, kRowGemvMaxRows), std::memory_order_relaxed); }

void launch_bf16_row_gemv(const bf16* x, const GemvPart* parts, int n_parts, int64_t rows, int64_t n_in,
                          cudaStream_t stream) {
  KILN_CHECK(rows >= 1 && rows <= kRowGemvMaxRows) << "bf16 row gemv: " << rows << " rows";
  KILN_CHECK(n_parts >= 1 && n_parts <= kGemvParts) << "bf16 row gemv: " << n_parts << " linears";
  KILN_CHECK(n_in % 8 == 0 && n_in <= (int64_t(1) << 30)) << "bf16 row gemv: " << n_in << " inputs";
  constexpr int kOut = 2, kSplit = 4;  // 2 rows a CTA, each over 4 warps
  RowGemvParams p{};
  p.n_parts = n_parts;
  int64_t ctas = 0;
  for (int i = 0; i < n_parts; ++i) {
    KILN_CHECK(parts[i].n_out >= 1) << "bf16 row gemv: a linear of " << parts[i].n_out << " outputs";
    p.parts[i] = parts[i];
    ctas += (parts[i].n_out + kOut - 1) / kOut;
    p.cta_end[i] = int(ctas);
  }
  KILN_CHECK(ctas < (int64_t(1) << 31)) << "bf16 row gemv: " << ctas << " CTAs";
  p.x = x;
  p.K = int(n_in);
  launch_rows<kDense, kOut, kSplit>(int(rows), dim3(unsigned(ctas)), p, stream);
}

void launch_moe_row_gemv(const bf16* x, const QuantExpert* table, const MoeShape& s, int top_k, int rows_cap,
                         const int32_t* perm, const int4* tiles, int n_slots, bf16* act, float* y,
                         cudaStream_t stream) {
  KILN_CHECK(rows_cap == kRowGemvMoeRows) << "moe row gemv: tiles of " << rows_cap << " rows";
  KILN_CHECK(s.d_model % 8 == 0 && s.d_ff % 8 == 0 && !s.transposed)
      << "moe row gemv: d_model " << s.d_model << ", d_ff " << s.d_ff;
  KILN_CHECK(n_slots >= 1 && n_slots <= 65535) << "moe row gemv: " << n_slots << " tiles";
  RowGemvParams p{};
  p.tiles = tiles;
  p.perm = perm;
  p.experts = table;
  p.top_k = top_k;
  p.d_ff = int(s.d_ff);
  p.n_out = int(s.d_model);
  p.s = s;
  p.act = act;
  p.y = y;
  // Up: gate and up of one output a group of 2 warps over d_model (each half of it), 2
  // outputs a CTA. Down: 2 rows a warp over the d_ff inputs (a few hundred), 8 a CTA. One
  // H200, Qwen3-30B-A3B one stream (kiln generate, ms a decode step; alternated in one
  // hold, noisy at +-0.05): the MoE on the tensor-core GEMV 3.242 / 3.347, this up with
  // 1 output a CTA over 4 warps 3.319 / 3.386, 2 outputs over 4 warps each 3.380 / 3.329,
  // the committed 3.212 / 3.266, 4 outputs of 1 warp each 3.374 / 3.326; a down of 2 rows
  // over 4 warps 3.48-3.53 (against 3.27), of 4 rows a warp 3.339 / 3.376. Served one
  // stream, the committed form against the tensor-core GEMV: +1.6%.
  p.x = x;
  p.K = int(s.d_model);
  launch_dependent(row_gemv_kernel<kUp, 1, 2, 2>, dim3(unsigned((s.d_ff + 1) / 2), unsigned(n_slots)),
                   dim3(32 * kWarps), 0, stream, p);
  KILN_CUDA_LAUNCH_CHECK();
  p.x = act;
  p.K = int(s.d_ff);
  launch_dependent(row_gemv_kernel<kDown, 1, 2, 1>, dim3(unsigned((s.d_model + 7) / 8), unsigned(n_slots)),
                   dim3(32 * kWarps), 0, stream, p);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
