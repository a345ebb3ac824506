// The native SM120 MoE GEMMs' data layout (kernels/quant_gemm_sm120.cu), in plain C++
// for the kernels and the host alike: how activations are quantized on the fly, where
// each byte of a pipeline stage lives in shared memory, and which shared-memory bytes
// each lane hands to ldmatrix and to the block-scaled mma.sync as operands and scale
// factors. tests/backends/cuda/quant_mma_sm120_test.cpp feeds exactly these mappings to
// an emulation of the PTX-documented mma semantics on the CPU, and the start-up
// self-test compares the device's quantized activations with quantize_act_rows byte for
// byte, so what the sm_120a kernels read is verified without an SM120 card.
//
// A = activations [rows, K] (row), B = weights [K, fused columns] (col: one packed weight
// row of backends/cuda/quant_pack.h per column, read as it is). One instruction per
// weight format (PTX ISA 9.0, mma "block scaling"; shared/research/kernels-sm120.md 2.2-2.4):
//
//   MXFP4 weights (e2m1, ue8m0 per 32): mma.sync.m16n8k32 kind::mxf8f6f4 block_scale
//     scale_vec::1X, A e4m3 with a ue8m0 scale per 32 inputs (W4A8). Why 8-bit
//     activations: gpt-oss, the MXFP4 family, was trained with bf16 activations, and an
//     e2m1 activation keeps one mantissa bit (a block's values land on 8 magnitudes;
//     llama.cpp's W4A4 MXFP4 path fails its op tests, PR 17906, and a W4A8 fallback is
//     proposed where 4-bit activations hurt, PR 24364), while e4m3 keeps three (relative
//     error <= 2^-4). The price: mxf8f6f4 runs at half the FP4 rate (RTX 5090, third-
//     party: 731 vs 1462 dense TFLOP/s), still twice the bf16 mma.sync with fp32
//     accumulation the portable path uses (370), and the FP4 weights are widened to one
//     per byte in registers (b_operand).
//   NVFP4 weights (e2m1, ue4m3 per 16, fp32 global): mma.sync.m16n8k64 kind::mxf4nvf4
//     block_scale scale_vec::4X, A e2m1 with a ue4m3 scale per 16 inputs and an fp32
//     scale per row (W4A4, NVFP4's own activation format: ModelOpt calibrates these
//     checkpoints for it), at the full FP4 rate.
//
// Activation quantization (quantize_block_*, one rule on host and device; no
// multiply-add, so the compiler's FMA contraction cannot make the two differ):
//   E4m3: per block of 32 inputs, the smallest power of two 2^e with amax / 2^e <= 448
//     (rounding the OCP MX exponent up, so the largest element is never clipped), then
//     each x / 2^e to e4m3, round to nearest even. Stored in "slot order" (see
//     e4m3_block_input), the order that lets one ldmatrix feed the mma.
//   E2m1: per row g = amax(row) / (6 * 448) (1 for a zero row), per block of 16
//     s = e4m3(amax(block) / (6 g)) (ModelOpt's NVFP4 recipe with the row as the
//     tensor), each x / (s g) to e2m1, round to nearest even, saturating at 6.
// Padding inputs (K up to the 128-input tile) are zero codes with a finite scale.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define KILN_SM120_HD __host__ __device__
#else
#define KILN_SM120_HD
#endif

