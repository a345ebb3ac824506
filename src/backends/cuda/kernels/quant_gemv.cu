// Decode-shaped products over quantized weights (quant_pack.h layout): a few rows of
// activations (at most kGemvRows) against each weight, the case of MoE decode (one or
// two tokens per expert) and of a dense linear at batch 1-8. The work is streaming the
// weights; the arithmetic must stay out of its way. Each warp loads its weight codes
// straight from global memory into registers (16 bytes per lane per 128 inputs, no
// shared memory), turns them into bf16 pairs with a few bit operations and hands them
// to the tensor cores as the A operand of mma.sync m16n8k16, the activation rows as B
// (n = 8 token rows; unused rows are zeros). The multiply-adds cost nothing on the CUDA
// cores, which only decode.
//
// A warp's unit is 16 weight rows (the mma's m): for an up GEMM the gate rows of 8
// consecutive outputs i and their up rows, so each lane holds gate and up of output i
// for two tokens and applies the GLU itself; else 16 consecutive output rows. Lane
// (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 of the A fragment and token row
// g of B. Per 128-input block, lane t owns inputs [32t, 32t + 32) of the block for its
// rows (one 16-byte load of 4-bit codes, two of FP8); packed weights are unit-major
// (quant_layout.h), so a warp's loads of one block are one contiguous run (1 KB of
// 4-bit codes) when its 16 rows are a unit. A dot product does not care in
// which order k is summed, so the mma's logical k is mapped onto these physical inputs
// in whatever order the decoding yields pairs (decode_pair), and the CTA stages its
// activation rows in shared memory permuted to the same order, so that a step's B
// fragment is one 8-byte load.
//
// Memory parallelism is the whole game at one or two tokens: each warp keeps kRing - 1
// blocks of codes (3 KB for 4-bit formats) in flight while it decodes one, and when a GEMM has too few
// units to fill the GPU the warps of a CTA split the unit's k range (split) and add up
// their results through shared memory.
//
// Scales: a 4-bit lane chunk of 32 inputs lies in one or two scale groups, but one mma
// sums the chunks of four lanes, so the scale goes onto the weights before the mma: a
// bf16 multiply of each decoded pair, exact for MXFP4 / NVFP4 (power-of-two or 4-bit
// scales times 2-bit mantissas) and a single rounding for INT4 (as the reference's bf16
// weights are). FP8 with 128-input groups (block FP8, per channel, per tensor) scales a
// whole block's fp32 result instead.
//
// Plain bf16 weights (a dense linear at batch 1-8, where cuBLASLt's split-K GEMMs reach
// 20-30% of copy bandwidth) take the same kernel as a format of their own (kBf16Value):
// no decoding, no scales, the lane's 64 bytes of a row per block are the A fragments as
// loaded, and rows are not padded (the last block's loads stop at K). At 1-4 rows those take
// row_gemv.cu's kernel instead (launch_quant_gemv_linears hands them over), which streams
// them faster.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/attention_mma.cuh"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/pdl.cuh"
#include "backends/cuda/kernels/quant_decode.cuh"
#include "backends/cuda/kernels/smem.cuh"

