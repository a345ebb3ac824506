// GEMMs over quantized weights (the portable path, sm_80+): FP8 e4m3, MXFP4, NVFP4
// and INT4 weights in the packed layout of backends/cuda/quant_pack.h, bf16
// activations, bf16 mma.sync m16n8k16 with fp32 accumulation (W8A16 / W4A16).
//
// One kernel serves dense linears and both MoE GEMMs (moe_gemm.cu's tile table,
// fused gate/up columns and GLU epilogue; see there). A multistage cp.async pipeline
// brings in, per stage of 64 inputs, the activation tile and the weight's raw codes
// (and the scales of their 128-input k tile); the CTA dequantizes stage s + 1's weight
// tile into one of two bf16 tiles in shared memory (value(code) * scale, exact in bf16
// for MXFP4 and NVFP4; one bf16 rounding for INT4 and FP8, as transformers' bf16
// dequantization has) while its warps run the bf16 kernel's ldmatrix + mma loop over
// stage s and the other tile: one barrier per stage. NVFP4's global scale multiplies
// the fp32 result. Weights move once, at their packed size.
//
// The dequantization is the CUDA cores' work and is shared by the tile's rows, so the
// tile shape is chosen by rows per weight (QTile, quant_gemm_tile: the place for a
// tuner). Shared memory = stages x (A + codes + a k tile's scales) + two B tiles:
//   decode:  16 x 64, 4 warps in N, 6 stages: 52 KiB (4-bit), 64 KiB (FP8);
//   prefill: 64 x 128 (FP8 64 x 64), 2 x 4 warps, 4 stages: 96 KiB (72 KiB FP8);
//   wide:    128 x 128, 4 x 2 warps, 3 stages: 95 KiB; 4-bit formats whose k tile's
//            scales of a row fit 8 bytes (MXFP4, NVFP4, INT4 with 16-bit scales, g >= 32).
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/attention_mma.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/quant_decode.cuh"
#include "backends/cuda/kernels/smem.cuh"
#include "backends/cuda/kernels/tile_grid.cuh"

