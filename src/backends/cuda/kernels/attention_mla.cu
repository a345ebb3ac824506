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
// Q is rounded to bf16 (q_lat from the fp32 absorb) and P to bf16 before P V:
// two roundings the fp32 warp kernel (attention.cu) does not have.
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/attention_mma.cuh"
#include "backends/cuda/kernels/common.cuh"

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
constexpr int kQBytes = kRows * kD * 2, kTileBytes = kBN * kD * 2, kSBytes = kRows * kBN * 4;
constexpr int kSmemBytes = kQBytes + 2 * kTileBytes + kSBytes;
constexpr int kMaxSplits = 64;
constexpr int kMinKeysPerSplit = 128;
static_assert(kSmemBytes <= 101376, "must fit the SM120 per-block shared memory");
static_assert(kBN == 8 * kWarps && kLat == 128 * kWarps, "warp w: keys 8w.., latent columns 128w..");

struct MlaParams {
  const float* q_lat;    // [n_tokens, n_heads, 512] fp32
  const bf16* q_rope;    // [n_tokens, n_heads, 64]
  const bf16* cache;     // [n_blocks, block_size, 576]
  float* o_lat;          // [n_tokens, n_heads, 512] (n_splits == 1)
  float* part_o;         // [n_tokens * n_heads, n_splits, 512] unnormalised
  float* part_ml;        // [n_tokens * n_heads, n_splits, 2] (max in the exp2 domain, sum)
  DeviceBatch b;
  int n_heads, head_tiles, n_splits;
  float scale_log2;
};

__device__ __forceinline__ void load_latent_tile(uint32_t dst, const MlaParams& p, const int32_t* table, int j0,
                                                 int j_hi) {
  constexpr int kChunks = kD / 8;  // 72 per row
  for (int c = int(threadIdx.x); c < kBN * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks, j = j0 + r;
    const bool valid = j <= j_hi;
    const bf16* src = p.cache;
    if (valid) {
      const int64_t slot = int64_t(__ldg(table + j / p.b.block_size)) * p.b.block_size + j % p.b.block_size;
      src = p.cache + slot * kD + ch * 8;
    }
    cp_async_16(dst + swz<kD>(r, ch), src, valid);
  }
}

__global__ void __launch_bounds__(kThreads) mla_decode_kernel(const MlaParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_u32(smem), s_kv0 = s_q + kQBytes;
  float* s_s = reinterpret_cast<float*>(smem + kQBytes + 2 * kTileBytes);  // [16][32]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int t = int(blockIdx.x) / p.head_tiles, h0 = (int(blockIdx.x) % p.head_tiles) * kRows;
  const int split = int(blockIdx.y);
  const int s = p.b.seq_of_token[t], pos = p.b.positions[t];
  const int32_t* table = p.b.block_table + int64_t(s) * p.b.max_blocks;

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
  load_latent_tile(s_kv0, p, table, kt_begin * kBN, pos);
  cp_async_commit();

  // Q tile: 16 heads x [q_lat (fp32 -> bf16) | q_rope]; rows past n_heads are zero.
  for (int c = int(threadIdx.x); c < kRows * (kD / 8); c += kThreads) {
    const int r = c / (kD / 8), ch = c % (kD / 8), h = h0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < p.n_heads) {
      const int64_t row = int64_t(t) * p.n_heads + h;
      if (ch < kLat / 8) {
        const float4* f = reinterpret_cast<const float4*>(p.q_lat + row * kLat + ch * 8);
        const float4 a = f[0], b = f[1];
        v = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
      } else {
        v = *reinterpret_cast<const uint4*>(p.q_rope + row * kRope + (ch - kLat / 8) * 8);
      }
    }
    *reinterpret_cast<uint4*>(smem + swz<kD>(r, ch)) = v;
  }

  Row row[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = h0 + lane / 4 + 8 * half;
    if (h < p.n_heads) row[half].token = t, row[half].head = h, row[half].pos = pos, row[half].lo = 0;
  }
  float acc[kLat / kWarps / 8][4] = {};  // 16 n8 tiles: latent columns 128 warp + 8 n
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int j0 = kt * kBN;
    const uint32_t s_kv = s_kv0 + ((kt - kt_begin) & 1) * kTileBytes;
    cp_async_wait<0>();
    __syncthreads();  // tile kt (and Q) landed; every warp is done with tile kt - 1 and S
    if (kt + 1 < kt_end) {
      load_latent_tile(s_kv0 + ((kt + 1 - kt_begin) & 1) * kTileBytes, p, table, j0 + kBN, pos);
      cp_async_commit();
    }
    // S[:, 8w .. 8w + 8) over the 576 dims, two k16 steps per ldmatrix of K.
    float sc[4] = {};
