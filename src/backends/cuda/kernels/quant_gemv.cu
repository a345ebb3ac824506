// Decode-shaped products over quantized weights (quant_pack.h layout): a few rows of
// activations (at most kGemvRows) against each weight, the case of MoE decode (one
// or two tokens per expert) and of a dense linear at batch 1-4. Tensor-core tiles
// waste 12 of 16 rows there and stage every weight through shared memory; here each
// warp streams its weight rows straight from global memory into registers (16 bytes
// per lane: 32 four-bit or 16 FP8 codes), decodes them with a few integer ops and
// multiplies on the CUDA cores, the activations read from shared memory.
//
// Work unit: one warp owns a pair of weight rows at a time, for every activation row of
// its tile: (gate_i, up_i) of a fused gate/up GEMM (the GLU applied in the warp), or
// two consecutive output rows of a down / dense GEMM. A CTA covers kUnitsPerCta units
// of one tile (MoE: moe_gemm.cu's tile table with tiles of kGemvRows rows; dense: all
// rows). A lane's chunk (32 four-bit or 16 FP8 codes) holds whole scale groups or
// lies in one (groups are 16 to 128 inputs), so the products of a group are summed
// first and scaled once, in fp32.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/quant_decode.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnitsPerCta = 64;
constexpr int kKTile = 128;  // codes are padded to whole 128-input tiles

struct GemvParams {
  const int4* tiles;           // MoE tile table, or nullptr: dense (one tile of `dense_rows` rows)
  const int32_t* perm;
  const QuantExpert* experts;
  QuantMat dense;
  const float* dense_bias;
  int dense_rows;
  int x_rows;                  // activation rows staged in shared memory (<= kGemvRows)
  const bf16* a;               // activations [.., K]
  int top_k, K, Kp, units, d_ff, n_out;
  int64_t code_row, scale_row;
  QuantFormat f;
  MoeShape s;
  bf16* act;                   // up: [sorted rows, d_ff]
  float* y;                    // down: [pairs, d_model]
  bf16* out;                   // dense: [rows, n_out]
};

// Four codes of byte pair `b` (bits 0-15: codes 0..3, low nibble first) as four floats.
// e2m1: magnitudes through two byte permutations (tables of the bf16 high and low bytes
// of 0, .5, 1, 1.5, 2, 3, 4, 6), the sign bit moved to bit 15 of each bf16.
__device__ __forceinline__ void e2m1x4(uint32_t b, float (&v)[4]) {
  const uint32_t sel = b & 0x7777u;
  const uint32_t hi = __byte_perm(0x3f3f3f00u, 0x40404040u, sel);
  const uint32_t lo = __byte_perm(0xc0800000u, 0xc0804000u, sel);
  const uint32_t p01 = __byte_perm(lo, hi, 0x5140), p23 = __byte_perm(lo, hi, 0x7362);
  const uint32_t s01 = ((b & 0x8u) << 12) | ((b & 0x80u) << 24), s23 = ((b & 0x800u) << 4) | ((b & 0x8000u) << 16);
  v[0] = __uint_as_float((p01 | s01) << 16);
  v[1] = __uint_as_float((p01 | s01) & 0xffff0000u);
  v[2] = __uint_as_float((p23 | s23) << 16);
  v[3] = __uint_as_float((p23 | s23) & 0xffff0000u);
}

// Eight values of 32 bits of codes (4-bit: 8 codes; FP8 takes two words per 8).
template <int kValue>
__device__ __forceinline__ void decode8(uint32_t w0, uint32_t w1, float (&v)[8]) {
  if constexpr (kValue == 0) {
    float a[4], b[4];
    e2m1x4(w0 & 0xffffu, a);
    e2m1x4(w0 >> 16, b);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = a[i], v[4 + i] = b[i];
  } else if constexpr (kValue == 1) {
    // (code | 0x4300) as bf16 is 128 + code: two codes per 32-bit op.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t t = ((w0 >> (4 * j)) & 0x000f000fu) | 0x43004300u;  // codes j and j + 4
      v[j] = __uint_as_float(t << 16) - 136.0f;
      v[j + 4] = __uint_as_float(t & 0xffff0000u) - 136.0f;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t w = j < 2 ? w0 : w1;
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((w >> (16 * (j % 2))) & 0xffffu), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      v[2 * j] = f.x;
      v[2 * j + 1] = f.y;
    }
  }
}

