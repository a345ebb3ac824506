// Token sampling and logprobs (ops::SampleArgs) without a sort: one CTA per row of bf16
// logits, a radix select over the 16-bit candidate key of each logit.
//
// The candidate order (logit descending, ids ascending on ties) is ascending `key`, then
// ascending id, where key is the bf16 bit pattern made order-reversing (key_of). Every
// candidate at one key has the same logit, so the same probability: a filter or a draw
// crosses the order at one key, and only the rank among that key's ids is left to find.
// A query "the first key whose inclusive prefix (of counts, or of probability mass) exceeds
// x" is answered by a 2048-bin histogram of the key's top 11 bits (one pass over the row,
// shared by all queries) and a count of the 32 keys inside the chosen bin (one pass per
// round of queries). 11 + 5 bits rather than 8 + 8: logits cluster in a few octaves, and 8
// top bits (sign + 7 exponent bits) would put most of a row into a handful of bins,
// serialising the shared-memory atomics.
//
// Masses are exact: a candidate's unnormalised probability e = exp((logit - max) / T) in
// (0, 1] is rounded once to 40-bit fixed point, so every sum is an integer sum, independent
// of order (deterministic run to run) and consistent between passes; the sums fit 64 bits
// for vocabularies up to 2^24. Per row:
//   pass 1: max key + lowest id (the greedy token, the max logit);
//   pass 2: the coarse histograms of count and mass, sum e^(logit - max) for the logprobs,
//           the count and mass of the min-p set (e >= min_p);
//   key passes: top-k and top-n (by count), then top-p (by mass), then the draw (by mass);
//           each counts the keys of its coarse bin per segment of the row (16 segments);
//   collect: the draw's rank among the ids at its key, and the top-n candidates, by an
//           ordered block-wide scan of only the segments that hold them.
// Greedy rows run pass 1 only, plus pass 2 for logprobs and a key pass and the collect
// for alternatives.
// Measured on an H100 (one row, vocab 201088, random logits): 28 us greedy, 64 us greedy
// with its logprob, 160 us at a temperature, 195 us with top-k or top-p, 265 us with all
// filters and 20 alternatives; rows run in parallel (17 rows at vocab 151936: 126-236 us).
// Pass 2 (~90 us, an exp and 2-3 shared atomics per logit) dominates.
//
// A row over a cluster: on SM 9.0+ a row is a thread-block cluster of up to 8 CTAs when
// the batch leaves SMs idle (sample_cluster_size), each CTA taking an equal share of the
// row's segments. A pass's per-CTA histograms, sums and per-segment key counts are
// combined through distributed shared memory (every CTA ends with the whole row's, so
// the queries run unchanged in each); the top-n candidates and the drawn id are written
// into the first CTA's, which writes the outputs. The sums are integer sums, so the
// result is the one-CTA kernel's bit for bit. On an H200 (kiln bench op, vocab 201088, a
// call with its parameters up and tokens down): one row at top-p 0.9, temperature 0.8,
// 247 -> 107-123 us (8 CTAs), greedy 50 -> 26-33 us; 64 rows (2 CTAs each) 236 -> 180-187
// us (docs/perf/sampling.md). The ~21 us the collect's scan of the draw's one tile took
// in that row was likely instruction fetch: at 8 CTAs a row the kernel's code runs nearly
// once a launch, so its size is a cost (kUnrolledSubTiles); rolled up to 0.58x the size,
// one row at top-p takes 83 us, 64 rows 149 us, greedy as before.
// A cross-CTA merge must move each value once: one remote load of every bin from every
// CTA by every CTA took 97k cycles at 8 CTAs, the share-then-copy merge below 8.5k.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cooperative_groups.h>

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
constexpr int kSegments = 16;                // whole tiles each (one tile up to vocab 262144)
constexpr int kCoarseBits = 11, kFineBits = 16 - kCoarseBits;
constexpr int kCoarseBins = 1 << kCoarseBits, kFineBins = 1 << kFineBits;
constexpr int kBinsPerThread = kCoarseBins / kThreads;
constexpr float kFixedOne = 0x1p40f;         // fixed-point scale of the masses
constexpr int kMaxCluster = 8;               // CTAs a row at most (the portable cluster size)
// Sub-tiles an element loop unrolls (each sub-tile's 8 elements always are): pass 1 (a min an
// element, and a greedy row's only pass) all kLoads, the other passes one. The code is the
// cost: with 8 CTAs a row each CTA runs every pass over 1-2 tiles, so nearly every
// instruction runs once a launch and is fetched cold. Unrolled throughout, the kernel was
// 362 KB of code and "no instruction" 24% of its stalls (ncu, one row at 8 CTAs).
constexpr int kUnrolledSubTiles = 1;
static_assert(kFineBins == 32, "the keys of a coarse bin are one warp wide");
static_assert(kCoarseBins % kThreads == 0);
static_assert(2 * kSegments * kFineBins / 4 <= kThreads, "a thread copies a 16-byte word of key counts");
static_assert(kCoarseBins / kMaxCluster % 4 == 0, "a CTA's share of the bins is whole 16-byte words");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KILN_SAMPLE_CLUSTERS
#endif