namespace kiln::cuda {
namespace {

constexpr int kKTile = 128;    // codes are padded to whole 128-input blocks
constexpr int kXPad = 4;       // bf16 after each staged activation row: conflict-free B loads (8-byte aligned rows)
constexpr int kSmemBudget = 48 * 1024;  // staged activations per CTA (rows are capped to fit)
// Warps per CTA: 4, or 8 for a MoE launch whose staged rows leave an SM fewer than 4
// CTAs of 4 (moe_gemv_warps): the rows are staged once for twice the units.
constexpr int kCtaWarps = 4, kWideCtaWarps = 8;
__host__ __device__ constexpr int static_smem(int warps) { return warps * 4 * 32 * 4; }  // split-k partial sums
constexpr int kBf16Value = kQuantValueBf16;  // plain bf16 weights (kernels.h)
static_assert(kGemvRows == 8, "token rows are the mma's n");

struct GemvParams {
  const int4* tiles;           // MoE tile table, or nullptr: dense (one tile of `dense_rows` rows)
  const int32_t* perm;
  const QuantExpert* experts;
  GemvPart parts[kGemvParts];  // dense: the linears of one input, their units in this order
  int part_end[kGemvParts];    // units of parts 0..i
  int n_parts;
  int dense_rows;
  int rows_cap;                // most rows a tile has (the staged rows)
  const bf16* a;               // activations [.., K]
  int top_k, K, Kp, units, d_ff, n_out, n_blocks;  // units: all parts'; n_out: a MoE down's
  int split;                   // warps per unit, each over n_blocks / split blocks
  int upw;                     // kMoeDownUnits: units per warp
  int64_t code_row, scale_row;
  QuantFormat f;
  MoeShape s;
  bf16* act;                   // up: [sorted rows, d_ff]
  float* y;                    // down: [pairs, d_model]
};

// Blocks in a warp's register ring for codes of value kind v: 4 for the 4-bit formats
// (3 KB in flight per warp), 2 for FP8 and bf16 (whose blocks are 2-4x larger).
__host__ __device__ constexpr int ring_blocks(int v) { return v == 2 || v == kBf16Value ? 2 : 4; }

// Format: how codes decode (kValue as QuantFormat::value, or kBf16Value: plain bf16
// weights, unscaled), how scales are stored (kScale as QuantFormat::scale_kind) and how
// many a lane's 32-input chunk has (kSpc: 32 / group, at least 1).
template <int kValue, int kScale, int kSpc>
struct Fmt {
  static constexpr bool kFp8 = kValue == 2;
  static constexpr bool kBf16 = kValue == kBf16Value;
  // 32-bit words of codes per lane per block and row, and blocks in the register ring.
  static constexpr int kChunkWords = kFp8 ? 8 : kBf16 ? 16 : 4;
  static constexpr int kRing = ring_blocks(kValue);
  // Decoded pairs are bf16 whose value is the code's times 2^-kBias (e2m1: the 3 bits
  // placed under a bf16 exponent of bias 127 rather than 1; e4m3: bias 127 vs 7).
  static constexpr int kBias = kValue == 0 ? 126 : kValue == 2 ? 120 : 0;
  // Pre-mma scale factors carry 2^kPre so that bf16 holds them and the scaled weights
  // stay normal numbers; the fp32 result is multiplied by 2^(kBias - kPre).
  static constexpr int kPre = kValue == 1 || kBf16 ? 0 : 100;
  static constexpr float kUnbias = kValue == 0 ? 0x1p26f : kValue == 2 ? 0x1p20f : 1.0f;
  static_assert(kBias - kPre == (kValue == 0 ? 26 : kValue == 2 ? 20 : 0));
  static constexpr int kCodeBytes = kFp8 ? kKTile : kBf16 ? 2 * kKTile : kKTile / 2;  // per row per block
  static constexpr int kScaleBytes = kScale <= 1 ? 1 : kScale <= 3 ? 2 : 4;
};

// The bits of a scale of kind kScale (QuantFormat::scale_kind), through the read-only path.
template <int kScale>
__device__ __forceinline__ uint32_t load_scale_bits(const uint8_t* p) {
  if constexpr (kScale <= 1) return __ldg(p);
  else if constexpr (kScale <= 3) return __ldg(reinterpret_cast<const unsigned short*>(p));
  else return __ldg(reinterpret_cast<const unsigned*>(p));
}

// The bf16 pair that multiplies a chunk's decoded codes before the mma: 2^kPre times the
// scale (bits of kind kScale). The common cases are integer operations: an e8m0 scale
// 2^(e - 127) times 2^100 is the bf16 with exponent field e + 100; a bf16 scale is
// itself. The rest converts.
template <int kValue, int kScale>
__device__ __forceinline__ uint32_t pre_scale(uint32_t bits) {
  if constexpr (kScale == 0 && kValue != 1) {
    // Exponent field e + 100 for e up to 154 (e 0 included: 2^-127 * 2^100); 155-254
    // would overflow to infinity (pack_quantized refuses them: kQuantMaxE8m0) and 255
    // is NaN, as the float conversion gives. No branch.
    static_assert(kQuantMaxE8m0 + 100 == 254, "the largest finite bf16 exponent field");
    return (bits == 255u ? 0x7fc0u : min(bits + 100u, 255u) << 7) * 0x10001u;
  } else if constexpr (kScale == 2 && kValue == 1) {
    return bits * 0x10001u;
  } else {
    const float v = scale_of(kScale, bits);
    return bf16x2_bits(__float2bfloat162_rn(kValue == 1 ? v : v * 0x1p100f));
  }
}

// Pair i (0..3) of an 8-code word of 4-bit codes c0..c7 (c0 in the low nibble): the
// bf16x2 (c_i, c_{i+4}). e2m1: nibble i moved to bits 12-15 (and i + 4 to 28-31), its
// magnitude shifted under the bf16 exponent, the sign kept (Marlin's trick). INT4:
// (code | 0x4300) as bf16 is 128 + code, minus 136.
template <int kValue>
__device__ __forceinline__ uint32_t decode_pair(uint32_t w, int i) {
  if constexpr (kValue == 0) {
    const uint32_t u = w << (12 - 4 * i);
    return (u & 0x80008000u) | ((u & 0x70007000u) >> 6);
  } else {
    const uint32_t u = ((w >> (4 * i)) & 0x000f000fu) | 0x43004300u;
    return bf16x2_bits(__hsub2(as_bf16x2(u), __floats2bfloat162_rn(136.0f, 136.0f)));
  }
}
// e4m3 bytes b0..b3 of a word: (b0, b2) for j = 0, (b1, b3) for j = 1.
__device__ __forceinline__ uint32_t decode_fp8_pair(uint32_t w, int j) {
  const uint32_t u = j == 0 ? w << 8 : w;
  return (u & 0x80008000u) | ((u & 0x7f007f00u) >> 4);
}

// Eight activations (one 16-byte load) in the order the steps read them as B: 4-bit
// codes pair inputs (i, i + 4) of 8, FP8 (i, i + 2) of 4, bf16 weights (i, i + 1), and
// a step's (b0, b1) is 4 consecutive staged values.
template <int kValue>
__device__ __forceinline__ uint4 permute_x(uint4 v) {
  if constexpr (kValue == kBf16Value) {
    return v;
  } else if constexpr (kValue == 2) {  // x0 x2 x1 x3 | x4 x6 x5 x7
    return make_uint4(__byte_perm(v.x, v.y, 0x5410), __byte_perm(v.x, v.y, 0x7632), __byte_perm(v.z, v.w, 0x5410),
                      __byte_perm(v.z, v.w, 0x7632));
  } else {  // x0 x4 x1 x5 | x2 x6 x3 x7
    return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                      __byte_perm(v.y, v.w, 0x7632));
  }
}

// Bytes of `rows` staged activation rows of kp inputs.
__host__ __device__ int x_bytes(int rows, int kp) { return rows * (kp + kXPad) * 2; }

// One block of codes of a lane's two rows, and their scales' bits, as loaded.
template <int kValue, int kScale, int kSpc>
struct Slot {
  uint32_t w[2][Fmt<kValue, kScale, kSpc>::kChunkWords];
  uint32_t s[2][kSpc];
};

// d += a (16x16 bf16) * b (16x8 bf16) as attn::mma_bf16, but not volatile: the compiler
// may schedule it among the decoding instructions.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A field of a dense launch's part i, read where it is used (constant indices: straight
// from the parameter bank, not kept in registers through the k loop).
template <typename Get>
__device__ __forceinline__ auto part_field(const GemvParams& p, int i, Get get) {
  auto v = get(p.parts[0]);
#pragma unroll
  for (int j = 1; j < kGemvParts; ++j)
    if (i == j) v = get(p.parts[j]);
  return v;
}

// What a launch computes: a MoE layer's up (gate and up, then the GLU) or down product
// over the tile table, or dense linears (up to kGemvParts of one input). kMoeDownUnits is
// the down product with several units a warp (p.upw, split 1), for a short K: a TP rank's
// part of d_ff can be two or three blocks, too few to pay for a warp's start (the tile,
// the staged rows, the ring's first requests), so a warp streams units unit .. unit + upw
// - 1 as one run of blocks, the next unit's first blocks requested while the last ones of
// the unit before are summed. (A kind of its own: the other instances keep their registers.)
enum Kind { kMoeDown, kMoeUp, kDense, kMoeDownUnits };

// (8-warp CTAs are held to 128 registers, so that two fit an SM: the reason for them.)
template <int kKind, int kWarps, int kValue, int kScale, int kSpc>
__global__ void __launch_bounds__(32 * kWarps, kWarps == kWideCtaWarps ? 2 : 0) quant_gemv_kernel(const GemvParams p) {
  constexpr int kThreads = 32 * kWarps;
  constexpr bool kUp = kKind == kMoeUp;
  using F = Fmt<kValue, kScale, kSpc>;
  using S = Slot<kValue, kScale, kSpc>;
  constexpr int R = F::kRing;
  constexpr int kCodeBytes = F::kCodeBytes;  // per row per block
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float partial[kWarps][4][32];
  static_assert(sizeof(partial) == static_smem(kWarps));
  // Every launch is a dependent one (pdl.cuh). A MoE down GEMV starts streaming its
  // weights before the up GEMV (always the kernel before it) has completed: it reads the
  // tile table align wrote two kernels back and weights no kernel writes. The others wait
  // first: the up GEMV reads the tiles align just wrote, and a dense GEMV cannot know that
  // the kernel before it did not write its weights (a dummy load's fill, a test's).
  constexpr bool kMulti = kKind == kMoeDownUnits;
  constexpr bool prefetch = kKind == kMoeDown || kMulti;
  if (!prefetch) pdl_wait();
  int row0, rows;
  const QuantExpert* ew = nullptr;
  if constexpr (kKind != kDense) {
    const int4 tile = p.tiles[blockIdx.y];
    if (tile.x < 0) return;
    row0 = tile.y, rows = tile.z;
    ew = p.experts + tile.x;
  } else {
    row0 = 0, rows = p.dense_rows;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int unit = (blockIdx.x * (kWarps / p.split) + warp / p.split) * (kMulti ? p.upw : 1), slice = warp % p.split;
  // A dense launch's unit lies in one of its parts: part pi, whose units begin at pb
  // (MoE: 0, 0). Its fields are read where used.
  int pi = 0, pb = 0;
  if constexpr (kKind == kDense) {
#pragma unroll
    for (int i = 1; i < kGemvParts; ++i)
      if (i < p.n_parts && unit >= p.part_end[i - 1]) pi = i, pb = p.part_end[i - 1];
  }
  const int pu = unit - pb;
  const auto n_out = [&] {
    return kKind != kDense ? p.n_out : int(part_field(p, pi, [](const GemvPart& q) { return q.n_out; }));
  };
  const int per_slice = (p.n_blocks + p.split - 1) / p.split;
  const int b_begin = min(p.n_blocks, slice * per_slice);
  const int b_end = unit < p.units ? min(p.n_blocks, b_begin + per_slice) : b_begin;

  // This lane's two weight rows: gate and up of output 8 unit + g, or rows 16 unit + g (+ 8):
  // their codes, and the scales of this lane's chunk of block 0 (block b's are b code /
  // scale steps on: packed weights are unit-major, quant_layout.h, bf16 rows row-major;
  // a chunk's kSpc > 1 scales are consecutive: group 32 / kSpc).
  const int group_shift = __ffs(p.f.group) - 1;
  const int tile_scale = (kKTile >> group_shift) * F::kScaleBytes;  // a row's scale bytes per block
  constexpr int kCodeStep = F::kBf16 ? kCodeBytes : kQuantUnitRows * kCodeBytes;
  const int scale_step = kQuantUnitRows * tile_scale;
  const uint8_t* codes[2];
  const uint8_t* scales[2];
  bool live[2];
  float scale2[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int f = kUp ? 2 * (8 * unit + g) + h : 16 * pu + g + 8 * h;
    live[h] = unit < p.units && (kUp ? 8 * unit + g < p.d_ff : f < n_out());
    // (MoE kinds: ew is set and the dense matrix unused. Written as a compile-time branch
    // here and in the epilogue, their 4-bit instances took 135-146 registers, not 128,
    // and NVFP4 decode ran 5-11% slower.)
    const QuantMat dense = kKind == kDense ? part_field(p, pi, [](const GemvPart& q) { return q.w; }) : p.parts[0].w;
    const QuantRowRef w = quant_row(dense, ew, kUp, p.s.interleaved, p.d_ff, live[h] ? f : 0);
    codes[h] = w.m.codes + t * (kCodeBytes / 4) +
               (F::kBf16 ? int64_t(w.row) * p.code_row : quant_block_offset(w.row, 0, p.code_row, kCodeBytes));
    scales[h] = w.m.scales + quant_block_offset(w.row, 0, p.scale_row, tile_scale) +
                ((32 * t) >> group_shift) * F::kScaleBytes;
    scale2[h] = w.m.scale2 ? *w.m.scale2 : 1.0f;
  }
  // FP8 with 128-input groups scales each block's fp32 result (uniform).
  const bool block_scaled = F::kFp8 && p.f.group == kKTile;
  const auto load = [&](int blk, S& st) {
    const int k0 = blk * kKTile + 32 * t;  // the chunk's first input
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int v = 0; v < F::kChunkWords / 4; ++v) {
        // bf16 rows are not padded: their last block stops at K (a multiple of 8).
        const bool in = live[h] && (!F::kBf16 || k0 + 8 * v < p.K);
        const uint4 q = in ? __ldg(reinterpret_cast<const uint4*>(codes[h] + int64_t(blk) * kCodeStep) + v)
                           : make_uint4(0, 0, 0, 0);
        st.w[h][4 * v] = q.x, st.w[h][4 * v + 1] = q.y, st.w[h][4 * v + 2] = q.z, st.w[h][4 * v + 3] = q.w;
      }
      if constexpr (!F::kBf16) {
#pragma unroll
        for (int i = 0; i < kSpc; ++i)
          st.s[h][i] = load_scale_bits<kScale>(scales[h] + blk * scale_step + i * F::kScaleBytes);
      }
    }
  };
  // A ring of R blocks of codes in registers: block b + R - 1 is requested before block
  // b is decoded (slot indices are compile-time: the main loop is unrolled by R).
  S ring[R];
  // kMoeDownUnits: the warp's blocks in order, block lb of unit lu next (the next unit's
  // rows are 16 rows of bytes on in either layout, quant_layout.h).
  const int n_flat = kMulti ? p.upw * b_end : 0;
  int lb = 0, lu = unit;
  const auto request = [&](S& st) {
    load(lb, st);
    if (++lb < b_end) return;
    lb = 0, ++lu;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      codes[h] += int64_t(kQuantUnitRows) * p.code_row;
      scales[h] += int64_t(kQuantUnitRows) * p.scale_row;
      live[h] = lu < p.units && 16 * lu + g + 8 * h < p.n_out;
    }
  };