namespace kiln::cuda::sm120 {

// The activations' format, one per weight format (see the header).
enum class ActFormat : int { kE4m3 = 0, kE2m1 = 1 };

// CTA tile (mirrors quant_gemm.cu's prefill tile): kBM rows x kBN fused columns, 2 x 2
// warps of 32 x 64, kKTile inputs per pipeline stage.
inline constexpr int kBM = 64, kBN = 128, kKTile = 128;
inline constexpr int kWarpsM = 2, kWarpsN = 2, kThreads = 32 * kWarpsM * kWarpsN;
inline constexpr int kMT = kBM / (16 * kWarpsM);  // m16 tiles per warp
inline constexpr int kNT = kBN / (8 * kWarpsN);   // n8 tiles per warp

KILN_SM120_HD constexpr int act_bits(ActFormat f) { return f == ActFormat::kE4m3 ? 8 : 4; }
KILN_SM120_HD constexpr int act_group(ActFormat f) { return f == ActFormat::kE4m3 ? 32 : 16; }
// Inputs per mma (k32 for mxf8f6f4, k64 for mxf4nvf4) and mmas per stage along k.
KILN_SM120_HD constexpr int mma_k(ActFormat f) { return f == ActFormat::kE4m3 ? 32 : 64; }
KILN_SM120_HD constexpr int k_steps(ActFormat f) { return kKTile / mma_k(f); }

// ---- quantized activations in global memory: row r of K inputs, Kp = K rounded up to 128
//   codes   u8 [rows, Kp * bits / 8]   (e4m3: slot order per 32; e2m1: low nibble = even k)
//   scales  u8 [rows, Kp / group]      (ue8m0 / ue4m3)
//   row_scale f32 [rows]               (e2m1 only)
inline constexpr int64_t k_padded(int64_t k) { return (k + kKTile - 1) / kKTile * kKTile; }
inline constexpr int64_t act_code_row_bytes(ActFormat f, int64_t k) { return k_padded(k) * act_bits(f) / 8; }
inline constexpr int64_t act_scale_row_bytes(ActFormat f, int64_t k) { return k_padded(k) / act_group(f); }

// The input (0..31) of an e4m3 block stored at byte s. The mma wants input k of its
// 32 (mxf8f6f4, 8-bit A) in byte k of the row and the FP4 weights in packed order;
// lane t of a quad loads packed weight inputs 8t..8t+7 as one word and widens them into
// its two B registers (mma k 4t..4t+3 and 16+4t..16+4t+3). Relabelling the mma's k by
// that map (k-order is free inside one scale block) puts input 8t + j at byte 4t + j
// and input 8t + 4 + j at byte 16 + 4t + j: so stored.
KILN_SM120_HD constexpr int e4m3_block_input(int s) { return 8 * ((s & 15) >> 2) + 4 * (s >> 4) + (s & 3); }
KILN_SM120_HD constexpr int e4m3_block_slot(int k) { return 16 * ((k & 7) >> 2) + 4 * (k >> 3) + (k & 3); }

// ---- number formats (magnitudes; the caller adds the sign)

KILN_SM120_HD inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
KILN_SM120_HD inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// OCP e4m3fn code (sign bit clear) of v >= 0: round to nearest even, saturating at 448
// (never the NaN code 0x7f).
KILN_SM120_HD inline uint32_t e4m3_code(float v) {
  if (!(v < 448.0f)) return 0x7eu;
  if (v < 0x1p-6f) return uint32_t(rintf(v * 512.0f));  // subnormals: multiples of 2^-9 (8 = 2^-6, normal)
  const uint32_t u = f32_bits(v);
  const uint32_t r = u + 0x7ffffu + ((u >> 20) & 1u);  // 23 mantissa bits to 3, ties to even
  return (r >> 20) - ((127u - 7u) << 3);                // exponent bias 127 -> 7
}
KILN_SM120_HD inline float e4m3_value(uint32_t c) {  // c <= 0x7e
  const uint32_t e = c >> 3, m = c & 7u;
  return e == 0 ? float(m) * 0x1p-9f : bits_f32(((e + 120u) << 23) | (m << 20));
}

// e2m1 code (sign bit clear) of v >= 0: the nearest of 0, .5, 1, 1.5, 2, 3, 4, 6, ties to
// the even code, saturating at 6 (what cvt.rn.satfinite.e2m1x2 does).
KILN_SM120_HD inline uint32_t e2m1_code(float v) {
  return uint32_t(v > 0.25f) + uint32_t(v >= 0.75f) + uint32_t(v > 1.25f) + uint32_t(v >= 1.75f) +
         uint32_t(v > 2.5f) + uint32_t(v >= 3.5f) + uint32_t(v > 5.0f);
}
KILN_SM120_HD inline float e2m1_value(uint32_t c) {  // c <= 7
  return c < 4 ? 0.5f * float(c) : bits_f32(((c >> 1) + 126u) << 23 | (c & 1u) << 22);
}

// ue8m0: 2^(c - 127); c = 0 is 2^-127, a subnormal (never 0xff here).
KILN_SM120_HD inline float ue8m0_value(uint32_t c) { return c == 0 ? bits_f32(0x00400000u) : bits_f32(c << 23); }

KILN_SM120_HD inline float abs_max(float m, float x) {
  const float a = x < 0.0f ? -x : x;
  return a > m ? a : m;
}

// ---- on-the-fly activation quantization

// E4m3 block: x[0..31] -> 8 code words in slot order (word w = bytes 4w..4w+3), returns the
// ue8m0 scale byte.
KILN_SM120_HD inline uint32_t quantize_block_e4m3(const float* x, uint32_t (&words)[8]) {
  float amax = 0.0f;
  for (int k = 0; k < 32; ++k) amax = abs_max(amax, x[k]);
  // amax = 1.m * 2^E (zero and subnormals: E = -127): 2^e >= amax / 448 = amax / (1.75 * 2^8).
  const uint32_t u = f32_bits(amax);
  int e = int(u >> 23) - 127 - 8 + ((u & 0x7fffffu) > 0x600000u ? 1 : 0);
  e = e < -127 ? -127 : e;  // e <= 120 for any finite amax
  const float inv = bits_f32(uint32_t(127 - e) << 23);  // 2^-e, a normal number: exact products
  for (int w = 0; w < 8; ++w) {
    uint32_t word = 0;
    for (int j = 0; j < 4; ++j) {
      const float v = x[e4m3_block_input(4 * w + j)] * inv;
      word |= (e4m3_code(v < 0.0f ? -v : v) | (v < 0.0f ? 0x80u : 0u)) << (8 * j);
    }
    words[w] = word;
  }
  return uint32_t(e + 127);
}

// E2m1 row scale from the row's absolute maximum.
KILN_SM120_HD inline float e2m1_row_scale(float row_amax) { return row_amax > 0.0f ? row_amax / 2688.0f : 1.0f; }

// E2m1 block: x[0..15] with row scale g -> 2 code words (input k at bits 4(k % 8) of word
// k / 8), returns the ue4m3 scale byte (0: the block is all zero codes).
KILN_SM120_HD inline uint32_t quantize_block_e2m1(const float* x, float g, uint32_t (&words)[2]) {
  float amax = 0.0f;
  for (int k = 0; k < 16; ++k) amax = abs_max(amax, x[k]);
  const float six_g = 6.0f * g;
  const uint32_t sc = e4m3_code(amax / six_g);
  const float denom = e4m3_value(sc) * g;
  words[0] = words[1] = 0;
  if (sc == 0) return 0;
  for (int k = 0; k < 16; ++k) {
    const float v = x[k] / denom;
    const uint32_t c = e2m1_code(v < 0.0f ? -v : v);
    words[k >> 3] |= (c | (v < 0.0f && c != 0 ? 8u : 0u)) << (4 * (k & 7));
  }
  return sc;
}

// ---- one pipeline stage in shared memory (byte offsets from the stage's start)
//   A codes  [kBM rows][kKTile * bits / 8]   16-byte chunks swizzled (tile_chunk)
//   A scales [kBM rows][kKTile / group]      one word per k step (e2m1) or per stage
//   B codes  [kBN rows][64]                  the packed e2m1 weight rows, swizzled
//   B scales [kBN rows][kKTile / group]      the weights' own scale bytes (same group)
KILN_SM120_HD constexpr int a_row_bytes(ActFormat f) { return kKTile * act_bits(f) / 8; }
KILN_SM120_HD constexpr int scale_row_bytes(ActFormat f) { return kKTile / act_group(f); }
inline constexpr int kBRowBytes = kKTile / 2;
KILN_SM120_HD constexpr int a_scales_offset(ActFormat f) { return kBM * a_row_bytes(f); }
KILN_SM120_HD constexpr int b_codes_offset(ActFormat f) { return a_scales_offset(f) + kBM * scale_row_bytes(f); }
KILN_SM120_HD constexpr int b_scales_offset(ActFormat f) { return b_codes_offset(f) + kBN * kBRowBytes; }
KILN_SM120_HD constexpr int stage_bytes(ActFormat f) { return b_scales_offset(f) + kBN * scale_row_bytes(f); }

// Where 16-byte chunk `chunk` of row `row` lives in a tile of row_bytes-byte rows (64 or
// 128): the chunk index XOR (row / rows per 128-byte line) % chunks per row, so the 8 row
// addresses of one ldmatrix matrix (8 consecutive rows, one chunk column) fall in 8
// different 16-byte bank groups.
KILN_SM120_HD constexpr uint32_t tile_chunk(int row, int chunk, int row_bytes) {
  return uint32_t(row * row_bytes + 16 * (chunk ^ ((row / (128 / row_bytes)) % (row_bytes / 16))));
}

// ---- per-lane fragment mapping (lane = %laneid, g = lane / 4, t = lane % 4)

// The row address lane supplies to ldmatrix.x4 for the A fragment of the m16 tile at
// row m0, k step ks: matrix i = rows m0 + 8 (i % 2) .. +7, chunk 2 ks + i / 2. Lane l
// receives word t of row g of matrix i, i.e. a0..a3 = rows g / g+8 x bytes 4t.. of the
// step's first / second 16 bytes: the PTX A fragment of both m16n8k32 (8-bit) and
// m16n8k64 (e2m1: 8 inputs per word).
KILN_SM120_HD constexpr uint32_t a_frag_addr(ActFormat f, int lane, int m0, int ks) {
  return tile_chunk(m0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * ks + (lane >> 4), a_row_bytes(f));
}
// The row address for the B words of the n8 tile at column n0: matrix i = chunk i (packed
// inputs 32i..32i+31 of the stage) of columns n0..n0+7; lane l receives word t of column g.
KILN_SM120_HD constexpr uint32_t b_frag_addr(int lane, int n0) {
  return tile_chunk(n0 + (lane & 7), lane >> 3, kBRowBytes);
}

// Byte permute (PTX prmt / __byte_perm, selectors 0..7 only).
KILN_SM120_HD inline uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = uint64_t(y) << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t(v >> (8 * ((s >> (4 * i)) & 7u)) & 0xffu) << (8 * i);
  return r;
#endif
}

