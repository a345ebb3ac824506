// MoE: router logits, the three routing rules (mirroring the CPU reference
// exactly, ties to the lower expert id), the GEMV expert path (one block per
// (token, chosen expert) computes the whole gated MLP as matrix-vector products:
// the reference path, for every layout), the align that sorts the routed pairs by expert
// into the tile table of the fast paths (moe_gemm.cu's grouped mma.sync GEMMs,
// quant_gemm.cu, quant_gemv.cu), and the weighted combine.
#include <cfloat>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/pdl.cuh"
#include "backends/cuda/kernels/smem.cuh"

namespace kiln::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK = 16;
constexpr int kExpertThreads = 256;

// The router at up to kRouterTokens tokens: one block per expert reads the expert's row
// once into registers (every 16-byte load in flight at once) and dots it with each
// token's x (L2-resident). A warp per logit (below) reads a row as a chain of 2-3
// dependent rounds of loads, with only 128-256 warps on the GPU at one token: gpt-oss-120b
// one token 61.4 -> 58.1 us per MoE layer. From 32 tokens the warps are many and the
// block's reductions cost more (616 -> 636 us): the warp per logit again.
constexpr int kRouterThreads = 256;
constexpr int kRouterChunks = 4;  // 16-byte chunks of the row per thread: d_model <= 8192
constexpr int kRouterTokens = 8;

__global__ void __launch_bounds__(kRouterThreads)
    router_logits_rows_kernel(const bf16* x, const bf16* w, const float* bias, int64_t n_tokens, int64_t n_experts,
                              int64_t d, float* logits) {
  __shared__ float part[kRouterThreads / 32][kRouterTokens];
  pdl_wait();  // a dependent launch (pdl.cuh)
  const int64_t e = blockIdx.x;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  uint4 wv[kRouterChunks];
#pragma unroll
  for (int c = 0; c < kRouterChunks; ++c) {
    const int64_t i = (int64_t(c) * kRouterThreads + tid) * 8;
    wv[c] = i < d ? *reinterpret_cast<const uint4*>(w + e * d + i) : make_uint4(0, 0, 0, 0);
  }
  // Each chunk's token inputs are requested together (predicated loads, not a loop that
  // stops at n_tokens, which issued them one round trip after another: 9.5 us at eight
  // tokens of gpt-oss-120b against 4.4 at one, ncu).
  float acc[kRouterTokens] = {};
#pragma unroll
  for (int c = 0; c < kRouterChunks; ++c) {
    const int64_t i = (int64_t(c) * kRouterThreads + tid) * 8;
    if (i >= d) break;
    const bf16* wb = reinterpret_cast<const bf16*>(&wv[c]);
    uint4 xa[kRouterTokens];
#pragma unroll
    for (int t = 0; t < kRouterTokens; ++t)
      xa[t] = t < n_tokens ? __ldg(reinterpret_cast<const uint4*>(x + t * d + i)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int t = 0; t < kRouterTokens; ++t) {
      const bf16* xb = reinterpret_cast<const bf16*>(&xa[t]);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[t] += to_f(xb[k]) * to_f(wb[k]);
    }
  }
#pragma unroll
  for (int t = 0; t < kRouterTokens; ++t) {
    acc[t] = warp_sum(acc[t]);
    if (lane == 0) part[warp][t] = acc[t];
  }
  __syncthreads();
  if (tid < n_tokens) {
    float s = 0.0f;
#pragma unroll
    for (int v = 0; v < kRouterThreads / 32; ++v) s += part[v][tid];
    logits[tid * n_experts + e] = s + (bias ? bias[e] : 0.0f);
  }
}

// One warp per (token, expert), for rows the block-per-expert kernel does not take;
// 16-byte loads when rows are multiples of 8 elements.
__global__ void router_logits_kernel(const bf16* x, const bf16* w, const float* bias, int64_t n_tokens,
                                     int64_t n_experts, int64_t d, float* logits) {
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= n_tokens * n_experts) return;
  const int64_t t = warp / n_experts, e = warp % n_experts;
  const bf16* xr = x + t * d;
  const bf16* wr = w + e * d;
  float acc = 0.0f;
  if (d % 8 == 0) {
#pragma unroll 4
    for (int64_t i = lane * 8; i < d; i += 32 * 8) {
      const uint4 xa = *reinterpret_cast<const uint4*>(xr + i), wa = *reinterpret_cast<const uint4*>(wr + i);
      const bf16* xv = reinterpret_cast<const bf16*>(&xa);
      const bf16* wv = reinterpret_cast<const bf16*>(&wa);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc += to_f(xv[k]) * to_f(wv[k]);
    }
  } else {
    for (int64_t i = lane; i < d; i += 32) acc += to_f(xr[i]) * to_f(wr[i]);
  }
  acc = warp_sum(acc);
  if (lane == 0) logits[warp] = acc + (bias ? bias[e] : 0.0f);
}