#pragma unroll
  for (int j = 0; j < R - 1; ++j) {
    if constexpr (kMulti) {
      if (j < n_flat) request(ring[j]);
    } else if (b_begin + j < b_end) {
      load(b_begin + j, ring[j]);
    }
  }

  if (prefetch) pdl_wait();
  // The activation rows, staged while the first blocks of codes are on their way.
  const int x_stride = p.Kp + kXPad;
  bf16* xs = reinterpret_cast<bf16*>(smem);  // [rows, Kp + kXPad], permuted (permute_x)
  for (int c = threadIdx.x; c < rows * (p.Kp / 8); c += kThreads) {
    const int r = c / (p.Kp / 8), k = (c % (p.Kp / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (k < p.K) {
      const int64_t src = kKind == kDense ? r : kUp ? p.perm[row0 + r] / p.top_k : row0 + r;
      v = permute_x<kValue>(*reinterpret_cast<const uint4*>(p.a + src * p.K + k));
    }
    uint2* dst = reinterpret_cast<uint2*>(xs + r * x_stride + k);
    dst[0] = make_uint2(v.x, v.y), dst[1] = make_uint2(v.z, v.w);
  }
  __syncthreads();
  // Token row g's staged inputs. Lanes past the tile's rows read its last row: B column g
  // only reaches output column g, which the epilogue does not store.
  const bf16* xg = xs + min(g, rows - 1) * x_stride + 32 * t;

  // Two accumulators: consecutive mmas do not wait on each other. The 4-bit formats' mmas
  // add up in them across blocks (their scales are applied before the mma); FP8 (whose
  // blocks may carry a scale of their own) and bf16 add each block's sum into the first.
  // (H100, accumulating across blocks: MXFP4 / INT4 MoE layers 3-9% faster at 8-256
  // tokens; NVFP4 mixed, Qwen3-30B-A3B 3-6% slower as its down GEMV went from 128 to 138
  // registers; bf16 dense linears at 1-8 rows 5-12% slower, hence not for bf16.)
  constexpr bool kAcross = !F::kFp8 && !F::kBf16;
  float acc2[2][4] = {};
  const auto compute = [&](const S& st, int blk) {
    uint32_t sf[2][kSpc] = {};
    // Pre-mma scale factors (bf16 pairs) per row and scale of the chunk: 2^kPre times the
    // scale, or 2^120 alone for block-scaled FP8 (which makes decoded e4m3 numbers exact).
    if constexpr (!F::kBf16) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < kSpc; ++i)
          sf[h][i] = block_scaled ? 0x7b807b80u : pre_scale<kValue, kScale>(st.s[h][i]);  // 2^120: 0x7b80
    }
    float part[2][4] = {};
    float(&d)[2][4] = kAcross ? acc2 : part;
#pragma unroll
    for (int step = 0; step < 8; ++step) {
      uint32_t a[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (F::kBf16) {  // words 2 step and 2 step + 1: inputs (4 step, +1), (+2, +3)
          a[h] = st.w[h][2 * step], a[2 + h] = st.w[h][2 * step + 1];
        } else {
          // A step covers 4 inputs: FP8 word `step`; 4-bit word step / 2, pairs 2r and 2r + 1.
          const __nv_bfloat162 f = as_bf16x2(sf[h][step * kSpc / 8]);
          const uint32_t w = st.w[h][F::kFp8 ? step : step / 2];
          const uint32_t lo = F::kFp8 ? decode_fp8_pair(w, 0) : decode_pair<kValue>(w, 2 * (step % 2));
          const uint32_t hi = F::kFp8 ? decode_fp8_pair(w, 1) : decode_pair<kValue>(w, 2 * (step % 2) + 1);
          a[h] = bf16x2_bits(__hmul2(as_bf16x2(lo), f));
          a[2 + h] = bf16x2_bits(__hmul2(as_bf16x2(hi), f));
        }
      }
      const uint2 b = *reinterpret_cast<const uint2*>(xg + blk * kKTile + 4 * step);
      mma_bf16(d[step % 2], a, b.x, b.y);
    }
    if constexpr (!kAcross) {
      const float s0 = block_scaled ? scale_of(kScale, st.s[0][0]) : 1.0f;
      const float s1 = block_scaled ? scale_of(kScale, st.s[1][0]) : 1.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) acc2[0][j] += (part[0][j] + part[1][j]) * (j < 2 ? s0 : s1);
    }
  };
  // The outputs of unit u (its slices' partial sums added up first where split > 1): the
  // GLU (up) or the bias added.
  const auto finish = [&](int u) {
    float acc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = acc2[0][j] + acc2[1][j];
    // The unit's slices add up in the first one's registers.
    if (p.split > 1) {
#pragma unroll
      for (int j = 0; j < 4; ++j) partial[warp][j][lane] = acc[j];
      __syncthreads();
      if (slice != 0) return;
      for (int w = 1; w < p.split; ++w)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] += partial[warp + w][j][lane];
    }
    if (u >= p.units) return;

    // acc: rows g (0, 1) and g + 8 (2, 3) for token rows 2t and 2t + 1.
    const float unbias = block_scaled ? 1.0f : F::kUnbias;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int n = 2 * t + j;
      if (n >= rows) continue;
      float v0 = acc[j] * unbias * scale2[0], v1 = acc[2 + j] * unbias * scale2[1];
      if constexpr (kUp) {
        const int i = 8 * u + g;
        if (!live[0]) continue;
        p.act[int64_t(row0 + n) * p.d_ff + i] = __float2bfloat16(
            glu_output(v0, v1, ew->gate_up_bias, p.s.interleaved, i, p.d_ff, p.s.glu_kind, p.s.alpha, p.s.limit));
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int o = 16 * (u - pb) + g + 8 * h;
          // (kMoeDownUnits: live is already the next unit's, requested ahead.)
          if (kMulti ? o >= p.n_out : !live[h]) continue;
          const float v = h == 0 ? v0 : v1;
          if (ew == nullptr) {
            const float* bias = part_field(p, pi, [](const GemvPart& q) { return q.bias; });
            part_field(p, pi, [](const GemvPart& q) { return q.out; })[int64_t(n) * n_out() + o] =
                __float2bfloat16(v + (bias ? bias[o] : 0.0f));
          } else {
            p.y[int64_t(p.perm[row0 + n]) * p.n_out + o] = v + (ew->down_bias ? ew->down_bias[o] : 0.0f);
          }
        }
      }
    }
  };
  if constexpr (kMulti) {
    // The same loop over the warp's run of blocks (requested by `request`); a unit's last
    // block finishes it.
    int cb = 0, cu = unit;
    const auto step = [&](const S& st) {
      compute(st, cb);
      if (++cb < b_end) return;
      finish(cu);
      cb = 0, ++cu;
#pragma unroll
      for (int j = 0; j < 4; ++j) acc2[0][j] = acc2[1][j] = 0.0f;
    };
    int n0 = 0;
    for (; n0 + 2 * R - 1 <= n_flat; n0 += R) {
#pragma unroll
      for (int j = 0; j < R; ++j) {
        request(ring[(j + R - 1) % R]);
        step(ring[j]);
      }
    }
    for (; n0 < n_flat; n0 += R) {
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (n0 + j < n_flat) {
          if (n0 + j + R - 1 < n_flat) request(ring[(j + R - 1) % R]);
          step(ring[j]);
        }
      }
    }
    return;
  }
  // The steady state, while a group's R blocks and the R blocks requested ahead of them
  // all lie in the range: no guards, so the compiler schedules the group's loads and
  // decoding freely (the guarded loop alone streamed 12-17% slower: bench/gemv_dissect.cu).
  int b0 = b_begin;
  for (; b0 + 2 * R - 1 <= b_end; b0 += R) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      load(b0 + j + R - 1, ring[(j + R - 1) % R]);
      compute(ring[j], b0 + j);
    }
  }
  // The last blocks, guarded (slot (blk - b_begin) % R, as above).
  for (; b0 < b_end; b0 += R) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int blk = b0 + j;
      if (blk < b_end) {
        if (blk + R - 1 < b_end) load(blk + R - 1, ring[(j + R - 1) % R]);
        compute(ring[j], blk);
      }
    }
  }

  finish(unit);
}

