// MLA attention over the latent cache on tensor cores (the absorbed form: every
// head attends to the same 576-wide latent rows, like MQA with d_qk = d_latent +
// d_rope and d_v = d_latent).
//
// One CTA = 4 warps = 16 query rows (16 heads of one token) x one split of the
// token's visible keys, in key tiles of kBN = 32 latent rows:
//   S = Q K^T   warp w computes the 16 x 8 scores of keys 8w..8w+7 over all 576
//               dims (Q fragments reloaded from shared memory: 144 registers of
//               Q would not fit), and writes them to shared memory;
//   softmax     every warp reads the whole 16 x 32 S and runs the same online
//               softmax (attention_mma.cuh), so P is in registers in each warp;
//   O += P V    warp w owns latent columns [128w, 128w + 128) of the output
//               (V = the tile's first 512 columns, read with ldmatrix.trans).
// K/V tiles are double-buffered cp.async gathers through the block table.
// Shared memory: Q 16 x 576 + 2 x 32 x 576 bf16 + S 16 x 32 fp32 = 94,208 B
// (the SM120 cap is 101,376). With n_splits > 1 each split writes unnormalised
// fp32 partials and mla_combine_kernel merges them.
//
// An e4m3 cache (attention_mma.cuh): tiles of 32 rows of 576 codes padded to 592
// bytes, then each row's two scales (latent, rope): 2 x 19,200 B, 58,880 B in all.
// S keeps the latent and the rope dot products apart (their rows have their own
// scales) and adds them scaled; P takes the latent scale before P V. Q is staged with
// the head dimension permuted in each 16 (load_q_frags' order) so that its ldmatrix
// fragments match the codes'.
//
// Q is rounded to bf16 (q_lat from the fp32 absorb) and P to bf16 before P V:
// two roundings the fp32 warp kernel (attention.cu) does not have.
//
// DeepSeek sparse attention (kSparse): the keys of a token are the entries of its
// compacted selection (MlaSelection: list[0 .. count)), so key index i stands for position
// list[i]: the tiles gather those rows and the causal mask becomes i < count (the dense
// kernel's j <= p with p = count - 1). The dense instance is unchanged.
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/attention_mma.cuh"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/smem.cuh"