// The largest (value, index) over the warp, ties to the lower index; every lane
// gets the result. Lanes with nothing to offer pass (-inf, INT_MAX).
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
}

// k rounds of warp argmax over the allowed entries of val (expert lane + 32 j in
// slot j), each round removing its winner: top-k, largest first, ties to the
// lower expert id (the CPU reference's order). Lane n gets the n-th expert (k <= 32):
// no array indexed by the round, so the rounds stay a loop, not 16 unrolled copies.
template <int kPer>
__device__ int warp_top_k(const float (&val)[kPer], bool (&allowed)[kPer], int k) {
  const int lane = int(threadIdx.x) % 32;
  int mine = -1;
#pragma unroll 1
  for (int n = 0; n < k; ++n) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (allowed[j] && (bi == INT_MAX || val[j] > bv)) bv = val[j], bi = lane + 32 * j;
    warp_argmax(bv, bi);
    if (lane == n) mine = bi;
    if (bi % 32 == lane) {
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (lane + 32 * j == bi) allowed[j] = false;
    }
  }
  return mine;
}

// Grouped top-k's groups: lane g holds group g's score; bit g of the result is set for the
// topk_group best groups (ties to the lower g).
__device__ __forceinline__ unsigned warp_top_groups(float my_group, const MoeRouting& r) {
  const int lane = int(threadIdx.x) % 32;
  unsigned kept = 0;
  for (int k = 0; k < r.topk_group; ++k) {
    float v = lane < r.n_group && !((kept >> lane) & 1u) ? my_group : -INFINITY;
    int i = lane < r.n_group && !((kept >> lane) & 1u) ? lane : INT_MAX;
    warp_argmax(v, i);
    kept |= 1u << i;
  }
  return kept;
}

// A token's routing from lane k's k-th chosen expert (global id; lanes >= top_k: -1) and
// its value w (the logit for rule 1, else its score; lanes >= top_k: 0): the reference's
// sequential arithmetic over k (sums in k order, a lane's terms broadcast in turn), each
// lane finishing its own k; experts / weights [t, k] written as launch_route says, lane
// k's expert also returned (-1 past top_k).
__device__ __forceinline__ int route_finish(float w, int chosen, const MoeRouting& r, int64_t t, int32_t* experts,
                                            float* weights) {
  const int lane = int(threadIdx.x) % 32, K = r.top_k;
  const auto sum_in_order = [&](float x) {
    float s = 0.0f;
#pragma unroll 1
    for (int k = 0; k < K; ++k) s += __shfl_sync(0xffffffffu, x, k);
    return s;
  };
  if (r.kind == 1) {
    w = __expf(w - __shfl_sync(0xffffffffu, w, 0));
    w /= sum_in_order(w);
  } else if (r.norm_topk_prob) {
    const float s = sum_in_order(w);
    w /= r.kind == 2 ? s + 1e-20f : s;
  }
  if (r.kind == 2) w *= r.routed_scaling_factor;
  if (lane >= K) return -1;
  // Local indices; experts another rank holds become -1 with weight 0 (launch_route).
  const int lo = r.first_local, hi = r.n_local > 0 ? lo + r.n_local : r.n_experts;
  const bool here = chosen >= lo && chosen < hi;
  experts[t * K + lane] = here ? chosen - lo : -1;
  weights[t * K + lane] = here ? w : 0.0f;
  return here ? chosen - lo : -1;
}

