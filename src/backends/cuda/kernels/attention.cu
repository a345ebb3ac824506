// Paged attention and MLA: the first CUDA versions, one warp per (query token,
// head) with an online softmax over the cached positions. They use no shared
// memory, so they run under any --smem-cap; they are the correctness baseline the
// tiled mma.sync kernels (attention_fa2.cu prefill, attention_decode.cu split-KV
// decode) are checked against, and the fallback where those have no instance.
// launch_attention is the dispatch between the three attention paths. Over an e4m3
// cache they read each value as code * its row's scale in fp32, as the CPU reference.
#include <cfloat>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/kv_fp8.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ int64_t slot_of(const DeviceBatch& b, int s, int j) {
  return int64_t(b.block_table[int64_t(s) * b.max_blocks + j / b.block_size]) * b.block_size + j % b.block_size;
}

// Element i of a cache row as fp32: bf16, or an e4m3 code times the row's scale.
__device__ __forceinline__ float cache_value(const bf16* row, int i, float) { return to_f(row[i]); }
__device__ __forceinline__ float cache_value(const e4m3* row, int i, float scale) {
  return e4m3_to_float(reinterpret_cast<const uint8_t*>(row)[i]) * scale;
}

// Each lane owns head dims lane, lane + 32, ... (kPer of them; D <= 32 * kPer).
// k_scale / v_scale: [slots, n_kv_heads] for an e4m3 cache (T = e4m3), else unused.
template <int kPer, typename T>
__global__ void attention_warp_kernel(const bf16* q, const T* k_cache, const T* v_cache, const float* k_scale,
                                      const float* v_scale, bf16* out, const float* sinks, DeviceBatch b, int n_heads,
                                      int n_kv_heads, int d_head, float scale, int window) {
  const int warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp >= b.n_tokens * n_heads) return;
  const int t = warp / n_heads, h = warp % n_heads, kvh = h / (n_heads / n_kv_heads);
  const int s = b.seq_of_token[t], p = b.positions[t];
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    qv[i] = d < d_head ? to_f(q[(int64_t(t) * n_heads + h) * d_head + d]) * scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -FLT_MAX, l = 0.0f;
  const int j0 = window > 0 ? max(0, p - window + 1) : 0;
  for (int j = j0; j <= p; ++j) {
    const int64_t head_row = slot_of(b, s, j) * n_kv_heads + kvh, row = head_row * d_head;
    const float ks = kIsFp8<T> ? k_scale[head_row] : 1.0f, vs = kIsFp8<T> ? v_scale[head_row] : 1.0f;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int d = lane + 32 * i;
      if (d < d_head) dot += qv[i] * cache_value(k_cache + row, d, ks);
    }
    const float score = warp_sum(dot);
    const float m_new = fmaxf(m, score), corr = __expf(m - m_new), pj = __expf(score - m_new);
    l = l * corr + pj;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < d_head ? pj * cache_value(v_cache + row, d, vs) : 0.0f);
    }
    m = m_new;
  }
  if (sinks != nullptr) {  // a virtual key with logit sinks[h] and no value
    const float sink = sinks[h], m_new = fmaxf(m, sink), corr = __expf(m - m_new);
    l = l * corr + __expf(sink - m_new);
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= corr;
  }
  const float inv_l = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    if (d < d_head) out[(int64_t(t) * n_heads + h) * d_head + d] = __float2bfloat16(acc[i] * inv_l);
  }
}

// q_lat[t, h, c] = sum_d q_nope[t, h, d] W_uk[h][d, c]: one block per (t, h) of
// kAbsorbGroups x 64 threads. Thread (g, i) sums d = g, g + kAbsorbGroups, ... for
// the 8 columns c = 8i.. (one 16-byte load of W_uk per d), so each block keeps
// kAbsorbGroups rows of W_uk in flight; the groups' partial sums meet in shared
// memory. d_latent: a multiple of 8, at most 512 (checked by launch_mla).
constexpr int kAbsorbGroups = 8;
__global__ void __launch_bounds__(64 * kAbsorbGroups)
    mla_absorb_q_kernel(const bf16* q_nope, const bf16* kv_b, float* q_lat, int n_heads, int d_nope, int d_v,
                        int d_latent) {
  __shared__ float part[kAbsorbGroups][512];
  const int th = blockIdx.x, h = th % n_heads;
  const int g = int(threadIdx.x) / 64, c0 = (int(threadIdx.x) % 64) * 8;
  const bf16* qn = q_nope + int64_t(th) * d_nope;
  const bf16* w_uk = kv_b + int64_t(h) * (d_nope + d_v) * d_latent;
  float acc[8] = {};
#pragma unroll 4
  for (int d = g; d < d_nope && c0 < d_latent; d += kAbsorbGroups) {
    const float q = to_f(qn[d]);
    const uint4 raw = *reinterpret_cast<const uint4*>(w_uk + int64_t(d) * d_latent + c0);
    const bf16* w = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += q * to_f(w[k]);
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) part[g][c0 + k] = acc[k];
  __syncthreads();
  for (int c = int(threadIdx.x); c < d_latent; c += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kAbsorbGroups; ++i) sum += part[i][c];
    q_lat[int64_t(th) * d_latent + c] = sum;
  }
}