namespace kiln::cuda {
namespace {

using attn::cp_async_16;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::kLog2e;
using attn::ldmatrix_x4;
using attn::mma_bf16;
using attn::pack_bf16;
using attn::Row;
using attn::smem_u32;
using attn::swz;

constexpr int kLat = 512, kRope = 64, kD = kLat + kRope;  // DeepSeek-V3 / Kimi K2
constexpr int kRows = 16, kWarps = 4, kThreads = 32 * kWarps, kBN = 32;
constexpr int kQBytes = kRows * kD * 2, kSBytes = kRows * kBN * 4;
constexpr int kMaxSplits = 64;
constexpr int kMinKeysPerSplit = 128;
static_assert(kBN == 8 * kWarps && kLat == 128 * kWarps, "warp w: keys 8w.., latent columns 128w..");

// Shared memory of the kernel over a cache of T: Q, two K/V tiles (e4m3: + scale pairs), S.
template <typename T>
struct MlaSmem {
  using L = attn::KvTile<T, kD>;
  static constexpr int kTileBytes = L::bytes(kBN, 2);
  static constexpr int kScales = kBN * L::kRowBytes;  // a tile's scale pairs (e4m3)
  static constexpr int kBytes = kQBytes + 2 * kTileBytes + kSBytes;
  static_assert(kBytes <= 101376, "must fit the SM120 per-block shared memory");
};

struct MlaParams {
  const float* q_lat;    // [n_tokens, n_heads, 512] fp32
  const bf16* q_rope;    // [n_tokens, n_heads, 64]
  const void* cache;     // [n_blocks, block_size, 576] bf16 or e4m3 (the kernel's T)
  const float* scale;    // e4m3: [n_blocks, block_size, 2] (latent, rope); bf16: nullptr
  float* o_lat;          // [n_tokens, n_heads, 512] (n_splits == 1)
  float* part_o;         // [n_tokens * n_heads, n_splits, 512] unnormalised
  float* part_ml;        // [n_tokens * n_heads, n_splits, 2] (max in the exp2 domain, sum)
  DeviceBatch b;
  int n_heads, head_tiles, n_splits;
  float scale_log2;
  MlaSelection sel;      // kSparse: the compacted selections
};

// Rows of latent cache slots j0 .. j0 + 31 (zero past j_hi); e4m3: then their scale pairs.
// list (sparse): key j is position list[j], else position j.
template <typename T>
__device__ __forceinline__ void load_latent_tile(uint32_t dst, const MlaParams& p, const int32_t* table, int j0,
                                                 int j_hi, const int32_t* list) {
  using L = attn::KvTile<T, kD>;
  const char* base = static_cast<const char*>(p.cache);
  for (int c = int(threadIdx.x); c < kBN * L::kChunks; c += kThreads) {  // 72 (bf16) or 36 (e4m3) per row
    const int r = c / L::kChunks, ch = c % L::kChunks, j = j0 + r;
    const bool valid = j <= j_hi;
    const char* src = base;
    if (valid) {
      const int pj = list != nullptr ? __ldg(list + j) : j;
      const int64_t slot = int64_t(__ldg(table + pj / p.b.block_size)) * p.b.block_size + pj % p.b.block_size;
      src = base + slot * kD * int64_t(sizeof(T)) + ch * 16;
    }
    cp_async_16(dst + L::offset(r, ch), src, valid);
  }
  if constexpr (kIsFp8<T>) {
    for (int r = int(threadIdx.x); r < kBN; r += kThreads) {
      const int j = j0 + r;
      const bool valid = j <= j_hi;
      const float* src = p.scale;
      if (valid) {
        const int pj = list != nullptr ? __ldg(list + j) : j;
        src = p.scale + (int64_t(__ldg(table + pj / p.b.block_size)) * p.b.block_size + pj % p.b.block_size) * 2;
      }
      attn::cp_async_small<8>(dst + MlaSmem<T>::kScales + r * 8, src, valid);
    }
  }
}

// Q tile row r: 16 heads x [q_lat (fp32 -> bf16) | q_rope]; rows past n_heads are zero.
// e4m3: within each 16 dims, pairs (0, 1), (4, 5), (8, 9), (12, 13) then (2, 3), (6, 7),
// (10, 11), (14, 15): the order in which a k16 step's A fragment meets the codes.
template <typename T>
__device__ __forceinline__ void stage_q(unsigned char* smem, const MlaParams& p, int t, int h0) {
  for (int c = int(threadIdx.x); c < kRows * (kD / 16); c += kThreads) {
    const int r = c / (kD / 16), blk = c % (kD / 16), h = h0 + r;
    uint32_t v[8] = {};  // 16 bf16 as 8 pairs, natural order
    if (h < p.n_heads) {
      const int64_t row = int64_t(t) * p.n_heads + h;
      if (blk < kLat / 16) {
        const float4* f = reinterpret_cast<const float4*>(p.q_lat + row * kLat + blk * 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 a = f[i];
          v[2 * i] = pack_bf16(a.x, a.y), v[2 * i + 1] = pack_bf16(a.z, a.w);
        }
      } else {
        const uint4* b = reinterpret_cast<const uint4*>(p.q_rope + row * kRope + (blk - kLat / 16) * 16);
        const uint4 x = b[0], y = b[1];
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
      }
    }
    uint4 lo, hi;
    if constexpr (kIsFp8<T>) {
      lo = make_uint4(v[0], v[2], v[4], v[6]), hi = make_uint4(v[1], v[3], v[5], v[7]);
    } else {
      lo = make_uint4(v[0], v[1], v[2], v[3]), hi = make_uint4(v[4], v[5], v[6], v[7]);
    }
    *reinterpret_cast<uint4*>(smem + swz<kD>(r, 2 * blk)) = lo;
    *reinterpret_cast<uint4*>(smem + swz<kD>(r, 2 * blk + 1)) = hi;
  }
}

// This warp's 16 x 8 scores (keys 8 warp ..) over the 576 dims. bf16: one sum; e4m3: the
// latent and the rope sums apart, then each times its rows' scale.
template <typename T>
__device__ __forceinline__ void mla_scores(uint32_t s_q, uint32_t s_kv, int warp, int lane, float (&sc)[4]) {
  using L = attn::KvTile<T, kD>;
  const auto q_frag = [&](int step, uint32_t (&qa)[4]) {  // k16 step `step` of Q
    ldmatrix_x4(s_q + swz<kD>(lane % 8 + ((lane / 8) % 2) * 8, step * 2 + lane / 16), qa);
  };
  if constexpr (!kIsFp8<T>) {
    // Two k16 steps per ldmatrix of K.
#pragma unroll 4
    for (int kk = 0; kk < kD / 16; kk += 2) {
      uint32_t kb[4];
      ldmatrix_x4(s_kv + L::offset(warp * 8 + lane % 8, kk * 2 + lane / 8), kb);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t qa[4];
        q_frag(kk + i, qa);
        mma_bf16(sc, qa, kb[2 * i], kb[2 * i + 1]);
      }
    }
  } else {
    // Four k16 steps (chunks of 16 codes) per ldmatrix of K: 8 for the latent, 1 for rope.
    float lat[4] = {}, rope[4] = {};
    const auto steps = [&](int kk, float (&acc)[4]) {
      uint32_t kb[4];
      ldmatrix_x4(s_kv + L::offset(warp * 8 + lane % 8, kk + lane / 8), kb);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t qa[4];
        q_frag(kk + i, qa);
        mma_bf16(acc, qa, e4m3x4_lo(kb[i]), e4m3x4_hi(kb[i]));
      }
    };
#pragma unroll 2
    for (int kk = 0; kk < kLat / 16; kk += 4) steps(kk, lat);
    steps(kLat / 16, rope);
    const int key = warp * 8 + 2 * (lane % 4);  // columns key, key + 1: (latent, rope) scale pairs
    float4 sp;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(sp.x), "=f"(sp.y), "=f"(sp.z), "=f"(sp.w)
                 : "r"(s_kv + MlaSmem<T>::kScales + key * 8));
    sc[0] = lat[0] * sp.x + rope[0] * sp.y, sc[1] = lat[1] * sp.z + rope[1] * sp.w;
    sc[2] = lat[2] * sp.x + rope[2] * sp.y, sc[3] = lat[3] * sp.z + rope[3] * sp.w;
  }
}