// One warp per token; expert e lives in lane e % 32, slot e / 32. The three
// rules mirror the CPU reference (cpu_moe.cpp) step by step.
template <int kPer>
__device__ void route_token(const float* logits, const float* correction, const MoeRouting& r, int64_t t,
                            int32_t* experts, float* weights) {
  const int lane = int(threadIdx.x) % 32;
  const float* lg = logits + t * r.n_experts;
  const int E = r.n_experts, K = r.top_k;
  float val[kPer], score[kPer];
  bool allowed[kPer];
  int chosen = -1;  // lane k: the k-th expert chosen (k < K)
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    allowed[j] = e < E;
    val[j] = e < E ? lg[e] : -INFINITY;
  }
  if (r.kind == 0) {  // softmax over all, top-k of the probabilities
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPer; ++j) mx = fmaxf(mx, val[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) sum += (score[j] = allowed[j] ? __expf(val[j] - mx) : 0.0f);
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < kPer; ++j) score[j] /= sum;
    chosen = warp_top_k(score, allowed, K);
  } else if (r.kind == 1) {  // top-k of the logits, softmax over the chosen
    chosen = warp_top_k(val, allowed, K);
  } else {  // sigmoid, correction bias, grouped top-k (DeepSeek-V3)
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = lane + 32 * j;
      score[j] = 1.0f / (1.0f + __expf(-val[j]));
      val[j] = e < E ? score[j] + (correction ? correction[e] : 0.0f) : -INFINITY;  // the choice score
    }
    // Group g's score = the sum of its two largest choice scores; lane g keeps it.
    const int per_group = E / r.n_group;
    float my_group = -INFINITY;
    for (int g = 0; g < r.n_group; ++g) {
      float a = -INFINITY, b = -INFINITY;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int e = lane + 32 * j;
        if (e >= g * per_group && e < (g + 1) * per_group) {
          if (val[j] > a) b = a, a = val[j];
          else if (val[j] > b) b = val[j];
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {  // merge the lanes' top-2 pairs
        const float oa = __shfl_xor_sync(0xffffffffu, a, o), ob = __shfl_xor_sync(0xffffffffu, b, o);
        const float hi = fmaxf(a, oa);
        b = fmaxf(fminf(a, oa), fmaxf(b, ob));
        a = hi;
      }
      if (lane == g) my_group = a + b;
    }
    const unsigned kept = warp_top_groups(my_group, r);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = lane + 32 * j;
      allowed[j] = e < E && ((kept >> (e / per_group)) & 1u);
    }
    chosen = warp_top_k(val, allowed, K);
  }
  // The chosen experts' values, fetched from their lanes into lane k's w.
  float w = 0.0f;
#pragma unroll 1
  for (int k = 0; k < K; ++k) {
    const int e = __shfl_sync(0xffffffffu, chosen, k);
    float mine = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (lane + 32 * j == e) mine = r.kind == 1 ? val[j] : score[j];
    const float v = __shfl_sync(0xffffffffu, mine, e % 32);
    if (lane == k) w = v;
  }
  route_finish(w, chosen, r, t, experts, weights);
}

template <int kPer>
__global__ void route_kernel(const float* logits, const float* correction, MoeRouting r, int64_t n_tokens,
                             int32_t* experts, float* weights) {
  pdl_wait();  // a dependent launch after the router (pdl.cuh)
  const int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (t < n_tokens) route_token<kPer>(logits, correction, r, t, experts, weights);
}

// ---- align: the (token, slot) pairs sorted by expert, and the tile table -------------

constexpr int kAlignThreads = 1024;
// Route and align in one block (launch_route_align): a warp per token, then the align.
// 16 warps, not 32: route_token over 512 experts takes 79 registers.
constexpr int kRouteAlignThreads = 512;

// Exclusive prefix sums of (a, b) over the block's kThreads threads; the totals go to
// *total.
template <int kThreads>
__device__ int2 block_exclusive_scan(int2 v, int2* total) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kThreads % 32 == 0 && kWarps <= 32);
  __shared__ int2 warp_sums[kWarps];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  int2 incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl.x, o), y = __shfl_up_sync(0xffffffffu, incl.y, o);
    if (lane >= o) incl.x += x, incl.y += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int2 w = lane < kWarps ? warp_sums[lane] : make_int2(0, 0);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, w.x, o), y = __shfl_up_sync(0xffffffffu, w.y, o);
      if (lane >= o) w.x += x, w.y += y;
    }
    if (lane < kWarps) warp_sums[lane] = w;
  }
  __syncthreads();
  const int2 before = warp > 0 ? warp_sums[warp - 1] : make_int2(0, 0);
  *total = warp_sums[kWarps - 1];
  return make_int2(incl.x - v.x + before.x, incl.y - v.y + before.y);
}