// One warp per (t, h): scores over the latent cache, o_lat = sum_j p_j c_j, over j <= p
// or (sel.list) the token's selected positions.
// cache_scale: [slots, 2] (latent, rope) for an e4m3 cache (T = e4m3), else unused.
template <int kPerLat, int kPerRope, typename T>
__global__ void mla_attend_kernel(const float* q_lat, const bf16* q_rope, const T* cache, const float* cache_scale,
                                  float* o_lat, DeviceBatch b, int n_heads, int d_latent, int d_rope, float scale,
                                  MlaSelection sel) {
  const int warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp >= b.n_tokens * n_heads) return;
  const int t = warp / n_heads;
  const int s = b.seq_of_token[t], p = b.positions[t];
  const int row_elems = d_latent + d_rope;
  float ql[kPerLat], qr[kPerRope], acc[kPerLat];
#pragma unroll
  for (int i = 0; i < kPerLat; ++i) {
    const int c = lane + 32 * i;
    ql[i] = c < d_latent ? q_lat[int64_t(warp) * d_latent + c] * scale : 0.0f;
    acc[i] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kPerRope; ++i) {
    const int c = lane + 32 * i;
    qr[i] = c < d_rope ? to_f(q_rope[int64_t(warp) * d_rope + c]) * scale : 0.0f;
  }
  float m = -FLT_MAX, l = 0.0f;
  const int n_keys = sel.list != nullptr ? sel.count[t] : p + 1;
  const int32_t* list = sel.list != nullptr ? sel.list + int64_t(t) * sel.top_k : nullptr;
  for (int i = 0; i < n_keys; ++i) {
    const int64_t slot = slot_of(b, s, list != nullptr ? list[i] : i);
    const T* row = cache + slot * row_elems;
    const float ls = kIsFp8<T> ? cache_scale[2 * slot] : 1.0f, rs = kIsFp8<T> ? cache_scale[2 * slot + 1] : 1.0f;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLat; ++i) {
      const int c = lane + 32 * i;
      if (c < d_latent) dot += ql[i] * cache_value(row, c, ls);
    }
#pragma unroll
    for (int i = 0; i < kPerRope; ++i) {
      const int c = lane + 32 * i;
      if (c < d_rope) dot += qr[i] * cache_value(row, d_latent + c, rs);
    }
    const float score = warp_sum(dot);
    const float m_new = fmaxf(m, score), corr = __expf(m - m_new), pj = __expf(score - m_new);
    l = l * corr + pj;
#pragma unroll
    for (int i = 0; i < kPerLat; ++i) {
      const int c = lane + 32 * i;
      acc[i] = acc[i] * corr + (c < d_latent ? pj * cache_value(row, c, ls) : 0.0f);
    }
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < kPerLat; ++i) {
    const int c = lane + 32 * i;
    if (c < d_latent) o_lat[int64_t(warp) * d_latent + c] = acc[i] / l;
  }
}

// out[t, h, v] = W_uv[h][v, :] . o_lat[t, h, :]: one warp per output element.
__global__ void mla_up_v_kernel(const float* o_lat, const bf16* kv_b, bf16* out, int64_t n_rows, int n_heads,
                                int d_nope, int d_v, int d_latent) {
  const int64_t warp = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= n_rows * d_v) return;
  const int64_t th = warp / d_v;
  const int v = int(warp % d_v), h = int(th % n_heads);
  const bf16* w = kv_b + (int64_t(h) * (d_nope + d_v) + d_nope + v) * d_latent;
  const float* o = o_lat + th * d_latent;
  float acc = 0.0f;
  for (int c = lane; c < d_latent; c += 32) acc += to_f(w[c]) * o[c];
  acc = warp_sum(acc);
  if (lane == 0) out[th * d_v + v] = __float2bfloat16(acc);
}

