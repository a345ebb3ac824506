// Device pieces shared by the tensor-core attention kernels (attention_fa2.cu,
// attention_decode.cu, attention_mla.cu): PTX wrappers (cp.async, ldmatrix, mma.sync
// bf16), the swizzled shared-memory tile layouts, the paged K/V tile gather, Q K^T and
// P V over bf16 or e4m3 tiles, the per-row online softmax, and the "row space" that
// maps CTAs to query rows.
//
// An e4m3 cache (kv_fp8.cuh) is read in registers: a K / V tile lands in shared memory
// as codes (half the bytes of bf16) plus its rows' fp32 scales, and the mma fragments
// are built from the codes by a byte permutation and an exact conversion to bf16. The
// scales are applied outside the mma: a key's K scale multiplies its score column
// (q . (s k) = s (q . k)), its V scale its probability column before P V. An e4m3
// fragment reads 4 consecutive codes per thread where the bf16 mma wants elements
// (2c, 2c + 1) and (2c + 8, 2c + 9) of a k16 step: the dot product is order-free, so
// Q's fragment takes the same permutation of the head dimension (load_q_frags); for
// P V, ldmatrix.trans of byte pairs gives each thread two adjacent output columns, so
// an e4m3 accumulator holds the even columns of a 16-column group in one n8 tile and
// the odd ones in the next (acc_pair maps them back).
//
// Row space. For one sequence s and one kv head, the query rows are the pairs
// (token, q head of the kv head's group), row R = i * group + g for the
// sequence's i-th query token and g in [0, group). A CTA owns kBM consecutive
// rows, so the K/V it streams is read once for every q head that shares it
// (GQA) and any group size works (a tile may hold part of a token's heads).
// Tiles of all sequences are numbered on the device by launch_attention_tiles
// from DeviceBatch.seq_of_token (sorted: tokens are grouped by sequence), since
// the host holds no per-sequence query counts.
#pragma once

#include <cfloat>
#include <climits>
#include <cstdint>

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/kv_fp8.cuh"

namespace kiln::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;

struct Params {
  const bf16* q;        // [n_tokens, n_heads, D]
  const void* k_cache;  // [n_blocks, block_size, n_kv_heads, D] bf16 or e4m3 (the kernel's T)
  const void* v_cache;
  const float* k_scale;  // e4m3: [n_blocks, block_size, n_kv_heads]; bf16: nullptr
  const float* v_scale;
  bf16* out;            // [n_tokens, n_heads, D]
  const float* sinks;   // [n_heads] or nullptr
  DeviceBatch b;
  int n_heads, n_kv_heads, group;
  float scale_log2;     // scale * log2(e): scores live in the exp2 domain
  int window;           // 0: full causal
  int bs_shift;         // log2(block_size) (block_size is a power of two)
  const int4* tiles;          // [gridDim.x] (sequence, first row, first token, rows); x < 0: no tile
  int tiles_per_seq;          // tiles == nullptr (split-KV, one token per sequence): CTA x is
                              // tile x % tiles_per_seq of sequence x / tiles_per_seq
  int n_splits;               // KV splits (gridDim.z); 1: write `out` directly
  float* part_o;              // [n_tokens, n_heads, n_splits, D] unnormalised partial outputs
  float* part_ml;             // [n_tokens, n_heads, n_splits, 2] (max in exp2 domain, sum)
};

// ---- PTX wrappers (sm_80+)

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared, bypassing L1; valid == false zero-fills.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// 4 or 8 bytes (a row's scale, MLA's pair of scales) global -> shared; valid == false zero-fills.
template <int kBytes>
__device__ __forceinline__ void cp_async_small(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(kBytes),
               "r"(valid ? kBytes : 0));
}
// 8 bytes from shared memory.
__device__ __forceinline__ uint2 lds_64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a (16x16 bf16, row) * b (16x8 bf16, col), fp32 accumulation.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float exp2_approx(float x) {  // ex2.approx(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ int warp_max_i(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_min_i(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- tiles: rows of D bf16 (D * 2 bytes), 16-byte chunks XOR-swizzled by the
// row's low 3 bits so the 8 row addresses of one ldmatrix hit 8 different bank
// groups (rows are 128 or 256 bytes apart, which would otherwise all collide).
template <int D>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return uint32_t(row * (D * 2) + ((chunk ^ (row & 7)) << 4));
}

