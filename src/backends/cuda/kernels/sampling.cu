// Token sampling and logprobs (ops::SampleArgs) without a sort: one CTA per row of bf16
// logits, a radix select over the 16-bit candidate key of each logit.
//
// The candidate order (logit descending, ids ascending on ties) is ascending `key`, then
// ascending id, where key is the bf16 bit pattern made order-reversing (below). Every
// candidate at one key has the same logit, so the same probability: a filter or a draw
// crosses the order at one key, and only the rank among that key's ids is left to find.
// A query "the first key whose inclusive prefix (of counts, or of probability mass) exceeds
// x" is answered by a 2048-bin histogram of the key's top 11 bits (one pass over the row,
// shared by all queries) and a 32-bin histogram of the low 5 bits inside the chosen bin
// (one pass per round of queries). 11 + 5 rather than 8 + 8: logits cluster in a few
// octaves, and 8 top bits (sign + 7 exponent bits) would put most of a row into a handful
// of bins, serialising the shared-memory atomics.
//
// Masses are exact: a candidate's unnormalised probability e = exp((logit - max) / T) in
// (0, 1] is rounded once to 40-bit fixed point (uint64), so every sum is an integer sum,
// independent of order (deterministic run to run) and consistent between passes; the sums
// fit 64 bits for vocabularies up to 2^24. Per row:
//   pass 1: max key + lowest id (the greedy token, the max logit);
//   pass 2: the coarse histograms of count and mass, sum e^(logit - max) for the logprobs,
//           the count and mass of the min-p set (e >= min_p);
//   fine passes: top-k and top-n (by count), then top-p (by mass), then the draw (by mass);
//   collect pass: the draw's rank among the ids at its key, and the top-n candidates, by a
//           block-wide scan over the row in id order.
// Greedy rows run pass 1 only (plus pass 2, a fine pass and the collect pass for logprobs).
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;                      // bf16 per 16-byte load
constexpr int kLoads = 4;                    // loads in flight per thread per tile
constexpr int kSub = kThreads * kVec;        // one load by every thread: a sub-tile
constexpr int kTile = kSub * kLoads;         // elements per tile
constexpr int kCoarseBits = 11, kFineBits = 16 - kCoarseBits;
constexpr int kCoarseBins = 1 << kCoarseBits, kFineBins = 1 << kFineBits;
constexpr int kBinsPerThread = kCoarseBins / kThreads;
constexpr float kFixedOne = 0x1p40f;         // fixed-point scale of the masses
static_assert(kFineBins == 32, "the fine histogram is one warp wide");
static_assert(kCoarseBins % kThreads == 0);

// The candidate key: ascending key = logit descending. Negative bf16 patterns already
// grow with magnitude; positive ones are reversed below them. -0 is +0 (they tie).
__device__ __forceinline__ uint32_t key_of(uint32_t bits) {
  if (bits == 0x8000u) bits = 0;
  return (bits & 0x8000u) ? bits : (~bits & 0x7fffu);
}
__device__ __forceinline__ float logit_of_key(uint32_t key) {
  const uint32_t bits = (key & 0x8000u) ? key : (~key & 0x7fffu);
  return __uint_as_float(bits << 16);
}
__device__ __forceinline__ float logit_of_bits(uint32_t bits) { return __uint_as_float(bits << 16); }

// e = exp((logit - max) / T) in 40-bit fixed point. One function for every pass, so a
// candidate's mass is the same number wherever it is computed.
__device__ __forceinline__ uint64_t mass_of(float logit, float max_logit, float temperature) {
  return __float2ull_rn(expf((logit - max_logit) / temperature) * kFixedOne);
}

struct Pair {
  uint64_t count, mass;
};

// The crossing of a query in the coarse histogram: its bin and what comes before it.
struct Coarse {
  int bin;
  uint32_t count_before;
  uint64_t mass_before;
};

// One key of the candidate order: the candidates before it and those at it.
struct Level {
  uint32_t key;
  uint32_t above;        // candidates before this key
  uint64_t mass_above;   // their mass
  uint32_t count;        // candidates at this key
  uint64_t mass;         // the mass of one candidate at this key
};

