// Decode attention, split-KV (flash-decoding): for steps whose sequences have
// few query tokens and possibly long contexts. Decode is bandwidth-bound, so
// the design goals are: every K/V byte read once per kv head, enough CTAs in
// flight to saturate DRAM, and several tiles of loads outstanding per CTA.
//
// Grid (row tile, kv head, split). A CTA owns kBM = 16 query rows of one
// sequence and one kv head (rows = (token, q head of the group) pairs, see
// attention_mma.cuh: all q heads sharing a kv head are in the same CTA, so K/V
// is streamed once for the group; gpt-oss and Qwen3-30B have groups of 8) and
// 1/n_splits of the rows' visible key range. Its 4 warps share the 16 rows and
// split each kBN = 64-key tile four ways (16 keys per warp): each warp keeps
// its own running (max, sum, 16 x D accumulator), merged through shared
// memory at the end. With n_splits > 1 each split writes an fp32 partial
// (max, sum, unnormalised output) and attention_combine_kernel merges them and
// adds the sink; with one split the CTA writes the output itself.
//
// Loads: a kStages-deep cp.async ring of (K, V) tiles, kStages - 1 tiles in
// flight while one is computed. Q (16 * D * 2 bytes) is staged in the last
// stage, which the ring first fills after Q is in registers.
// Shared memory: kStages * (K + V tile = 2 * 64 * D * 2 bytes):
//   D =  64: 3 stages * 16,384 = 49,152 B (2 CTAs per 100 KB SM120 SM)
//   D = 256: 2 warps (tiles of 32 keys), 3 stages * 32,768 = 98,304 B; bf16 caches
//            only (an e4m3 cache takes the warp kernel); 255 registers with spills
//   D = 128: 3 stages * 32,768 = 98,304 B (1 CTA per SM120 SM, so its ring
//            is the SM's only source of loads in flight: 3 stages keep 2 tiles
//            = 64 KB in flight; on the H100, with 2 CTAs per SM, 2 and 3
//            stages measured the same)
// Either keeps >= 32 KB of loads in flight per SM, above the ~10-25 KB that
// Little's law asks for at SM120 / H100 DRAM bandwidth and latency. The
// end-of-loop merge reuses the ring: 4 warps * 16 rows * (D + 2) floats.
// An e4m3 cache (attention_mma.cuh) halves the tiles and adds 64 scales each:
// 3 * 2 * (64 * D + 256) = 26,112 B (D 64) / 50,688 B (D 128), so with D = 128 two
// CTAs fit an SM120 SM; the stages hold the same keys, now in half the bytes.
#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/attention_mma.cuh"
#include "backends/cuda/kernels/pdl.cuh"
#include "backends/cuda/kernels/smem.cuh"

