// Prefill attention, FlashAttention-2 style (Dao 2023, "FlashAttention-2"):
// bf16 mma.sync m16n8k16 with fp32 accumulation, ldmatrix from XOR-swizzled
// shared memory, cp.async loads of K and V gathered per cached position
// through the paged block table.
//
// One CTA = kWarps warps = kBM = 16 * kWarps query rows of one sequence and one
// kv head (rows = (token, q head of the group) pairs: attention_mma.cuh),
// looping over kBN = 64-key tiles from the smallest visible position of its
// rows to the largest query position. Each warp owns 16 rows and keeps Q (A
// fragments), the running max / sum and the 16 x D output accumulator in
// registers; S = QK^T becomes P in registers and feeds P V without touching
// shared memory. Warps skip tiles wholly outside their rows' causal / window
// range and mask only the tiles that straddle it.
//
// Pipeline, kKBufs = 1 (FA2's: one K and one V buffer, three barriers a tile):
// V_j is in flight during S = Q K_j^T, K_{j+1} during P V_j.
// kKBufs = 2 (two K buffers, two barriers a tile): K_{j+1} is issued at the top
// of tile j and has the whole of S and P V to land.
//
// Shared memory = (kKBufs + 1) * kBN * D * 2 bytes; Q (kBM * D * 2 bytes) is
// staged through the K buffers before the loop and lives in registers after.
//   variant (warps, K buffers, kBN, min CTAs/SM)   D = 64     D = 128
//   0: (4, 1, 64, 1)                              16,384 B   32,768 B
//   1: (4, 2, 64, 1)                              24,576 B   49,152 B
//   2: (8, 2, 64, 1)                              24,576 B   49,152 B
//   3: (4, 2, 64, 3: <= 168 registers)            24,576 B   49,152 B
//   4: (4, 2, 32, 3)                              12,288 B   24,576 B
// All fit the 101,376 B SM120 cap with room for 2 CTAs per 100 KB SM120 SM.
// An e4m3 cache (attention_mma.cuh) halves each tile and adds its 4-byte scales, but Q
// (bf16) is still staged through the K buffers, so the shared memory is
// max(kKBufs * tile, Q) + tile: at D = 128 e.g. variant 2 takes 32,768 + 8,448 = 41,216 B.
// Registers (ptxas, sm_90: ~160 per thread at D = 64, 243-255 at D = 128 without
// a min-CTA bound; variants 3-4 cap at 168 and spill at D = 128) allow 2 CTAs
// of 4 warps or 1 of 8 per SM at D = 128.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/attention_mma.cuh"
#include "backends/cuda/kernels/smem.cuh"