namespace kiln::cuda {
namespace {

using attn::cp_async_16;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::smem_u32;
using attn::swz;

constexpr int kKTile = 128;      // the packed layout's k tile (quant_pack.h kQuantKTile): scales per tile
constexpr int kKStage = 64;      // inputs per pipeline stage: one 128-byte swizzled bf16 row of A and of B
constexpr int kMaxScaleRow = 32; // scale bytes per row per k tile (kQuantMaxTileScaleBytes)
// Dense decode tiles split over k (quant_linear_k_splits) where their grid leaves SMs
// without work: enough splits for about kQuantSplitWaves CTAs per SM, at most
// kQuantMaxKSplits, each of at least kQuantMinSplitStages stages (the 6-stage pipeline's
// fill is not repaid by fewer). A decode tile is one CTA per 64 outputs streaming the
// whole K: GLM-4.5-Air's FP8 o_proj (12,288 -> 4,096) ran as 64 CTAs at 257 GB/s for
// 4-31 rows on an H200, 200 us against 43 us for the GEMV of one row; in 5 splits 72 us
// at 8 rows, 108 at 31 (kiln bench op "linear (quantized, decode rows)", docs/PERF.md).
constexpr int kQuantSplitWaves = 2;
constexpr int kQuantMaxKSplits = 8;
constexpr int kQuantMinSplitStages = 8;

// value: 0 e2m1, 1 int4, 2 e4m3 (QuantValue).
// kScaleRow: scale bytes per row per k tile the stage holds (at most kMaxScaleRow; a
// format with more takes another shape, quant_gemm_tile).
template <int kBM_, int kBNF_, int kWarpsM_, int kWarpsN_, int kStages_, int kValue_, int kScaleRow_ = kMaxScaleRow>
struct QConfig {
  static constexpr int kBM = kBM_, kBNF = kBNF_, kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kStages = kStages_;
  static constexpr int kScaleRow = kScaleRow_;
  static constexpr int kValue = kValue_;
  static constexpr int kBits = kValue == 2 ? 8 : 4;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMT = kBM / (16 * kWarpsM);
  static constexpr int kNT = kBNF / (8 * kWarpsN);
  static constexpr int kABytes = kBM * kKStage * 2;
  static constexpr int kCodeRow = kKStage * kBits / 8;      // code bytes per row per stage
  static constexpr int kCodeBytes = kBNF * kCodeRow;
  static constexpr int kScaleBytes = kBNF * kScaleRow;      // the scales of the stage's k tile
  static constexpr int kStageBytes = kABytes + kCodeBytes + kScaleBytes;
  static constexpr int kBTileBytes = kBNF * kKStage * 2;    // one of the two dequantized B tiles
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kBTileBytes;
  static constexpr int kAChunks = kABytes / 16 / kThreads;
  static constexpr int kCodeChunks = (kCodeBytes / 16 + kThreads - 1) / kThreads;
  // Consecutive 8-input chunks of one B row each thread dequantizes per stage.
  static constexpr int kDeqChunks = kBNF * kKStage / 8 / kThreads;
  // The fp32 result's factor that undoes the bias of decoded e2m1 values (see dequantize_stage).
  static constexpr float kUnbias = kValue == 0 ? 0x1p26f : 1.0f;
  static_assert(kMT >= 1 && kNT % 2 == 0, "warp tile: whole m16 tiles, pairs of n8 tiles");
  static_assert(kAChunks >= 1 && kDeqChunks >= 1 && (kKStage / 8) % kDeqChunks == 0,
                "every thread loads A and dequantizes whole chunks of one row");
  static_assert(kStages >= 3, "the main loop waits for stage s + 1 while stage s + 2 may be in flight");
  static_assert(kBits == 8 || kDeqChunks % 2 == 0, "4-bit chunks are loaded two words at a time");
  static_assert(kSmemBytes <= 101376, "must fit the SM120 per-block shared memory");
};
// Tile shapes, by rows per weight (QTile): decode 16 x 64 (4 warps in N); prefill 64 x 128
// (2 x 4 warps of 32 x 32; FP8 64 x 64, its codes twice the bytes); wide 128 x 128 (4 x 2
// warps of 32 x 64; 4-bit formats with at most 8 scale bytes per row and k tile: MXFP4,
// NVFP4, INT4 with 16-bit scales from group 32): twice the rows over each dequantized B
// tile and half the activation bytes per product of the prefill tile.
template <int V>
using DecodeQ = QConfig<16, 64, 1, 4, 6, V>;
template <int V>
using PrefillQ = QConfig<64, V == 2 ? 64 : 128, 2, 4, 4, V>;
constexpr int kWideScaleRow = 8;
template <int V>
using WideQ = QConfig<128, 128, 4, 2, 3, V, kWideScaleRow>;

struct QGemmParams {
  const int4* tiles;            // MoE: (expert, first sorted row, rows, 0); nullptr: dense
  const int32_t* perm;          // MoE: pair index of each sorted row
  const QuantExpert* experts;   // MoE
  QuantMat dense;               // dense: the weight
  const float* dense_bias;      // dense: [NF] or nullptr
  int dense_rows;               // dense: rows of a
  const bf16* a;                // dense / up: x [rows or n_tokens, K]; down: act [n_pairs, K] sorted
  int top_k;
  int K, NF, d_ff;
  int64_t code_row, scale_row;  // packed row bytes at this K
  int tile_scale;               // scale bytes per row per stage
  QuantFormat f;
  MoeShape s;
  bf16* act;                    // up output [n_pairs, d_ff]
  float* y;                     // down output [n_pairs, d_model]
  bf16* out;                    // dense output [rows, NF]
  // W8A8 (quant_gemm_w8a8_kernel): the activations quantized by quantize_fp8_act_kernel,
  // e4m3 codes [.., a_code_row] and fp32 scales [.., a_scale_row] per 128 inputs, rows
  // as `a`'s.
  const uint8_t* a_codes;
  const float* a_scales;
  int64_t a_code_row, a_scale_row;
  bool n_fast;                  // the grid's order: cta_grid
  // Dense decode tiles split over k (launch_quant_linear): split z of gridDim.z takes
  // stages [z per, (z + 1) per) and writes its fp32 sums (scale2 applied, no bias) to
  // partial [gridDim.z, dense_rows, NF]; reduce_splits_kernel adds them in split order.
  float* partial;
};

// Where fused column f's weight row lives (codes and scales of its 128-input block 0;
// block b's are b * kQuantUnitRows row blocks on: the unit-major layout, quant_layout.h).
template <bool kUp>
__device__ __forceinline__ void b_row(const QGemmParams& p, const QuantExpert* ew, int f, const uint8_t*& codes,
                                      const uint8_t*& scales) {
  const QuantRowRef w = quant_row(p.dense, ew, kUp, p.s.interleaved, p.d_ff, f);
  codes = w.m.codes + quant_block_offset(w.row, 0, p.code_row, p.f.code_block_bytes());
  scales = w.m.scales + quant_block_offset(w.row, 0, p.scale_row, p.tile_scale);
}

// The offset of stage s's codes (inputs [64 s, 64 s + 64): half of block s / 2) from a
// row's block 0, kCodeRow bytes per row per stage.
template <int kCodeRow>
__device__ __forceinline__ int64_t stage_codes(int s) {
  return int64_t(s >> 1) * (kQuantUnitRows * 2 * kCodeRow) + (s & 1) * kCodeRow;
}

// This CTA's rows: MoE tile i of the table (false: an unused slot) or the dense rows
// [bm i, + bm), i = grid_row_tile; ew: the tile's expert, nullptr for a dense weight.
__device__ __forceinline__ bool cta_tile(const QGemmParams& p, int bm, int& row0, int& rows, const QuantExpert*& ew) {
  ew = nullptr;
  if (p.tiles == nullptr) {
    row0 = grid_row_tile(p.n_fast) * bm;
    rows = min(bm, p.dense_rows - row0);
    return true;
  }
  const int4 tile = p.tiles[grid_row_tile(p.n_fast)];
  if (tile.x < 0) return false;
  row0 = tile.y, rows = tile.z;
  ew = p.experts + tile.x;
  return true;
}

// The epilogue of both GEMM kernels (one warp's tile of m16 x n8 accumulators; the
// thread holds rows lane / 4 (+ 8) and fused columns (2q, 2q + 1), q = lane % 4, of each):
// the GLU into act (up), the bf16 output with its bias (dense), or the pair's fp32 y
// (down). r0 and f0: the warp's first tile row and fused column; unbias: a factor of
// every accumulator (the decoded values' bias, QConfig::kUnbias).
template <bool kUp, int kMT, int kNT>
__device__ __forceinline__ void store_tile(const QGemmParams& p, const QuantExpert* ew, int row0, int rows, int f0,
                                           int r0, int lane, float unbias, const float (&acc)[kMT][kNT][4]) {
  // Global scales (NVFP4) of the thread's even and odd columns: gate and up, or one matrix.
  float g2 = unbias, u2 = unbias;
  if (const float* s2 = quant_row(p.dense, ew, kUp, p.s.interleaved, p.d_ff, 0).m.scale2) g2 *= *s2;
  if (const float* s2 = quant_row(p.dense, ew, kUp, p.s.interleaved, p.d_ff, 1).m.scale2) u2 *= *s2;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = r0 + mt * 16 + lane / 4 + half * 8;
      if (r >= rows) continue;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int f = f0 + nt * 8 + 2 * (lane % 4);
        if (f >= p.NF) continue;
        float v0 = acc[mt][nt][2 * half] * g2, v1 = acc[mt][nt][2 * half + 1] * u2;
        if constexpr (kUp) {
          const int i = f / 2;
          p.act[int64_t(row0 + r) * p.d_ff + i] = __float2bfloat16(
              glu_output(v0, v1, ew->gate_up_bias, p.s.interleaved, i, p.d_ff, p.s.glu_kind, p.s.alpha, p.s.limit));
        } else if (ew == nullptr && p.partial != nullptr) {
          float* o = p.partial + (int64_t(blockIdx.z) * p.dense_rows + row0 + r) * p.NF + f;
          o[0] = v0;
          if (f + 1 < p.NF) o[1] = v1;
        } else if (ew == nullptr) {
          bf16* o = p.out + int64_t(row0 + r) * p.NF + f;
          o[0] = __float2bfloat16(v0 + (p.dense_bias ? p.dense_bias[f] : 0.0f));
          if (f + 1 < p.NF) o[1] = __float2bfloat16(v1 + (p.dense_bias ? p.dense_bias[f + 1] : 0.0f));
        } else {
          if (ew->down_bias != nullptr) v0 += ew->down_bias[f], v1 += ew->down_bias[f + 1];
          const int64_t pair = p.perm[row0 + r];
          *reinterpret_cast<float2*>(p.y + pair * p.NF + f) = make_float2(v0, v1);
        }
      }
    }
  }
}