// kUp: unit i = (gate row, up row) of output i; else unit u = rows (2u, 2u + 1).
template <int kValue, bool kUp>
__global__ void __launch_bounds__(kThreads) quant_gemv_kernel(const GemvParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* xs = reinterpret_cast<bf16*>(smem);  // [x_rows, Kp], zero past K and past the tile's rows
  int row0, rows;
  const QuantExpert* ew = nullptr;
  if (p.tiles != nullptr) {
    const int4 tile = p.tiles[blockIdx.x];
    if (tile.x < 0) return;
    row0 = tile.y, rows = tile.z;
    ew = p.experts + tile.x;
  } else {
    row0 = 0, rows = p.dense_rows;
  }
  // Activation rows into shared memory, 8 bf16 per 16-byte load.
  const int chunks_per_row = p.Kp / 8;
  for (int c = threadIdx.x; c < p.x_rows * chunks_per_row; c += kThreads) {
    const int r = c / chunks_per_row, k = (c % chunks_per_row) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows && k < p.K) {
      const int64_t src = p.tiles == nullptr ? r : kUp ? p.perm[row0 + r] / p.top_k : row0 + r;
      v = *reinterpret_cast<const uint4*>(p.a + src * p.K + k);
    }
    *reinterpret_cast<uint4*>(xs + r * p.Kp + k) = v;
  }
  __syncthreads();

  constexpr int kCodes = kValue == 2 ? 16 : 32;  // per lane per chunk (16 bytes)
  constexpr int kSteps = kCodes / 8;              // 8 inputs per step
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Rows to multiply: the tile's (a decode tile usually has one), uniform in the CTA.
  // Groups are powers of two (16 to 128): shifts, not divisions, in the inner loop.
  const int group_shift = __ffs(p.f.group) - 1, n_chunks = p.Kp / kCodes, x_rows = min(p.x_rows, rows);
  float gu_scale2[2] = {1.0f, 1.0f};
  for (int u = blockIdx.y * kUnitsPerCta + warp; u < min(p.units, (blockIdx.y + 1) * kUnitsPerCta); u += kWarps) {
    // The unit's two weight rows.
    const uint8_t* codes[2];
    const uint8_t* scales[2];
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Unit u is fused column 2u + h of an up GEMM, or output rows 2u + h.
      const QuantRowRef w = quant_row(p.dense, ew, kUp, p.s.interleaved, p.d_ff, 2 * u + h);
      live[h] = kUp || 2 * u + h < p.n_out;
      codes[h] = w.m.codes + int64_t(live[h] ? w.row : 0) * p.code_row;
      scales[h] = w.m.scales + int64_t(live[h] ? w.row : 0) * p.scale_row;
      gu_scale2[h] = w.m.scale2 ? *w.m.scale2 : 1.0f;
    }
    float acc[2][kGemvRows] = {};
    // The next chunk's codes are loaded before this one is decoded: two 16-byte loads
    // per row in flight per lane.
    const auto load = [&](int c, uint4 (&w)[2]) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        w[h] = live[h] && c < n_chunks ? __ldg(reinterpret_cast<const uint4*>(codes[h]) + c) : make_uint4(0, 0, 0, 0);
    };
    uint4 next[2];
    load(lane, next);
    for (int c = lane; c < n_chunks; c += 32) {
      uint4 w[2] = {next[0], next[1]};
      load(c + 32, next);
      const int k0 = c * kCodes;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t words[4] = {w[h].x, w[h].y, w[h].z, w[h].w};
        float part[kGemvRows] = {};
        float sc = 0.0f;
#pragma unroll
        for (int q = 0; q < kSteps; ++q) {
          const int k = k0 + q * 8;
          if (q == 0 || (k & ((1 << group_shift) - 1)) == 0) {  // a scale group starts (or the chunk does)
            if (q > 0) {
#pragma unroll
              for (int r = 0; r < kGemvRows; ++r) acc[h][r] += part[r] * sc, part[r] = 0.0f;
            }
            sc = scale_value(p.f.scale_kind, scales[h] + (k >> group_shift) * p.f.scale_bytes);
          }
          float v[8];
          if constexpr (kValue == 2) decode8<2>(words[2 * q], words[2 * q + 1], v);
          else decode8<kValue>(words[q], 0u, v);
#pragma unroll
          for (int r = 0; r < kGemvRows; ++r) {
            if (r >= x_rows) break;
            const uint4 xv = *reinterpret_cast<const uint4*>(xs + r * p.Kp + k);
            const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              part[r] += __uint_as_float(xw[e] << 16) * v[2 * e];
              part[r] += __uint_as_float(xw[e] & 0xffff0000u) * v[2 * e + 1];
            }
          }
        }
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) acc[h][r] += part[r] * sc;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) acc[h][r] = warp_sum(acc[h][r]) * gu_scale2[h];
    if (lane >= kGemvRows || lane >= rows) continue;
    const int r = lane;  // lane r writes activation row r's outputs
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
    for (int i = 0; i < kGemvRows; ++i)
      if (i == r) v0 = acc[0][i], v1 = acc[1][i];
    if constexpr (kUp) {
      if (ew->gate_up_bias != nullptr) {
        const bool il = p.s.interleaved && ew->gate_up.codes != nullptr;
        v0 += ew->gate_up_bias[il ? 2 * u : u];
        v1 += ew->gate_up_bias[il ? 2 * u + 1 : p.d_ff + u];
      }
      p.act[int64_t(row0 + r) * p.d_ff + u] = __float2bfloat16(glu_value(v0, v1, p.s.glu_kind, p.s.alpha, p.s.limit));
    } else if (ew == nullptr) {
      bf16* o = p.out + int64_t(r) * p.n_out + 2 * u;
      o[0] = __float2bfloat16(v0 + (p.dense_bias ? p.dense_bias[2 * u] : 0.0f));
      if (live[1]) o[1] = __float2bfloat16(v1 + (p.dense_bias ? p.dense_bias[2 * u + 1] : 0.0f));
    } else {
      if (ew->down_bias != nullptr) v0 += ew->down_bias[2 * u], v1 += ew->down_bias[2 * u + 1];
      const int64_t pair = p.perm[row0 + r];
      *reinterpret_cast<float2*>(p.y + pair * p.n_out + 2 * u) = make_float2(v0, v1);
    }
  }
}