// The B registers of k step ks from the n8 tile's 4 ldmatrix words q (q[i] = packed inputs
// 8t..8t+7 of chunk i). E2m1 (k64): chunks 2ks, 2ks+1 are b0, b1 as they are. E4m3
// (mxf8f6f4 k32, e2m1 one per byte in bits 5:2, zero padding): chunk ks widened, nibbles
// 0-3 to b0 (mma k 4t..4t+3) and 4-7 to b1 (k 16+4t..), matching e4m3_block_input.
KILN_SM120_HD inline void b_operand(ActFormat f, const uint32_t (&q)[4], int ks, uint32_t& b0, uint32_t& b1) {
  if (f == ActFormat::kE2m1) {
    b0 = q[2 * ks];
    b1 = q[2 * ks + 1];
    return;
  }
  const uint32_t lo = (q[ks] << 2) & 0x3c3c3c3cu;  // even nibbles 0, 2, 4, 6 at bits 5:2 of bytes 0-3
  const uint32_t hi = (q[ks] >> 2) & 0x3c3c3c3cu;  // odd nibbles 1, 3, 5, 7
  b0 = byte_perm(lo, hi, 0x5140u);                 // nibbles 0, 1, 2, 3
  b1 = byte_perm(lo, hi, 0x7362u);                 // nibbles 4, 5, 6, 7
}