// A mass bin is a 64-bit integer kept as two 32-bit words: a 64-bit shared-memory atomic
// add compiles to a compare-and-swap loop (ATOMS.CAST.SPIN.64 on sm_90), which made the
// histogram pass 5x slower than two 32-bit adds (483 vs 99 us for a 201088-entry row on
// an H100). Whoever wraps the low word carries into the high word, so the sum is exact.
__device__ __forceinline__ void add_mass(uint32_t* lo, uint32_t* hi, uint64_t w) {
  const uint32_t l = uint32_t(w), old = atomicAdd(lo, l);
  const uint32_t h = uint32_t(w >> 32) + (old + l < old ? 1u : 0u);
  if (h) atomicAdd(hi, h);
}
__device__ __forceinline__ uint64_t mass_at(const uint32_t* lo, const uint32_t* hi, int i) {
  return uint64_t(hi[i]) << 32 | lo[i];
}

struct Shared {
  uint32_t coarse_count[kCoarseBins];
  uint32_t coarse_mass_lo[kCoarseBins], coarse_mass_hi[kCoarseBins];
  uint32_t fine_count[2][kFineBins];
  uint32_t fine_mass_lo[2][kFineBins], fine_mass_hi[2][kFineBins];
  Pair scan[kWarps];
  uint64_t reduce[4][kWarps];
  Coarse coarse[2];
  Level level[2];
  uint32_t top_key[kSampleMaxTop];
  int32_t top_id[kSampleMaxTop];
  uint32_t n_above;
  int32_t draw_id;
};

// This thread's elements [tile + q * kSub + 8 * thread, + 8) for q < kLoads, packed bf16
// bits (zero past the end). Aligned rows take 16-byte loads.
__device__ __forceinline__ void load_tile(const uint16_t* row, int vocab, bool aligned, int tile,
                                          uint4 (&raw)[kLoads]) {
#pragma unroll
  for (int q = 0; q < kLoads; ++q) {
    const int e0 = tile + q * kSub + threadIdx.x * kVec;
    if (aligned && e0 + kVec <= vocab) {
      raw[q] = __ldg(reinterpret_cast<const uint4*>(row + e0));
    } else {
      uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        if (e0 + i < vocab) w[i / 2] |= uint32_t(row[e0 + i]) << (16 * (i % 2));
      raw[q] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

__device__ __forceinline__ uint32_t bits_at(const uint4 (&raw)[kLoads], int q, int i) {
  const uint32_t w = i / 2 == 0 ? raw[q].x : i / 2 == 1 ? raw[q].y : i / 2 == 2 ? raw[q].z : raw[q].w;
  return (w >> (16 * (i % 2))) & 0xffffu;
}

__device__ __forceinline__ int element_id(int tile, int q, int i) { return tile + q * kSub + threadIdx.x * kVec + i; }

// f(tile, raw) for every tile of the row, in order, while f returns true. The next tile's
// loads are issued before f runs on this one (a single block streams the whole row, so
// the pass is latency bound without them). Every thread must return the same value.
template <typename F>
__device__ __forceinline__ void for_each_tile(const uint16_t* row, int vocab, bool aligned, F&& f) {
  uint4 cur[kLoads];
  load_tile(row, vocab, aligned, 0, cur);
  for (int tile = 0; tile < vocab; tile += kTile) {
    uint4 next[kLoads];
    const bool more = tile + kTile < vocab;
    if (more) load_tile(row, vocab, aligned, tile + kTile, next);
    if (!f(tile, cur)) return;
    if (more) {
#pragma unroll
      for (int q = 0; q < kLoads; ++q) cur[q] = next[q];
    }
  }
}

// f(id, bits) for every element of the row (in no particular order).
template <typename F>
__device__ __forceinline__ void for_each_element(const uint16_t* row, int vocab, bool aligned, F&& f) {
  for_each_tile(row, vocab, aligned, [&](int tile, const uint4(&raw)[kLoads]) {
#pragma unroll
    for (int q = 0; q < kLoads; ++q)
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        if (element_id(tile, q, i) < vocab) f(element_id(tile, q, i), bits_at(raw, q, i));
    return true;
  });
}

// ---- block-wide reductions and scans (every thread calls; results in every thread) ----

__device__ uint64_t block_min(uint64_t v, Shared& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) s.reduce[0][threadIdx.x / 32] = v;
  __syncthreads();
  uint64_t r = s.reduce[0][0];
  for (int w = 1; w < kWarps; ++w) r = min(r, s.reduce[0][w]);
  __syncthreads();
  return r;
}

// Sums of N values per thread; integer sums, so any order gives the same result.
template <int N>
__device__ void block_sum(uint64_t (&v)[N], Shared& s) {
  static_assert(N <= 4);
#pragma unroll
  for (int k = 0; k < N; ++k) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
    if (threadIdx.x % 32 == 0) s.reduce[k][threadIdx.x / 32] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) {
    v[k] = 0;
    for (int w = 0; w < kWarps; ++w) v[k] += s.reduce[k][w];
  }
  __syncthreads();
}

// Exclusive prefix of v over threads in thread order, and the block total.
__device__ Pair block_exclusive_scan(Pair v, Shared& s, Pair& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  Pair incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t c = __shfl_up_sync(0xffffffffu, incl.count, o), m = __shfl_up_sync(0xffffffffu, incl.mass, o);
    if (lane >= o) incl.count += c, incl.mass += m;
  }
  if (lane == 31) s.scan[warp] = incl;
  __syncthreads();
  if (warp == 0) {  // inclusive prefix of the warp totals
    Pair w = lane < kWarps ? s.scan[lane] : Pair{0, 0};
#pragma unroll
    for (int o = 1; o < kWarps; o <<= 1) {
      const uint64_t c = __shfl_up_sync(0xffffffffu, w.count, o), m = __shfl_up_sync(0xffffffffu, w.mass, o);
      if (lane >= o) w.count += c, w.mass += m;
    }
    if (lane < kWarps) s.scan[lane] = w;
  }
  __syncthreads();
  const Pair before = warp ? s.scan[warp - 1] : Pair{0, 0};
  total = s.scan[kWarps - 1];
  __syncthreads();  // s.scan is reused by the next call
  return {before.count + incl.count - v.count, before.mass + incl.mass - v.mass};
}