// The CTAs of one row: n of them (1 without clusters), this one the rank-th, taking
// segments [first(rank), first(rank + 1)) of the `used` segments that hold elements.
struct Cluster {
  int n = 1, rank = 0, used = kSegments;
  __device__ __forceinline__ void sync() const {
#ifdef KILN_SAMPLE_CLUSTERS
    if (n > 1) cooperative_groups::this_cluster().sync();
#endif
  }
  // `p` (this CTA's shared memory) in CTA `r`'s shared memory.
  template <typename T>
  __device__ __forceinline__ T* at(T* p, int r) const {
#ifdef KILN_SAMPLE_CLUSTERS
    if (n > 1) return cooperative_groups::this_cluster().map_shared_rank(p, unsigned(r));
#endif
    return p;
  }
  __device__ __forceinline__ int first(int r) const { return r * used / n; }
  // The CTA whose segments hold `segment` (for a segment past `used`, which holds nothing:
  // the last CTA).
  __device__ __forceinline__ int owner(int segment) const {
    int o = 0;
    for (int r = 1; r < n; ++r) o = first(r) <= segment ? r : o;
    return o;
  }
};

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
  uint32_t above;       // candidates before this key
  uint64_t mass_above;  // their mass
  uint32_t count;       // candidates at this key
  uint64_t mass;        // the mass of one candidate at this key
};

// Query slots: 0 for top-k, then top-p, then the draw (one after the other); 1 for top-n.
struct Shared {
  alignas(16) uint32_t coarse_count[kCoarseBins];
  alignas(16) uint32_t coarse_mass_lo[kCoarseBins];
  alignas(16) uint32_t coarse_mass_hi[kCoarseBins];
  alignas(16) uint32_t key_count[2][kSegments][kFineBins];  // per slot: each key of its coarse bin, per segment
  Pair scan[kWarps];
  uint64_t reduce[4][kWarps];
  Coarse coarse[2];
  Level level[2];
  uint32_t top_key[kSampleMaxTop];
  int32_t top_id[kSampleMaxTop];
  uint32_t n_above;  // top-n candidates gathered before the top-n key
  int32_t draw_id;
  uint64_t xfer[4];  // a CTA's reduced values, read by the others of its cluster
};

// Elements [e0, e0 + 8) below `end` as packed bf16 bits, zero from `end` on, one by one (a
// row that is not 16-byte aligned, or the row's last elements). Out of line: it is rarely
// taken, and inlined it was 14 copies in the kernel.
__device__ __noinline__ uint4 load_partial(const uint16_t* row, int end, int e0) {
  uint64_t w[2] = {0, 0};
  for (int i = 0; i < kVec && e0 + i < end; ++i) w[i / 4] |= uint64_t(row[e0 + i]) << (16 * (i % 4));
  return make_uint4(uint32_t(w[0]), uint32_t(w[0] >> 32), uint32_t(w[1]), uint32_t(w[1] >> 32));
}

// This thread's elements [tile + q * kSub + 8 * thread, + 8) for q < kLoads, packed bf16
// bits (zero from `end` on). Aligned rows take 16-byte loads.
__device__ __forceinline__ void load_tile(const uint16_t* row, int end, bool aligned, int tile, uint4 (&raw)[kLoads]) {
#pragma unroll
  for (int q = 0; q < kLoads; ++q) {
    const int e0 = tile + q * kSub + threadIdx.x * kVec;
    raw[q] = aligned && e0 + kVec <= end ? __ldg(reinterpret_cast<const uint4*>(row + e0)) : load_partial(row, end, e0);
  }
}