int kp_of(int64_t k) { return int((k + kKTile - 1) / kKTile * kKTile); }

// Calls fn(kernel) with the instance for format f (one per format the packer produces,
// quant_pack.cpp).
template <int kKind, int kWarps, typename Fn>
void with_instance(const QuantFormat& f, Fn&& fn) {
  const int v = f.value, s = f.scale_kind, spc = std::max(1, 32 / f.group);
  if (v == 0 && s == 0 && spc == 1) fn(quant_gemv_kernel<kKind, kWarps, 0, 0, 1>);        // MXFP4
  else if (v == 0 && s == 1 && spc == 2) fn(quant_gemv_kernel<kKind, kWarps, 0, 1, 2>);   // NVFP4
  else if (v == 1 && s == 2 && spc == 1) fn(quant_gemv_kernel<kKind, kWarps, 1, 2, 1>);   // INT4, bf16 scales
  else if (v == 1 && s == 2 && spc == 2) fn(quant_gemv_kernel<kKind, kWarps, 1, 2, 2>);
  else if (v == 1 && s == 2 && spc == 4) fn(quant_gemv_kernel<kKind, kWarps, 1, 2, 4>);
  else if (v == 1 && s == 3 && spc == 1) fn(quant_gemv_kernel<kKind, kWarps, 1, 3, 1>);   // INT4, f16 scales
  else if (v == 1 && s == 3 && spc == 2) fn(quant_gemv_kernel<kKind, kWarps, 1, 3, 2>);
  else if (v == 1 && s == 3 && spc == 4) fn(quant_gemv_kernel<kKind, kWarps, 1, 3, 4>);
  else if (v == 1 && s == 4 && spc == 1) fn(quant_gemv_kernel<kKind, kWarps, 1, 4, 1>);   // INT4, f32 scales
  else if (v == 1 && s == 4 && spc == 2) fn(quant_gemv_kernel<kKind, kWarps, 1, 4, 2>);
  else if (v == 1 && s == 4 && spc == 4) fn(quant_gemv_kernel<kKind, kWarps, 1, 4, 4>);
  else if (v == 2 && s == 4 && spc == 1) fn(quant_gemv_kernel<kKind, kWarps, 2, 4, 1>);   // FP8
  else if (v == 2 && s == 4 && spc == 2) fn(quant_gemv_kernel<kKind, kWarps, 2, 4, 2>);
  else if (v == kBf16Value) fn(quant_gemv_kernel<kKind, kWarps, kBf16Value, 0, 1>);  // plain bf16
  else KILN_CHECK(false) << "quant gemv: no kernel for value kind " << v << ", scale kind " << s << ", group " << f.group;
}