// Scale factors: with thread-id 0, lanes 4g and 4g + 1 supply the scale word of A rows g
// and g + 8, lane 4g that of B column g (PTX "warp-level block scaling"; CUTLASS
// SM120 SFA/SFB layouts, llama.cpp). Inside a word byte j is the scale of the step's
// j-th block: 4X (e2m1, k64) takes all four, 1X (e4m3, k32) the byte byte-id names, so
// one word covers the stage's four k32 steps.
inline constexpr int kScaleThreadId = 0;
KILN_SM120_HD constexpr int scale_byte_id(ActFormat f, int ks) { return f == ActFormat::kE2m1 ? 0 : ks; }
KILN_SM120_HD constexpr uint32_t sfa_offset(ActFormat f, int lane, int m0, int ks) {
  return uint32_t((m0 + (lane >> 2) + 8 * (lane & 1)) * scale_row_bytes(f) + (f == ActFormat::kE2m1 ? 4 * ks : 0));
}
KILN_SM120_HD constexpr uint32_t sfb_offset(ActFormat f, int lane, int n0, int ks) {
  return uint32_t((n0 + (lane >> 2)) * scale_row_bytes(f) + (f == ActFormat::kE2m1 ? 4 * ks : 0));
}

// Accumulator element i (0..3) of an m16n8 tile: row g + 8 (i / 2), column 2t + i % 2.
KILN_SM120_HD constexpr int acc_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
KILN_SM120_HD constexpr int acc_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// ---- host side: whole rows in the global layout (the self-test's and the CPU test's
// reference; the device pre-pass runs the same block functions in parallel)