// Element i of sub-tile q (q need not be a constant: no runtime index into the registers).
__device__ __forceinline__ uint32_t bits_at(const uint4 (&raw)[kLoads], int q, int i) {
  uint4 v = raw[0];
#pragma unroll
  for (int k = 1; k < kLoads; ++k)
    if (q == k) v = raw[k];
  const uint32_t w = i / 2 == 0 ? v.x : i / 2 == 1 ? v.y : i / 2 == 2 ? v.z : v.w;
  return (w >> (16 * (i % 2))) & 0xffffu;
}

__device__ __forceinline__ int element_id(int tile, int q, int i) { return tile + q * kSub + threadIdx.x * kVec + i; }

// f(tile, raw) for the tiles starting at begin, begin + kTile, ... below end, in order. The
// next tile's loads are issued before f runs on this one (one block streams the whole
// row, so a pass is latency bound without them).
template <typename F>
__device__ __forceinline__ void for_each_tile(const uint16_t* row, int begin, int end, bool aligned, F&& f) {
  uint4 cur[kLoads];
  load_tile(row, end, aligned, begin, cur);
  for (int tile = begin; tile < end; tile += kTile) {
    uint4 next[kLoads];
    const bool more = tile + kTile < end;
    if (more) load_tile(row, end, aligned, tile + kTile, next);
    f(tile, cur);
    if (more) {
#pragma unroll
      for (int q = 0; q < kLoads; ++q) cur[q] = next[q];
    }
  }
}