// The block's kThreads threads count the pairs per expert, scan them into row offsets
// and tile offsets (each thread kMoeAlignMaxExperts / kThreads consecutive experts),
// scatter the pair indices into perm and write the tile table (n_slots entries, the
// unused ones marked expert -1).
template <int kThreads>
__device__ void align_pairs(const int32_t* experts, int n_pairs, int n_experts, int bm, int32_t* perm, int4* tiles,
                            int n_slots) {
  constexpr int kPer = kMoeAlignMaxExperts / kThreads;
  static_assert(kPer * kThreads == kMoeAlignMaxExperts);
  __shared__ int count[kMoeAlignMaxExperts], cursor[kMoeAlignMaxExperts];
  const int tid = int(threadIdx.x);
#pragma unroll 1
  for (int e = tid; e < n_experts; e += kThreads) count[e] = 0;
  __syncthreads();
#pragma unroll 1
  for (int i = tid; i < n_pairs; i += kThreads)
    if (experts[i] >= 0) atomicAdd(&count[experts[i]], 1);  // -1: another rank's expert
  __syncthreads();
  int n[kPer];
  int2 mine = make_int2(0, 0);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = tid * kPer + j;
    n[j] = e < n_experts ? count[e] : 0;
    mine.x += n[j], mine.y += (n[j] + bm - 1) / bm;
  }
  int2 total;
  int2 off = block_exclusive_scan<kThreads>(mine, &total);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = tid * kPer + j;
    if (e >= n_experts) break;
    cursor[e] = off.x;
#pragma unroll 1
    for (int k = 0; k * bm < n[j]; ++k) tiles[off.y + k] = make_int4(e, off.x + k * bm, min(bm, n[j] - k * bm), 0);
    off.x += n[j], off.y += (n[j] + bm - 1) / bm;
  }
  __syncthreads();
#pragma unroll 1
  for (int i = tid; i < n_pairs; i += kThreads)
    if (experts[i] >= 0) perm[atomicAdd(&cursor[experts[i]], 1)] = i;
#pragma unroll 1
  for (int x = total.y + tid; x < n_slots; x += kThreads) tiles[x] = make_int4(-1, 0, 0, 0);
}

__global__ void __launch_bounds__(kAlignThreads)
    moe_align_kernel(const int32_t* experts, int n_pairs, int n_experts, int bm, int32_t* perm, int4* tiles,
                     int n_slots) {
  pdl_wait();  // a dependent launch after the routing (pdl.cuh)
  align_pairs<kAlignThreads>(experts, n_pairs, n_experts, bm, perm, tiles, n_slots);
}

// A warp per token routes, then the block aligns what it routed: one kernel boundary
// fewer in a decode step (the global writes of route_token are visible to the block
// after the barrier).
template <int kPer>
__global__ void __launch_bounds__(kRouteAlignThreads)
    route_align_kernel(const float* logits, const float* correction, MoeRouting r, int n_tokens, int32_t* experts,
                       float* weights, int n_experts, int bm, int32_t* perm, int4* tiles, int n_slots) {
  pdl_wait();  // a dependent launch after the router (pdl.cuh)
#pragma unroll 1
  for (int t = int(threadIdx.x) / 32; t < n_tokens; t += kRouteAlignThreads / 32)
    route_token<kPer>(logits, correction, r, t, experts, weights);
  __syncthreads();
  align_pairs<kRouteAlignThreads>(experts, n_tokens * r.top_k, n_experts, bm, perm, tiles, n_slots);
}