template <typename T, bool kSparse>
__global__ void __launch_bounds__(kThreads) mla_decode_kernel(const MlaParams p) {
  using M = MlaSmem<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_u32(smem), s_kv0 = s_q + kQBytes;
  float* s_s = reinterpret_cast<float*>(smem + kQBytes + 2 * M::kTileBytes);  // [16][32]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int t = int(blockIdx.x) / p.head_tiles, h0 = (int(blockIdx.x) % p.head_tiles) * kRows;
  const int split = int(blockIdx.y);
  const int s = p.b.seq_of_token[t];
  const int32_t* table = p.b.block_table + int64_t(s) * p.b.max_blocks;
  // The last key: position p, or (sparse) index count - 1 of the selection list.
  const int pos = kSparse ? p.sel.count[t] - 1 : p.b.positions[t];
  const int32_t* list = kSparse ? p.sel.list + int64_t(t) * p.sel.top_k : nullptr;

  // This split's key tiles of [0, pos].
  const int n_kt = pos / kBN + 1, per_split = (n_kt + p.n_splits - 1) / p.n_splits;
  const int kt_begin = split * per_split, kt_end = min(n_kt, kt_begin + per_split);
  if (kt_begin >= kt_end) {  // an empty split: mark its partials empty
    if (threadIdx.x < kRows && h0 + int(threadIdx.x) < p.n_heads) {
      float* ml = p.part_ml + ((int64_t(t) * p.n_heads + h0 + threadIdx.x) * p.n_splits + split) * 2;
      ml[0] = -INFINITY;
      ml[1] = 0.0f;
    }
    return;
  }
  load_latent_tile<T>(s_kv0, p, table, kt_begin * kBN, pos, list);
  cp_async_commit();
  stage_q<T>(smem, p, t, h0);

  Row row[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = h0 + lane / 4 + 8 * half;
    if (h < p.n_heads) row[half].token = t, row[half].head = h, row[half].pos = pos, row[half].lo = 0;
  }
  float acc[kLat / kWarps / 8][4] = {};  // 16 n8 tiles: latent columns 128 warp .. (acc_pair's layout)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int j0 = kt * kBN;
    const uint32_t s_kv = s_kv0 + ((kt - kt_begin) & 1) * M::kTileBytes;
    cp_async_wait<0>();
    __syncthreads();  // tile kt (and Q) landed; every warp is done with tile kt - 1 and S
    if (kt + 1 < kt_end) {
      load_latent_tile<T>(s_kv0 + ((kt + 1 - kt_begin) & 1) * M::kTileBytes, p, table, j0 + kBN, pos, list);
      cp_async_commit();
    }
    float sc[4] = {};
    mla_scores<T>(s_q, s_kv, warp, lane, sc);
    const int g = lane / 4, q2 = 2 * (lane % 4);
    *reinterpret_cast<float2*>(s_s + g * kBN + warp * 8 + q2) = make_float2(sc[0], sc[1]);
    *reinterpret_cast<float2*>(s_s + (g + 8) * kBN + warp * 8 + q2) = make_float2(sc[2], sc[3]);
    __syncthreads();
    float s4[kBN / 8][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
      const float2 a = *reinterpret_cast<const float2*>(s_s + g * kBN + n * 8 + q2);
      const float2 b = *reinterpret_cast<const float2*>(s_s + (g + 8) * kBN + n * 8 + q2);
      s4[n][0] = a.x, s4[n][1] = a.y, s4[n][2] = b.x, s4[n][3] = b.y;
    }
    attn::online_softmax(s4, acc, m, l, row, j0, p.scale_log2, j0 + kBN - 1 > pos);
    attn::scale_columns<T, kBN / 8, 2>(s4, s_kv + M::kScales, 0);  // e4m3: V = the latent, its scales
    uint32_t pf[kBN / 16][4];
    attn::pack_probs(s4, pf);
    attn::mma_pv<T, kD, kBN / 16, kLat / kWarps / 16>(s_kv, 0, warp * (kLat / kWarps), pf, acc);
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float lh = attn::quad_sum(l[half]);
    if (row[half].pos < 0) continue;
    const int64_t r = int64_t(t) * p.n_heads + row[half].head;
    const int c0 = warp * (kLat / kWarps);
    const float inv = p.n_splits == 1 ? 1.0f / lh : 1.0f;
    float* o = p.n_splits == 1 ? p.o_lat + r * kLat + c0 : p.part_o + (r * p.n_splits + split) * kLat + c0;
#pragma unroll
    for (int n = 0; n < kLat / kWarps / 8; ++n) {
      int col;
      const float2 v = attn::acc_pair<T>(acc, n, half, col);
      *reinterpret_cast<float2*>(o + col) = make_float2(v.x * inv, v.y * inv);
    }
    if (p.n_splits > 1 && warp == 0 && lane % 4 == 0) {
      float* ml = p.part_ml + (r * p.n_splits + split) * 2;
      ml[0] = m[half];
      ml[1] = lh;
    }
  }
}

