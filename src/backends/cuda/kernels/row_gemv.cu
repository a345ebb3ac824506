// Linears of a few activation rows (one decode stream: one row) over plain bf16 weights,
// on the CUDA cores. At one row a linear is a pure stream of its weight: every weight
// byte is used once, in one multiply-add a row, so the tensor cores buy nothing and what
// decides the time is how many bytes are in flight from the first instruction on. The
// tensor-core GEMV (quant_gemv.cu) stages the activation rows in shared memory and keeps
// one or two 128-input blocks a warp in flight; here nothing is staged and every lane asks
// for its weight chunks at once.
//
// A CTA of kWarps warps owns kOut consecutive output rows of one part (a launch covers up
// to kGemvParts linears of one input, as the GEMV's: a layer's q, k and v); each warp
// takes a 1/kWarps slice of K, each lane 16-byte chunks of it (8 inputs) lane, lane + 32,
// ..., kLoads chunks of each row in flight; the slices' sums meet in shared memory and are
// added in slice order. One H200, `kiln bench op --only "linear (graph) Qwen3"` (weights
// 4x the L2, graph-replayed), us at 1 / 2 / 4 rows, the tensor-core GEMV -> this kernel:
// Qwen3-30B-A3B q / k / v 10.0 / 10.5 / 10.9 -> 7.3 / 8.2 / 10.3, o 9.1 / 10.0 / 10.9 ->
// 6.5 / 6.8 / 9.0; a TP2 rank's q / k / v 7.0 / 7.1 / 7.9 -> 4.9 / 5.3 / 6.2, o 6.1 / 6.1 /
// 6.4 -> 4.0 / 4.1 / 5.7 (a plain read of the q / k / v bytes: 6.3 us). Served at one
// stream: Qwen3-30B-A3B +8.6%, gpt-oss-20b +4.1% (docs/perf/multi-gpu.md, thirtieth section).
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/pdl.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;  // K slices a CTA
constexpr int kOut = 2;    // output rows a CTA
constexpr int kLoads = 4;  // 16-byte chunks of each weight row a lane has in flight

struct RowGemvParams {
  GemvPart parts[kGemvParts];
  int cta_end[kGemvParts];  // CTAs of parts 0..i
  int n_parts;
  const bf16* x;  // [rows, K]
  int K;
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

template <int kRows>
__global__ void __launch_bounds__(32 * kWarps) bf16_row_gemv_kernel(const RowGemvParams p) {
  // A dense linear cannot know that the kernel before it did not write its weights (a
  // dummy load's fill, a test's): it waits before its first read.
  pdl_wait();
  __shared__ float partial[kWarps][kOut][kRows];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  // This CTA's part (constant indices: the fields come straight from the parameter bank).
  int pi = 0, cta0 = 0;
#pragma unroll
  for (int i = 1; i < kGemvParts; ++i)
    if (i < p.n_parts && int(blockIdx.x) >= p.cta_end[i - 1]) pi = i, cta0 = p.cta_end[i - 1];
  GemvPart part = p.parts[0];
#pragma unroll
  for (int i = 1; i < kGemvParts; ++i)
    if (pi == i) part = p.parts[i];
  const int o0 = (int(blockIdx.x) - cta0) * kOut;
  const int nc = p.K / 8, per = (nc + kWarps - 1) / kWarps;
  const int c_begin = warp * per, c_end = min(nc, c_begin + per);
  const uint4* w[kOut];
#pragma unroll
  for (int j = 0; j < kOut; ++j)  // (a row past the part's end reads its last row, not stored)
    w[j] = reinterpret_cast<const uint4*>(part.w.codes) + int64_t(min(o0 + j, int(part.n_out) - 1)) * nc;
  const uint4* x = reinterpret_cast<const uint4*>(p.x);

  float acc[kOut][kRows] = {};
  for (int c0 = c_begin + lane; c0 < c_end; c0 += 32 * kLoads) {
    uint4 wv[kOut][kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
#pragma unroll
      for (int j = 0; j < kOut; ++j)
        wv[j][u] = c0 + 32 * u < c_end ? __ldcs(w[j] + c0 + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      if (c0 + 32 * u >= c_end) continue;
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const uint4 xr = __ldg(x + int64_t(n) * nc + c0 + 32 * u);
        const uint32_t words[4] = {xr.x, xr.y, xr.z, xr.w};
        float2 xf[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) xf[i] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
#pragma unroll
        for (int j = 0; j < kOut; ++j) acc[j][n] = dot8(wv[j][u], xf, acc[j][n]);
      }
    }
  }
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
  if (int(threadIdx.x) < kOut * kRows) {
    const int j = int(threadIdx.x) / kRows, n = int(threadIdx.x) % kRows, o = o0 + j;
    if (o >= part.n_out) return;
    float v = 0.0f;
#pragma unroll
    for (int s = 0; s < kWarps; ++s) v += partial[s][j][n];
    part.out[int64_t(n) * part.n_out + o] = __float2bfloat16(v + (part.bias ? part.bias[o] : 0.0f));
  }
}

// The most rows this kernel takes (0: none, the tensor-core GEMV at every row count).
std::atomic<int> max_rows{[] {
  const char* v = std::getenv("KILN_ROW_GEMV_ROWS");
  return v && *v ? std::clamp(std::atoi(v), 0, kRowGemvMaxRows) : kRowGemvDefaultRows;
}()};

}  // namespace

int bf16_row_gemv_rows() { return max_rows.load(std::memory_order_relaxed); }

void set_bf16_row_gemv_rows(int n) { max_rows.store(std::clamp(n, 0, kRowGemvMaxRows), std::memory_order_relaxed); }

void launch_bf16_row_gemv(const bf16* x, const GemvPart* parts, int n_parts, int64_t rows, int64_t n_in,
                          cudaStream_t stream) {
  KILN_CHECK(rows >= 1 && rows <= kRowGemvMaxRows) << "bf16 row gemv: " << rows << " rows";
  KILN_CHECK(n_parts >= 1 && n_parts <= kGemvParts) << "bf16 row gemv: " << n_parts << " linears";
  KILN_CHECK(n_in % 8 == 0 && n_in <= (int64_t(1) << 30)) << "bf16 row gemv: " << n_in << " inputs";
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
  void (*kernel)(RowGemvParams) = rows == 1   ? bf16_row_gemv_kernel<1>
                                 : rows == 2 ? bf16_row_gemv_kernel<2>
                                 : rows == 3 ? bf16_row_gemv_kernel<3>
                                             : bf16_row_gemv_kernel<4>;
  launch_dependent(kernel, dim3(unsigned(ctas)), dim3(32 * kWarps), 0, stream, p);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
