// Grouped expert GEMMs for MoE: bf16 mma.sync m16n8k16 with fp32 accumulation,
// ldmatrix from XOR-swizzled shared memory, a multistage cp.async pipeline.
//
// After routing, moe.cu's align sorts the (token, slot) pairs by expert: `perm` lists
// the pair indices expert by expert (ascending expert id; within an expert in
// atomic arrival order, which changes no value since every row is computed on
// its own), and a tile table cuts each expert's rows into tiles of kBM rows (an
// expert that receives no token has no tile; a pair routed to an expert another rank
// holds, -1 after launch_route, gets no row, so no weight is read for it and its y is
// never written). Two GEMMs run over the table, one
// CTA per (tile, column block):
//   up:   act[row]     = glu(x[token(row)] . gate_up_e^T)  bf16, in perm order
//   down: y[pair(row)] = act[row] . down_e^T (+ bias)      fp32, per pair
// then moe.cu's combine kernel sums each token's pairs in ascending expert id.
//
// Gate and up come from the same CTA: its B tile holds kBNF "fused" columns
// f = 2i + h (h = 0 gate, 1 up) of output column i, so an m16n8 accumulator
// fragment's column pair (2q, 2q + 1) is the (gate, up) of one output column in
// one thread, and the GLU is applied in registers. The three stored layouts map
// onto this: interleaved fused rows already are it; concatenated [gate; up] rows
// and separate gate / up matrices are gathered row by row (one cp.async per 16
// bytes, any row order is free). Weights stored input-major ([n_in, n_out],
// gpt-oss bf16) are read with ldmatrix.trans, which needs the fused columns
// contiguous: interleaved gate_up, or no GLU (down). moe_grouped_supported says
// which layouts this kernel takes; launch_moe_experts falls back to the
// per-(token, expert) GEMV kernel for the others.
//
// Two tile shapes (shared memory = stages x (A + B tile), all within the SM120
// 101,376 B cap):
//   decode:  kBM 16, kBNF 64, 4 warps side by side in N, 4 stages (40,960 B): few
//            rows per expert, so many column blocks spread the weight stream over
//            every SM;
//   prefill: kBM 64, kBNF 128, 2 x 2 warps of 32 x 64, 3 stages (73,728 B) where two
//            such CTAs fit an SM (H100: three), else 2 stages (49,152 B): an SM120 SM
//            (100 KB) holds one 3-stage CTA, and the 2-stage tile took 6-28% less time
//            there and mostly 3-14% more on the H100's 228 KB (docs/PERF.md, "CUDA ops
//            other than attention").
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/attention_mma.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/pdl.cuh"
#include "backends/cuda/kernels/smem.cuh"
#include "backends/cuda/kernels/tile_grid.cuh"