// o_lat[r] = sum_z 2^(m_z - M) o_z / sum_z 2^(m_z - M) l_z: one block of 128
// threads per row, 4 latent columns per thread (float4), the split weights
// computed once into shared memory.
__global__ void __launch_bounds__(kLat / 4)
    mla_combine_kernel(const float* part_o, const float* part_ml, int n_splits, float* o_lat) {
  __shared__ float w[kMaxSplits];
  __shared__ float inv_denom;
  const int64_t r = blockIdx.x;
  const float* ml = part_ml + r * n_splits * 2;
  if (threadIdx.x < 32) {
    float mx = -INFINITY;
    for (int z = int(threadIdx.x); z < n_splits; z += 32) mx = fmaxf(mx, ml[2 * z]);
    mx = warp_max(mx);
    float denom = 0.0f;
    for (int z = int(threadIdx.x); z < n_splits; z += 32) {
      w[z] = attn::exp2_approx(ml[2 * z] - mx);
      denom += ml[2 * z + 1] * w[z];
    }
    denom = warp_sum(denom);
    if (threadIdx.x == 0) inv_denom = 1.0f / denom;
  }
  __syncthreads();
  const int c = int(threadIdx.x) * 4;
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int z = 0; z < n_splits; ++z) {
    if (w[z] == 0.0f) continue;  // an empty split: its partial was never written
    const float4 o = *reinterpret_cast<const float4*>(part_o + (r * n_splits + z) * kLat + c);
    v.x += w[z] * o.x, v.y += w[z] * o.y, v.z += w[z] * o.z, v.w += w[z] * o.w;
  }
  const float s = inv_denom;
  *reinterpret_cast<float4*>(o_lat + r * kLat + c) = make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}