// Launch over `tiles` tiles (MoE: about the live ones), splitting each unit's k range
// over 2 or 4 warps while the warps still fit in one wave (all resident at once): more warps
// hide more latency, but a split whose warps spill into a second wave leaves most of the
// GPU idle while that wave's few CTAs stream, and a warp streams best over many blocks.
// A slice shorter than 2 ring - 1 blocks never leaves the k loop's guarded tail: slices
// keep at least that many. H100, one token, splits forced (up / down): gpt-oss-120b MXFP4
// 2 / 2 (1.4 waves for the up GEMV: the two-wave rule) 46.8 us, 1 / 2 (the one-wave rule)
// 43.7, 1 / 1 50.1, 2 / 1 52.7; DeepSeek-like INT4 2 / 1 (1.9 waves) 114.6, 1 / 1 110.8;
// Qwen3-30B-A3B MXFP4 2 / 1 (both rules) 27.1, 1 / 1 29.6; at eight tokens neither rule
// splits. The dense linear rows measured the same under both rules (Llama-3-8B gate_up,
// 1.7 waves at split 2 under the old one: 104.9-107.5 us with it, 107.7 without, across
// runs). Slices of at least 6 blocks for every format (not 2 ring - 1) cost gpt-oss-20b
// decode 3-5%: the bf16 attention projections lost their 4-way split.
// Warps the current device holds at once at up to 128 registers a thread: a launch's wave.
int64_t gemv_wave() {
  int device = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return int64_t(sms) * 16;
}