namespace kiln::cuda {
namespace {

using attn::cp_async_16;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::smem_u32;
using attn::swz;

template <int kBM_, int kBNF_, int kWarpsM_, int kWarpsN_, int kStages_>
struct GemmConfig {
  static constexpr int kBM = kBM_, kBNF = kBNF_, kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kStages = kStages_;
  static constexpr int kBK = 64;  // one 128-byte swizzled row of A / B per k tile
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMT = kBM / (16 * kWarpsM);  // m16 tiles per warp
  static constexpr int kNT = kBNF / (8 * kWarpsN);  // n8 tiles per warp
  static constexpr int kABytes = kBM * kBK * 2, kBBytes = kBNF * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kAChunks = kBM * kBK / 8 / kThreads;   // 16-byte A chunks per thread per stage
  static constexpr int kBChunks = kBNF * kBK / 8 / kThreads;  // and B chunks
  static_assert(kMT >= 1 && kNT % 2 == 0, "warp tile: whole m16 tiles, pairs of n8 tiles");
  static_assert(kAChunks >= 1 && kBChunks >= 1, "every thread loads A and B chunks");
  static_assert(kSmemBytes <= 101376, "must fit the SM120 per-block shared memory");
};
using DecodeGemm = GemmConfig<16, 64, 1, 4, 4>;
using PrefillGemm = GemmConfig<64, 128, 2, 2, 3>;
using PrefillGemm2 = GemmConfig<64, 128, 2, 2, 2>;  // for SMs of about 100 KB
static_assert(PrefillGemm2::kBM == PrefillGemm::kBM, "moe_grouped_bm: one prefill tile height");

// Average rows per expert from which the 64-row tiles pay off.
constexpr int kPrefillRowsPerExpert = 32;

struct GemmParams {
  const int4* tiles;              // (expert, first sorted row, rows, 0); expert < 0: no tile
  const int32_t* perm;            // [n_pairs] pair index of each sorted row
  const ExpertWeights* experts;   // [n_experts]
  const bf16* a;                  // up: x [n_tokens, K]; down: act [n_pairs, K] in sorted order
  int top_k;                      // up: a pair's token is pair / top_k
  int K;                          // d_model (up) or d_ff (down)
  int NF;                         // fused columns: 2 * d_ff (up) or d_model (down)
  int d_ff;
  MoeShape s;
  bf16* act;                      // up output [n_pairs, d_ff]
  float* y;                       // down output [n_pairs, d_model]
  bool n_fast;                    // the grid's order (tile_grid.cuh)
};

// Stored row (non-transposed) of fused column f of expert e's up weights.
__device__ __forceinline__ const bf16* up_row(const ExpertWeights& ew, const GemmParams& p, int f) {
  const int i = f >> 1, h = f & 1;
  if (ew.gate_up == nullptr) return (h ? ew.up : ew.gate) + int64_t(i) * p.K;
  const int row = p.s.interleaved ? f : h * p.d_ff + i;
  return ew.gate_up + int64_t(row) * p.K;
}

template <typename C, bool kUp, bool kTrans>
__global__ void __launch_bounds__(C::kThreads) moe_gemm_kernel(const GemmParams p) {
  constexpr int kBK = C::kBK;
  extern __shared__ __align__(128) unsigned char smem[];
  const int4 tile = p.tiles[grid_row_tile(p.n_fast)];
  if (tile.x < 0) return;
  const int row0 = tile.y, rows = tile.z, n0 = grid_n_tile(p.n_fast) * C::kBNF;
  const ExpertWeights ew = p.experts[tile.x];
  const bf16* w_base = kUp ? ew.gate_up : ew.down;  // the transposed layouts read one matrix
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
  const uint32_t s0 = smem_u32(smem);

  // The rows this thread copies, fixed across k tiles: A chunk c -> (row c / 8,
  // 16-byte chunk c % 8); B likewise over the kBNF fused rows (or, transposed,
  // over kBK k rows of kBNF / 8 chunks).
  const bf16* a_src[C::kAChunks];
#pragma unroll
  for (int i = 0; i < C::kAChunks; ++i) {
    const int r = (tid + i * C::kThreads) / 8;
    a_src[i] = nullptr;
    if (r < rows) {
      const int64_t row = kUp ? p.perm[row0 + r] / p.top_k : row0 + r;
      a_src[i] = p.a + row * p.K;
    }
  }
  const bf16* b_src[kTrans ? 1 : C::kBChunks];
  if constexpr (!kTrans) {
#pragma unroll
    for (int i = 0; i < C::kBChunks; ++i) {
      const int f = n0 + (tid + i * C::kThreads) / 8;
      b_src[i] = f >= p.NF ? nullptr : kUp ? up_row(ew, p, f) : ew.down + int64_t(f) * p.K;
    }
  }

  const auto load_stage = [&](int stage, int k0) {
    const uint32_t sa = s0 + stage * C::kStageBytes, sb = sa + C::kABytes;
#pragma unroll
    for (int i = 0; i < C::kAChunks; ++i) {
      const int c = tid + i * C::kThreads, r = c / 8, ch = c % 8, k = k0 + ch * 8;
      const bool valid = a_src[i] != nullptr && k < p.K;
      cp_async_16(sa + swz<kBK>(r, ch), valid ? a_src[i] + k : p.a, valid);
    }
#pragma unroll
    for (int i = 0; i < C::kBChunks; ++i) {
      const int c = tid + i * C::kThreads;
      if constexpr (kTrans) {  // rows = k, kBNF / 8 chunks of fused columns each
        const int r = c / (C::kBNF / 8), ch = c % (C::kBNF / 8), k = k0 + r, f = n0 + ch * 8;
        const bool valid = k < p.K && f < p.NF;
        cp_async_16(sb + swz<C::kBNF>(r, ch), valid ? w_base + int64_t(k) * p.NF + f : w_base, valid);
      } else {
        const int r = c / 8, ch = c % 8, k = k0 + ch * 8;
        const bool valid = b_src[i] != nullptr && k < p.K;
        cp_async_16(sb + swz<kBK>(r, ch), valid ? b_src[i] + k : p.a, valid);
      }
    }
  };

  float acc[C::kMT][C::kNT][4] = {};
  const int n_k = (p.K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < n_k) load_stage(s, s * kBK);
    cp_async_commit();
  }
  for (int kt = 0; kt < n_k; ++kt) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();  // stage kt landed; every warp is done with stage kt - 1
    const int next = kt + C::kStages - 1;
    if (next < n_k) load_stage(next % C::kStages, next * kBK);
    cp_async_commit();
    const uint32_t sa = s0 + (kt % C::kStages) * C::kStageBytes, sb = sa + C::kABytes;
    attn::warp_tile_mma<C::kMT, C::kNT, kBK, kTrans, C::kBNF>(sa, sb, wm, wn, lane, acc);
  }
  cp_async_wait<0>();