template <typename C, bool kUp>
__global__ void __launch_bounds__(C::kThreads) quant_gemm_kernel(const QGemmParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  int row0, rows;
  const QuantExpert* ew;
  if (!cta_tile(p, C::kBM, row0, rows, ew)) return;
  const int n0 = grid_n_tile(p.n_fast) * C::kBNF;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
  const uint32_t s0 = smem_u32(smem);
  const uint32_t sbt = s0 + C::kStages * C::kStageBytes;  // the two bf16 B tiles
  unsigned char* const bt_ptr = smem + C::kStages * C::kStageBytes;

  // A rows this thread copies (8 chunks of 16 bytes per 64-input row).
  const bf16* a_src[C::kAChunks];
#pragma unroll
  for (int i = 0; i < C::kAChunks; ++i) {
    const int r = (tid + i * C::kThreads) / 8;
    a_src[i] = nullptr;
    if (r < rows) {
      const int64_t row = p.tiles == nullptr ? row0 + r : kUp ? p.perm[row0 + r] / p.top_k : row0 + r;
      a_src[i] = p.a + row * p.K;
    }
  }
  // Code rows this thread copies.
  constexpr int kCodeChunksPerRow = C::kCodeRow / 16;
  constexpr int kCodeChunksTotal = C::kCodeBytes / 16;
  const uint8_t* c_src[C::kCodeChunks];
#pragma unroll
  for (int i = 0; i < C::kCodeChunks; ++i) {
    const int c = tid + i * C::kThreads, f = n0 + c / kCodeChunksPerRow;
    const uint8_t* sc;
    c_src[i] = nullptr;
    if (c < kCodeChunksTotal && f < p.NF) b_row<kUp>(p, ew, f, c_src[i], sc);
  }
  const int granules = p.tile_scale / 4;  // 4-byte scale pieces per row per k tile

  // Stage s: inputs [64 s, 64 s + 64) of A and codes, and every scale of their k tile.
  const auto load_stage = [&](int stage, int s) {
    const uint32_t sa = s0 + stage * C::kStageBytes, sc = sa + C::kABytes, ss = sc + C::kCodeBytes;
    const int k0 = s * kKStage;
#pragma unroll
    for (int i = 0; i < C::kAChunks; ++i) {
      const int c = tid + i * C::kThreads, r = c / 8, ch = c % 8, k = k0 + ch * 8;
      const bool valid = a_src[i] != nullptr && k < p.K;
      cp_async_16(sa + swz<kKStage>(r, ch), valid ? a_src[i] + k : p.a, valid);
    }
#pragma unroll
    for (int i = 0; i < C::kCodeChunks; ++i) {
      const int c = tid + i * C::kThreads, r = c / kCodeChunksPerRow, ch = c % kCodeChunksPerRow;
      if (kCodeChunksTotal % C::kThreads != 0 && c >= kCodeChunksTotal) continue;
      const bool valid = c_src[i] != nullptr;
      cp_async_16(sc + r * C::kCodeRow + ch * 16,
                  valid ? static_cast<const void*>(c_src[i] + stage_codes<C::kCodeRow>(s) + ch * 16) : p.a, valid);
    }
    for (int g = tid; g < C::kBNF * granules; g += C::kThreads) {
      const int r = g / granules, j = g % granules, f = n0 + r;
      if (f >= p.NF) continue;
      const uint8_t *codes, *scales;
      b_row<kUp>(p, ew, f, codes, scales);
      attn::cp_async_small<4>(ss + r * C::kScaleRow + 4 * j, scales + int64_t(s / 2) * kQuantUnitRows * p.tile_scale + 4 * j,
                                  true);
    }
  };

  // Dequantizes stage s (at `stage`) into B tile `buf`: this thread's kDeqChunks chunks of
  // 8 inputs of one row, written as 16-byte swizzled chunks. 4-bit codes decode to bf16
  // pairs in a few bit operations (quant_decode.cuh) times a bf16 pair of the scale
  // (times 2^100 for e2m1, whose decoded values carry 2^-126: kUnbias restores the
  // product's 2^26 in fp32), exact for MXFP4 / NVFP4 and one rounding for INT4, as the
  // GEMV's; FP8 goes through fp32 (e4m3 value times the scale, one rounding).
  const int group_shift = __ffs(p.f.group) - 1;
  // A 4-bit scale per group of chunks (NVFP4: 2 chunks; MXFP4, INT4 g32: 4): a power of two.
  const int group_chunks_mask = max(p.f.group / 8, 1) - 1;
  const auto dequantize_stage = [&](int stage, int s, int buf) {
    const unsigned char* codes = smem + stage * C::kStageBytes + C::kABytes;
    const unsigned char* scales = codes + C::kCodeBytes;
    unsigned char* bt = bt_ptr + buf * C::kBTileBytes;
    const int c0 = tid * C::kDeqChunks, r = c0 / (kKStage / 8), ch0 = c0 % (kKStage / 8);
    const int kt0 = (s % 2) * kKStage + ch0 * 8;  // the first input's place in its k tile
    const unsigned char* srow = scales + r * C::kScaleRow;
    if constexpr (C::kBits == 4) {
      uint32_t w[C::kDeqChunks];
      const unsigned char* src = codes + r * C::kCodeRow + ch0 * 4;
#pragma unroll
      for (int i = 0; i < C::kDeqChunks; i += 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(src + 4 * i);
        w[i] = v.x, w[i + 1] = v.y;
      }
      __nv_bfloat162 f2 = {};
#pragma unroll
      for (int i = 0; i < C::kDeqChunks; ++i) {
        if ((i & group_chunks_mask) == 0) {
          const float sv = scale_value(p.f.scale_kind, srow + ((kt0 + 8 * i) >> group_shift) * p.f.scale_bytes);
          f2 = __float2bfloat162_rn(C::kValue == 1 ? sv : sv * 0x1p100f);
        }
        uint4 out;
        out.x = bf16x2_bits(__hmul2(as_bf16x2(decode_pair_natural<C::kValue>(w[i], 0)), f2));
        out.y = bf16x2_bits(__hmul2(as_bf16x2(decode_pair_natural<C::kValue>(w[i], 1)), f2));
        out.z = bf16x2_bits(__hmul2(as_bf16x2(decode_pair_natural<C::kValue>(w[i], 2)), f2));
        out.w = bf16x2_bits(__hmul2(as_bf16x2(decode_pair_natural<C::kValue>(w[i], 3)), f2));
        *reinterpret_cast<uint4*>(bt + swz<kKStage>(r, ch0 + i)) = out;
      }
    } else {
#pragma unroll
      for (int i = 0; i < C::kDeqChunks; ++i) {
        const int k = kt0 + 8 * i;
        const float sc = scale_value(p.f.scale_kind, srow + (k >> group_shift) * p.f.scale_bytes);
        const uint2 w = *reinterpret_cast<const uint2*>(codes + r * C::kCodeRow + (ch0 + i) * 8);
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = e4m3_value(((e < 4 ? w.x : w.y) >> (8 * (e % 4))) & 0xffu) * sc;
        uint4 out;
        out.x = attn::pack_bf16(v[0], v[1]);
        out.y = attn::pack_bf16(v[2], v[3]);
        out.z = attn::pack_bf16(v[4], v[5]);
        out.w = attn::pack_bf16(v[6], v[7]);
        *reinterpret_cast<uint4*>(bt + swz<kKStage>(r, ch0 + i)) = out;
      }
    }
  };

  // The pipeline: stages s + 1 .. s + kStages - 2 in flight while the CTA dequantizes
  // stage s + 1 into one B tile and multiplies stage s's A by the other: one barrier per
  // stage, which also frees stage s - 1's buffers for the load it then issues.
  // This CTA's stages: all of them, or its split's range (dense decode tiles, gridDim.z
  // splits). i counts the CTA's own stages (its buffers), sb + i is the stage of K.
  float acc[C::kMT][C::kNT][4] = {};
  const int n_k = int(p.code_row * 8 / C::kBits) / kKStage;  // padded to whole k tiles: even
  const int per = (n_k + int(gridDim.z) - 1) / int(gridDim.z);
  const int sb = min(n_k, int(blockIdx.z) * per), n_s = min(n_k, sb + per) - sb;
#pragma unroll
  for (int i = 0; i < C::kStages - 1; ++i) {
    if (i < n_s) load_stage(i, sb + i);
    cp_async_commit();
  }
  cp_async_wait<C::kStages - 2>();
  __syncthreads();
  if (n_s > 0) dequantize_stage(0, sb, 0);
  for (int i = 0; i < n_s; ++i) {
    cp_async_wait<C::kStages - 3>();
    __syncthreads();  // stage i + 1 landed, B tile i % 2 written; stage i - 1 and B tile (i + 1) % 2 free
    const int next = i + C::kStages - 1;
    if (next < n_s) load_stage(next % C::kStages, sb + next);
    cp_async_commit();
    if (i + 1 < n_s) dequantize_stage((i + 1) % C::kStages, sb + i + 1, (i + 1) % 2);
    attn::warp_tile_mma<C::kMT, C::kNT, kKStage>(s0 + (i % C::kStages) * C::kStageBytes,
                                                  sbt + (i % 2) * C::kBTileBytes, wm, wn, lane, acc);
  }
  cp_async_wait<0>();

  store_tile<kUp>(p, ew, row0, rows, n0 + wn * C::kNT * 8, (wm * C::kMT) * 16, lane, C::kUnbias, acc);
}