// One token (a one-stream decode step): route_token's rules with a thread per expert
// (expert e in thread e: warp e / 32, lane e % 32, as route_token's lane and slot), the
// top-k by ranks instead of k rounds of warp argmax, and the tiles laid out by one warp
// without align's counts and scans. The same values as route_token (every sum in its
// order, ties to the lower id) and, the top_k experts being distinct, each local one a
// tile of one row whose place is its expert's rank among them: align_pairs' tiles and
// perm, bit for bit.
template <int kPer>
__global__ void __launch_bounds__(32 * kPer)
    route_one_kernel(const float* logits, const float* correction, MoeRouting r, int32_t* experts, float* weights,
                     int32_t* perm, int4* tiles, int n_slots) {
  constexpr int kE = 32 * kPer;
  __shared__ float s_val[kE];
  __shared__ float s_red[kPer];
  __shared__ int s_chosen[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  __shared__ unsigned s_kept;
  pdl_wait();  // a dependent launch after the router (pdl.cuh)
  const int e = int(threadIdx.x), lane = e % 32, warp = e / 32, E = r.n_experts, K = r.top_k;
  if (e < kMaxTopK) s_chosen[e] = -1, s_w[e] = 0.0f;  // (fewer allowed than k: those slots get no expert)
  bool allowed = e < E;
  const float v = allowed ? logits[e] : -INFINITY;
  float score = 0.0f, choice = v;  // score: the weight's source (rules 0, 2); choice: what ranks
  if (r.kind == 0) {  // softmax over all, top-k of the probabilities
    const float m = warp_max(v);
    if (lane == 0) s_red[warp] = m;
    __syncthreads();
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPer; ++j) mx = fmaxf(mx, s_red[j]);
    s_val[e] = score = allowed ? __expf(v - mx) : 0.0f;
    __syncthreads();
    if (warp == 0) {  // route_token's sum: lane l adds its slots in order, then the butterfly
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kPer; ++j) sum += s_val[lane + 32 * j];
      sum = warp_sum(sum);
      if (lane == 0) s_red[0] = sum;
    }
    __syncthreads();
    score /= s_red[0];
    choice = score;
  } else if (r.kind == 2) {  // sigmoid, correction bias, grouped top-k
    score = 1.0f / (1.0f + __expf(-v));
    choice = allowed ? score + (correction ? correction[e] : 0.0f) : -INFINITY;
    if (r.n_group > 1) {
      s_val[e] = choice;
      __syncthreads();
      // Group g's score (the sum of its two largest choices, route_token's top-2 merge),
      // in lane g of warp 0; then the topk_group best, ties to the lower g.
      if (warp == 0) {
        const int per_group = E / r.n_group;
        float a = -INFINITY, b = -INFINITY;
        if (lane < r.n_group) {
#pragma unroll 1
          for (int f = lane * per_group; f < (lane + 1) * per_group; ++f) {
            const float x = s_val[f];
            if (x > a) b = a, a = x;
            else if (x > b) b = x;
          }
        }
        const unsigned kept = warp_top_groups(lane < r.n_group ? a + b : -INFINITY, r);
        if (lane == 0) s_kept = kept;
      }
      __syncthreads();
      allowed = allowed && ((s_kept >> (e / (E / r.n_group))) & 1u);
    }
  }
  // Rank among the allowed: larger first, ties to the lower id (k rounds of argmax's order).
  s_val[e] = allowed ? choice : -INFINITY;
  __syncthreads();
  if (allowed) {
    int rank = 0;
#pragma unroll 4
    for (int f = 0; f < kE; ++f) {
      const float x = s_val[f];
      rank += x > choice || (x == choice && f < e);
    }
    if (rank < K) s_chosen[rank] = e, s_w[rank] = r.kind == 1 ? v : score;
  }
  __syncthreads();
  if (warp != 0) return;
  // The tiles: lane k's local expert (-1: another rank's).
  const int le = route_finish(lane < K ? s_w[lane] : 0.0f, lane < K ? s_chosen[lane] : -1, r, 0, experts, weights);
  int place = 0;
#pragma unroll 1
  for (int j = 0; j < K; ++j) {
    const int o = __shfl_sync(0xffffffffu, le, j);
    place += o >= 0 && o < le;
  }
  const int n_tiles = __popc(__ballot_sync(0xffffffffu, le >= 0));
  if (le >= 0) perm[place] = lane, tiles[place] = make_int4(le, place, 1, 0);
#pragma unroll 1
  for (int x = n_tiles + lane; x < n_slots; x += 32) tiles[x] = make_int4(-1, 0, 0, 0);
}

// Row r of a logical [n_out, n_in] matrix dotted with v (fp32, in shared memory),
// by one warp; `transposed`: stored [n_in, n_out].
__device__ float row_dot(const bf16* w, bool transposed, int64_t n_out, int64_t n_in, int64_t r, const float* v) {
  float acc = 0.0f;
  const int lane = threadIdx.x % 32;
  if (!transposed) {
    const bf16* row = w + r * n_in;
    for (int64_t i = lane; i < n_in; i += 32) acc += to_f(row[i]) * v[i];
  } else {
    for (int64_t i = lane; i < n_in; i += 32) acc += to_f(w[i * n_out + r]) * v[i];
  }
  return warp_sum(acc);
}