template <int kKind, int kWarps>
void launch_gemv_warps(GemvParams p, int n_slots, int64_t tiles, cudaStream_t stream) {
  const int64_t wave = gemv_wave();
  p.split = 1;
  const int min_slice = 2 * ring_blocks(p.f.value) - 1;
  while (kKind != kMoeDownUnits && p.split < kCtaWarps && int64_t(p.units) * tiles * p.split * 2 <= wave &&
         p.n_blocks >= 2 * min_slice * p.split)
    p.split *= 2;
  const int units_per_cta = kWarps / p.split * (kKind == kMoeDownUnits ? p.upw : 1);
  // The tile is the grid's slow index: align puts the live tiles first, so the live CTAs
  // are dispatched first. A dependent launch's CTAs all wait at pdl_wait; where the grid
  // is more than one wave (one token: 8 slots, 4 live, 5 CTAs per SM), the CTAs left for
  // later are now dead ones, where with the tile as the fast index some were live.
  // H100, one token, gpt-oss-120b MXFP4 47.2 -> 44.0 us (ncu, serialized without
  // dependent launches, saw no change), decode +2%.
  KILN_CHECK(n_slots <= 65535) << "quant gemv: " << n_slots << " tiles";
  const dim3 grid(unsigned((p.units + units_per_cta - 1) / units_per_cta), unsigned(n_slots));
  const int smem = x_bytes(p.rows_cap, p.Kp);
  KILN_CHECK(smem <= kSmemBudget) << "quant gemv: " << p.rows_cap << " rows of " << p.K << " inputs";
  with_instance<kKind, kWarps>(p.f, [&](auto kernel) {
    prepare_smem(kernel, smem, static_smem(kWarps));
    launch_dependent(kernel, grid, 32 * kWarps, smem, stream, p);
  });
  KILN_CUDA_LAUNCH_CHECK();
}