// The grid of row_tiles x n_tiles CTAs: a MoE launch's in tile_grid.cuh's order; dense
// launches keep the row tile fast, so that their few row tiles share each weight slice.
dim3 cta_grid(QGemmParams& p, int row_tiles, int64_t n_tiles) {
  const TileGrid g = p.tiles != nullptr ? moe_tile_grid(row_tiles, n_tiles)
                                        : TileGrid{dim3(unsigned(row_tiles), unsigned(n_tiles)), false};
  p.n_fast = g.n_fast;
  return g.grid;
}

template <typename C, bool kUp>
void launch_q(QGemmParams p, int grid_x, cudaStream_t stream, int k_splits = 1) {
  const auto kernel = quant_gemm_kernel<C, kUp>;
  prepare_smem(kernel, C::kSmemBytes);
  dim3 grid = cta_grid(p, grid_x, (p.NF + C::kBNF - 1) / C::kBNF);
  grid.z = unsigned(k_splits);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
}

// out [rows, n] = bf16(sum over the splits of partial [splits, rows, n] + bias), the
// splits added in order (the result does not depend on the schedule).
__global__ void reduce_splits_kernel(const float* partial, int splits, int64_t rows, int64_t n, const float* bias,
                                     bf16* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  float v = 0.0f;
  for (int z = 0; z < splits; ++z) v += partial[int64_t(z) * rows * n + i];
  out[i] = __float2bfloat16(v + (bias != nullptr ? bias[i % n] : 0.0f));
}