// A K / V tile of kRows rows of D elements of T (bf16, or e4m3 codes then the rows'
// fp32 scales). Chunks are 16 bytes: 8 bf16 or 16 codes. e4m3 rows of 64 or 128 bytes
// are XOR-swizzled over the 8 chunks of each 128-byte line; MLA's 576-byte rows are
// padded to 592 (37 chunks: row r's chunk c is at 16-byte unit 37 r + c, and 37 r mod 8
// differs for 8 consecutive rows), so every ldmatrix phase is conflict-free.
template <typename T, int D>
struct KvTile {
  static constexpr bool kFp8 = kIsFp8<T>;
  static_assert(!kFp8 || D == 64 || D == 128 || D == 576, "e4m3 tiles: D 64, 128 or 576");
  static constexpr int kRowBytes = kFp8 && D == 576 ? D + 16 : D * int(sizeof(T));
  static constexpr int kChunks = D * int(sizeof(T)) / 16;  // chunks of data per row
  // Bytes of a tile of kRows rows (scales_per_row: the fp32 scales each e4m3 row has).
  static constexpr int bytes(int rows, int scales_per_row = 1) {
    return rows * kRowBytes + (kFp8 ? rows * scales_per_row * 4 : 0);
  }
  __device__ static uint32_t offset(int row, int chunk) {
    if constexpr (!kFp8) {
      return swz<D>(row, chunk);
    } else if constexpr (D == 576) {
      return uint32_t(row * kRowBytes + (chunk << 4));
    } else {  // 128 / D rows per 128-byte line, each line's 8 chunks XOR-swizzled
      return uint32_t(row * D + ((chunk ^ ((row / (128 / D)) & (D / 16 - 1))) << 4));
    }
  }
};

// Rows [0, kRows) of a K or V tile = cached positions j0 + r of sequence s,
// kv head kvh, gathered through the block table (one 16-byte cp.async per
// chunk). Positions past j_hi (beyond every row's query position, possibly past
// the sequence's blocks) are zero-filled: P is 0 there, and 0 * 0 stays 0.
template <typename T, int D, int kRows, int kThreads>
__device__ __forceinline__ void load_kv_tile(uint32_t dst, const void* cache, const Params& p, const int32_t* table,
                                             int kvh, int j0, int j_hi) {
  using L = KvTile<T, D>;
  constexpr int kChunks = L::kChunks;
  static_assert((kRows * kChunks) % kThreads == 0, "tile chunks must divide over the threads");
  const int bs_mask = (1 << p.bs_shift) - 1;
  const char* base = static_cast<const char*>(cache);
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int c = int(threadIdx.x) + i * kThreads, r = c / kChunks, ch = c % kChunks, j = j0 + r;
    const bool valid = j <= j_hi;
    const char* src = base;
    if (valid) {
      const int64_t slot = (int64_t(__ldg(table + (j >> p.bs_shift))) << p.bs_shift) + (j & bs_mask);
      src = base + ((slot * p.n_kv_heads + kvh) * D) * int64_t(sizeof(T)) + ch * 16;
    }
    cp_async_16(dst + L::offset(r, ch), src, valid);
  }
}