// ---- queries ---------------------------------------------------------------------------

// The coarse bin where the inclusive prefix (of counts, or of masses when by_mass) first
// exceeds x, into s.coarse[q]. x is below the row's total, so exactly one thread finds it.
__device__ void coarse_find(Shared& s, int q, bool by_mass, uint64_t x) {
  const int b0 = threadIdx.x * kBinsPerThread;
  Pair local{0, 0};
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    local.count += s.coarse_count[b0 + i];
    local.mass += mass_at(s.coarse_mass_lo, s.coarse_mass_hi, b0 + i);
  }
  if (threadIdx.x == 0) s.coarse[q] = {kCoarseBins - 1, 0, 0};  // never read unless x was out of range
  Pair total;
  const Pair before = block_exclusive_scan(local, s, total);  // synchronises after the write above
  const uint64_t lo = by_mass ? before.mass : before.count, n = by_mass ? local.mass : local.count;
  if (lo <= x && x < lo + n) {
    uint64_t c = before.count, m = before.mass;
    for (int i = 0; i < kBinsPerThread; ++i) {
      const uint64_t bc = s.coarse_count[b0 + i], bm = mass_at(s.coarse_mass_lo, s.coarse_mass_hi, b0 + i);
      if (x < (by_mass ? m + bm : c + bc)) {
        s.coarse[q] = {b0 + i, uint32_t(c), m};
        break;
      }
      c += bc, m += bm;
    }
  }
  __syncthreads();
}

// Histograms the low bits of the keys in coarse bin s.coarse[q].bin, for the queries q < n.
__device__ void fine_pass(const uint16_t* row, int vocab, bool aligned, int n, bool with_mass, float max_logit,
                          float temperature, Shared& s) {
  for (int i = threadIdx.x; i < 2 * kFineBins; i += kThreads) {
    s.fine_count[i / kFineBins][i % kFineBins] = 0;
    s.fine_mass_lo[i / kFineBins][i % kFineBins] = 0;
    s.fine_mass_hi[i / kFineBins][i % kFineBins] = 0;
  }
  __syncthreads();
  const int bin0 = s.coarse[0].bin, bin1 = n > 1 ? s.coarse[1].bin : -1;
  for_each_element(row, vocab, aligned, [&](int, uint32_t bits) {
    const uint32_t key = key_of(bits);
    const int bin = int(key >> kFineBits), f = int(key % kFineBins);
    if (bin != bin0 && bin != bin1) return;
    const uint64_t w = with_mass ? mass_of(logit_of_bits(bits), max_logit, temperature) : 0;
    for (int q = 0; q < n; ++q) {
      if (bin != (q ? bin1 : bin0)) continue;
      atomicAdd(&s.fine_count[q][f], 1u);
      if (with_mass) add_mass(&s.fine_mass_lo[q][f], &s.fine_mass_hi[q][f], w);
    }
  });
  __syncthreads();
}