// The instance for (tile shape, value kind, up or not). FP8 has no wide tiles (qtile_for).
template <bool kUp, int V>
void dispatch_value(QTile t, const QGemmParams& p, int grid_x, cudaStream_t stream, int k_splits) {
  if (t == QTile::kDecode) return launch_q<DecodeQ<V>, kUp>(p, grid_x, stream, k_splits);
  if constexpr (V != 2) {
    if (t == QTile::kWide) return launch_q<WideQ<V>, kUp>(p, grid_x, stream);
  }
  launch_q<PrefillQ<V>, kUp>(p, grid_x, stream);
}
// k_splits > 1: dense decode tiles only (launch_quant_linear), partial set.
template <bool kUp>
void dispatch(QTile t, const QGemmParams& p, int grid_x, cudaStream_t stream, int k_splits = 1) {
  switch (p.f.value) {
    case 0: dispatch_value<kUp, 0>(t, p, grid_x, stream, k_splits); break;
    case 1: dispatch_value<kUp, 1>(t, p, grid_x, stream, k_splits); break;
    default: dispatch_value<kUp, 2>(t, p, grid_x, stream, k_splits);
  }
}

void set_rows(QGemmParams& p, const QuantFormat& f, int64_t K) {
  p.code_row = f.code_row_bytes(K);
  p.scale_row = f.scale_row_bytes(K);
  p.tile_scale = f.tile_scale_bytes();
  p.K = int(K);
}

// The tile table of a MoE layer's bm-row tiles (launch_moe_align) and the up GEMM's
// parameters over it; the down GEMM then takes act as `a`, NF = d_model, K = d_ff.
QGemmParams moe_up_params(const bf16* x, const QuantExpert* table, const QuantFormat& f, const int32_t* experts,
                          const MoeShape& s, int64_t n_pairs, int n_experts, int top_k, int bm,
                          MoeGroupedScratch& sc, int* n_slots, cudaStream_t stream) {
  *n_slots = moe_tile_slots(n_pairs, n_experts, bm);
  launch_moe_align(experts, n_pairs, n_experts, bm, sc.perm, sc.tiles, *n_slots, stream);
  QGemmParams p{};
  p.tiles = sc.tiles;
  p.perm = sc.perm;
  p.experts = table;
  p.top_k = top_k;
  p.d_ff = int(s.d_ff);
  p.s = s;
  p.f = f;
  p.act = sc.act;
  p.y = sc.y;
  p.a = x;
  p.NF = int(2 * s.d_ff);
  set_rows(p, f, s.d_model);
  return p;
}

__global__ void dequantize_kernel(QuantMat w, QuantFormat f, int64_t n_out, int64_t n_in, int64_t code_row,
                                  int64_t scale_row, bf16* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_out * n_in) return;
  const int64_t o = i / n_in, k = i % n_in;
  const int64_t b = k / kKTile, kb = k % kKTile;  // block, and k within it (quant_layout.h)
  const uint8_t* codes = w.codes + quant_block_offset(o, b, code_row, f.code_block_bytes());
  float v;
  if (f.value == 2) {
    v = e4m3_value(codes[kb]);
  } else {
    const uint32_t c = (codes[kb / 2] >> (4 * (kb % 2))) & 0xfu;
    v = f.value == 0 ? e2m1_value(c) : float(int(c) - 8);
  }
  v *= scale_value(f.scale_kind, w.scales + quant_block_offset(o, b, scale_row, f.tile_scale_bytes()) +
                                     (kb / f.group) * f.scale_bytes);
  if (w.scale2) v *= *w.scale2;
  out[i] = __float2bfloat16(v);
}


// ---- W8A8: FP8 weights times FP8 activations on the e4m3 tensor cores (SM 8.9+) ----
//
// For FP8 weights with one scale per 128 inputs of a row (block-128, per channel, per
// tensor) at prefill shapes. A pre-pass (quantize_fp8_act_kernel) quantizes the
// activations per row and 128 inputs, formats::quantize_fp8_act_block's rule: e4m3
// codes [rows, Kp] and an fp32 scale per block. The GEMM multiplies codes by codes with
// mma.sync m16n8k32 e4m3 into fp32 partial sums over one 128-input k tile, then adds
// them to the accumulators times the row's activation scale and the column's weight
// scale (DeepSeek-V3's per-block promotion): nothing is dequantized, and a stage is the
// raw bytes of both operands, ldmatrix'd from 128-byte XOR-swizzled rows (16 codes per
// chunk: an 8x8 b16 matrix is 8 rows x 16 codes, exactly an m16n8k32 fragment's quarter).
// The k tile's scales (its rows' activation scales, its columns' weight scales) are
// read a k tile ahead into registers, one of each per thread, and stored in one buffer
// behind the stage's barrier; a second barrier orders that store before the promotion.
//
// Tile: 64 rows (moe_grouped_bm's prefill tiles) x 128 fused columns, 2 stages of 24 KiB
// codes + 768 B of scales: 49,920 B, so that two CTAs fit an SM120 SM's 100 KB (each block
// also takes 1 KB of it). MoE launches run 4 x 2 warps of 16 x 64: twice the warps per SM
// of 2 x 2 warps of 32 x 64 (255 registers), and in an expert's last tile the warps past
// its rows skip their mmas (MoE layers at 2048 tokens 3-9% faster on an H100; 2 x 4 warps
// of 32 x 32, skipping by 32 rows, gained half as much). Dense shapes keep 2 x 2 warps
// (4 x 2 ran them 2% faster to 7% slower; docs/perf/w8a8-prefill.md). Three
// stages with the scales staged (76 KB: one CTA there) were 12-19 points of the e4m3 peak slower on an H100 held
// to 100 KB per SM, and on its full 228 KB (two CTAs either way, by registers) 0-3 points
// faster for the MoE layers, the same or slower for dense shapes (docs/perf/w8a8-prefill.md).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define KILN_FP8_MMA 1
#else
#define KILN_FP8_MMA 0
#endif

constexpr int kF8BM = 64, kF8BN = 128, kF8Stages = 2;
constexpr int kF8ABytes = kF8BM * kKTile, kF8BBytes = kF8BN * kKTile;
constexpr int kF8StageBytes = kF8ABytes + kF8BBytes;
constexpr int kF8SmemBytes = kF8Stages * kF8StageBytes + (kF8BM + kF8BN) * 4;  // + the scales
static_assert(kF8SmemBytes <= 101376, "must fit the SM120 per-block shared memory");
static_assert(2 * (kF8SmemBytes + 1024) <= 102400, "two CTAs per SM120 SM");