// One block per (token, slot): act = glu(gate x, up x) in shared memory, then
// y = down act (+ bias), unweighted, into scratch[t, slot, :].
__global__ void expert_mlp_kernel(const bf16* x, const ExpertWeights* table, const int32_t* experts, MoeShape s,
                                  int top_k, float* scratch) {
  extern __shared__ float smem[];
  float* xs = smem;             // [d_model]
  float* act = smem + s.d_model;  // [d_ff]
  const int64_t ts = blockIdx.x, t = ts / top_k;
  if (experts[ts] < 0) return;  // another rank's expert
  const ExpertWeights ew = table[experts[ts]];
  for (int64_t i = threadIdx.x; i < s.d_model; i += blockDim.x) xs[i] = to_f(x[t * s.d_model + i]);
  __syncthreads();
  const int warp = threadIdx.x / 32, n_warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int64_t r = warp; r < s.d_ff; r += n_warps) {
    float g, u;
    int64_t gr = r, ur = r;
    if (ew.gate_up) {
      gr = s.interleaved ? 2 * r : r;
      ur = s.interleaved ? 2 * r + 1 : s.d_ff + r;
      g = row_dot(ew.gate_up, s.transposed, 2 * s.d_ff, s.d_model, gr, xs);
      u = row_dot(ew.gate_up, s.transposed, 2 * s.d_ff, s.d_model, ur, xs);
    } else {
      g = row_dot(ew.gate, s.transposed, s.d_ff, s.d_model, r, xs);
      u = row_dot(ew.up, s.transposed, s.d_ff, s.d_model, r, xs);
    }
    if (ew.gate_up_bias) g += ew.gate_up_bias[gr], u += ew.gate_up_bias[ur];
    // act goes to the down projection as bf16, like the grouped path's.
    if (lane == 0) act[r] = to_f(__float2bfloat16(glu_value(g, u, s.glu_kind, s.alpha, s.limit)));
  }
  __syncthreads();
  for (int64_t o = warp; o < s.d_model; o += n_warps) {
    float y = row_dot(ew.down, s.transposed, s.d_model, s.d_ff, o, act);
    if (lane == 0) scratch[ts * s.d_model + o] = y + (ew.down_bias ? ew.down_bias[o] : 0.0f);
  }
}

// out[t] = sum over slots in ascending expert id of w * y (fixed order); slots of
// expert -1 (another rank's) are never visited. A decode step has one to a few
// tokens, so a token's row is cut over several blocks of kCombineThreads threads,
// kVec consecutive elements each; the slot order is worked out once per block, and
// every slot's values are requested before the first is added (the loads are
// independent: no chain of dependent global reads per element).
constexpr int kCombineThreads = 128;
template <int kVec>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const float* scratch, const int32_t* experts, const float* weights, int64_t n_tokens, int top_k,
                   int64_t d_model, bf16* out) {
  __shared__ int order[kMaxTopK];  // slots by increasing expert id, then -1 (other ranks' experts)
  __shared__ float weight[kMaxTopK];
  pdl_wait();  // a dependent launch after the down projection (pdl.cuh)
  const int tid = int(threadIdx.x);
  const int64_t i = (int64_t(blockIdx.x) * kCombineThreads + tid) * kVec;
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    __syncthreads();  // the previous token's order is read
    if (tid < kMaxTopK) order[tid] = -1;
    __syncthreads();
    if (tid < top_k) {
      const int e = experts[t * top_k + tid];
      int rank = 0;  // slots of a lower expert id (top-k picks distinct experts)
      for (int k = 0; k < top_k; ++k) {
        const int o = experts[t * top_k + k];
        rank += o >= 0 && o < e;
      }
      if (e >= 0) order[rank] = tid, weight[rank] = weights[t * top_k + tid];
    }
    __syncthreads();
    if (i >= d_model) continue;
    float v[kMaxTopK][kVec];
#pragma unroll
    for (int n = 0; n < kMaxTopK; ++n) {
      if (n >= top_k || order[n] < 0) break;
      const float* y = scratch + (t * top_k + order[n]) * d_model + i;
      if constexpr (kVec == 4) {
        const float4 q = *reinterpret_cast<const float4*>(y);
        v[n][0] = q.x, v[n][1] = q.y, v[n][2] = q.z, v[n][3] = q.w;
      } else {
        v[n][0] = *y;
      }
    }
    float acc[kVec] = {};
#pragma unroll
    for (int n = 0; n < kMaxTopK; ++n) {
      if (n >= top_k || order[n] < 0) break;
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] += weight[n] * v[n][j];
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[t * d_model + i + j] = __float2bfloat16(acc[j]);
  }
}