// The scales of the same rows (an e4m3 tile's; nothing for bf16): kRows floats at dst,
// one 4-byte cp.async each, zero past j_hi.
template <typename T, int kRows, int kThreads>
__device__ __forceinline__ void load_kv_scales(uint32_t dst, const float* scale, const Params& p,
                                               const int32_t* table, int kvh, int j0, int j_hi) {
  if constexpr (kIsFp8<T>) {
    const int bs_mask = (1 << p.bs_shift) - 1;
    for (int r = int(threadIdx.x); r < kRows; r += kThreads) {
      const int j = j0 + r;
      const bool valid = j <= j_hi;
      const float* src = scale;
      if (valid) {
        const int64_t slot = (int64_t(__ldg(table + (j >> p.bs_shift))) << p.bs_shift) + (j & bs_mask);
        src = scale + slot * p.n_kv_heads + kvh;
      }
      cp_async_small<4>(dst + r * 4, src, valid);
    }
  }
}

// Rows [row0, row0 + kRows) of sequence s's row space -> a Q tile; rows past
// the sequence are zero-filled.
template <int D, int kRows, int kThreads>
__device__ __forceinline__ void load_q_tile(uint32_t dst, const Params& p, int q0, int n_rows, int row0, int kvh) {
  constexpr int kChunks = D / 8;
  for (int c = int(threadIdx.x); c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks, R = row0 + r;
    const bool valid = R < n_rows;
    const bf16* src = p.q;
    if (valid) {
      const int t = q0 + R / p.group, h = kvh * p.group + R % p.group;
      src = p.q + (int64_t(t) * p.n_heads + h) * D + ch * 8;
    }
    cp_async_16(dst + swz<D>(r, ch), src, valid);
  }
}

// The query row this thread holds in an m16 fragment (lane / 4, + 8 for half 1).
struct Row {
  int token = -1, head = -1;
  int pos = -1;       // -1: no row (past the sequence): every key masked
  int lo = INT_MAX;   // first visible key
};

__device__ __forceinline__ Row row_info(const Params& p, int q0, int n_rows, int R, int kvh) {
  Row r;
  if (R < n_rows) {
    r.token = q0 + R / p.group;
    r.head = kvh * p.group + R % p.group;
    r.pos = p.b.positions[r.token];
    r.lo = p.window > 0 ? max(0, r.pos - p.window + 1) : 0;
  }
  return r;
}

// One online-softmax step for the two rows (half 0: lane/4, half 1: +8) of an
// m16 x (8 * kN) score fragment: scale into the exp2 domain, mask keys outside
// [lo, pos], rescale the running (m, l, acc) and turn scores into P in place.
// l stays per-thread (the 4 lanes of a quad sum at the end).
template <int kN, int kAccN>
__device__ __forceinline__ void online_softmax(float (&s)[kN][4], float (&acc)[kAccN][4], float (&m)[2],
                                               float (&l)[2], const Row (&row)[2], int j0, float scale_log2,
                                               bool need_mask) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = s[n][2 * half + e] * scale_log2;
        if (need_mask) {
          const int j = j0 + n * 8 + 2 * (lane % 4) + e;
          if (j > row[half].pos || j < row[half].lo) v = -INFINITY;
        }
        s[n][2 * half + e] = v;
        mx = fmaxf(mx, v);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[half], mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a fully masked row: exp2(-inf - 0) = 0
    const float corr = exp2_approx(m[half] - m_use);
    l[half] *= corr;
#pragma unroll
    for (int n = 0; n < kAccN; ++n) {
      acc[n][2 * half] *= corr;
      acc[n][2 * half + 1] *= corr;
    }
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = exp2_approx(s[n][2 * half + e] - m_use);
        s[n][2 * half + e] = pv;
        l[half] += pv;
      }
    }
    m[half] = m_new;
  }
}