namespace kiln::cuda {
namespace attn {
namespace {

template <int D, typename T>
struct DecodeConfig {
  static constexpr int kStages = 3;
  static constexpr int kWarps = D == 256 ? 2 : 4;  // D = 256: tiles of 32 keys, so 3 stages fit
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBM = 16;
  static constexpr int kBN = 16 * kWarps;
  static constexpr int kTileBytes = KvTile<T, D>::bytes(kBN);
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kQBytes = kBM * D * 2;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kSmemBytes <= 101376, "must fit the SM120 per-block shared memory");
  static_assert(kQBytes <= kStageBytes, "Q is staged in the last stage");
  static_assert(kWarps * kBM * (D + 2) * 4 <= kSmemBytes, "the merge reuses the ring");
};

// Keys per split at least this many (one tile of 64 keys). Served Qwen3-30B-A3B at one stream (2 x
// H200, contexts 512-640) decoded 2.4% (TP2) / 2.6% (TP1) faster than at 256 keys (4
// tiles, the earlier floor, chosen for a CTA's fixed latency and the combine), 128 keys
// between; at 8 and 64 streams the wave bound below decides either way (no change).
constexpr int kMinKeysPerSplit = 64;
constexpr int kMaxSplits = 128;

template <int D, typename T>
__global__ void __launch_bounds__(DecodeConfig<D, T>::kThreads) attention_decode_kernel(const Params p) {
  pdl_wait();  // a dependent launch (pdl.cuh)
  using C = DecodeConfig<D, T>;
  constexpr int kBN = C::kBN, kStages = C::kStages;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_ring = smem_u32(smem), s_q = s_ring + (kStages - 1) * C::kStageBytes;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, kvh = int(blockIdx.y), split = int(blockIdx.z);
  int s, row0, q0, n_rows;
  if (p.tiles != nullptr) {
    const int4 tile = p.tiles[blockIdx.x];  // (sequence, first row, first token, rows)
    if (tile.x < 0) return;
    s = tile.x, row0 = tile.y, q0 = tile.z, n_rows = tile.w;
  } else {  // one query token per sequence: token s is sequence s's (checked below)
    s = int(blockIdx.x) / p.tiles_per_seq, row0 = (int(blockIdx.x) % p.tiles_per_seq) * C::kBM, q0 = s;
    n_rows = p.group;
  }
  const int32_t* table = p.b.block_table + int64_t(s) * p.b.max_blocks;

  // All warps hold the same 16 rows: the CTA's key range from warp reductions.
  const Row row[2] = {row_info(p, q0, n_rows, row0 + lane / 4, kvh),
                      row_info(p, q0, n_rows, row0 + lane / 4 + 8, kvh)};
  // A sequence without query tokens would shift the token <-> sequence map of
  // the one-token-per-sequence grid: a broken batch contract, so stop loudly.
  if (p.tiles == nullptr && p.b.seq_of_token[q0] != s) __trap();
  const int kv_hi = warp_max_i(max(row[0].pos, row[1].pos));
  const int kv_lo = warp_min_i(min(row[0].lo, row[1].lo));
  const int kt_first = kv_lo / kBN, n_kt = kv_hi / kBN - kt_first + 1;
  const int per_split = (n_kt + p.n_splits - 1) / p.n_splits;
  const int kt_begin = kt_first + split * per_split;
  const int n_my = max(0, min(per_split, kt_first + n_kt - kt_begin));

  if (n_my == 0) {  // an empty split (short context): mark its partial empty
    if (threadIdx.x < C::kBM && row0 + int(threadIdx.x) < n_rows) {
      const Row r = row_info(p, q0, n_rows, row0 + int(threadIdx.x), kvh);
      float* ml = p.part_ml + ((int64_t(r.token) * p.n_heads + r.head) * p.n_splits + split) * 2;
      ml[0] = -INFINITY;
      ml[1] = 0.0f;
    }
    return;
  }

  // A stage: the K tile (codes, then its scales for e4m3), then the V tile.
  constexpr uint32_t kScales = kBN * KvTile<T, D>::kRowBytes;
  const auto load_stage = [&](uint32_t st, int j0) {
    load_kv_tile<T, D, kBN, C::kThreads>(st, p.k_cache, p, table, kvh, j0, kv_hi);
    load_kv_scales<T, kBN, C::kThreads>(st + kScales, p.k_scale, p, table, kvh, j0, kv_hi);
    load_kv_tile<T, D, kBN, C::kThreads>(st + C::kTileBytes, p.v_cache, p, table, kvh, j0, kv_hi);
    load_kv_scales<T, kBN, C::kThreads>(st + C::kTileBytes + kScales, p.v_scale, p, table, kvh, j0, kv_hi);
  };
  load_q_tile<D, C::kBM, C::kThreads>(s_q, p, q0, n_rows, row0, kvh);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_my) {
      const int j0 = (kt_begin + st) * kBN;
      load_stage(s_ring + st * C::kStageBytes, j0);
    }
    cp_async_commit();  // Q rides in group 0
  }