// The same sums for prefill-shaped calls: a block per token, which ranks its slots once
// (a lane per slot, the ranks by shuffles: one barrier) and streams the whole row, each
// thread's loads of up to 8 slots in flight together, where combine_kernel's blocks of a
// token each redo the ranking (three barriers, a loop of reads) for 2 KB of the row.
// H200, kiln bench op, a MoE layer alternated against combine_kernel in one run: at
// 2,048 / 8,192 rows Qwen3-30B-A3B 722 -> 718-724 / 2,346-2,381 -> 2,328-2,412 us (level),
// a TP2 rank's part 460.3-461.0 -> 451.8-454.7 / 1,441.6-1,446.5 -> 1,409.6-1,415.0, a TP4
// rank's 316-319 -> 311-317 / 977-980 -> 955-963, an EP2 rank's 404-405 -> 396-400 /
// 1,266 -> 1,234-1,241 (docs/perf/multi-gpu.md, twenty-third section).
constexpr int kCombineRowThreads = 256;
constexpr int kCombineRowTokens = 16;  // from this many tokens (below: combine_kernel)
__global__ void __launch_bounds__(kCombineRowThreads, 3)
    combine_rows_kernel(const float* scratch, const int32_t* experts, const float* weights, int top_k,
                        int64_t d_model, bf16* out) {
  __shared__ int order[kMaxTopK];
  __shared__ float weight[kMaxTopK];
  __shared__ int n_live;
  pdl_wait();  // a dependent launch after the down projection (pdl.cuh)
  const int64_t t = blockIdx.x;
  const int tid = int(threadIdx.x);
  if (tid < 32) {
    const int e = tid < top_k ? experts[t * top_k + tid] : -1;
    const float w = tid < top_k ? weights[t * top_k + tid] : 0.0f;
    int rank = 0, live = 0;  // slots of a lower expert id (top-k picks distinct experts)
    for (int k = 0; k < top_k; ++k) {
      const int o = __shfl_sync(0xffffffffu, e, k);
      rank += o >= 0 && o < e;
      live += o >= 0;
    }
    if (e >= 0) order[rank] = tid, weight[rank] = w;
    if (tid == 0) n_live = live;
  }
  __syncthreads();
  const int n = n_live;
  const float* y = scratch + t * top_k * d_model;
  constexpr int kSlots = 8;  // slots whose loads are in flight together (74 registers: 3 CTAs an SM)
  for (int64_t i = int64_t(tid) * 4; i < d_model; i += kCombineRowThreads * 4) {
    float acc[4] = {};
    for (int k0 = 0; k0 < n; k0 += kSlots) {
      float4 v[kSlots];
#pragma unroll
      for (int k = 0; k < kSlots; ++k)
        if (k0 + k < n) v[k] = *reinterpret_cast<const float4*>(y + order[k0 + k] * d_model + i);
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        if (k0 + k >= n) break;
        const float w = weight[k0 + k];
        acc[0] += w * v[k].x, acc[1] += w * v[k].y, acc[2] += w * v[k].z, acc[3] += w * v[k].w;
      }
    }
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out + t * d_model + i);
    o[0] = __floats2bfloat162_rn(acc[0], acc[1]);
    o[1] = __floats2bfloat162_rn(acc[2], acc[3]);
  }
}

void check_routing(const MoeRouting& r) {
  KILN_CHECK(r.n_experts <= kMaxExperts && r.top_k <= kMaxTopK && r.n_group <= 32 && r.n_group >= 1 &&
             r.n_experts % r.n_group == 0)
      << "route: " << r.n_experts << " experts in " << r.n_group << " groups, top " << r.top_k << " (supported: up to "
      << kMaxExperts << " experts, 32 groups, top " << kMaxTopK << ")";
}

// go(std::integral_constant<int, kPer>) for the routing's experts per lane (route_token).
template <typename Go>
void with_experts_per_lane(int n_experts, Go&& go) {
  if (n_experts <= 32) go(std::integral_constant<int, 1>{});
  else if (n_experts <= 64) go(std::integral_constant<int, 2>{});
  else if (n_experts <= 128) go(std::integral_constant<int, 4>{});
  else if (n_experts <= 256) go(std::integral_constant<int, 8>{});
  else go(std::integral_constant<int, 16>{});
}

}  // namespace