namespace kiln::cuda {
namespace attn {
namespace {

constexpr int kTilesThreads = 1024;

template <int D, int kWarps_, int kKBufs_, int kBN_, int kMinBlocks_, typename T_ = bf16>
struct Fa2Config {
  using T = T_;  // the cache element type
  static constexpr int kD = D, kWarps = kWarps_, kKBufs = kKBufs_;
  static constexpr int kMinBlocks = kMinBlocks_;  // per SM, for __launch_bounds__ (caps registers)
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBM = 16 * kWarps;  // query rows per CTA
  static constexpr int kBN = kBN_;         // keys per tile
  // e4m3: a K buffer holds K_j's codes, K_j's scales and V_j's scales (they land with
  // K_j, before the softmax needs them); the V buffer V_j's codes.
  static constexpr int kScaleBytes = kBN * KvTile<T, D>::kRowBytes;  // the scales' offset in a K buffer
  static constexpr int kKTileBytes = KvTile<T, D>::bytes(kBN, 2);
  static constexpr int kVTileBytes = KvTile<T, D>::bytes(kBN, 0);
  // The K buffers, where Q is staged first (bf16 Q fits a bf16 cache's buffers), then V.
  static constexpr int kKBytes = kKBufs * kKTileBytes > kBM * D * 2 ? kKBufs * kKTileBytes : kBM * D * 2;
  static constexpr int kSmemBytes = kKBytes + kVTileBytes;
  static_assert(kIsFp8<T> || kBM * D * 2 <= kKBufs * kKTileBytes, "Q is staged through the K buffers");
  static_assert(kSmemBytes <= 101376, "must fit the SM120 per-block shared memory");
};

// The variant table (attention_fa2_variant_count() entries). The default per
// head size is the fastest on the H100 under --smem-cap 101376
// (bench/attention_bench.cpp, causal prefill of 2k and 8k tokens, gpt-oss and
// Qwen3-30B shapes): D = 64: variant 1 (168 TFLOP/s at 8k vs 141-152 for the
// others); D = 128: variant 2 (194 vs 137-178). Not yet tuned on SM120.
constexpr int kVariants = 5;
constexpr int default_variant(int d_head) { return d_head == 64 ? 1 : 2; }

// See launch_attention_tiles (attention_mma.cuh). One block of kTilesThreads:
// q_start by binary search over the sorted seq_of_token, tile counts by a block
// scan, then each thread writes the tiles of its sequences.
__global__ void __launch_bounds__(kTilesThreads)
    attention_tiles_kernel(const int32_t* seq_of_token, int n_tokens, int n_seqs, int rows_per_token, int bm,
                           int32_t* q_start, int4* tiles, int n_slots) {
  __shared__ int warp_sums[kTilesThreads / 32];
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  for (int s = tid; s <= n_seqs; s += kTilesThreads) {
    int lo = 0, hi = n_tokens;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (seq_of_token[mid] < s) lo = mid + 1;
      else hi = mid;
    }
    q_start[s] = lo;
  }
  __syncthreads();
  const int per = (n_seqs + kTilesThreads - 1) / kTilesThreads;
  const int s0 = min(n_seqs, tid * per), s1 = min(n_seqs, s0 + per);
  auto rows = [&](int s) { return (q_start[s + 1] - q_start[s]) * rows_per_token; };
  int sum = 0;
  for (int s = s0; s < s1; ++s) sum += (rows(s) + bm - 1) / bm;
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += v;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  const int total = warp_sums[kTilesThreads / 32 - 1];
  int tile = incl - sum + (warp > 0 ? warp_sums[warp - 1] : 0);
  for (int s = s0; s < s1; ++s) {
    const int n_rows = rows(s);
    for (int row0 = 0; row0 < n_rows; row0 += bm, ++tile)  // later tiles see more keys: first
      tiles[total - 1 - tile] = make_int4(s, row0, q_start[s], n_rows);
  }
  for (int x = total + tid; x < n_slots; x += kTilesThreads) tiles[x] = make_int4(-1, 0, 0, 0);
}

template <typename C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) attention_fa2_kernel(const Params p) {
  using T = typename C::T;
  constexpr int D = C::kD, kBN = C::kBN, kWarps = C::kWarps;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int range_lo[kWarps], range_hi[kWarps];
  const uint32_t s_k0 = smem_u32(smem), s_v = s_k0 + C::kKBytes;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, kvh = int(blockIdx.y);
  const int4 tile = p.tiles[blockIdx.x];  // (sequence, first row, first token, rows)
  if (tile.x < 0) return;
  const int s = tile.x, row0 = tile.y, q0 = tile.z, n_rows = tile.w;
  const int32_t* table = p.b.block_table + int64_t(s) * p.b.max_blocks;

  load_q_tile<D, C::kBM, C::kThreads>(s_k0, p, q0, n_rows, row0, kvh);
  cp_async_commit();

  const Row row[2] = {row_info(p, q0, n_rows, row0 + warp * 16 + lane / 4, kvh),
                      row_info(p, q0, n_rows, row0 + warp * 16 + lane / 4 + 8, kvh)};
  // This warp's key range and the bounds past which a tile needs no mask.
  const int w_hi = warp_max_i(max(row[0].pos, row[1].pos));
  const int w_lo = warp_min_i(min(row[0].lo, row[1].lo));
  const int w_pos_min = warp_min_i(min(row[0].pos < 0 ? INT_MAX : row[0].pos, row[1].pos < 0 ? INT_MAX : row[1].pos));
  const int w_lo_max = warp_max_i(max(row[0].pos < 0 ? -1 : row[0].lo, row[1].pos < 0 ? -1 : row[1].lo));
  if (lane == 0) range_lo[warp] = w_lo, range_hi[warp] = w_hi;

  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[D / 16][4];
  load_q_frags<T, D>(s_k0, warp * 16, qf);
  int kv_lo = INT_MAX, kv_hi = -1;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) kv_lo = min(kv_lo, range_lo[w]), kv_hi = max(kv_hi, range_hi[w]);
  __syncthreads();  // Q is in registers: the K buffers are free