  uint32_t qf[D / 16][4];
  float acc[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int i = 0; i < n_my; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile i landed; every warp is done with tile i - 1's stage
    if (i == 0) {
      load_q_frags<T, D>(s_q, 0, qf);
      __syncthreads();  // Q is in registers: its stage may take a tile
    }
    const int next = i + kStages - 1;
    if (next < n_my) {
      const uint32_t st = s_ring + (next % kStages) * C::kStageBytes;
      const int j0 = (kt_begin + next) * kBN;
      load_stage(st, j0);
    }
    cp_async_commit();

    const uint32_t s_k = s_ring + (i % kStages) * C::kStageBytes, s_v = s_k + C::kTileBytes;
    const int key0 = warp * 16, j0 = (kt_begin + i) * kBN + key0;  // this warp's 16 keys
    if (j0 > kv_hi) continue;
    float sc[2][4] = {};
    mma_qk<T, D, 2>(s_k, key0, qf, sc);
    scale_columns<T>(sc, s_k + kScales, key0);
    online_softmax(sc, acc, m, l, row, j0, p.scale_log2, true);
    scale_columns<T>(sc, s_v + kScales, key0);
    uint32_t pf[1][4];
    pack_probs(sc, pf);
    mma_pv<T, D, 1, D / 16>(s_v, key0, 0, pf, acc);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring and Q buffers are free: merge the 4 warps

  float* s_acc = reinterpret_cast<float*>(smem);  // [kWarps][kBM][D]
  float* s_m = s_acc + C::kWarps * C::kBM * D;    // [kWarps][kBM]
  float* s_l = s_m + C::kWarps * C::kBM;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = lane / 4 + 8 * half;
    const float lh = quad_sum(l[half]);
    if (lane % 4 == 0) s_m[warp * C::kBM + r] = m[half], s_l[warp * C::kBM + r] = lh;
    float* dst = s_acc + (warp * C::kBM + r) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      int col;
      const float2 v = acc_pair<T>(acc, n, half, col);
      *reinterpret_cast<float2*>(dst + col) = v;
    }
  }
  __syncthreads();

  // 8 threads per row, D / 8 dims each (two rows each with 2 warps).
  constexpr int kPer = D / 8;
  const int d0 = (int(threadIdx.x) % 8) * kPer;
  for (int r = int(threadIdx.x) / 8; r < C::kBM; r += C::kThreads / 8) {
    if (row0 + r >= n_rows) break;
    const Row out_row = row_info(p, q0, n_rows, row0 + r, kvh);
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) mx = fmaxf(mx, s_m[w * C::kBM + r]);
    const float m_use = mx == -INFINITY ? 0.0f : mx;
    float wgt[C::kWarps], sum = 0.0f;
#pragma unroll
    for (int w = 0; w < C::kWarps; ++w) {
      wgt[w] = exp2_approx(s_m[w * C::kBM + r] - m_use);
      sum += s_l[w * C::kBM + r] * wgt[w];
    }
    float o[kPer];
#pragma unroll
    for (int d = 0; d < kPer; ++d) {
      o[d] = 0.0f;
#pragma unroll
      for (int w = 0; w < C::kWarps; ++w) o[d] += s_acc[(w * C::kBM + r) * D + d0 + d] * wgt[w];
    }
    const int64_t out_index = int64_t(out_row.token) * p.n_heads + out_row.head;
    if (p.n_splits == 1) {
      float acc_scale;
      const float inv = finish_row(mx, sum, p.sinks, out_row.head, acc_scale);
      bf16* dst = p.out + out_index * D + d0;
#pragma unroll
      for (int d = 0; d < kPer; d += 2)
        *reinterpret_cast<__nv_bfloat162*>(dst + d) = __floats2bfloat162_rn(o[d] * inv, o[d + 1] * inv);
    } else {
      float* dst = p.part_o + (out_index * p.n_splits + split) * D + d0;
#pragma unroll
      for (int d = 0; d < kPer; d += 4)
        *reinterpret_cast<float4*>(dst + d) = make_float4(o[d], o[d + 1], o[d + 2], o[d + 3]);
      if (d0 == 0) {
        float* ml = p.part_ml + (out_index * p.n_splits + split) * 2;
        ml[0] = mx;
        ml[1] = sum;
      }
    }
  }
}