template <int kPer, typename T>
void attention_for(const bf16* q, const KvCacheView& kv, bf16* out, const float* sinks, const DeviceBatch& b,
                   int n_heads, int n_kv_heads, int d_head, float scale, int window, cudaStream_t stream) {
  const int warps = b.n_tokens * n_heads;
  attention_warp_kernel<kPer, T><<<ceil_div(warps, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
      q, static_cast<const T*>(kv.k), static_cast<const T*>(kv.v), kv.k_scale, kv.v_scale, out, sinks, b, n_heads,
      n_kv_heads, d_head, scale, window);
  KILN_CUDA_LAUNCH_CHECK();
}

template <int kPer>
void attention_for(const bf16* q, const KvCacheView& kv, bf16* out, const float* sinks, const DeviceBatch& b,
                   int n_heads, int n_kv_heads, int d_head, float scale, int window, cudaStream_t stream) {
  if (kv.fp8) attention_for<kPer, e4m3>(q, kv, out, sinks, b, n_heads, n_kv_heads, d_head, scale, window, stream);
  else attention_for<kPer, bf16>(q, kv, out, sinks, b, n_heads, n_kv_heads, d_head, scale, window, stream);
}

}  // namespace

const char* attention_path_name(AttentionPath path) {
  switch (path) {
    case AttentionPath::kAuto: return "auto";
    case AttentionPath::kWarp: return "warp";
    case AttentionPath::kFa2: return "fa2";
    case AttentionPath::kSplitKv: return "split-kv";
  }
  return "?";
}

AttentionPath choose_attention_path(const DeviceBatch& b, int d_head, int smem_cap, bool fp8_cache) {
  const bool paged_ok = b.block_size > 0 && (b.block_size & (b.block_size - 1)) == 0;
  const auto fits = [&](int bytes) { return paged_ok && bytes > 0 && bytes <= smem_cap; };
  // DeviceBatch has no per-sequence query counts on the host, hence the average.
  if (int64_t(b.n_tokens) <= 4 * int64_t(b.n_seqs) && fits(attention_decode_smem_bytes(d_head, fp8_cache))) {
    return AttentionPath::kSplitKv;
  }
  if (fits(attention_fa2_smem_bytes(d_head, -1, fp8_cache))) return AttentionPath::kFa2;
  return AttentionPath::kWarp;
}

namespace {

AttentionPath resolve(const DeviceBatch& b, int d_head, int smem_cap, bool fp8, const AttentionOptions& o) {
  const AttentionPath path = o.path == AttentionPath::kAuto ? choose_attention_path(b, d_head, smem_cap, fp8) : o.path;
  if (path == AttentionPath::kSplitKv) {
    const int bytes = attention_decode_smem_bytes(d_head, fp8);
    KILN_CHECK(bytes > 0 && bytes <= smem_cap) << "attention split-kv: head size " << d_head << ", " << bytes
                                               << " bytes of shared memory vs cap " << smem_cap;
  } else if (path == AttentionPath::kFa2) {
    const int bytes = attention_fa2_smem_bytes(d_head, o.fa2_variant, fp8);
    KILN_CHECK(bytes > 0 && bytes <= smem_cap) << "attention fa2: head size " << d_head << ", " << bytes
                                               << " bytes of shared memory vs cap " << smem_cap;
  }
  return path;
}

}  // namespace

size_t attention_scratch_bytes(const DeviceBatch& b, int n_heads, int n_kv_heads, int d_head, int sliding_window,
                               int smem_cap, bool fp8_cache, const AttentionOptions& options) {
  if (b.n_tokens == 0) return 0;
  switch (resolve(b, d_head, smem_cap, fp8_cache, options)) {
    case AttentionPath::kSplitKv:
      return attention_decode_scratch_bytes(b, n_heads, n_kv_heads, d_head, sliding_window, options.n_splits,
                                            fp8_cache);
    case AttentionPath::kFa2:
      return attention_fa2_scratch_bytes(b, n_heads, n_kv_heads, d_head, options.fa2_variant);
    default:
      return 0;
  }
}