// Warps per CTA of a MoE launch staging `rows` rows of kp inputs: 4 while an SM holds 4
// such CTAs (16 warps), else 8 where it holds 2 of those (the same 16 warps over the same
// staged rows; 0: neither, the tile is to be cut). On the H100's 228 KB every MoE tile
// takes 4; on an SM120 SM's 100 KB, eight tokens of the DeepSeek-like shape (3 rows of
// 7168 inputs, 43 KB) held 2 CTAs of 4 warps, or 3 with the tile cut to 2 rows: 491 us
// per layer, against 443 in 2 CTAs of 8 (cuda_ops.cpp, moe_gemv_tile_rows, for the rule).
int moe_gemv_warps(int rows, int kp) {
  const int x = x_bytes(rows, kp);
  if (blocks_fit_sm(x + static_smem(kCtaWarps), 4)) return kCtaWarps;
  return blocks_fit_sm(x + static_smem(kWideCtaWarps), 2) ? kWideCtaWarps : 0;
}

// Warps of this instance an SM holds with `smem` bytes of staged rows: the occupancy
// calculator's CTAs (registers, warps, the device's shared memory) as far as the emulated
// SM's shared memory holds them too (blocks_fit_sm). Asked once per instance, shape and
// device (a launch is on the host's path of every eager step).
template <int kKind, int kWarps>
int resident_warps(const QuantFormat& f, int smem) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, int> known;
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  int warps = 0;
  with_instance<kKind, kWarps>(f, [&](auto kernel) {
    const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), smem, device);
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = known.find(key); it != known.end()) {
      warps = it->second;
      return;
    }
    prepare_smem(kernel, smem, static_smem(kWarps));
    int ctas = 0;
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, 32 * kWarps, smem));
    while (ctas > 0 && !blocks_fit_sm(smem + static_smem(kWarps), ctas)) --ctas;
    warps = known[key] = ctas * kWarps;
  });
  return warps;
}

// set_quant_gemv_units_per_warp's value (0: the rule).
std::atomic<int> forced_units_per_warp{[] {
  const char* v = std::getenv("KILN_GEMV_UNITS_PER_WARP");
  return v && *v ? std::max(0, std::atoi(v)) : 0;
}()};

// Units a warp of a MoE down GEMV takes (kMoeDownUnits where more than 1): doubled, up to
// 8, while the doubled run of blocks stays within 28 KB of codes and scales and the warps
// still make two waves. H200, kiln bench op (graph-replayed MoE layers; the bf16 ones by
// wall clock), us at 64 / 256 rows with one unit a warp -> the rule's: NVFP4 Qwen3-30B-A3B
// (a unit of 6.8 KB; 4 units) 192.6 / 434.6 -> 176.8 / 393.6, its TP2 rank part (3.4 KB;
// 4 / 8) 120.5 / 264.8 -> 107.8 / 228.6, its TP4 rank part (2.3 KB; 4 / 8) 88.5 / 181.0
// -> 78.1 / 149.0; MXFP4 (6.5 KB; 4) 156.5 / 360.3 -> 153.8 / 348.0; FP8 (12.7 KB; 2)
// 194.7 / 411.2 -> 192.1 / 395.7; bf16 at TP4 (6 KB; 4) 64 rows 134.8 -> 129.2. Units of
// 18 KB (a DeepSeek-like d_ff of 2048 in INT4 / NVFP4) ran 0.5-6.5% slower two a warp; at 8
// rows (64 tiles: 2 or 4 units a warp leave one or two waves) every format but NVFP4 ran
// 2-7% slower, hence the two waves (docs/perf/multi-gpu-early.md, nineteenth section; the
// configurations the rule picks were measured by forcing them, KILN_GEMV_UNITS_PER_WARP).
int down_units_per_warp(const GemvParams& p, int64_t tiles) {
  if (const int forced = forced_units_per_warp.load(std::memory_order_relaxed); forced > 0) return forced;
  const int64_t wave = gemv_wave(), warps = int64_t(p.units) * tiles;
  const int64_t unit_bytes = int64_t(kQuantUnitRows) * (p.code_row + p.scale_row);
  int upw = 1;
  // (Doubled: runs of 2 upw units, warps / (2 upw) >= 2 waves.)
  while (upw < 8 && 2 * upw * unit_bytes <= 28 * 1024 && warps >= 4 * upw * wave) upw *= 2;
  return upw;
}