// Enough CTAs for two per SM, each split at least kMinKeysPerSplit keys of the
// largest context the batch shape allows (not the current one: a recorded
// decode step keeps its grid), or of the selection's top_k (sparse_top_k > 0).
int mla_splits(const DeviceBatch& b, int head_tiles, int sparse_top_k) {
  int device = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t ctas = int64_t(b.n_tokens) * head_tiles;
  const int64_t by_sms = (2 * int64_t(sms) + ctas - 1) / ctas;
  const int64_t keys = sparse_top_k > 0 ? int64_t(sparse_top_k) : int64_t(b.max_blocks) * b.block_size;
  const int64_t by_ctx = (keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return int(std::clamp<int64_t>(std::min(by_sms, by_ctx), 1, kMaxSplits));
}

}  // namespace

bool mla_mma_supported(int d_latent, int d_rope) { return d_latent == kLat && d_rope == kRope; }
int mla_mma_smem_bytes(bool fp8_cache) { return fp8_cache ? MlaSmem<e4m3>::kBytes : MlaSmem<bf16>::kBytes; }

size_t mla_mma_scratch_floats(const DeviceBatch& b, int n_heads, int sparse_top_k) {
  const int head_tiles = (n_heads + kRows - 1) / kRows;
  const int splits = mla_splits(b, head_tiles, sparse_top_k);
  return splits == 1 ? 0 : size_t(b.n_tokens) * n_heads * splits * (kLat + 2);
}

void launch_mla_attend_mma(const float* q_lat, const bf16* q_rope, const MlaCacheView& cache, float* o_lat,
                           float* partials, const DeviceBatch& b, int n_heads, float scale, cudaStream_t stream,
                           const MlaSelection& sel) {
  const bool sparse = sel.list != nullptr;
  MlaParams p{};
  p.q_lat = q_lat;
  p.q_rope = q_rope;
  p.cache = cache.data;
  p.scale = cache.scale;
  p.o_lat = o_lat;
  p.b = b;
  p.n_heads = n_heads;
  p.head_tiles = (n_heads + kRows - 1) / kRows;
  p.n_splits = mla_splits(b, p.head_tiles, sparse ? sel.top_k : 0);
  p.sel = sel;
  p.scale_log2 = scale * kLog2e;
  if (p.n_splits > 1) {
    KILN_CHECK(partials != nullptr) << "mla: no scratch for split partials";
    p.part_o = partials;
    p.part_ml = partials + size_t(b.n_tokens) * n_heads * p.n_splits * kLat;
  }
  const auto launch = [&](auto kernel, int smem_bytes) {
    prepare_smem(kernel, smem_bytes);
    kernel<<<dim3(unsigned(b.n_tokens * p.head_tiles), unsigned(p.n_splits)), kThreads, smem_bytes, stream>>>(p);
    KILN_CUDA_LAUNCH_CHECK();
  };
  if (sparse) {
    if (cache.fp8) launch(mla_decode_kernel<e4m3, true>, MlaSmem<e4m3>::kBytes);
    else launch(mla_decode_kernel<bf16, true>, MlaSmem<bf16>::kBytes);
  } else {
    if (cache.fp8) launch(mla_decode_kernel<e4m3, false>, MlaSmem<e4m3>::kBytes);
    else launch(mla_decode_kernel<bf16, false>, MlaSmem<bf16>::kBytes);
  }
  if (p.n_splits > 1) {
    mla_combine_kernel<<<unsigned(b.n_tokens * n_heads), kLat / 4, 0, stream>>>(p.part_o, p.part_ml, p.n_splits,
                                                                               o_lat);
    KILN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace kiln::cuda