void launch_router_logits(const bf16* x, const bf16* router, const float* bias, int64_t n_tokens, int64_t n_experts,
                          int64_t d_model, float* logits, cudaStream_t stream) {
  const int64_t warps = n_tokens * n_experts;
  if (warps == 0) return;
  if (n_tokens <= kRouterTokens && d_model % 8 == 0 && d_model <= int64_t(kRouterThreads) * 8 * kRouterChunks) {
    launch_dependent(router_logits_rows_kernel, unsigned(n_experts), kRouterThreads, 0, stream, x, router, bias,
                     n_tokens, n_experts, d_model, logits);
    KILN_CUDA_LAUNCH_CHECK();
    return;
  }
  router_logits_kernel<<<ceil_div(warps * 32, 256), 256, 0, stream>>>(x, router, bias, n_tokens, n_experts, d_model,
                                                                      logits);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_route(const float* logits, const float* correction_bias, const MoeRouting& r, int64_t n_tokens,
                  int32_t* experts, float* weights, cudaStream_t stream) {
  check_routing(r);
  if (n_tokens == 0) return;
  const unsigned blocks = unsigned(ceil_div(n_tokens * 32, 128));
  with_experts_per_lane(r.n_experts, [&](auto per) {
    launch_dependent(route_kernel<decltype(per)::value>, blocks, 128, 0, stream, logits, correction_bias, r, n_tokens,
                     experts, weights);
  });
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_moe_align(const int32_t* experts, int64_t n_pairs, int n_experts, int bm, int32_t* perm, int4* tiles,
                      int n_slots, cudaStream_t stream) {
  KILN_CHECK(n_experts <= kMoeAlignMaxExperts)
      << "moe align: " << n_experts << " experts (at most " << kMoeAlignMaxExperts << ")";
  launch_dependent(moe_align_kernel, 1, kAlignThreads, 0, stream, experts, int(n_pairs), n_experts, bm, perm, tiles,
                   n_slots);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_route_align(const float* logits, const float* correction_bias, const MoeRouting& r, int64_t n_tokens,
                        int32_t* experts, float* weights, int n_experts, int bm, int32_t* perm, int4* tiles,
                        int n_slots, cudaStream_t stream) {
  check_routing(r);
  KILN_CHECK(n_tokens <= kRouteAlignMaxTokens) << "route + align: " << n_tokens << " tokens";
  KILN_CHECK(n_experts <= kMoeAlignMaxExperts)
      << "moe align: " << n_experts << " experts (at most " << kMoeAlignMaxExperts << ")";
  if (n_tokens == 0) return;
  if (n_tokens == 1) {
    with_experts_per_lane(r.n_experts, [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      launch_dependent(route_one_kernel<kPer>, 1, 32 * kPer, 0, stream, logits, correction_bias, r, experts, weights,
                       perm, tiles, n_slots);
    });
    KILN_CUDA_LAUNCH_CHECK();
    return;
  }
  with_experts_per_lane(r.n_experts, [&](auto per) {
    launch_dependent(route_align_kernel<decltype(per)::value>, 1, kRouteAlignThreads, 0, stream, logits,
                     correction_bias, r, int(n_tokens), experts, weights, n_experts, bm, perm, tiles, n_slots);
  });
  KILN_CUDA_LAUNCH_CHECK();
}

const char* moe_path_name(MoePath path) {
  switch (path) {
    case MoePath::kAuto: return "auto";
    case MoePath::kGemv: return "gemv";
    case MoePath::kGrouped: return "grouped mma.sync";
    case MoePath::kStreamGemv: return "streaming gemv";
  }
  return "?";
}

int moe_gemv_smem_bytes(const MoeShape& s) { return int(size_t(s.d_model + s.d_ff) * sizeof(float)); }

void launch_moe_gemv(const bf16* x, const ExpertWeights* expert_table, const int32_t* experts, const MoeShape& s,
                     int64_t n_tokens, int top_k, float* y, int smem_cap, cudaStream_t stream) {
  if (n_tokens == 0) return;
  const int smem = moe_gemv_smem_bytes(s);
  KILN_CHECK(smem <= smem_cap) << "moe gemv: d_model " << s.d_model << " + d_ff " << s.d_ff << " floats need "
                               << smem << " bytes of shared memory, cap " << smem_cap;
  prepare_smem(expert_mlp_kernel, smem);
  expert_mlp_kernel<<<unsigned(n_tokens * top_k), kExpertThreads, smem, stream>>>(x, expert_table, experts, s, top_k,
                                                                                  y);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_moe_combine(const float* y, const int32_t* experts, const float* weights, int64_t n_tokens, int top_k,
                        int64_t d_model, bf16* out, cudaStream_t stream) {
  if (n_tokens == 0) return;
  KILN_CHECK(top_k <= kMaxTopK) << "moe combine: top " << top_k << " (at most " << kMaxTopK << ")";
  // (Pairs of bf16 stored at once: an out view 8-byte aligned, as every row of an
  // allocated one is when d_model % 4 == 0.)
  if (n_tokens >= kCombineRowTokens && d_model % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
    launch_dependent(combine_rows_kernel, unsigned(n_tokens), kCombineRowThreads, 0, stream, y, experts, weights, top_k,
                     d_model, out);
    KILN_CUDA_LAUNCH_CHECK();
    return;
  }
  const int vec = d_model % 4 == 0 ? 4 : 1;
  const dim3 grid(unsigned(ceil_div(d_model, int64_t(kCombineThreads) * vec)),
                  unsigned(std::min<int64_t>(n_tokens, 65535)));
  const auto kernel = vec == 4 ? combine_kernel<4> : combine_kernel<1>;
  launch_dependent(kernel, grid, kCombineThreads, 0, stream, y, experts, weights, n_tokens, top_k, d_model, out);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