void launch_attention(const bf16* q, const KvCacheView& kv, bf16* out, const float* sinks, const DeviceBatch& b,
                      int n_heads, int n_kv_heads, int d_head, float scale, int sliding_window, cudaStream_t stream,
                      int smem_cap, const AttentionOptions& options) {
  if (b.n_tokens == 0) return;
  KILN_CHECK(d_head > 0 && d_head <= 256) << "attention: head size " << d_head << " (supported up to 256)";
  KILN_CHECK(!kv.fp8 || (kv.k_scale != nullptr && kv.v_scale != nullptr)) << "attention: e4m3 cache without scales";
  const AttentionPath path = resolve(b, d_head, smem_cap, kv.fp8, options);
  if (path == AttentionPath::kWarp) {
    if (d_head <= 32) attention_for<1>(q, kv, out, sinks, b, n_heads, n_kv_heads, d_head, scale, sliding_window, stream);
    else if (d_head <= 64) attention_for<2>(q, kv, out, sinks, b, n_heads, n_kv_heads, d_head, scale, sliding_window, stream);
    else if (d_head <= 128) attention_for<4>(q, kv, out, sinks, b, n_heads, n_kv_heads, d_head, scale, sliding_window, stream);
    else attention_for<8>(q, kv, out, sinks, b, n_heads, n_kv_heads, d_head, scale, sliding_window, stream);
    return;
  }
  // Scratch: the caller's, else stream-ordered from the device's default pool.
  void* scratch = options.scratch;
  const size_t bytes = scratch != nullptr ? 0 : attention_scratch_bytes(b, n_heads, n_kv_heads, d_head,
                                                                        sliding_window, smem_cap, kv.fp8, options);
  if (bytes > 0) KILN_CUDA_CHECK(cudaMallocAsync(&scratch, bytes, stream));
  if (path == AttentionPath::kSplitKv) {
    launch_attention_decode(q, kv, out, sinks, b, n_heads, n_kv_heads, d_head, scale, sliding_window,
                            options.n_splits, scratch, stream);
  } else {
    launch_attention_fa2(q, kv, out, sinks, b, n_heads, n_kv_heads, d_head, scale, sliding_window,
                         options.fa2_variant, scratch, stream);
  }
  if (bytes > 0) KILN_CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

const char* mla_path_name(MlaPath path) {
  switch (path) {
    case MlaPath::kAuto: return "auto";
    case MlaPath::kWarp: return "warp";
    case MlaPath::kMma: return "mma.sync";
  }
  return "?";
}

void launch_mla(const bf16* q_nope, const bf16* q_rope, const MlaCacheView& cache, const bf16* kv_b, bf16* out,
                float* scratch, const DeviceBatch& b, int n_heads, int d_nope, int d_rope, int d_v, int d_latent,
                float scale, MlaPath path, cudaStream_t stream, const MlaSelection& sel) {
  if (b.n_tokens == 0) return;
  KILN_CHECK(d_latent <= 512 && d_latent % 8 == 0 && d_rope <= 64)
      << "mla: d_latent " << d_latent << ", d_rope " << d_rope << " (supported: latent a multiple of 8 up to 512, "
      << "rope up to 64)";
  KILN_CHECK(!cache.fp8 || cache.scale != nullptr) << "mla: e4m3 cache without scales";
  const int rows = b.n_tokens * n_heads;
  float* q_lat = scratch;
  float* o_lat = scratch + int64_t(rows) * d_latent;
  mla_absorb_q_kernel<<<rows, 64 * kAbsorbGroups, 0, stream>>>(q_nope, kv_b, q_lat, n_heads, d_nope, d_v,
                                                                 d_latent);
  KILN_CUDA_LAUNCH_CHECK();
  if (path == MlaPath::kMma) {
    KILN_CHECK(mla_mma_supported(d_latent, d_rope)) << "mla: no mma.sync kernel for latent " << d_latent;
    launch_mla_attend_mma(q_lat, q_rope, cache, o_lat, o_lat + int64_t(rows) * d_latent, b, n_heads, scale, stream,
                          sel);
  } else {
    const dim3 grid(ceil_div(rows, kWarpsPerBlock)), block(32 * kWarpsPerBlock);
    if (cache.fp8) {
      mla_attend_kernel<16, 2, e4m3><<<grid, block, 0, stream>>>(q_lat, q_rope, static_cast<const e4m3*>(cache.data),
                                                                   cache.scale, o_lat, b, n_heads, d_latent, d_rope,
                                                                   scale, sel);
    } else {
      mla_attend_kernel<16, 2, bf16><<<grid, block, 0, stream>>>(q_lat, q_rope, static_cast<const bf16*>(cache.data),
                                                                   nullptr, o_lat, b, n_heads, d_latent, d_rope, scale,
                                                                   sel);
    }
    KILN_CUDA_LAUNCH_CHECK();
  }
  mla_up_v_kernel<<<ceil_div(int64_t(rows) * d_v, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
      o_lat, kv_b, out, rows, n_heads, d_nope, d_v, d_latent);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