// x [rows, k] (fp32 values of bf16 activations) -> codes, scales, row_scale (e2m1; may be
// null for e4m3) in the global layout above.
inline void quantize_act_rows(ActFormat f, const float* x, int64_t rows, int64_t k, uint8_t* codes, uint8_t* scales,
                              float* row_scale) {
  const int64_t code_row = act_code_row_bytes(f, k), scale_row = act_scale_row_bytes(f, k);
  const int group = act_group(f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * k;
    float g = 1.0f;
    if (f == ActFormat::kE2m1) {
      float amax = 0.0f;
      for (int64_t i = 0; i < k; ++i) amax = abs_max(amax, xr[i]);
      g = e2m1_row_scale(amax);
      row_scale[r] = g;
    }
    for (int64_t b = 0; b < scale_row; ++b) {
      float v[32] = {};
      for (int j = 0; j < group; ++j) v[j] = b * group + j < k ? xr[b * group + j] : 0.0f;
      uint8_t* dst = codes + r * code_row + b * (group * act_bits(f) / 8);
      if (f == ActFormat::kE4m3) {
        uint32_t w[8];
        scales[r * scale_row + b] = uint8_t(quantize_block_e4m3(v, w));
        memcpy(dst, w, sizeof(w));
      } else {
        uint32_t w[2];
        scales[r * scale_row + b] = uint8_t(quantize_block_e2m1(v, g, w));
        memcpy(dst, w, sizeof(w));
      }
    }
  }
}

// The value input k of row r stands for after quantization (quantize_act_rows' layout).
inline float act_value(ActFormat f, const uint8_t* codes, const uint8_t* scales, const float* row_scale, int64_t k_in,
                       int64_t r, int64_t k) {
  const int64_t code_row = act_code_row_bytes(f, k_in), scale_row = act_scale_row_bytes(f, k_in);
  const uint32_t sc = scales[r * scale_row + k / act_group(f)];
  if (f == ActFormat::kE4m3) {
    const uint32_t c = codes[r * code_row + k / 32 * 32 + e4m3_block_slot(int(k % 32))];
    const float v = e4m3_value(c & 0x7fu) * ue8m0_value(sc);
    return c & 0x80u ? -v : v;
  }
  const uint32_t c = (codes[r * code_row + k / 2] >> (4 * (k % 2))) & 0xfu;
  const float v = e2m1_value(c & 7u) * e4m3_value(sc) * row_scale[r];
  return c & 8u ? -v : v;
}

}  // namespace kiln::cuda::sm120