// P (an m16 x 8 kN fp32 fragment of probabilities) as the bf16 A fragments of
// kN / 2 k16 steps of P.V.
template <int kN>
__device__ __forceinline__ void pack_probs(const float (&s)[kN][4], uint32_t (&pf)[kN / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < kN / 2; ++kk) {
    pf[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    pf[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    pf[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pf[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// Q fragments of a 16-row Q tile (rows row0.., bf16, swz<D> layout at s_q) for the
// D / 16 k16 steps of Q K^T. e4m3 keys: the head dimension permuted as the keys' codes
// come (k16 slots 2c, 2c + 1, 2c + 8, 2c + 9 hold dims 4c .. 4c + 3): one 8-byte load
// of dims 4c .. 4c + 3 per row half instead of ldmatrix.
template <typename T, int D>
__device__ __forceinline__ void load_q_frags(uint32_t s_q, int row0, uint32_t (&qf)[D / 16][4]) {
  const int lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    if constexpr (!kIsFp8<T>) {
      ldmatrix_x4(s_q + swz<D>(row0 + lane % 8 + ((lane / 8) % 2) * 8, kk * 2 + lane / 16), qf[kk]);
    } else {
      const int c = lane % 4, chunk = kk * 2 + c / 2, byte = (c % 2) * 8;
      const uint2 lo = lds_64(s_q + swz<D>(row0 + lane / 4, chunk) + byte);
      const uint2 hi = lds_64(s_q + swz<D>(row0 + lane / 4 + 8, chunk) + byte);
      qf[kk][0] = lo.x, qf[kk][1] = hi.x, qf[kk][2] = lo.y, qf[kk][3] = hi.y;
    }
  }
}

// sc[n] += Q K^T for the kNT n8 tiles of keys key0 + 8 n .. (rows of the tile at s_k)
// over the D dims of qf (load_q_frags). e4m3: codes only; scale_scores applies the scales.
template <typename T, int D, int kNT>
__device__ __forceinline__ void mma_qk(uint32_t s_k, int key0, const uint32_t (&qf)[D / 16][4],
                                       float (&sc)[kNT][4]) {
  using L = KvTile<T, D>;
  const int lane = int(threadIdx.x) % 32;
  static_assert(kNT % 2 == 0, "keys in pairs of n8 tiles");
  if constexpr (!L::kFp8) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nn = 0; nn < kNT / 2; ++nn) {
        uint32_t b[4];
        ldmatrix_x4(s_k + L::offset(key0 + nn * 16 + lane % 8 + (lane / 16) * 8, kk * 2 + (lane / 8) % 2), b);
        mma_bf16(sc[2 * nn], qf[kk], b[0], b[1]);
        mma_bf16(sc[2 * nn + 1], qf[kk], b[2], b[3]);
      }
    }
  } else {
    // One ldmatrix: keys (0-7, 8-15) x chunks (kk, kk + 1) = 2 n8 tiles x 2 k16 steps.
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
#pragma unroll
      for (int nn = 0; nn < kNT / 2; ++nn) {
        uint32_t w[4];
        ldmatrix_x4(s_k + L::offset(key0 + nn * 16 + lane % 8 + ((lane / 8) % 2) * 8, kk + lane / 16), w);
        mma_bf16(sc[2 * nn], qf[kk], e4m3x4_lo(w[0]), e4m3x4_hi(w[0]));
        mma_bf16(sc[2 * nn + 1], qf[kk], e4m3x4_lo(w[1]), e4m3x4_hi(w[1]));
        mma_bf16(sc[2 * nn], qf[kk + 1], e4m3x4_lo(w[2]), e4m3x4_hi(w[2]));
        mma_bf16(sc[2 * nn + 1], qf[kk + 1], e4m3x4_lo(w[3]), e4m3x4_hi(w[3]));
      }
    }
  }
}

// e4m3: multiplies the fragment's columns (keys key0 + 8 n + 2 (lane % 4) + e) by their
// rows' scales at s_scale (floats indexed by key, kStride floats apart): after Q K^T the
// K scales, after the softmax the V scales. bf16: nothing.
template <typename T, int kN, int kStride = 1>
__device__ __forceinline__ void scale_columns(float (&s)[kN][4], uint32_t s_scale, int key0) {
  if constexpr (kIsFp8<T>) {
    const int lane = int(threadIdx.x) % 32;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int key = key0 + n * 8 + 2 * (lane % 4);
      float a, b;
      if constexpr (kStride == 1) {
        const uint2 v = lds_64(s_scale + key * 4);
        a = __uint_as_float(v.x), b = __uint_as_float(v.y);
      } else {
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(a) : "r"(s_scale + key * kStride * 4));
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(b) : "r"(s_scale + (key + 1) * kStride * 4));
      }
      s[n][0] *= a, s[n][1] *= b, s[n][2] *= a, s[n][3] *= b;
    }
  }
}