// The warps: kWarpsM in M x 2 in N. MoE launches take 4 x 2 warps of 16 x 64 (two CTAs per
// SM by registers, 128), dense ones 2 x 2 of 32 x 64 (255 registers).
template <int kWarpsM_>
struct F8Config {
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = 2, kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMT = kF8BM / 16 / kWarpsM, kNT = kF8BN / 8 / kWarpsN;  // m16 and n8 tiles per warp
  static constexpr int kChunkRows = kThreads / 8;  // tile rows one pass of 16-byte chunks covers
  static_assert(kF8BN <= kThreads && kF8BM <= kThreads, "one thread per tile row and column reads its scales");
  static_assert(kMT >= 1 && kNT % 2 == 0 && kF8BM % kChunkRows == 0, "whole m16 tiles; pairs of n8 tiles; whole passes");
};
using F8Moe = F8Config<4>;
using F8Dense = F8Config<2>;

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if KILN_FP8_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // never launched: quant_w8a8_supported refuses devices below SM 8.9
#endif
}

template <typename C, bool kUp>
__global__ void __launch_bounds__(C::kThreads, 2) quant_gemm_w8a8_kernel(const QGemmParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  int row0, rows;
  const QuantExpert* ew;
  if (!cta_tile(p, kF8BM, row0, rows, ew)) return;
  const int n0 = grid_n_tile(p.n_fast) * kF8BN;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
  const uint32_t s0 = smem_u32(smem);
  // The activation row of tile row r: a token (dense, or up: the pair's token) or a sorted pair.
  const auto a_row = [&](int r) -> int64_t {
    return p.tiles == nullptr ? row0 + r : kUp ? p.perm[row0 + r] / p.top_k : row0 + r;
  };
  // Chunks this thread copies: tile rows tid / 8 + C::kChunkRows i, chunk tid % 8.
  const int ch = tid % 8;
  constexpr int kAPasses = kF8BM / C::kChunkRows, kBPasses = kF8BN / C::kChunkRows;
  const uint8_t* a_src[kAPasses];
#pragma unroll
  for (int i = 0; i < kAPasses; ++i) {
    const int r = tid / 8 + C::kChunkRows * i;
    a_src[i] = r < rows ? p.a_codes + a_row(r) * p.a_code_row + ch * 16 : nullptr;
  }
  const uint8_t* b_src[kBPasses];
#pragma unroll
  for (int i = 0; i < kBPasses; ++i) {
    const int f = n0 + tid / 8 + C::kChunkRows * i;
    const uint8_t* sc;
    b_src[i] = nullptr;
    if (f < p.NF) {
      b_row<kUp>(p, ew, f, b_src[i], sc);
      b_src[i] += ch * 16;
    }
  }
  // Scales this thread reads: tile row tid's activation scale, fused column n0 + tid's
  // weight scale (f32, one per 128 inputs).
  const float* as_src = tid < rows && tid < kF8BM ? p.a_scales + a_row(tid) * p.a_scale_row : nullptr;
  const float* ws_src = nullptr;
  if (tid < kF8BN && n0 + tid < p.NF) {
    const uint8_t *codes, *scales;
    b_row<kUp>(p, ew, n0 + tid, codes, scales);
    ws_src = reinterpret_cast<const float*>(scales);
  }
  const auto load_stage = [&](int stage, int kt) {
    const uint32_t sa = s0 + stage * kF8StageBytes, sb = sa + kF8ABytes;
#pragma unroll
    for (int i = 0; i < kAPasses; ++i)
      cp_async_16(sa + swz<64>(tid / 8 + C::kChunkRows * i, ch), a_src[i] ? a_src[i] + int64_t(kt) * kKTile : p.a_codes,
                  a_src[i] != nullptr);
#pragma unroll
    for (int i = 0; i < kBPasses; ++i)
      cp_async_16(sb + swz<64>(tid / 8 + C::kChunkRows * i, ch),
                  b_src[i] ? b_src[i] + int64_t(kt) * kQuantUnitRows * kKTile : p.a_codes, b_src[i] != nullptr);
  };
  float* const scales = reinterpret_cast<float*>(smem + kF8Stages * kF8StageBytes);  // [kF8BM + kF8BN]
  float as_next = 0.0f, ws_next = 0.0f;
  const auto read_scales = [&](int kt) {
    if (as_src) as_next = __ldg(as_src + kt);
    if (ws_src) ws_next = __ldg(ws_src + kt * kQuantUnitRows);  // (unit-major: one f32 per row and block)
  };

  float acc[C::kMT][C::kNT][4] = {};
  const int n_k = int(p.a_code_row / kKTile);
  // A warp whose rows all lie past the tile's (a MoE expert's last tile), or whose columns
  // all lie past NF (gpt-oss's 2880-wide down GEMM), skips its mmas, leaving the SM's
  // tensor cores to the other CTA.
  const bool live = wm * C::kMT * 16 < rows && n0 + wn * C::kNT * 8 < p.NF;
#pragma unroll
  for (int st = 0; st < kF8Stages - 1; ++st) {
    if (st < n_k) load_stage(st, st);
    cp_async_commit();
  }
  read_scales(0);
  for (int kt = 0; kt < n_k; ++kt) {
    cp_async_wait<kF8Stages - 2>();
    __syncthreads();  // stage kt landed; every warp is done with stage kt - 1 and the scales
    const int next = kt + kF8Stages - 1;
    if (next < n_k) load_stage(next % kF8Stages, next);
    cp_async_commit();
    if (tid < kF8BM) scales[tid] = as_next;
    if (tid < kF8BN) scales[kF8BM + tid] = ws_next;
    if (kt + 1 < n_k) read_scales(kt + 1);
    const int stage = kt % kF8Stages;
    const uint32_t sa = s0 + stage * kF8StageBytes, sb = sa + kF8ABytes;
    float part[C::kMT][C::kNT][4] = {};
    if (live) {
#pragma unroll
      for (int kk = 0; kk < kKTile / 32; ++kk) {
        uint32_t af[C::kMT][4];
#pragma unroll
        for (int mt = 0; mt < C::kMT; ++mt)
          attn::ldmatrix_x4(sa + swz<64>((wm * C::kMT + mt) * 16 + lane % 8 + ((lane / 8) % 2) * 8, kk * 2 + lane / 16),
                            af[mt]);
#pragma unroll
        for (int nn = 0; nn < C::kNT / 2; ++nn) {
          uint32_t b[4];
          attn::ldmatrix_x4(sb + swz<64>(wn * C::kNT * 8 + nn * 16 + lane % 8 + (lane / 16) * 8, kk * 2 + (lane / 8) % 2),
                            b);
#pragma unroll
          for (int mt = 0; mt < C::kMT; ++mt) {
            mma_e4m3(part[mt][2 * nn], af[mt], b[0], b[1]);
            mma_e4m3(part[mt][2 * nn + 1], af[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // the k tile's scales stored
    // The k tile's partial sums, scaled by row x column and added up in fp32.
#pragma unroll
    for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float sa_r = scales[(wm * C::kMT + mt) * 16 + lane / 4 + half * 8];
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt) {
          const float* sw = scales + kF8BM + wn * C::kNT * 8 + nt * 8 + 2 * (lane % 4);
          acc[mt][nt][2 * half] += part[mt][nt][2 * half] * (sa_r * sw[0]);
          acc[mt][nt][2 * half + 1] += part[mt][nt][2 * half + 1] * (sa_r * sw[1]);
        }
      }
  }
  cp_async_wait<0>();
  store_tile<kUp>(p, ew, row0, rows, n0 + wn * C::kNT * 8, wm * C::kMT * 16, lane, 1.0f, acc);
}

// One warp per (row, 128-input block), 4 inputs per lane: codes [rows, Kp] (zero past K)
// and scales [rows, Kp / 128], by formats::quantize_fp8_act_block's rule.
__global__ void quantize_fp8_act_kernel(const bf16* x, int64_t rows, int K, int Kp, uint8_t* codes, float* scales) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x % 32), n_blocks = Kp / kKTile;
  if (w >= rows * n_blocks) return;
  const int64_t r = w / n_blocks;
  const int k = int(w % n_blocks) * kKTile + 4 * lane;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (k < K) {  // K % 8 == 0: a lane's 4 inputs are all in or all out
    const uint2 raw = *reinterpret_cast<const uint2*>(x + r * K + k);
    const bf16* h = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __bfloat162float(h[j]);
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  float s = amax / 448.0f;
  if (!(s > 0.0f)) s = 1.0f;
  uint32_t packed = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    packed |= uint32_t(__nv_cvt_float_to_fp8(v[j] / s, __NV_SATFINITE, __NV_E4M3)) << (8 * j);
  *reinterpret_cast<uint32_t*>(codes + r * Kp + k) = packed;
  if (lane == 0) scales[w] = s;
}

// Quantizes rows x k activations into buf (codes, then scales) and points p at them.
void quantize_act(QGemmParams& p, const bf16* x, int64_t rows, int64_t k, uint8_t* buf, cudaStream_t stream) {
  const int64_t kp = (k + kKTile - 1) / kKTile * kKTile;
  p.a_codes = buf;
  p.a_scales = reinterpret_cast<const float*>(buf + rows * kp);
  p.a_code_row = kp;
  p.a_scale_row = kp / kKTile;
  const int64_t threads = rows * (kp / kKTile) * 32;
  if (threads == 0) return;
  quantize_fp8_act_kernel<<<unsigned((threads + 255) / 256), 256, 0, stream>>>(
      x, rows, int(k), int(kp), buf, reinterpret_cast<float*>(buf + rows * kp));
  KILN_CUDA_LAUNCH_CHECK();
}

template <typename C, bool kUp>
void launch_w8a8(QGemmParams p, int grid_x, cudaStream_t stream) {
  const auto kernel = quant_gemm_w8a8_kernel<C, kUp>;
  prepare_smem(kernel, kF8SmemBytes);
  const dim3 grid = cta_grid(p, grid_x, (p.NF + kF8BN - 1) / kF8BN);
  kernel<<<grid, C::kThreads, kF8SmemBytes, stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
}

// Whether format f has a wide instance: 4-bit codes, a k tile's scales of a row in its bytes.
bool wide_format(const QuantFormat& f) { return f.value != 2 && f.tile_scale_bytes() <= kWideScaleRow; }

}  // namespace

bool quant_gemm_decode_rows(int64_t rows_per_group) { return rows_per_group < 32; }

QTile quant_gemm_tile(int64_t rows_per_weight, const QuantFormat& f) {
  if (quant_gemm_decode_rows(rows_per_weight)) return QTile::kDecode;
  return rows_per_weight >= quant_gemm_tile_rows(QTile::kWide) && wide_format(f) ? QTile::kWide : QTile::kPrefill;
}

QTile quant_moe_tile(int64_t n_pairs, int n_experts, const QuantFormat& f) {
  if (moe_grouped_bm(n_pairs, n_experts) < quant_gemm_tile_rows(QTile::kPrefill)) return QTile::kDecode;
  return n_pairs >= int64_t(quant_gemm_tile_rows(QTile::kWide)) * n_experts && wide_format(f) ? QTile::kWide
                                                                                               : QTile::kPrefill;
}

int quant_gemm_tile_rows(QTile t) {
  static_assert(DecodeQ<0>::kBM == 16 && PrefillQ<0>::kBM == 64 && WideQ<0>::kBM == 128);
  return t == QTile::kDecode ? 16 : t == QTile::kPrefill ? 64 : 128;
}

int quant_gemm_smem_bytes() {
  return std::max({DecodeQ<0>::kSmemBytes, DecodeQ<2>::kSmemBytes, PrefillQ<0>::kSmemBytes, PrefillQ<2>::kSmemBytes,
                   WideQ<0>::kSmemBytes});
}

int quant_linear_k_splits(int64_t rows, int64_t n_out, int64_t n_in, const QuantFormat& f) {
  if (rows < 1 || quant_gemm_tile(rows, f) != QTile::kDecode) return 1;
  int device = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t ctas = (rows + 15) / 16 * ((n_out + 63) / 64);
  const int64_t stages = (n_in + kKTile - 1) / kKTile * (kKTile / kKStage);
  // Split below one CTA per SM for FP8, two for the 4-bit formats: at 224 CTAs (GLM-4.5-Air's
  // qkv at 8-16 rows, a TP2 rank's at 24-31) two splits took NVFP4 70 -> 59 us and FP8 84 ->
  // 91 us on an H200.
  if (ctas >= (f.value == 2 ? 1 : 2) * int64_t(sms)) return 1;
  int64_t splits = (kQuantSplitWaves * sms + ctas - 1) / ctas;
  splits = std::min<int64_t>({splits, kQuantMaxKSplits, stages / kQuantMinSplitStages});
  return int(std::max<int64_t>(splits, 1));
}

void launch_quant_linear(const bf16* x, const QuantMat& w, const QuantFormat& f, const float* bias, int64_t rows,
                         int64_t n_out, int64_t n_in, bf16* out, cudaStream_t stream, int k_splits,
                         float* split_scratch) {
  if (rows == 0) return;
  QGemmParams p{};
  p.dense = w;
  p.dense_bias = bias;
  p.dense_rows = int(rows);
  p.a = x;
  p.NF = int(n_out);
  p.f = f;
  p.out = out;
  set_rows(p, f, n_in);
  const QTile t = quant_gemm_tile(rows, f);
  const int bm = quant_gemm_tile_rows(t);
  if (k_splits > 1) {
    KILN_CHECK(t == QTile::kDecode && split_scratch != nullptr)
        << "quant linear: " << k_splits << " splits of " << rows << " rows without decode tiles or scratch";
    p.partial = split_scratch;
  }
  dispatch<false>(t, p, int((rows + bm - 1) / bm), stream, std::max(k_splits, 1));
  if (k_splits <= 1) return;
  const int64_t n = rows * n_out;
  reduce_splits_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(split_scratch, k_splits, rows, n_out, bias, out);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_moe_grouped_quant(const bf16* x, const QuantExpert* table, const QuantFormat& f, const int32_t* experts,
                              const MoeShape& s, int64_t n_pairs, int n_experts, int top_k, MoeGroupedScratch& sc,
                              cudaStream_t stream) {
  if (n_pairs == 0) return;
    const QTile t = quant_moe_tile(n_pairs, n_experts, f);
  const int bm = quant_gemm_tile_rows(t);
  int n_slots = 0;
  QGemmParams p = moe_up_params(x, table, f, experts, s, n_pairs, n_experts, top_k, bm, sc, &n_slots, stream);
  dispatch<true>(t, p, n_slots, stream);
  p.a = sc.act;
  p.NF = int(s.d_model);
  set_rows(p, f, s.d_ff);
  dispatch<false>(t, p, n_slots, stream);
}

bool quant_w8a8_supported(const QuantFormat& f, int cc) {
  return f.value == 2 && f.scale_kind == 4 && f.group == kKTile && cc >= 89;
}

int quant_w8a8_smem_bytes() { return kF8SmemBytes; }

size_t quant_w8a8_act_bytes(int64_t rows, int64_t k) {
  const int64_t kp = (k + kKTile - 1) / kKTile * kKTile;
  return size_t(rows * kp + rows * (kp / kKTile) * 4);
}

void launch_quant_linear_w8a8(const bf16* x, const QuantMat& w, const QuantFormat& f, const float* bias, int64_t rows,
                              int64_t n_out, int64_t n_in, bf16* out, void* act_scratch, cudaStream_t stream) {
  if (rows == 0) return;
  KILN_CHECK(f.value == 2 && f.group == kKTile) << "w8a8 gemm: weights of value kind " << f.value << ", group " << f.group;
  QGemmParams p{};
  p.dense = w;
  p.dense_bias = bias;
  p.dense_rows = int(rows);
  p.NF = int(n_out);
  p.f = f;
  p.out = out;
  set_rows(p, f, n_in);
  quantize_act(p, x, rows, n_in, static_cast<uint8_t*>(act_scratch), stream);
  launch_w8a8<F8Dense, false>(p, int((rows + kF8BM - 1) / kF8BM), stream);
}

void launch_moe_grouped_quant_w8a8(const bf16* x, const QuantExpert* table, const QuantFormat& f,
                                   const int32_t* experts, const MoeShape& s, int64_t n_pairs, int n_experts,
                                   int top_k, MoeGroupedScratch& sc, void* act_scratch, cudaStream_t stream) {
  if (n_pairs == 0) return;
  KILN_CHECK(f.value == 2 && f.group == kKTile) << "w8a8 moe: weights of value kind " << f.value << ", group " << f.group;
  KILN_CHECK_EQ(moe_grouped_bm(n_pairs, n_experts), kF8BM) << "w8a8 moe: decode-shaped call";
  int n_slots = 0;
  QGemmParams p = moe_up_params(x, table, f, experts, s, n_pairs, n_experts, top_k, kF8BM, sc, &n_slots, stream);
  // x per token for the up GEMM, then (the same buffer, stream-ordered) act per pair.
  quantize_act(p, x, n_pairs / top_k, s.d_model, static_cast<uint8_t*>(act_scratch), stream);
  launch_w8a8<F8Moe, true>(p, n_slots, stream);
  p.NF = int(s.d_model);
  set_rows(p, f, s.d_ff);
  quantize_act(p, sc.act, n_pairs, s.d_ff, static_cast<uint8_t*>(act_scratch), stream);
  launch_w8a8<F8Moe, false>(p, n_slots, stream);
}

size_t moe_w8a8_act_bytes(const MoeShape& s, int64_t n_pairs, int top_k) {
  return std::max(quant_w8a8_act_bytes(n_pairs / top_k, s.d_model), quant_w8a8_act_bytes(n_pairs, s.d_ff));
}

void launch_dequantize(const QuantMat& w, const QuantFormat& f, int64_t n_out, int64_t n_in, bf16* out,
                       cudaStream_t stream) {
  const int64_t n = n_out * n_in;
  if (n == 0) return;
  dequantize_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(w, f, n_out, n_in, f.code_row_bytes(n_in),
                                                                    f.scale_row_bytes(n_in), out);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