  // Epilogue: thread holds rows lane / 4 (+ 8) and fused columns (2q, 2q + 1), q = lane % 4.
#pragma unroll
  for (int mt = 0; mt < C::kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = (wm * C::kMT + mt) * 16 + lane / 4 + half * 8;
      if (r >= rows) continue;
#pragma unroll
      for (int nt = 0; nt < C::kNT; ++nt) {
        const int f = n0 + wn * C::kNT * 8 + nt * 8 + 2 * (lane % 4);
        if (f >= p.NF) continue;
        float v0 = acc[mt][nt][2 * half], v1 = acc[mt][nt][2 * half + 1];
        if constexpr (kUp) {
          const int i = f / 2;
          p.act[int64_t(row0 + r) * p.d_ff + i] = __float2bfloat16(
              glu_output(v0, v1, ew.gate_up_bias, p.s.interleaved, i, p.d_ff, p.s.glu_kind, p.s.alpha, p.s.limit));
        } else {
          if (ew.down_bias != nullptr) v0 += ew.down_bias[f], v1 += ew.down_bias[f + 1];
          const int64_t pair = p.perm[row0 + r];
          *reinterpret_cast<float2*>(p.y + pair * p.NF + f) = make_float2(v0, v1);
        }
      }
    }
  }
}

template <typename C, bool kUp, bool kTrans>
void launch_gemm(GemmParams p, int n_slots, cudaStream_t stream) {
  const auto kernel = moe_gemm_kernel<C, kUp, kTrans>;
  prepare_smem(kernel, C::kSmemBytes);
  const TileGrid g = moe_tile_grid(n_slots, (p.NF + C::kBNF - 1) / C::kBNF);
  p.n_fast = g.n_fast;
  const dim3 grid = g.grid;
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
}

template <typename C>
void run_grouped(GemmParams p, const bf16* x, const int32_t* experts, int64_t n_pairs, int n_experts,
                 MoeGroupedScratch& sc, cudaStream_t stream) {
  const int n_slots = moe_tile_slots(n_pairs, n_experts, C::kBM);
  launch_moe_align(experts, n_pairs, n_experts, C::kBM, sc.perm, sc.tiles, n_slots, stream);
  p.tiles = sc.tiles;
  p.perm = sc.perm;
  // up: K = d_model, NF = 2 d_ff
  p.a = x;
  p.K = int(p.s.d_model);
  p.NF = int(2 * p.s.d_ff);
  if (p.s.transposed) launch_gemm<C, true, true>(p, n_slots, stream);
  else launch_gemm<C, true, false>(p, n_slots, stream);
  // down: K = d_ff, NF = d_model
  p.a = sc.act;
  p.K = int(p.s.d_ff);
  p.NF = int(p.s.d_model);
  if (p.s.transposed) launch_gemm<C, false, true>(p, n_slots, stream);
  else launch_gemm<C, false, false>(p, n_slots, stream);
}

bool prefill_tiles(int64_t n_pairs, int n_experts) { return n_pairs >= int64_t(kPrefillRowsPerExpert) * n_experts; }

}  // namespace

// Expert e's c_e pairs make ceil(c_e / bm) tiles, at most c_e / bm + 1 and at most c_e:
// in all at most n_pairs / bm + (experts with pairs), and at most n_pairs (the bound that
// holds at decode's one-row tiles, where the first gave twice the CTA rows, half dead).
int moe_tile_slots(int64_t n_pairs, int n_experts, int bm) {
  return int(std::min<int64_t>(n_pairs, (n_pairs + bm - 1) / bm + std::min<int64_t>(n_pairs, n_experts)));
}

int moe_grouped_bm(int64_t n_pairs, int n_experts) {
  return prefill_tiles(n_pairs, n_experts) ? PrefillGemm::kBM : DecodeGemm::kBM;
}

bool moe_grouped_supported(const MoeShape& s, bool fused_gate_up, int n_experts) {
  if (n_experts > kMoeAlignMaxExperts || s.d_model % 8 != 0 || s.d_ff % 8 != 0) return false;
  if (s.d_model > INT32_MAX / 4 || s.d_ff > INT32_MAX / 4) return false;
  // Transposed weights are read as [K, fused columns]: gate and up must alternate.
  return !s.transposed || (fused_gate_up && s.interleaved);
}

int moe_grouped_smem_bytes() { return std::max(DecodeGemm::kSmemBytes, PrefillGemm::kSmemBytes); }

void launch_moe_grouped(const bf16* x, const ExpertWeights* expert_table, const int32_t* experts,
                        const MoeShape& s, int64_t n_pairs, int n_experts, int top_k, MoeGroupedScratch& sc,
                        cudaStream_t stream) {
  if (n_pairs == 0) return;
  GemmParams p{};
  p.experts = expert_table;
  p.top_k = top_k;
  p.d_ff = int(s.d_ff);
  p.s = s;
  p.act = sc.act;
  p.y = sc.y;
  if (!prefill_tiles(n_pairs, n_experts)) run_grouped<DecodeGemm>(p, x, experts, n_pairs, n_experts, sc, stream);
  else if (blocks_fit_sm(PrefillGemm::kSmemBytes, 2)) run_grouped<PrefillGemm>(p, x, experts, n_pairs, n_experts, sc, stream);
  else run_grouped<PrefillGemm2>(p, x, experts, n_pairs, n_experts, sc, stream);
}

}  // namespace kiln::cuda