// acc[0, 2 kNd) += P . V: P from pack_probs (kK k16 steps: keys key0 + 16 kk ..),
// V the tile of rows of D elements of T at s_v, output columns dim0 .. dim0 + 16 kNd
// (2 kNd n8 tiles; e4m3: the even / odd layout of acc_pair).
template <typename T, int D, int kK, int kNd>
__device__ __forceinline__ void mma_pv(uint32_t s_v, int key0, int dim0, const uint32_t (&pf)[kK][4],
                                       float (&acc)[2 * kNd][4]) {
  using L = KvTile<T, D>;
  const int lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    const int key = key0 + kk * 16 + lane % 8 + ((lane / 8) % 2) * 8;
    if constexpr (!L::kFp8) {
#pragma unroll
      for (int nd = 0; nd < kNd; ++nd) {
        uint32_t b[4];
        ldmatrix_x4_trans(s_v + L::offset(key, dim0 / 8 + nd * 2 + lane / 16), b);
        mma_bf16(acc[2 * nd], pf[kk], b[0], b[1]);
        mma_bf16(acc[2 * nd + 1], pf[kk], b[2], b[3]);
      }
    } else {
      // Transposed byte pairs of keys (0-7, 8-15) x chunks (q, q + 1): each thread gets
      // keys 2c, 2c + 1 of output columns 2g, 2g + 1 of the chunk's 16.
      static_assert(kNd % 2 == 0, "e4m3 P V: output columns in pairs of 16");
#pragma unroll
      for (int q = 0; q < kNd; q += 2) {
        uint32_t w[4];
        ldmatrix_x4_trans(s_v + L::offset(key, dim0 / 16 + q + lane / 16), w);
        mma_bf16(acc[2 * q], pf[kk], e4m3x4_even(w[0]), e4m3x4_even(w[1]));
        mma_bf16(acc[2 * q + 1], pf[kk], e4m3x4_odd(w[0]), e4m3x4_odd(w[1]));
        mma_bf16(acc[2 * q + 2], pf[kk], e4m3x4_even(w[2]), e4m3x4_even(w[3]));
        mma_bf16(acc[2 * q + 3], pf[kk], e4m3x4_odd(w[2]), e4m3x4_odd(w[3]));
      }
    }
  }
}

// The i-th pair of adjacent output columns (i < kN) that this thread's P V accumulator
// holds in row half `half`: the columns (col, col + 1) relative to its dim0, their values.
// bf16: tile i, columns 8 i + 2c; e4m3: tiles 2q (even) and 2q + 1 (odd columns of the
// 16 from 16 q) hold 16 q + 4c + {0, 2} and + {1, 3}.
template <typename T, int kN>
__device__ __forceinline__ float2 acc_pair(const float (&acc)[kN][4], int i, int half, int& col) {
  const int c = int(threadIdx.x) % 4;
  if constexpr (!kIsFp8<T>) {
    col = 8 * i + 2 * c;
    return make_float2(acc[i][2 * half], acc[i][2 * half + 1]);
  } else {
    const int q = i / 2, e = i % 2;
    col = 16 * q + 4 * c + 2 * e;
    return make_float2(acc[2 * q][2 * half + e], acc[2 * q + 1][2 * half + e]);
  }
}