// The key where query q's inclusive prefix first exceeds x (after coarse_find and
// fine_pass), into s.level[q]. One warp scans the 32 fine bins.
__device__ void fine_find(Shared& s, int q, bool by_mass, uint64_t x) {
  if (threadIdx.x < 32) {
    const int f = threadIdx.x;
    const Coarse c = s.coarse[q];
    const uint64_t n = s.fine_count[q][f], w = mass_at(s.fine_mass_lo[q], s.fine_mass_hi[q], f);
    uint64_t cn = n, cw = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t a = __shfl_up_sync(0xffffffffu, cn, o), b = __shfl_up_sync(0xffffffffu, cw, o);
      if (f >= o) cn += a, cw += b;
    }
    const uint64_t rel = x - (by_mass ? c.mass_before : c.count_before);
    const unsigned hit = __ballot_sync(0xffffffffu, (by_mass ? cw : cn) > rel);
    // No hit only for an x out of range (a caller bug): take the bin's last key.
    const int at = hit ? __ffs(hit) - 1 : 31 - __clz(__ballot_sync(0xffffffffu, n > 0) | 1u);
    if (f == at) {
      s.level[q] = {uint32_t(c.bin) << kFineBits | uint32_t(f), c.count_before + uint32_t(cn - n),
                    c.mass_before + (cw - w), uint32_t(n), n ? w / n : 0};
    }
  }
  __syncthreads();
}