// out[t, h] = sum_z w_z o_z / (sum_z w_z l_z + exp2(sink - M)), w_z = exp2(m_z - M),
// M = max(max_z m_z, sink): one warp per (token, head), lanes over D.
template <int D>
__global__ void __launch_bounds__(128) attention_combine_kernel(const Params p) {
  pdl_wait();  // a dependent launch (pdl.cuh)
  const int64_t row = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  if (row >= int64_t(p.b.n_tokens) * p.n_heads) return;
  const int head = int(row % p.n_heads);
  const float* ml = p.part_ml + row * p.n_splits * 2;
  float mx = -INFINITY;
  for (int z = lane; z < p.n_splits; z += 32)
    if (ml[2 * z + 1] > 0.0f) mx = fmaxf(mx, ml[2 * z]);
  mx = warp_max(mx);
  const float sink = p.sinks != nullptr ? p.sinks[head] * kLog2e : -INFINITY;
  mx = fmaxf(mx, sink);
  float sum = 0.0f;
  for (int z = lane; z < p.n_splits; z += 32)
    if (ml[2 * z + 1] > 0.0f) sum += ml[2 * z + 1] * exp2_approx(ml[2 * z] - mx);
  sum = warp_sum(sum) + (p.sinks != nullptr ? exp2_approx(sink - mx) : 0.0f);
  constexpr int kPer = D / 32;
  float o[kPer] = {};
  const float* po = p.part_o + row * p.n_splits * D;
  for (int z = 0; z < p.n_splits; ++z) {
    if (!(ml[2 * z + 1] > 0.0f)) continue;  // empty split: its o was never written
    const float w = exp2_approx(ml[2 * z] - mx);
#pragma unroll
    for (int i = 0; i < kPer; ++i) o[i] += po[int64_t(z) * D + lane + 32 * i] * w;
  }
  const float inv = 1.0f / sum;
#pragma unroll
  for (int i = 0; i < kPer; ++i) p.out[row * D + lane + 32 * i] = __float2bfloat16(o[i] * inv);
}

// KV splits: as many as one wave of resident CTAs holds (a second, partial
// wave doubles the time of the longest CTAs: on the H100, Qwen3-30B x 8
// sequences x 32k, 8 splits = 256 CTAs in 264 slots run in 201 us, 9 splits in
// 301 us), at most one per kMinKeysPerSplit keys of the longest possible
// context (the window bounds it). From the --sweep-splits runs of
// bench/attention_bench.cpp: within 10% of the best split count in every case
// but one short one (batch 1 x 1k: 4 splits, 14 us vs 12.5 us at 8).
template <int D, typename T>
int choose_splits_for(const DeviceBatch& b, int group, int n_kv_heads, int window) {
  using C = DecodeConfig<D, T>;
  int device = 0, sms = 0, per_sm = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  prepare_smem(attention_decode_kernel<D, T>, C::kSmemBytes);
  KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_decode_kernel<D, T>, C::kThreads,
                                                                C::kSmemBytes));
  int64_t ctx = int64_t(b.max_blocks) * b.block_size;
  if (window > 0) ctx = std::min<int64_t>(ctx, window + C::kBN);
  const int64_t ctas =
      int64_t(std::max(b.n_seqs, int((int64_t(b.n_tokens) * group + C::kBM - 1) / C::kBM))) * n_kv_heads;
  const int64_t wave = int64_t(sms) * std::max(1, per_sm) / ctas;
  const int64_t by_ctx = (ctx + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return int(std::clamp<int64_t>(std::min(wave, by_ctx), 1, kMaxSplits));
}

// Calls f(D, T) (as std::integral_constant and a T value) for a head size and cache type.
template <typename F>
void with_decode_instance(int d_head, bool fp8, F&& f) {
  const auto for_d = [&](auto d) {
    if (fp8) f(d, e4m3{});
    else f(d, bf16{});
  };
  if (d_head == 64) for_d(std::integral_constant<int, 64>{});
  else if (d_head == 128) for_d(std::integral_constant<int, 128>{});
  else if (d_head == 256 && !fp8) f(std::integral_constant<int, 256>{}, bf16{});  // no e4m3 tiles of 256
}

int choose_splits(const DeviceBatch& b, int d_head, int group, int n_kv_heads, int window, int requested,
                  bool fp8) {
  if (requested > 0) return requested;
  int splits = 1;
  with_decode_instance(d_head, fp8, [&](auto d, auto t) {
    splits = choose_splits_for<decltype(d)::value, decltype(t)>(b, group, n_kv_heads, window);
  });
  return splits;
}

// Scratch layout: [tile table (unless one token per sequence)] [partials (when split)].
struct DecodeScratch {
  size_t table_bytes = 0, part_bytes = 0;
};
DecodeScratch decode_scratch(const DeviceBatch& b, int n_heads, int group, int d_head, int n_splits) {
  DecodeScratch d;
  if (b.n_tokens != b.n_seqs) d.table_bytes = tile_table_bytes(b, max_row_tiles(b, group, 16));
  if (n_splits > 1) d.part_bytes = size_t(b.n_tokens) * n_heads * n_splits * (d_head + 2) * sizeof(float);
  return d;
}