// A MoE launch takes 8-warp CTAs where the staged rows leave an SM too few CTAs of 4
// (moe_gemv_warps), and also where registers do: an instance above 128 registers a thread
// (the bf16 down GEMV: 134, ncu on the H200) fits 3 CTAs of 4 warps, 12 warps an SM,
// where 2 CTAs of 8, held to 128 registers by their launch bounds, make 16. So it goes by
// the warps each holds (the 4-warp CTAs where equal: finer-grained). H200, MoE layers
// (kiln bench op, the mean of two runs each, us): Qwen3-30B-A3B bf16 at 64 rows 346 ->
// 338, one TP2 rank 215 -> 203, one TP4 rank 148 -> 140; NVFP4 (graph-replayed) at 64
// rows Qwen3-30B-A3B 197 -> 188, Qwen3.5-35B-A3B 220 -> 208, DeepSeek-like 2,340 ->
// 2,273; gpt-oss-120b MXFP4 at 1 / 8 rows 48.6 / 171.9 -> 45.7 / 164.9; the other
// formats within 1% (docs/perf/multi-gpu-early.md, twelfth session). Dense launches always
// take 4-warp CTAs.
template <int kKind>
void launch_gemv(const GemvParams& p, int n_slots, int64_t tiles, cudaStream_t stream) {
  if constexpr (kKind == kDense) {
    launch_gemv_warps<kKind, kCtaWarps>(p, n_slots, tiles, stream);
  } else {
    const int by_smem = moe_gemv_warps(p.rows_cap, p.Kp), smem = x_bytes(p.rows_cap, p.Kp);
    if (const int upw = kKind == kMoeDown ? down_units_per_warp(p, tiles) : 1; upw > 1 && by_smem == kCtaWarps) {
      GemvParams q = p;
      q.upw = upw;
      launch_gemv_warps<kMoeDownUnits, kCtaWarps>(q, n_slots, tiles, stream);
      return;
    }
    const bool wide = by_smem == kWideCtaWarps ||
                      (by_smem == kCtaWarps &&
                       resident_warps<kKind, kWideCtaWarps>(p.f, smem) > resident_warps<kKind, kCtaWarps>(p.f, smem));
    if (wide) launch_gemv_warps<kKind, kWideCtaWarps>(p, n_slots, tiles, stream);
    else launch_gemv_warps<kKind, kCtaWarps>(p, n_slots, tiles, stream);
  }
}

void set_k(GemvParams& p, const QuantFormat& f, int64_t K) {
  KILN_CHECK(K % 8 == 0) << "quant gemv: " << K << " inputs, not a multiple of 8";
  p.K = int(K);
  p.Kp = int(f.k_padded(K));
  p.n_blocks = p.Kp / kKTile;
  const bool bf16 = f.value == kBf16Value;  // unpadded bf16 rows, no scales
  p.code_row = bf16 ? K * 2 : f.code_row_bytes(K);
  p.scale_row = bf16 ? 0 : f.scale_row_bytes(K);
}

}  // namespace

int quant_gemv_max_rows(int64_t n_in) {
  int rows = kGemvRows;
  while (rows > 0 && x_bytes(rows, kp_of(n_in)) > kSmemBudget) --rows;
  return n_in % 8 != 0 ? 0 : rows;
}

int quant_gemv_moe_warps(int rows, int64_t n_in) { return moe_gemv_warps(rows, kp_of(n_in)); }

void set_quant_gemv_units_per_warp(int n) { forced_units_per_warp.store(std::max(0, n), std::memory_order_relaxed); }

void launch_quant_gemv_linears(const bf16* x, const GemvPart* parts, int n_parts, const QuantFormat& f, int64_t rows,
                               int64_t n_in, cudaStream_t stream) {
  KILN_CHECK(rows >= 1 && rows <= quant_gemv_max_rows(n_in)) << "quant gemv: " << rows << " rows of " << n_in;
  KILN_CHECK(n_parts >= 1 && n_parts <= kGemvParts) << "quant gemv: " << n_parts << " linears";
  if (f.value == kBf16Value && rows <= bf16_row_gemv_rows()) {
    launch_bf16_row_gemv(x, parts, n_parts, rows, n_in, stream);
    return;
  }
  GemvParams p{};
  p.n_parts = n_parts;
  for (int i = 0; i < p.n_parts; ++i) {
    p.parts[i] = parts[i];
    p.units += int((parts[i].n_out + 15) / 16);
    p.part_end[i] = p.units;
  }
  p.dense_rows = p.rows_cap = int(rows);
  p.a = x;
  p.f = f;
  set_k(p, f, n_in);
  launch_gemv<kDense>(p, 1, 1, stream);
}

void launch_moe_gemv_quant(const bf16* x, const QuantExpert* table, const QuantFormat& f, const MoeShape& s,
                           int top_k, int rows_cap, int64_t n_pairs, const int32_t* perm, const int4* tiles,
                           int n_slots, bf16* act, float* y, cudaStream_t stream) {
  KILN_CHECK(rows_cap >= 1 && rows_cap <= quant_gemv_max_rows(std::max(s.d_model, s.d_ff)))
      << "quant gemv: tiles of " << rows_cap << " rows";
  if (f.value == kBf16Value && rows_cap <= std::min(bf16_row_gemv_rows(), kRowGemvMoeRows)) {
    launch_moe_row_gemv(x, table, s, top_k, rows_cap, perm, tiles, n_slots, act, y, stream);
    return;
  }
  GemvParams p{};
  p.tiles = tiles;
  p.perm = perm;
  p.experts = table;
  p.top_k = top_k;
  p.rows_cap = rows_cap;
  p.d_ff = int(s.d_ff);
  p.s = s;
  p.f = f;
  p.act = act;
  p.y = y;
  p.a = x;
  p.units = int((s.d_ff + 7) / 8);
  set_k(p, f, s.d_model);
  const int64_t live_tiles = std::min<int64_t>(n_pairs, n_slots);
  launch_gemv<kMoeUp>(p, n_slots, live_tiles, stream);
  p.a = act;
  p.units = int((s.d_model + 15) / 16);
  p.n_out = int(s.d_model);
  set_k(p, f, s.d_ff);
  launch_gemv<kMoeDown>(p, n_slots, live_tiles, stream);
}

}  // namespace kiln::cuda