  float acc[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int kt_first = kv_lo / kBN, kt_last = kv_hi / kBN;
  const auto load_k = [&](uint32_t dst, int j0) {  // K_j (codes; e4m3: then K_j's and V_j's scales)
    load_kv_tile<T, D, kBN, C::kThreads>(dst, p.k_cache, p, table, kvh, j0, kv_hi);
    load_kv_scales<T, kBN, C::kThreads>(dst + C::kScaleBytes, p.k_scale, p, table, kvh, j0, kv_hi);
    load_kv_scales<T, kBN, C::kThreads>(dst + C::kScaleBytes + kBN * 4, p.v_scale, p, table, kvh, j0, kv_hi);
  };
  load_k(s_k0, kt_first * kBN);
  cp_async_commit();
  for (int kt = kt_first; kt <= kt_last; ++kt) {
    const int j0 = kt * kBN;
    const uint32_t s_k = s_k0 + (C::kKBufs == 2 ? ((kt - kt_first) & 1) * C::kKTileBytes : 0);
    cp_async_wait<0>();
    __syncthreads();  // K_j landed; every warp is done with V_{j-1} (and K_{j-1})
    load_kv_tile<T, D, kBN, C::kThreads>(s_v, p.v_cache, p, table, kvh, j0, kv_hi);
    cp_async_commit();
    const bool prefetch = C::kKBufs == 2 && kt < kt_last;
    if (prefetch) {
      const uint32_t s_next = s_k0 + ((kt + 1 - kt_first) & 1) * C::kKTileBytes;
      load_k(s_next, j0 + kBN);
      cp_async_commit();
    }

    const bool active = j0 <= w_hi && j0 + kBN - 1 >= w_lo;
    uint32_t pf[kBN / 16][4];
    if (active) {
      float sc[kBN / 8][4] = {};
      mma_qk<T, D, kBN / 8>(s_k, 0, qf, sc);
      scale_columns<T>(sc, s_k + C::kScaleBytes, 0);
      const bool need_mask = j0 + kBN - 1 > w_pos_min || j0 < w_lo_max;
      online_softmax(sc, acc, m, l, row, j0, p.scale_log2, need_mask);
      scale_columns<T>(sc, s_k + C::kScaleBytes + kBN * 4, 0);
      pack_probs(sc, pf);
    }
    if (C::kKBufs == 1) {
      __syncthreads();  // every warp is done reading K_j: its buffer takes K_{j+1}
      if (kt < kt_last) {
        load_k(s_k0, j0 + kBN);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
    } else if (prefetch) {
      cp_async_wait<1>();  // V_j (K_{j+1} may stay in flight)
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // V_j landed
    if (active) mma_pv<T, D, kBN / 16, D / 16>(s_v, 0, 0, pf, acc);
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float lh = quad_sum(l[half]);
    if (row[half].pos < 0) continue;
    float acc_scale;
    const float inv = finish_row(m[half], lh, p.sinks, row[half].head, acc_scale);
    bf16* o = p.out + (int64_t(row[half].token) * p.n_heads + row[half].head) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      int col;
      const float2 v = acc_pair<T>(acc, n, half, col);
      *reinterpret_cast<__nv_bfloat162*>(o + col) = __floats2bfloat162_rn(v.x * inv, v.y * inv);
    }
  }
}

// Calls f(Config) for variant v (see the table at the top) and cache element type T.
template <int D, typename T, typename F>
void with_variant(int v, F&& f) {
  switch (v) {
    case 0: f(Fa2Config<D, 4, 1, 64, 1, T>{}); return;
    case 1: f(Fa2Config<D, 4, 2, 64, 1, T>{}); return;
    case 2: f(Fa2Config<D, 8, 2, 64, 1, T>{}); return;
    case 3: f(Fa2Config<D, 4, 2, 64, 3, T>{}); return;
    case 4: f(Fa2Config<D, 4, 2, 32, 3, T>{}); return;
  }
  KILN_CHECK(false) << "attention fa2: no variant " << v;
}

// Head size 256 (the gated full attention of Qwen3-Next / Qwen3.5) has one variant, the
// same for every v: 4 warps, two K buffers of 32 keys (Q staged through both: 32,768 B,
// 49,152 B in all), bf16 caches only (an e4m3 cache takes the warp kernel). Its 16 x 256
// output accumulator and Q fragments are 192 registers a thread: ptxas (sm_90) uses 255
// and spills 376 bytes.
template <typename F>
void with_head_size(int d_head, int v, bool fp8, F&& f) {
  if (d_head == 64) fp8 ? with_variant<64, e4m3>(v, f) : with_variant<64, bf16>(v, f);
  else if (d_head == 128) fp8 ? with_variant<128, e4m3>(v, f) : with_variant<128, bf16>(v, f);
  else if (d_head == 256 && !fp8) f(Fa2Config<256, 4, 2, 32, 1, bf16>{});
}

}  // namespace

size_t tile_table_bytes(const DeviceBatch& b, int n_slots) {
  return (size_t(n_slots) * sizeof(int4) + size_t(b.n_seqs + 1) * sizeof(int32_t) + 255) / 256 * 256;
}

const int4* launch_attention_tiles(const DeviceBatch& b, int group, int bm, int n_slots, void* scratch,
                                   cudaStream_t stream) {
  int4* tiles = static_cast<int4*>(scratch);
  int32_t* q_start = reinterpret_cast<int32_t*>(tiles + n_slots);
  attention_tiles_kernel<<<1, kTilesThreads, 0, stream>>>(b.seq_of_token, b.n_tokens, b.n_seqs, group, bm, q_start,
                                                          tiles, n_slots);
  KILN_CUDA_LAUNCH_CHECK();
  return tiles;
}

}  // namespace attn