// f(id, bits) for every element of the row in [begin, end) (in no particular order).
template <int kUnroll = kUnrolledSubTiles, typename F>
__device__ __forceinline__ void for_each_element(const uint16_t* row, int begin, int end, bool aligned, F&& f) {
  for_each_tile(row, begin, end, aligned, [&](int tile, const uint4(&raw)[kLoads]) {
#pragma unroll kUnroll
    for (int q = 0; q < kLoads; ++q)
#pragma unroll kVec
      for (int i = 0; i < kVec; ++i)
        if (element_id(tile, q, i) < end) f(element_id(tile, q, i), bits_at(raw, q, i));
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

// v (the same in every thread of the CTA) combined over the cluster's CTAs: summed, or
// the minimum with kMin; the result in every thread of every CTA.
template <bool kMin, int N>
__device__ void cluster_combine(uint64_t (&v)[N], Shared& s, const Cluster& cl) {
  static_assert(N <= 4);
  if (cl.n == 1) return;
  if (threadIdx.x == 0)
    for (int k = 0; k < N; ++k) s.xfer[k] = v[k];
  cl.sync();
  if (threadIdx.x < N) {  // a thread a value reads the cluster's, for the CTA
    uint64_t acc = kMin ? ~0ull : 0;
    for (int r = 0; r < cl.n; ++r) {
      const uint64_t x = cl.at(s.xfer, r)[threadIdx.x];
      acc = kMin ? min(acc, x) : acc + x;
    }
    s.reduce[0][threadIdx.x] = acc;
  }
  cl.sync();  // every read done before s.xfer is written again (and s.reduce's in this CTA)
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = s.reduce[0][k];
  __syncthreads();  // s.reduce is reused by the next reduction
}

// The coarse histograms summed over the cluster's CTAs, into each CTA's own. Each CTA sums
// its share of the bins over every CTA, then copies the others' sums in 16-byte words.
// Called right after cluster_combine, whose last cluster sync ordered every CTA's histogram
// atomics before these reads. Without masses (greedy rows), the counts alone.
__device__ void merge_histograms(Shared& s, const Cluster& cl, bool with_mass) {
  if (cl.n == 1) return;
  const int share = kCoarseBins / cl.n, first = cl.rank * share;
  constexpr int kPer = kCoarseBins / 2 / kThreads;  // bins of a share a thread sums (2 CTAs at least)
  uint32_t c[kPer] = {}, lo[kPer] = {}, hi[kPer] = {};
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int b = first + int(threadIdx.x) + j * kThreads;
    if (b >= first + share) break;
    uint32_t rc[kMaxCluster], rl[kMaxCluster], rh[kMaxCluster];
#pragma unroll
    for (int r = 0; r < kMaxCluster; ++r) {
      if (r >= cl.n) continue;
      rc[r] = cl.at(s.coarse_count, r)[b];
      rl[r] = with_mass ? cl.at(s.coarse_mass_lo, r)[b] : 0u, rh[r] = with_mass ? cl.at(s.coarse_mass_hi, r)[b] : 0u;
    }
    uint64_t m = 0;
#pragma unroll
    for (int r = 0; r < kMaxCluster; ++r)
      if (r < cl.n) c[j] += rc[r], m += uint64_t(rh[r]) << 32 | rl[r];
    lo[j] = uint32_t(m), hi[j] = uint32_t(m >> 32);
  }
  cl.sync();  // every read of the CTAs' own histograms done
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int b = first + int(threadIdx.x) + j * kThreads;
    if (b < first + share) s.coarse_count[b] = c[j], s.coarse_mass_lo[b] = lo[j], s.coarse_mass_hi[b] = hi[j];
  }
  cl.sync();  // every CTA's share summed
  // The others' shares, 4 bins a 16-byte word (a share is >= 256 bins).
  constexpr int kWords = kCoarseBins / 4;
  for (int w = int(threadIdx.x); w < (with_mass ? 3 : 1) * kWords; w += kThreads) {
    const int a = w / kWords, bin = (w % kWords) * 4, owner = bin / share;
    if (owner == cl.rank) continue;
    uint32_t* mine = a == 0 ? s.coarse_count : a == 1 ? s.coarse_mass_lo : s.coarse_mass_hi;
    *reinterpret_cast<uint4*>(mine + bin) = *reinterpret_cast<const uint4*>(cl.at(mine, owner) + bin);
  }
  cl.sync();  // every copy done (no CTA's shares are read after this)
}

// Each segment's key counts from the CTA that counted it, into each CTA's own (and the
// top-n candidates the others wrote into the first CTA visible there), 16 bytes at a time.
__device__ void merge_key_counts(Shared& s, const Cluster& cl) {
  if (cl.n == 1) return;
  constexpr int kWords = 2 * kSegments * kFineBins / 4;  // a (slot, segment) is 8 words
  cl.sync();
  uint4 v{};
  const int w = int(threadIdx.x), g = (w / (kFineBins / 4)) % kSegments, owner = cl.owner(g);
  uint4* mine = reinterpret_cast<uint4*>(&s.key_count[0][0][0]) + w;
  if (w < kWords && owner != cl.rank) v = *cl.at(mine, owner);
  cl.sync();  // every read done before the writes
  if (w < kWords && owner != cl.rank) *mine = v;
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

// Counts the keys of coarse bin s.coarse[q].bin per segment, for slot 0 and / or 1 (and,
// with gather_top, appends the candidates of the bins before slot 1's to the top-n list:
// fewer than n_top). No masses: every candidate at a key weighs the same, so a key's mass
// is its count times one candidate's (fine_find), and the pass costs what pass 1 costs.
// This CTA counts its elements [begin, end) (its segments); the cluster's counts are then
// merged, and the candidates go to the first CTA's list.
__device__ void key_pass(const uint16_t* row, int begin, int end, bool aligned, int seg_tiles, bool slot0, bool slot1,
                         bool gather_top, Shared& s, const Cluster& cl) {
  for (int i = threadIdx.x; i < 2 * kSegments * kFineBins; i += kThreads) {
    const int q = i / (kSegments * kFineBins);
    if (q == 0 ? slot0 : slot1) s.key_count[q][(i / kFineBins) % kSegments][i % kFineBins] = 0;
  }
  __syncthreads();
  const int bin0 = slot0 ? s.coarse[0].bin : -1, bin1 = slot1 ? s.coarse[1].bin : -1;
  uint32_t* n_above = cl.at(&s.n_above, 0);
  uint32_t* top_key = cl.at(s.top_key, 0);
  int32_t* top_id = cl.at(s.top_id, 0);
  for_each_tile(row, begin, end, aligned, [&](int tile, const uint4(&raw)[kLoads]) {
    uint32_t* count0 = s.key_count[0][(tile / kTile) / seg_tiles];
    uint32_t* count1 = s.key_count[1][(tile / kTile) / seg_tiles];
#pragma unroll kUnrolledSubTiles
    for (int q = 0; q < kLoads; ++q)
#pragma unroll kVec
      for (int i = 0; i < kVec; ++i) {
        const uint32_t key = key_of(bits_at(raw, q, i));
        const int bin = int(key >> kFineBits), f = int(key % kFineBins);
        if (element_id(tile, q, i) >= end) continue;
        if (bin == bin0) atomicAdd(&count0[f], 1u);
        if (bin == bin1) atomicAdd(&count1[f], 1u);
        if (gather_top && bin < bin1) {
          const uint32_t slot = atomicAdd(n_above, 1u);
          if (slot < kSampleMaxTop) top_key[slot] = key, top_id[slot] = element_id(tile, q, i);
        }
      }
  });
  __syncthreads();
  merge_key_counts(s, cl);
}

// The key where query q's inclusive prefix first exceeds x (after coarse_find and
// key_pass), into s.level[q]. One warp scans the 32 keys; with_mass: a key's mass is
// mass_of its logit times its count.
__device__ void fine_find(Shared& s, int q, bool by_mass, uint64_t x, bool with_mass, float max_logit,
                          float temperature) {
  if (threadIdx.x < 32) {
    const int f = threadIdx.x;
    const Coarse c = s.coarse[q];
    const uint32_t key = uint32_t(c.bin) << kFineBits | uint32_t(f);
    uint64_t n = 0;
    for (int g = 0; g < kSegments; ++g) n += s.key_count[q][g][f];
    const uint64_t unit = with_mass && n ? mass_of(logit_of_key(key), max_logit, temperature) : 0, w = n * unit;
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
    if (f == at) s.level[q] = {key, c.count_before + uint32_t(cn - n), c.mass_before + (cw - w), uint32_t(n), unit};
  }
  __syncthreads();
}

// Ids at a key in id order, scanning only the segments that hold the ones wanted
// (key_count): the draw_rank-th id at draw_key (slot 0) into s.draw_id; the first
// n_top - top_above ids at top_key (slot 1) and the candidates of top_key's coarse bin
// below top_key (key_pass gathered those of earlier bins) into the top-n list. Each CTA of
// a cluster scans the segments it owns and writes into the first CTA's draw_id and list.
__device__ void collect(const uint16_t* row, int vocab, bool aligned, int seg_tiles, bool draw, uint32_t draw_key,
                        uint32_t draw_rank, int n_top, uint32_t top_key, uint32_t top_above, Shared& s,
                        const Cluster& cl) {
  uint32_t* n_above = cl.at(&s.n_above, 0);
  uint32_t* top_keys = cl.at(s.top_key, 0);
  int32_t* top_ids = cl.at(s.top_id, 0);
  int32_t* draw_id = cl.at(&s.draw_id, 0);
  const uint32_t top_need = n_top > 0 ? uint32_t(n_top) - top_above : 0;
  const int fd = int(draw_key % kFineBins), fn = int(top_key % kFineBins);
  const uint32_t top_bin = top_key >> kFineBits;
  uint32_t base_draw = 0, base_top = 0;  // matches in earlier segments
  for (int g = 0; g < kSegments; ++g) {  // every thread takes the same decisions
    const uint32_t n_draw = draw ? s.key_count[0][g][fd] : 0, n_top_key = n_top > 0 ? s.key_count[1][g][fn] : 0;
    uint32_t n_below = 0;  // top-n candidates of top_key's bin before top_key
    for (int f = 0; f < fn && n_top > 0; ++f) n_below += s.key_count[1][g][f];
    const bool want_draw = draw_rank - base_draw < n_draw;  // unsigned: base <= rank < base + n
    const bool want_top = (n_top_key > 0 && base_top < top_need) || n_below > 0;
    if ((want_draw || want_top) && cl.owner(g) == cl.rank) {
      uint64_t run_draw = base_draw, run_top = base_top;
      const int begin = g * seg_tiles * kTile, end = min(vocab, (g + 1) * seg_tiles * kTile);
      for_each_tile(row, begin, end, aligned, [&](int tile, const uint4(&raw)[kLoads]) {
        // Matches per sub-tile, four 16-bit fields (a sub-tile has kSub = 4096 elements).
        Pair local{0, 0};
#pragma unroll kUnrolledSubTiles
        for (int q = 0; q < kLoads; ++q)
#pragma unroll kVec
          for (int i = 0; i < kVec; ++i) {
            if (element_id(tile, q, i) >= end) continue;
            const uint32_t key = key_of(bits_at(raw, q, i));
            if (want_draw && key == draw_key) local.count += 1ull << (16 * q);
            if (want_top && key == top_key) local.mass += 1ull << (16 * q);
            if (want_top && key < top_key && key >> kFineBits == top_bin) {
              const uint32_t slot = atomicAdd(n_above, 1u);
              if (slot < top_above) top_keys[slot] = key, top_ids[slot] = element_id(tile, q, i);
            }
          }
        Pair total;
        const Pair before = block_exclusive_scan(local, s, total);
        if (local.count != 0 || local.mass != 0) {  // this thread's matches, with their ranks
          uint64_t rank_draw = run_draw, rank_top = run_top;  // matches before sub-tile q
#pragma unroll kUnrolledSubTiles
          for (int q = 0; q < kLoads; ++q) {
            const int sh = 16 * q;
            uint64_t rd = rank_draw + ((before.count >> sh) & 0xffffu);
            uint64_t rt = rank_top + ((before.mass >> sh) & 0xffffu);
#pragma unroll kVec
            for (int i = 0; i < kVec; ++i) {
              if (element_id(tile, q, i) >= end) continue;
              const uint32_t key = key_of(bits_at(raw, q, i));
              if (want_draw && key == draw_key) {
                if (rd == draw_rank) *draw_id = element_id(tile, q, i);
                ++rd;
              }
              if (want_top && key == top_key) {
                if (rt < top_need) top_keys[top_above + rt] = key, top_ids[top_above + rt] = element_id(tile, q, i);
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
      });
    }
    base_draw += n_draw, base_top += n_top_key;
  }
  __syncthreads();
  cl.sync();  // the first CTA's id and list complete
}

// One row per `cluster` consecutive CTAs (a thread-block cluster of that size when > 1).
__global__ void __launch_bounds__(kThreads, 1) sample_radix_bf16_kernel(const uint16_t* logits, int vocab,
                                                                     const SampleRow* rows, int n_top,
                                                                     int32_t* tokens, float* logprobs,
                                                                     int32_t* top_ids, float* top_logprobs,
                                                                     int cluster) {
  __shared__ Shared s;
#ifndef KILN_SAMPLE_CLUSTERS
  if (cluster != 1) __trap();  // (sample_cluster_size never asks it of such a build)
#endif
  const int r = int(blockIdx.x) / cluster;
  const uint16_t* row = logits + int64_t(r) * vocab;
  const bool aligned = reinterpret_cast<uintptr_t>(row) % 16 == 0;
  const int n_tiles = (vocab + kTile - 1) / kTile, seg_tiles = (n_tiles + kSegments - 1) / kSegments;
  // This CTA's elements: its share of the segments that hold any.
  const Cluster cl{.n = cluster, .rank = int(blockIdx.x) % cluster, .used = (n_tiles + seg_tiles - 1) / seg_tiles};
  const int seg_elems = seg_tiles * kTile;
  const int begin = min(vocab, cl.first(cl.rank) * seg_elems), end = min(vocab, cl.first(cl.rank + 1) * seg_elems);
  const SampleRow p = rows[r];
  const bool greedy = !(p.temperature > 0.0f);
  const bool want_logprobs = logprobs != nullptr || n_top > 0;

  // Pass 1: the first candidate (smallest key, then lowest id): the greedy token.
  if (threadIdx.x == 0) s.n_above = 0;  // (the first CTA's counts every CTA's candidates)
  uint64_t best = ~0ull;
  for_each_element<kLoads>(row, begin, end, aligned, [&](int id, uint32_t bits) {
    best = min(best, uint64_t(key_of(bits)) << 32 | uint32_t(id));
  });
  uint64_t best_all[1] = {block_min(best, s)};
  cluster_combine<true>(best_all, s, cl);  // (its syncs also publish n_above's zero to the cluster)
  best = best_all[0];
  const uint32_t best_key = uint32_t(best >> 32);
  const float max_logit = logit_of_key(best_key);
  if (threadIdx.x == 0) s.draw_id = int32_t(best & 0xffffffffu);
  if (greedy && !want_logprobs) {
    if (threadIdx.x == 0 && cl.rank == 0) tokens[r] = int32_t(best & 0xffffffffu);
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
  for_each_element(row, begin, end, aligned, [&](int, uint32_t bits) {
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
  cluster_combine<false>(sums, s, cl);
  if (histogram) merge_histograms(s, cl, !greedy);

  // Round 1: the top-k cut (slot 0) and the top-n key (slot 1), both by count, one pass.
  const bool top_k_on = !greedy && p.top_k > 0 && p.top_k < vocab;
  if (top_k_on) coarse_find(s, 0, false, uint64_t(p.top_k - 1));
  if (n_top > 0) coarse_find(s, 1, false, uint64_t(n_top - 1));
  if (top_k_on || n_top > 0) key_pass(row, begin, end, aligned, seg_tiles, top_k_on, n_top > 0, n_top > 0, s, cl);
  if (top_k_on) fine_find(s, 0, false, uint64_t(p.top_k - 1), true, max_logit, p.temperature);
  if (n_top > 0) fine_find(s, 1, false, uint64_t(n_top - 1), false, max_logit, p.temperature);
  const Level top_level = n_top > 0 ? s.level[1] : Level{};

  int32_t token = int32_t(best & 0xffffffffu);
  float token_logit = max_logit;
  if (!greedy) {
    // The kept prefix: n_keep candidates of total mass kept.
    uint64_t n_keep = uint64_t(vocab), kept = sums[3];
    if (top_k_on) {
      const Level l = s.level[0];
      n_keep = uint64_t(p.top_k);
      kept = l.mass_above + (n_keep - l.above) * l.mass;
    }
    __syncthreads();  // s.level[0] is rewritten below
    const double t_real = ceil(double(p.top_p) * double(kept));
    const uint64_t t = t_real < 1.0 ? 1 : t_real > double(kept) ? kept : uint64_t(t_real);
    // A min-p prefix lighter than t is shorter than the top-p prefix: min-p decides alone.
    if (p.top_p < 1.0f && !(min_p_on && sums[2] < t)) {
      // The shortest prefix with mass >= top_p * kept: the first whose inclusive mass > t - 1.
      coarse_find(s, 0, true, t - 1);
      key_pass(row, begin, end, aligned, seg_tiles, true, false, false, s, cl);
      fine_find(s, 0, true, t - 1, true, max_logit, p.temperature);
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
    key_pass(row, begin, end, aligned, seg_tiles, true, false, false, s, cl);
    fine_find(s, 0, true, target, true, max_logit, p.temperature);
    const Level l = s.level[0];
    const uint64_t rank = l.mass ? min((target - l.mass_above) / l.mass, uint64_t(l.count ? l.count - 1 : 0)) : 0;
    collect(row, vocab, aligned, seg_tiles, true, l.key, uint32_t(rank), n_top, top_level.key, top_level.above, s,
            cl);
    token = s.draw_id;
    token_logit = logit_of_key(l.key);
  } else if (n_top > 0) {
    collect(row, vocab, aligned, seg_tiles, false, 0, 0, n_top, top_level.key, top_level.above, s, cl);
  }

  if (threadIdx.x != 0 || cl.rank != 0) return;  // (the first CTA's shared memory holds the id and list)
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
    top_logprobs[int64_t(r) * n_top + i] = float(double(logit_of_key(s.top_key[i])) - double(max_logit) - log_z);
  }
}

}  // namespace

namespace {

// One thread per listed (row, token): the ops::PenaltyParams formula on the stored bf16.
__global__ void apply_penalties_kernel(uint16_t* logits, int vocab, const PenaltyEntry* entries, int n_entries,
                                       const PenaltyRow* rows) {
  const int i = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (i >= n_entries) return;
  const PenaltyEntry e = entries[i];
  const PenaltyRow p = rows[e.row];
  uint16_t* at = logits + int64_t(e.row) * vocab + e.token;
  float x = __uint_as_float(uint32_t(*at) << 16);
  x = x > 0.0f ? x / p.repetition : x * p.repetition;
  x -= p.frequency * float(e.count) + (e.count > 0 ? p.presence : 0.0f);
  *at = __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

}  // namespace

void launch_apply_penalties(bf16* logits, int64_t vocab, const PenaltyEntry* entries, int64_t n_entries,
                            const PenaltyRow* rows, cudaStream_t stream) {
  KILN_CHECK(n_entries <= INT32_MAX && vocab <= INT32_MAX) << "penalties: " << n_entries << " entries";
  if (n_entries == 0) return;
  constexpr int kBlock = 256;
  apply_penalties_kernel<<<unsigned((n_entries + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
      reinterpret_cast<uint16_t*>(logits), int(vocab), entries, int(n_entries), rows);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_sample(const bf16* logits, int64_t n_rows, int64_t vocab, const SampleRow* rows, int n_top,
                   int32_t* tokens, float* logprobs, int32_t* top_ids, float* top_logprobs, cudaStream_t stream) {
  // Masses are 40-bit fixed point of values <= 1: a row's sum needs vocab <= 2^24.
  KILN_CHECK(vocab > 0 && vocab <= (int64_t(1) << 24)) << "sample: vocab " << vocab;
  KILN_CHECK(n_top >= 0 && n_top <= kSampleMaxTop && n_top <= vocab) << "sample: n_top " << n_top;
  KILN_CHECK(n_rows <= INT32_MAX) << "sample: rows " << n_rows;
  if (n_rows == 0) return;
  const int cluster = sample_cluster_size(n_rows, vocab);
  if (cluster == 1) {
    sample_radix_bf16_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(reinterpret_cast<const uint16_t*>(logits),
                                                                        int(vocab), rows, n_top, tokens, logprobs,
                                                                        top_ids, top_logprobs, 1);
    KILN_CUDA_LAUNCH_CHECK();
    return;
  }
  KILN_CHECK(n_rows * cluster <= INT32_MAX) << "sample: " << n_rows << " rows of " << cluster << " blocks";
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(cluster), attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(n_rows * cluster));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&config, sample_radix_bf16_kernel, reinterpret_cast<const uint16_t*>(logits),
                                     int(vocab), rows, n_top, tokens, logprobs, top_ids, top_logprobs, cluster));
}

int sample_cluster_size(int64_t n_rows, int64_t vocab) {
  // Per device: its SMs, and the largest cluster (<= kMaxCluster) of which one fits (0:
  // not asked yet; 1: no clusters, before SM 9.0).
  constexpr int kDevices = 64;
  static std::atomic<int> sms_of[kDevices] = {}, largest_of[kDevices] = {};
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0, largest = 1;
  if (device >= 0 && device < kDevices && largest_of[device].load() != 0) {
    sms = sms_of[device].load(), largest = largest_of[device].load();
  } else {
    int major = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    // (Clusters need the kernel built for SM 9.0+: not a newer GPU running older PTX.)
    cudaFuncAttributes fa{};
    KILN_CUDA_CHECK(cudaFuncGetAttributes(&fa, sample_radix_bf16_kernel));
    for (int c = 2; major >= 9 && fa.ptxVersion >= 90 && c <= kMaxCluster; c *= 2) {
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = unsigned(c), attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(unsigned(c));
      config.blockDim = dim3(kThreads);
      config.attrs = &attr;
      config.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, sample_radix_bf16_kernel, &config) != cudaSuccess) {
        (void)cudaGetLastError();
        break;
      }
      if (clusters < 1) break;
      largest = c;
    }
    if (device >= 0 && device < kDevices) sms_of[device].store(sms), largest_of[device].store(largest);
  }
  // KILN_SAMPLE_CLUSTER=N: N CTAs a row (a power of two, within what fits; tests, benchmarks).
  if (const char* v = std::getenv("KILN_SAMPLE_CLUSTER"); v != nullptr && *v != 0) {
    const int want = std::atoi(v);
    int c = 1;
    while (c * 2 <= want && c * 2 <= largest) c *= 2;
    return c;
  }
  // As many CTAs a row as leave no row waiting for an SM, and no CTA without a tile (the
  // kernel shares out the segments that hold elements: tiles of them while they are 16 or
  // fewer, 16 at most).
  const int64_t n_tiles = (vocab + kTile - 1) / kTile, seg_tiles = (n_tiles + kSegments - 1) / kSegments;
  const int64_t tiles = (n_tiles + seg_tiles - 1) / seg_tiles;
  int c = 1;
  while (c * 2 <= largest && int64_t(c) * 2 * n_rows <= sms && c * 2 <= tiles) c *= 2;
  return c;
}

}  // namespace kiln::cuda