template <int D, typename T>
void decode_for(Params p, int n_splits, void* scratch, cudaStream_t stream) {
  using C = DecodeConfig<D, T>;
  p.n_splits = n_splits;
  const DecodeScratch layout = decode_scratch(p.b, p.n_heads, p.group, D, n_splits);
  char* base = static_cast<char*>(scratch);
  if (n_splits > 1) {
    p.part_o = reinterpret_cast<float*>(base + layout.table_bytes);
    p.part_ml = p.part_o + size_t(p.b.n_tokens) * p.n_heads * n_splits * D;
  }
  int x_tiles;
  if (p.b.n_tokens == p.b.n_seqs) {  // pure decode: tiles by arithmetic, no table kernel
    p.tiles_per_seq = (p.group + C::kBM - 1) / C::kBM;
    x_tiles = p.b.n_seqs * p.tiles_per_seq;
  } else {
    x_tiles = max_row_tiles(p.b, p.group, C::kBM);
    p.tiles = launch_attention_tiles(p.b, p.group, C::kBM, x_tiles, base, stream);
  }
  prepare_smem(attention_decode_kernel<D, T>, C::kSmemBytes);
  launch_dependent(attention_decode_kernel<D, T>, dim3(x_tiles, p.n_kv_heads, n_splits), C::kThreads, C::kSmemBytes,
                   stream, p);
  KILN_CUDA_LAUNCH_CHECK();
  if (n_splits > 1) {
    launch_dependent(attention_combine_kernel<D>, ceil_div(int64_t(p.b.n_tokens) * p.n_heads, 4), 128, 0, stream, p);
    KILN_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace
}  // namespace attn

int attention_decode_smem_bytes(int d_head, bool fp8_cache) {
  if (d_head != 64 && d_head != 128 && (d_head != 256 || fp8_cache)) return 0;
  int bytes = 0;
  attn::with_decode_instance(d_head, fp8_cache, [&](auto d, auto t) {
    bytes = attn::DecodeConfig<decltype(d)::value, decltype(t)>::kSmemBytes;
  });
  return bytes;
}

size_t attention_decode_scratch_bytes(const DeviceBatch& b, int n_heads, int n_kv_heads, int d_head,
                                      int sliding_window, int n_splits, bool fp8_cache) {
  const int group = n_heads / n_kv_heads;
  const int splits = attn::choose_splits(b, d_head, group, n_kv_heads, sliding_window, n_splits, fp8_cache);
  const attn::DecodeScratch d = attn::decode_scratch(b, n_heads, group, d_head, splits);
  return d.table_bytes + d.part_bytes;
}

void launch_attention_decode(const bf16* q, const KvCacheView& kv, bf16* out, const float* sinks,
                             const DeviceBatch& b, int n_heads, int n_kv_heads, int d_head, float scale,
                             int sliding_window, int n_splits, void* scratch, cudaStream_t stream) {
  if (b.n_tokens == 0) return;
  KILN_CHECK(attention_decode_smem_bytes(d_head, kv.fp8) > 0 && attn::log2_exact(b.block_size) >= 0)
      << "attention decode: no kernel for head size " << d_head << ", block size " << b.block_size;
  KILN_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0) << "attention decode: " << n_heads << " / " << n_kv_heads;
  KILN_CHECK(!kv.fp8 || (kv.k_scale != nullptr && kv.v_scale != nullptr)) << "attention decode: e4m3 without scales";
  const attn::Params p = attn::make_params(q, kv, out, sinks, b, n_heads, n_kv_heads, scale, sliding_window);
  n_splits = attn::choose_splits(b, d_head, p.group, n_kv_heads, sliding_window, n_splits, kv.fp8);
  KILN_CHECK(scratch != nullptr ||
             attention_decode_scratch_bytes(b, n_heads, n_kv_heads, d_head, sliding_window, n_splits, kv.fp8) == 0)
      << "attention decode: no scratch";
  attn::with_decode_instance(d_head, kv.fp8, [&](auto d, auto t) {
    attn::decode_for<decltype(d)::value, decltype(t)>(p, n_splits, scratch, stream);
  });
}

}  // namespace kiln::cuda