#pragma unroll 4
    for (int kk = 0; kk < kD / 16; kk += 2) {
      uint32_t kb[4];
      ldmatrix_x4(s_kv + swz<kD>(warp * 8 + lane % 8, kk * 2 + lane / 8), kb);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t qa[4];
        ldmatrix_x4(s_q + swz<kD>(lane % 8 + ((lane / 8) % 2) * 8, (kk + i) * 2 + lane / 16), qa);
        mma_bf16(sc, qa, kb[2 * i], kb[2 * i + 1]);
      }
    }
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
    uint32_t pf[kBN / 16][4];
    attn::pack_probs(s4, pf);
    attn::mma_pv<kD, kBN / 16, kLat / kWarps / 16>(s_kv, 0, warp * (kLat / kWarps / 8), pf, acc);
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float lh = attn::quad_sum(l[half]);
    if (row[half].pos < 0) continue;
    const int64_t r = int64_t(t) * p.n_heads + row[half].head;
    const int c0 = warp * (kLat / kWarps) + 2 * (lane % 4);
    if (p.n_splits == 1) {
      const float inv = 1.0f / lh;
      float* o = p.o_lat + r * kLat + c0;
#pragma unroll
      for (int n = 0; n < kLat / kWarps / 8; ++n)
        *reinterpret_cast<float2*>(o + n * 8) = make_float2(acc[n][2 * half] * inv, acc[n][2 * half + 1] * inv);
    } else {
      float* o = p.part_o + (r * p.n_splits + split) * kLat + c0;
#pragma unroll
      for (int n = 0; n < kLat / kWarps / 8; ++n)
        *reinterpret_cast<float2*>(o + n * 8) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
      if (warp == 0 && lane % 4 == 0) {
        float* ml = p.part_ml + (r * p.n_splits + split) * 2;
        ml[0] = m[half];
        ml[1] = lh;
      }
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
// decode step keeps its grid).
int mla_splits(const DeviceBatch& b, int head_tiles) {
  int device = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t ctas = int64_t(b.n_tokens) * head_tiles;
  const int64_t by_sms = (2 * int64_t(sms) + ctas - 1) / ctas;
  const int64_t by_ctx = (int64_t(b.max_blocks) * b.block_size + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return int(std::clamp<int64_t>(std::min(by_sms, by_ctx), 1, kMaxSplits));
}

}  // namespace

bool mla_mma_supported(int d_latent, int d_rope) { return d_latent == kLat && d_rope == kRope; }
int mla_mma_smem_bytes() { return kSmemBytes; }

size_t mla_mma_scratch_floats(const DeviceBatch& b, int n_heads) {
  const int head_tiles = (n_heads + kRows - 1) / kRows;
  const int splits = mla_splits(b, head_tiles);
  return splits == 1 ? 0 : size_t(b.n_tokens) * n_heads * splits * (kLat + 2);
}

void launch_mla_attend_mma(const float* q_lat, const bf16* q_rope, const bf16* latent_cache, float* o_lat,
                           float* partials, const DeviceBatch& b, int n_heads, float scale, cudaStream_t stream) {
  MlaParams p{};
  p.q_lat = q_lat;
  p.q_rope = q_rope;
  p.cache = latent_cache;
  p.o_lat = o_lat;
  p.b = b;
  p.n_heads = n_heads;
  p.head_tiles = (n_heads + kRows - 1) / kRows;
  p.n_splits = mla_splits(b, p.head_tiles);
  p.scale_log2 = scale * kLog2e;
  if (p.n_splits > 1) {
    KILN_CHECK(partials != nullptr) << "mla: no scratch for split partials";
    p.part_o = partials;
    p.part_ml = partials + size_t(b.n_tokens) * n_heads * p.n_splits * kLat;
  }
  KILN_CUDA_CHECK(cudaFuncSetAttribute(mla_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  mla_decode_kernel<<<dim3(unsigned(b.n_tokens * p.head_tiles), unsigned(p.n_splits)), kThreads, kSmemBytes,
                      stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  if (p.n_splits > 1) {
    mla_combine_kernel<<<unsigned(b.n_tokens * n_heads), kLat / 4, 0, stream>>>(p.part_o, p.part_ml, p.n_splits,
                                                                               o_lat);
    KILN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace kiln::cuda