template <bool kUp>
void launch_gemv(const GemvParams& p, int grid_x, cudaStream_t stream) {
  const int smem = p.x_rows * p.Kp * 2;
  const dim3 grid(unsigned(grid_x), unsigned((p.units + kUnitsPerCta - 1) / kUnitsPerCta));
  const auto go = [&](auto kernel) {
    if (smem > 48 * 1024) KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<grid, kThreads, smem, stream>>>(p);
  };
  switch (p.f.value) {
    case 0: go(quant_gemv_kernel<0, kUp>); break;
    case 1: go(quant_gemv_kernel<1, kUp>); break;
    default: go(quant_gemv_kernel<2, kUp>);
  }
  KILN_CUDA_LAUNCH_CHECK();
}

void set_k(GemvParams& p, const QuantFormat& f, int64_t K) {
  p.K = int(K);
  p.Kp = int(f.k_padded(K));
  p.code_row = f.code_row_bytes(K);
  p.scale_row = f.scale_row_bytes(K);
}

}  // namespace

int quant_gemv_smem_bytes(int64_t rows, int64_t k) { return int(rows * ((k + kKTile - 1) / kKTile * kKTile) * 2); }

void launch_quant_gemv_linear(const bf16* x, const QuantMat& w, const QuantFormat& f, const float* bias, int64_t rows,
                              int64_t n_out, int64_t n_in, bf16* out, cudaStream_t stream) {
  KILN_CHECK(rows >= 1 && rows <= kGemvRows) << "quant gemv: " << rows << " rows";
  GemvParams p{};
  p.dense = w;
  p.dense_bias = bias;
  p.dense_rows = int(rows);
  p.x_rows = int(rows);
  p.a = x;
  p.n_out = int(n_out);
  p.units = int((n_out + 1) / 2);
  p.f = f;
  p.out = out;
  set_k(p, f, n_in);
  launch_gemv<false>(p, 1, stream);
}

void launch_moe_gemv_quant(const bf16* x, const QuantExpert* table, const QuantFormat& f, const MoeShape& s,
                           int top_k, const int32_t* perm, const int4* tiles, int n_slots, bf16* act, float* y,
                           cudaStream_t stream) {
  GemvParams p{};
  p.tiles = tiles;
  p.perm = perm;
  p.experts = table;
  p.top_k = top_k;
  p.d_ff = int(s.d_ff);
  p.s = s;
  p.f = f;
  p.act = act;
  p.y = y;
  p.a = x;
  p.x_rows = kGemvRows;
  p.units = int(s.d_ff);
  set_k(p, f, s.d_model);
  launch_gemv<true>(p, n_slots, stream);
  p.a = act;
  p.units = int(s.d_model / 2);
  p.n_out = int(s.d_model);
  set_k(p, f, s.d_ff);
  launch_gemv<false>(p, n_slots, stream);
}

}  // namespace kiln::cuda