// The sum over the 4 lanes of a quad (the threads holding one fragment row).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The sink (a virtual key with logit sinks[h] and no value) joins the
// denominator; returns 1 / l with acc already rescaled to the new max.
__device__ __forceinline__ float finish_row(float m, float l, const float* sinks, int head, float& acc_scale) {
  acc_scale = 1.0f;
  if (sinks != nullptr) {
    const float sink = sinks[head] * kLog2e, m_new = fmaxf(m, sink);
    acc_scale = exp2_approx(m - m_new);
    l = l * acc_scale + exp2_approx(sink - m_new);
  }
  return acc_scale / l;
}

// Numbers the row tiles (see the top of this file) into a table of n_slots
// int4 (sequence, first row, first token of the sequence, rows of the
// sequence), heaviest tile first (a sequence's later rows see more keys), the
// unused slots marked with sequence -1; CTA x of a kernel's grid reads entry x.
// scratch: tile_table_bytes(b, n_slots). Defined in attention_fa2.cu.
size_t tile_table_bytes(const DeviceBatch& b, int n_slots);
const int4* launch_attention_tiles(const DeviceBatch& b, int group, int bm, int n_slots, void* scratch,
                                   cudaStream_t stream);

// Upper bound of the row tiles of a batch (the grid's x): per sequence
// ceil(rows / bm) <= rows / bm + 1.
inline int max_row_tiles(const DeviceBatch& b, int group, int bm) {
  return int((int64_t(b.n_tokens) * group + bm - 1) / bm) + b.n_seqs;
}

inline int log2_exact(int v) {  // -1 unless v is a power of two
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

// One warp's k loop over a swizzled A tile (rows of kBK bf16) and B tile for the GEMMs
// (moe_gemm.cu, quant_gemm.cu): the warp owns kMT m16 tiles from row wm * kMT * 16 and
// kNT n8 tiles from column wn * kNT * 8. B holds one row of kBK per output column, or,
// kTransB, one row of kBNF output columns per k (read with ldmatrix.trans).
template <int kMT, int kNT, int kBK, bool kTransB = false, int kBNF = 0>
__device__ __forceinline__ void warp_tile_mma(uint32_t sa, uint32_t sb, int wm, int wn, int lane,
                                              float (&acc)[kMT][kNT][4]) {
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    uint32_t af[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const int r = (wm * kMT + mt) * 16 + lane % 8 + ((lane / 8) % 2) * 8;
      ldmatrix_x4(sa + swz<kBK>(r, kk * 2 + lane / 16), af[mt]);
    }
#pragma unroll
    for (int nn = 0; nn < kNT / 2; ++nn) {
      const int nb = wn * kNT * 8 + nn * 16;  // first column of the two n8 tiles
      uint32_t b[4];
      if constexpr (kTransB) {
        ldmatrix_x4_trans(sb + swz<kBNF>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8, nb / 8 + lane / 16), b);
      } else {
        ldmatrix_x4(sb + swz<kBK>(nb + lane % 8 + (lane / 16) * 8, kk * 2 + (lane / 8) % 2), b);
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma_bf16(acc[mt][2 * nn], af[mt], b[0], b[1]);
        mma_bf16(acc[mt][2 * nn + 1], af[mt], b[2], b[3]);
      }
    }
  }
}

inline Params make_params(const bf16* q, const KvCacheView& kv, bf16* out, const float* sinks, const DeviceBatch& b,
                          int n_heads, int n_kv_heads, float scale, int window) {
  Params p{};
  p.q = q;
  p.k_cache = kv.k;
  p.v_cache = kv.v;
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  p.out = out;
  p.sinks = sinks;
  p.b = b;
  p.n_heads = n_heads;
  p.n_kv_heads = n_kv_heads;
  p.group = n_heads / n_kv_heads;
  p.scale_log2 = scale * kLog2e;
  p.window = window;
  p.bs_shift = log2_exact(b.block_size);
  p.n_splits = 1;
  return p;
}

}  // namespace kiln::cuda::attn