int attention_fa2_variant_count() { return attn::kVariants; }

int attention_fa2_smem_bytes(int d_head, int variant, bool fp8_cache) {
  if (d_head != 64 && d_head != 128 && (d_head != 256 || fp8_cache)) return 0;
  if (variant < 0) variant = attn::default_variant(d_head);
  int bytes = 0;
  attn::with_head_size(d_head, variant, fp8_cache, [&](auto c) { bytes = decltype(c)::kSmemBytes; });
  return bytes;
}

size_t attention_fa2_scratch_bytes(const DeviceBatch& b, int n_heads, int n_kv_heads, int d_head, int variant) {
  if (variant < 0) variant = attn::default_variant(d_head);
  int bm = 0;
  attn::with_head_size(d_head, variant, false, [&](auto c) { bm = decltype(c)::kBM; });
  return attn::tile_table_bytes(b, attn::max_row_tiles(b, n_heads / n_kv_heads, bm));
}

void launch_attention_fa2(const bf16* q, const KvCacheView& kv, bf16* out, const float* sinks, const DeviceBatch& b,
                          int n_heads, int n_kv_heads, int d_head, float scale, int sliding_window, int variant,
                          void* scratch, cudaStream_t stream) {
  if (b.n_tokens == 0) return;
  KILN_CHECK(attention_fa2_smem_bytes(d_head, variant, kv.fp8) > 0 && attn::log2_exact(b.block_size) >= 0)
      << "attention fa2: no kernel for head size " << d_head << ", block size " << b.block_size;
  KILN_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0) << "attention fa2: " << n_heads << " / " << n_kv_heads;
  KILN_CHECK(scratch != nullptr) << "attention fa2: no scratch";
  KILN_CHECK(!kv.fp8 || (kv.k_scale != nullptr && kv.v_scale != nullptr)) << "attention fa2: e4m3 without scales";
  if (variant < 0) variant = attn::default_variant(d_head);
  attn::Params p = attn::make_params(q, kv, out, sinks, b, n_heads, n_kv_heads, scale, sliding_window);
  const auto launch = [&](auto c) {
    using C = decltype(c);
    const dim3 grid(attn::max_row_tiles(b, p.group, C::kBM), n_kv_heads);
    p.tiles = attn::launch_attention_tiles(b, p.group, C::kBM, int(grid.x), scratch, stream);
    const auto kernel = attn::attention_fa2_kernel<C>;
    prepare_smem(kernel, C::kSmemBytes, 128);  // 48 KiB of dynamic memory plus the static 128 B: past the no-opt-in limit
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
    KILN_CUDA_LAUNCH_CHECK();
  };
  attn::with_head_size(d_head, variant, kv.fp8, launch);
}

}  // namespace kiln::cuda