// The collect pass over the row in id order: the id of rank draw_rank among the candidates
// at draw_key (into s.draw_id), and the top-n list: the top_above candidates with a key
// below top_key (any order) and the first n_top - top_above at top_key (ids ascending).
__device__ void collect(const uint16_t* row, int vocab, bool aligned, bool draw, uint32_t draw_key, uint32_t draw_rank,
                        int n_top, uint32_t top_key, uint32_t top_above, Shared& s) {
  const uint32_t top_need = n_top > 0 ? uint32_t(n_top) - top_above : 0;
  uint64_t run_draw = 0, run_top = 0;  // matches in earlier tiles
  for_each_tile(row, vocab, aligned, [&](int tile, const uint4(&raw)[kLoads]) {
    // Matches per sub-tile, four 16-bit fields (a sub-tile has kSub = 4096 elements).
    Pair local{0, 0};
#pragma unroll
    for (int q = 0; q < kLoads; ++q)
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (element_id(tile, q, i) >= vocab) continue;
        const uint32_t key = key_of(bits_at(raw, q, i));
        if (draw && key == draw_key) local.count += 1ull << (16 * q);
        if (n_top > 0 && key == top_key) local.mass += 1ull << (16 * q);
        if (n_top > 0 && key < top_key) {
          const uint32_t slot = atomicAdd(&s.n_above, 1u);
          if (slot < top_above) s.top_key[slot] = key, s.top_id[slot] = element_id(tile, q, i);
        }
      }
    Pair total;
    const Pair before = block_exclusive_scan(local, s, total);
    if (local.count != 0 || local.mass != 0) {  // this thread's matches, with their ranks
      uint64_t rank_draw = run_draw, rank_top = run_top;  // matches before sub-tile q
#pragma unroll
      for (int q = 0; q < kLoads; ++q) {
        const int sh = 16 * q;
        uint64_t rd = rank_draw + ((before.count >> sh) & 0xffffu), rt = rank_top + ((before.mass >> sh) & 0xffffu);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          if (element_id(tile, q, i) >= vocab) continue;
          const uint32_t key = key_of(bits_at(raw, q, i));
          if (draw && key == draw_key) {
            if (rd == draw_rank) s.draw_id = element_id(tile, q, i);
            ++rd;
          }
          if (n_top > 0 && key == top_key) {
            if (rt < top_need) s.top_key[top_above + rt] = key, s.top_id[top_above + rt] = element_id(tile, q, i);
            ++rt;
          }
        }
        rank_draw += (total.count >> sh) & 0xffffu;
        rank_top += (total.mass >> sh) & 0xffffu;
      }
    }
#pragma unroll
    for (int q = 0; q < kLoads; ++q) {
      run_draw += (total.count >> (16 * q)) & 0xffffu;
      run_top += (total.mass >> (16 * q)) & 0xffffu;
    }
    return n_top > 0 || run_draw <= draw_rank;  // uniform: every thread has the same totals
  });
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) sample_radix_bf16_kernel(const uint16_t* logits, int vocab,
                                                                     const SampleRow* rows, int n_top,
                                                                     int32_t* tokens, float* logprobs,
                                                                     int32_t* top_ids, float* top_logprobs) {
  __shared__ Shared s;
  const int r = blockIdx.x;
  const uint16_t* row = logits + int64_t(r) * vocab;
  const bool aligned = reinterpret_cast<uintptr_t>(row) % 16 == 0;
  const SampleRow p = rows[r];
  const bool greedy = !(p.temperature > 0.0f);
  const bool want_logprobs = logprobs != nullptr || n_top > 0;

  // Pass 1: the first candidate (smallest key, then lowest id): the greedy token.
  uint64_t best = ~0ull;
  for_each_element(row, vocab, aligned,
                   [&](int id, uint32_t bits) { best = min(best, uint64_t(key_of(bits)) << 32 | uint32_t(id)); });
  best = block_min(best, s);
  const uint32_t best_key = uint32_t(best >> 32);
  const float max_logit = logit_of_key(best_key);
  if (threadIdx.x == 0) s.draw_id = int32_t(best & 0xffffffffu), s.n_above = 0;
  if (greedy && !want_logprobs) {
    if (threadIdx.x == 0) tokens[r] = int32_t(best & 0xffffffffu);
    return;
  }

  // Pass 2: coarse histograms (unless only the token's logprob is asked for); sums for the
  // logprobs, min-p and the total mass.
  const bool histogram = !greedy || n_top > 0;
  for (int i = threadIdx.x; i < kCoarseBins; i += kThreads)
    s.coarse_count[i] = 0, s.coarse_mass_lo[i] = 0, s.coarse_mass_hi[i] = 0;
  __syncthreads();
  const bool min_p_on = !greedy && p.min_p > 0.0f;
  uint64_t sums[4] = {0, 0, 0, 0};  // sum e^(logit - max), min-p count, min-p mass, total mass
  for_each_element(row, vocab, aligned, [&](int, uint32_t bits) {
    const float logit = logit_of_bits(bits);
    const int bin = int(key_of(bits) >> kFineBits);
    if (histogram) atomicAdd(&s.coarse_count[bin], 1u);
    uint64_t w = 0;
    if (!greedy) {
      w = mass_of(logit, max_logit, p.temperature);
      add_mass(&s.coarse_mass_lo[bin], &s.coarse_mass_hi[bin], w);
      sums[3] += w;
      if (min_p_on && w >= __float2ull_rn(p.min_p * kFixedOne)) sums[1] += 1, sums[2] += w;
    }
    if (want_logprobs) sums[0] += !greedy && p.temperature == 1.0f ? w : mass_of(logit, max_logit, 1.0f);
  });
  block_sum(sums, s);

  // Round 1: the top-k cut and the top-n level (both by count), one fine pass.
  const bool top_k_on = !greedy && p.top_k > 0 && p.top_k < vocab;
  const int qk = 0, qn = top_k_on ? 1 : 0;  // query slots
  if (top_k_on) coarse_find(s, qk, false, uint64_t(p.top_k - 1));
  if (n_top > 0) coarse_find(s, qn, false, uint64_t(n_top - 1));
  const int round1 = int(top_k_on) + int(n_top > 0);
  if (round1 > 0) fine_pass(row, vocab, aligned, round1, !greedy, max_logit, p.temperature, s);
  if (top_k_on) fine_find(s, qk, false, uint64_t(p.top_k - 1));
  if (n_top > 0) fine_find(s, qn, false, uint64_t(n_top - 1));
  const Level top_level = n_top > 0 ? s.level[qn] : Level{};

  int32_t token = int32_t(best & 0xffffffffu);
  float token_logit = max_logit;
  if (!greedy) {
    // The kept prefix: n_keep candidates of total mass kept.
    uint64_t n_keep = uint64_t(vocab), kept = sums[3];
    if (top_k_on) {
      const Level l = s.level[qk];
      n_keep = uint64_t(p.top_k);
      kept = l.mass_above + (n_keep - l.above) * l.mass;
    }
    __syncthreads();  // s.level is rewritten below
    const double t_real = ceil(double(p.top_p) * double(kept));
    const uint64_t t = t_real < 1.0 ? 1 : t_real > double(kept) ? kept : uint64_t(t_real);
    // A min-p prefix lighter than t is shorter than the top-p prefix: min-p decides alone.
    if (p.top_p < 1.0f && !(min_p_on && sums[2] < t)) {
      // The shortest prefix with mass >= top_p * kept: the first whose inclusive mass > t - 1.
      coarse_find(s, 0, true, t - 1);
      fine_pass(row, vocab, aligned, 1, true, max_logit, p.temperature, s);
      fine_find(s, 0, true, t - 1);
      const Level l = s.level[0];
      const uint64_t need = l.mass ? (t - l.mass_above + l.mass - 1) / l.mass : l.count;
      const uint64_t n = l.above + min(need, uint64_t(l.count));
      if (n < n_keep) n_keep = n, kept = l.mass_above + min(need, uint64_t(l.count)) * l.mass;
      __syncthreads();
    }
    if (min_p_on && sums[1] < n_keep) n_keep = sums[1], kept = sums[2];
    // The draw: the first candidate whose inclusive mass exceeds floor(u * kept).
    const double target_real = floor(double(p.uniform) * double(kept));
    const uint64_t target = kept == 0 ? 0 : min(uint64_t(target_real), kept - 1);
    coarse_find(s, 0, true, target);
    fine_pass(row, vocab, aligned, 1, true, max_logit, p.temperature, s);
    fine_find(s, 0, true, target);
    const Level l = s.level[0];
    const uint64_t rank = l.mass ? min((target - l.mass_above) / l.mass, uint64_t(l.count ? l.count - 1 : 0)) : 0;
    collect(row, vocab, aligned, true, l.key, uint32_t(rank), n_top, top_level.key, top_level.above, s);
    token = s.draw_id;
    token_logit = logit_of_key(l.key);
  } else if (n_top > 0) {
    collect(row, vocab, aligned, false, 0, 0, n_top, top_level.key, top_level.above, s);
  }

  if (threadIdx.x != 0) return;
  tokens[r] = token;
  // log_softmax = logit - max - log(sum e^(logit - max)); the sum is in units of 2^-40.
  const double log_z = log(double(sums[0])) - 40.0 * 0.69314718055994530942;
  if (logprobs) logprobs[r] = float(double(token_logit) - double(max_logit) - log_z);
  // The top-n list in candidate order (key, then id): insertion sort of at most 20.
  for (int i = 1; i < n_top; ++i) {
    const uint32_t k = s.top_key[i];
    const int32_t id = s.top_id[i];
    int j = i - 1;
    while (j >= 0 && (s.top_key[j] > k || (s.top_key[j] == k && s.top_id[j] > id))) {
      s.top_key[j + 1] = s.top_key[j], s.top_id[j + 1] = s.top_id[j];
      --j;
    }
    s.top_key[j + 1] = k, s.top_id[j + 1] = id;
  }
  for (int i = 0; i < n_top; ++i) {
    top_ids[int64_t(r) * n_top + i] = s.top_id[i];
    top_logprobs[int64_t(r) * n_top + i] =
        float(double(logit_of_key(s.top_key[i])) - double(max_logit) - log_z);
  }
}

}  // namespace

void launch_sample(const bf16* logits, int64_t n_rows, int64_t vocab, const SampleRow* rows, int n_top,
                   int32_t* tokens, float* logprobs, int32_t* top_ids, float* top_logprobs, cudaStream_t stream) {
  // Masses are 40-bit fixed point of values <= 1: a row's sum needs vocab <= 2^24.
  KILN_CHECK(vocab > 0 && vocab <= (int64_t(1) << 24)) << "sample: vocab " << vocab;
  KILN_CHECK(n_top >= 0 && n_top <= kSampleMaxTop && n_top <= vocab) << "sample: n_top " << n_top;
  KILN_CHECK(n_rows <= INT32_MAX) << "sample: rows " << n_rows;
  if (n_rows == 0) return;
  sample_radix_bf16_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(reinterpret_cast<const uint16_t*>(logits),
                                                                      int(vocab), rows, n_top, tokens, logprobs,
                                                                      top_ids, top_logprobs);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
