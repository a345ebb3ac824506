// Grouped MoE GEMMs over MXFP4 / NVFP4 experts on consumer Blackwell's block-scaled
// tensor cores (sm_120a / sm_121a only): the native twin of quant_gemm.cu's prefill
// path, with the same tile table (moe_gemm.cu's launch_moe_align), the same fused
// gate/up columns and GLU epilogue, the same outputs (act, then y per pair) and the
// weights in quant_pack.h's layout, read as they are (codes and scale bytes go straight
// into the mma's operands and scale factors; nothing is dequantized).
//
// Activations are quantized on the fly, once per GEMM by a pre-pass (quantize_act_kernel:
// x before the up GEMM, act before the down GEMM), to the format quant_mma_sm120.h
// specifies: e4m3 with ue8m0 per 32 (MXFP4 weights, mxf8f6f4, W4A8) or e2m1 with ue4m3
// per 16 and an fp32 scale per row (NVFP4, mxf4nvf4, W4A4); the header says why. The
// pre-pass is portable code and reads each activation row once, where quantizing inside
// the GEMM would redo it in every column block.
//
// Tile: kBM 64 rows x kBN 128 fused columns, 2 x 2 warps of 32 x 64, 128 inputs per
// stage in a 3-stage cp.async pipeline; per stage and warp one ldmatrix.x4 per n8 tile
// brings its weight words, per k step one per m16 tile the activations, one 32-bit load
// per tile the scale words. Shared memory: 3 x 17,152 B (e4m3) or 3 x 13,824 B (e2m1).
// Untuned (no SM120 card here): 3 stages keep the e2m1 kernel at two CTAs per SM in
// 100 KB.
//
// Only sm_120a / sm_121a device code holds the block-scaled mma (its PTX is rejected
// elsewhere). Other targets compile the kernels to a trap that is never launched: the
// launcher refuses a device that is not SM 12.x or runs no native image (a compute_90
// PTX JIT-compiled on an SM120 card would be such a build; quant_sm120_native_available
// runs a probe kernel to tell). The start-up self-test then proves the path against
// the host reference before the backend uses it.
#include <algorithm>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/attention_mma.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/quant_decode.cuh"
#include "backends/cuda/kernels/quant_mma_sm120.h"
#include "backends/cuda/kernels/smem.cuh"

// The architecture-specific features of sm_120a / sm_121a (also sm_120f): nvcc 13.0
// defines __CUDA_ARCH_FAMILY_SPECIFIC__ 1200 / 1210 for them and nothing for sm_90 or
// plain sm_120 (checked by compiling; shared/research/kernels-sm120.md 2.1).
#if defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1200 && \
    __CUDA_ARCH_FAMILY_SPECIFIC__ < 1300
#define KILN_SM120_NATIVE 1
#else
#define KILN_SM120_NATIVE 0
#endif

namespace kiln::cuda {
namespace {

using sm120::ActFormat;
constexpr int kStages = 3;

template <ActFormat F>
constexpr int kSmemBytes = kStages * sm120::stage_bytes(F);
static_assert(kSmemBytes<ActFormat::kE4m3> <= 101376 && kSmemBytes<ActFormat::kE2m1> <= 101376,
              "must fit the SM120 per-block shared memory");
static_assert(sm120::kBN == sm120::kThreads, "one thread per weight row copies its scales");

struct NativeParams {
  const int4* tiles;           // (expert, first sorted row, rows, 0); expert < 0: no tile
  const int32_t* perm;         // pair index of each sorted row
  const QuantExpert* experts;
  const uint8_t* a_codes;      // quantized activations (quant_mma_sm120.h layout): up: per token,
  const uint8_t* a_scales;     // down: per sorted row
  const float* a_row_scale;    // e2m1: per row; e4m3: unused
  int64_t a_code_row, a_scale_row;
  int top_k, K, NF, d_ff;
  int64_t code_row, scale_row;  // the weights' packed row bytes at this K
  MoeShape s;
  bf16* act;                   // up output [n_pairs, d_ff], sorted rows
  float* y;                    // down output [n_pairs, d_model], per pair
};

// 4 or 8 bytes global -> shared (L1-allocating, the only sizes under 16); valid ==
// false zero-fills.
template <int kBytes>
__device__ __forceinline__ void cp_async_small(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(kBytes),
               "r"(valid ? kBytes : 0));
}

#if KILN_SM120_NATIVE
// d += (a * scale_a) (b * scale_b): A 16 x k, B k x 8, one scale byte per block of inputs
// per row / column chosen by (byte-id, thread-id) (quant_mma_sm120.h's mapping).
template <ActFormat F>
__device__ __forceinline__ void mma_block_scaled(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                 uint32_t sfa, uint32_t sfb, uint16_t byte_id) {
  const uint16_t tid = sm120::kScaleThreadId;
  if constexpr (F == ActFormat::kE4m3) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e2m1.f32.ue8m0 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {%11,%12}, %13, {%11,%12};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(sfa), "h"(byte_id), "h"(tid), "r"(sfb));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {%11,%12}, %13, {%11,%12};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(sfa), "h"(byte_id), "h"(tid), "r"(sfb));
  }
}
#endif

// The activation row a sorted row of the tile reads: its token (up) or itself (down).
template <bool kUp>
__device__ __forceinline__ int64_t a_row(const NativeParams& p, int sorted_row) {
  return kUp ? p.perm[sorted_row] / p.top_k : sorted_row;
}

template <ActFormat F, bool kUp>
__global__ void __launch_bounds__(sm120::kThreads) moe_gemm_sm120_kernel(const NativeParams p) {
#if KILN_SM120_NATIVE
  using namespace sm120;
  constexpr int kARow = a_row_bytes(F), kAChunksRow = kARow / 16, kSc = scale_row_bytes(F);
  constexpr int kAChunks = kBM * kAChunksRow / kThreads, kBChunks = kBN * (kBRowBytes / 16) / kThreads;
  constexpr int kStage = stage_bytes(F);
  extern __shared__ __align__(128) unsigned char smem[];
  const int4 tile = p.tiles[blockIdx.x];
  if (tile.x < 0) return;
  const int row0 = tile.y, rows = tile.z, n0 = int(blockIdx.y) * kBN;
  const QuantExpert* ew = p.experts + tile.x;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  const uint32_t s0 = attn::smem_u32(smem);

  // Source rows this thread copies, fixed across stages.
  const uint8_t* a_src[kAChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int r = (tid + i * kThreads) / kAChunksRow;
    a_src[i] = r < rows ? p.a_codes + a_row<kUp>(p, row0 + r) * p.a_code_row : nullptr;
  }
  const uint8_t* as_src = tid < rows ? p.a_scales + a_row<kUp>(p, row0 + tid) * p.a_scale_row : nullptr;
  const uint8_t* b_src[kBChunks];
#pragma unroll
  for (int i = 0; i < kBChunks; ++i) {
    const int f = n0 + (tid + i * kThreads) / (kBRowBytes / 16);
    b_src[i] = nullptr;
    if (f < p.NF) {
      const QuantRowRef w = quant_row(QuantMat{}, ew, kUp, p.s.interleaved, p.d_ff, f);
      b_src[i] = w.m.codes + quant_block_offset(w.row, 0, p.code_row, kBRowBytes);
    }
  }
  const uint8_t* bs_src = nullptr;
  if (n0 + tid < p.NF) {
    const QuantRowRef w = quant_row(QuantMat{}, ew, kUp, p.s.interleaved, p.d_ff, n0 + tid);
    bs_src = w.m.scales + quant_block_offset(w.row, 0, p.scale_row, kSc);
  }

  const auto load_stage = [&](int stage, int kt) {
    const uint32_t base = s0 + stage * kStage;
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      const int c = tid + i * kThreads, r = c / kAChunksRow, ch = c % kAChunksRow;
      const bool valid = a_src[i] != nullptr;
      attn::cp_async_16(base + tile_chunk(r, ch, kARow), valid ? a_src[i] + int64_t(kt) * kARow + 16 * ch : p.a_codes,
                        valid);
    }
    if (tid < kBM) {
      cp_async_small<kSc>(base + a_scales_offset(F) + tid * kSc, as_src ? as_src + int64_t(kt) * kSc : p.a_scales,
                          as_src != nullptr);
    }
#pragma unroll
    for (int i = 0; i < kBChunks; ++i) {
      const int c = tid + i * kThreads, r = c / (kBRowBytes / 16), ch = c % (kBRowBytes / 16);
      const bool valid = b_src[i] != nullptr;
      attn::cp_async_16(base + b_codes_offset(F) + tile_chunk(r, ch, kBRowBytes),
                        valid ? b_src[i] + int64_t(kt) * kQuantUnitRows * kBRowBytes + 16 * ch : p.a_codes, valid);
    }
    // (Weights are unit-major, quant_layout.h: a row's next block is 16 rows' blocks on.)
    cp_async_small<kSc>(base + b_scales_offset(F) + tid * kSc,
                        bs_src ? bs_src + int64_t(kt) * kQuantUnitRows * kSc : p.a_scales, bs_src != nullptr);
  };

  float acc[kMT][kNT][4] = {};
  const int n_k = int(k_padded(p.K) / kKTile);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_k) load_stage(s, s);
    attn::cp_async_commit();
  }
  for (int kt = 0; kt < n_k; ++kt) {
    attn::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed; every warp is done with stage kt - 1
    const int next = kt + kStages - 1;
    if (next < n_k) load_stage(next % kStages, next);
    attn::cp_async_commit();
    const uint32_t base = s0 + (kt % kStages) * kStage;
    const unsigned char* sp = smem + (kt % kStages) * kStage;
    uint32_t bq[kNT][4];  // the warp's weight words for the whole stage
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      attn::ldmatrix_x4(base + b_codes_offset(F) + b_frag_addr(lane, (wn * kNT + nt) * 8), bq[nt]);
#pragma unroll
    for (int ks = 0; ks < k_steps(F); ++ks) {
      uint32_t af[kMT][4], sfa[kMT];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int m0 = (wm * kMT + mt) * 16;
        attn::ldmatrix_x4(base + a_frag_addr(F, lane, m0, ks), af[mt]);
        sfa[mt] = *reinterpret_cast<const uint32_t*>(sp + a_scales_offset(F) + sfa_offset(F, lane, m0, ks));
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const uint32_t sfb =
            *reinterpret_cast<const uint32_t*>(sp + b_scales_offset(F) + sfb_offset(F, lane, (wn * kNT + nt) * 8, ks));
        uint32_t b0, b1;
        b_operand(F, bq[nt], ks, b0, b1);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          mma_block_scaled<F>(acc[mt][nt], af[mt], b0, b1, sfa[mt], sfb, uint16_t(scale_byte_id(F, ks)));
      }
    }
  }
  attn::cp_async_wait<0>();

  // Epilogue (quant_gemm.cu's): fused columns (2q, 2q + 1) are a (gate, up) pair or two
  // down columns; NVFP4's global weight scales and the e2m1 activations' row scale
  // multiply the fp32 sums.
  float g2 = 1.0f, u2 = 1.0f;
  if (const float* s2 = quant_row(QuantMat{}, ew, kUp, p.s.interleaved, p.d_ff, 0).m.scale2) g2 = *s2;
  if (const float* s2 = quant_row(QuantMat{}, ew, kUp, p.s.interleaved, p.d_ff, 1).m.scale2) u2 = *s2;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = (wm * kMT + mt) * 16 + acc_row(lane, 2 * half);
      if (r >= rows) continue;
      const float rs = F == ActFormat::kE2m1 ? p.a_row_scale[a_row<kUp>(p, row0 + r)] : 1.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int f = n0 + (wn * kNT + nt) * 8 + acc_col(lane, 0);
        if (f >= p.NF) continue;
        float v0 = acc[mt][nt][2 * half] * rs * g2, v1 = acc[mt][nt][2 * half + 1] * rs * u2;
        if constexpr (kUp) {
          const int i = f / 2;
          p.act[int64_t(row0 + r) * p.d_ff + i] = __float2bfloat16(
              glu_output(v0, v1, ew->gate_up_bias, p.s.interleaved, i, p.d_ff, p.s.glu_kind, p.s.alpha, p.s.limit));
        } else {
          if (ew->down_bias != nullptr) v0 += ew->down_bias[f], v1 += ew->down_bias[f + 1];
          const int64_t pair = p.perm[row0 + r];
          *reinterpret_cast<float2*>(p.y + pair * p.NF + f) = make_float2(v0, v1);
        }
      }
    }
  }
#else
  __trap();  // never launched: launch_moe_grouped_quant_sm120 refuses a device without native code
#endif
}

// One CTA per activation row: the row's blocks quantized by quant_mma_sm120.h's block
// functions, the e2m1 row scale from the row's maximum first (a block reduction).
constexpr int kQuantThreads = 128;

template <ActFormat F>
__global__ void __launch_bounds__(kQuantThreads) quantize_act_kernel(const bf16* x, int64_t K, uint8_t* codes,
                                                                     uint8_t* scales, float* row_scale) {
  using namespace sm120;
  constexpr int kGroup = act_group(F), kCodeBytes = kGroup * act_bits(F) / 8;
  const int64_t r = blockIdx.x;
  const bf16* xr = x + r * K;
  const int n_blocks = int(act_scale_row_bytes(F, K));
  // A block's inputs as floats (zero past K; K % 8 == 0, so a 16-byte chunk is all in or out).
  const auto load_block = [&](int b, float (&v)[kGroup]) {
#pragma unroll
    for (int c = 0; c < kGroup / 8; ++c) {
      const int64_t k = int64_t(b) * kGroup + 8 * c;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (k < K) raw = *reinterpret_cast<const uint4*>(xr + k);
      const bf16* h = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[8 * c + j] = __bfloat162float(h[j]);
    }
  };
  float g = 1.0f;
  if constexpr (F == ActFormat::kE2m1) {
    __shared__ float warp_amax[kQuantThreads / 32];
    float amax = 0.0f;
    for (int b = int(threadIdx.x); b < n_blocks; b += kQuantThreads) {
      float v[kGroup];
      load_block(b, v);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) amax = abs_max(amax, v[j]);
    }
    amax = warp_max(amax);
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
    g = e2m1_row_scale(amax);
    if (threadIdx.x == 0) row_scale[r] = g;
  }
  uint8_t* cr = codes + r * act_code_row_bytes(F, K);
  for (int b = int(threadIdx.x); b < n_blocks; b += kQuantThreads) {
    float v[kGroup];
    load_block(b, v);
    if constexpr (F == ActFormat::kE4m3) {
      uint32_t w[8];
      scales[r * n_blocks + b] = uint8_t(quantize_block_e4m3(v, w));
      uint4* dst = reinterpret_cast<uint4*>(cr + int64_t(b) * kCodeBytes);
      dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
      dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    } else {
      uint32_t w[2];
      scales[r * n_blocks + b] = uint8_t(quantize_block_e2m1(v, g, w));
      *reinterpret_cast<uint2*>(cr + int64_t(b) * kCodeBytes) = make_uint2(w[0], w[1]);
    }
  }
}

// Writes 1 when this device runs the native (sm_120a / sm_121a) code of this file.
__global__ void native_probe_kernel(int* out) { *out = KILN_SM120_NATIVE; }

template <ActFormat F, bool kUp>
void launch_gemm(const NativeParams& p, int n_slots, cudaStream_t stream) {
  const auto kernel = moe_gemm_sm120_kernel<F, kUp>;
  prepare_smem(kernel, kSmemBytes<F>);
  const dim3 grid(unsigned(n_slots), unsigned((p.NF + sm120::kBN - 1) / sm120::kBN));
  kernel<<<grid, sm120::kThreads, kSmemBytes<F>, stream>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
}

void set_rows(NativeParams& p, ActFormat a, const QuantFormat& f, int64_t K) {
  p.K = int(K);
  p.code_row = f.code_row_bytes(K);
  p.scale_row = f.scale_row_bytes(K);
  p.a_code_row = sm120::act_code_row_bytes(a, K);
  p.a_scale_row = sm120::act_scale_row_bytes(a, K);
}

template <ActFormat F>
void run_native(NativeParams p, const bf16* x, const QuantFormat& f, int64_t n_tokens, int64_t n_pairs, int n_slots,
                const QuantActBuffers& xq, const QuantActBuffers& aq, bf16* act, cudaStream_t stream) {
  // up: A = x quantized per token, K = d_model, NF = 2 d_ff
  launch_quantize_act(int(F), x, n_tokens, p.s.d_model, xq, stream);
  p.a_codes = xq.codes, p.a_scales = xq.scales, p.a_row_scale = xq.row_scale;
  p.NF = int(2 * p.s.d_ff);
  set_rows(p, F, f, p.s.d_model);
  launch_gemm<F, true>(p, n_slots, stream);
  // down: A = act quantized per sorted row, K = d_ff, NF = d_model
  launch_quantize_act(int(F), act, n_pairs, p.s.d_ff, aq, stream);
  p.a_codes = aq.codes, p.a_scales = aq.scales, p.a_row_scale = aq.row_scale;
  p.NF = int(p.s.d_model);
  set_rows(p, F, f, p.s.d_ff);
  launch_gemm<F, false>(p, n_slots, stream);
}

}  // namespace

int quant_native_act_format(const QuantFormat& f) {
  if (f.value != 0) return -1;  // e2m1 weights only
  if (f.scale_kind == 0 && f.group == 32) return int(ActFormat::kE4m3);  // MXFP4
  if (f.scale_kind == 1 && f.group == 16) return int(ActFormat::kE2m1);  // NVFP4
  return -1;
}

int quant_native_smem_bytes() { return std::max(kSmemBytes<ActFormat::kE4m3>, kSmemBytes<ActFormat::kE2m1>); }

bool quant_sm120_native_available() {
  int dev = 0, major = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major != 12) return false;
  static std::mutex mu;
  static std::map<int, bool> known;  // per device: the probe runs once
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(dev); it != known.end()) return it->second;
  int* d = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&d, sizeof(int)));
  KILN_CUDA_CHECK(cudaMemset(d, 0, sizeof(int)));
  native_probe_kernel<<<1, 1>>>(d);
  int native = 0;
  if (cudaGetLastError() == cudaSuccess) {  // no image for this device: not native
    KILN_CUDA_CHECK(cudaMemcpy(&native, d, sizeof(int), cudaMemcpyDeviceToHost));
  }
  KILN_CUDA_CHECK(cudaFree(d));
  return known[dev] = native == 1;
}

size_t quant_act_bytes(int act_format, int64_t rows, int64_t k) {
  const auto f = ActFormat(act_format);
  const auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  return up(size_t(rows * sm120::act_code_row_bytes(f, k))) + up(size_t(rows * sm120::act_scale_row_bytes(f, k))) +
         up(size_t(rows) * sizeof(float));
}

QuantActBuffers quant_act_buffers(int act_format, void* base, int64_t rows, int64_t k) {
  const auto f = ActFormat(act_format);
  const auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  auto* p = static_cast<uint8_t*>(base);
  QuantActBuffers q;
  q.codes = p;
  p += up(size_t(rows * sm120::act_code_row_bytes(f, k)));
  q.scales = p;
  p += up(size_t(rows * sm120::act_scale_row_bytes(f, k)));
  q.row_scale = reinterpret_cast<float*>(p);
  return q;
}

bool moe_native_quant_prefill(int64_t n_pairs, int n_experts) {
  return moe_grouped_bm(n_pairs, n_experts) == sm120::kBM;
}

size_t moe_native_quant_scratch_bytes(int act_format, const MoeShape& s, int64_t n_pairs, int top_k) {
  return quant_act_bytes(act_format, n_pairs / top_k, s.d_model) + quant_act_bytes(act_format, n_pairs, s.d_ff);
}

void launch_quantize_act(int act_format, const bf16* x, int64_t rows, int64_t k, const QuantActBuffers& out,
                         cudaStream_t stream) {
  KILN_CHECK(k % 8 == 0) << "quantize_act: " << k << " inputs (a multiple of 8)";
  if (rows == 0) return;
  if (ActFormat(act_format) == ActFormat::kE4m3) {
    quantize_act_kernel<ActFormat::kE4m3><<<unsigned(rows), kQuantThreads, 0, stream>>>(x, k, out.codes, out.scales,
                                                                                        out.row_scale);
  } else {
    quantize_act_kernel<ActFormat::kE2m1><<<unsigned(rows), kQuantThreads, 0, stream>>>(x, k, out.codes, out.scales,
                                                                                        out.row_scale);
  }
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_moe_grouped_quant_sm120(const bf16* x, const QuantExpert* table, const QuantFormat& f,
                                    const int32_t* experts, const MoeShape& s, int64_t n_pairs, int n_experts,
                                    int top_k, MoeGroupedScratch& sc, void* act_scratch, cudaStream_t stream) {
  if (n_pairs == 0) return;
  int dev = 0, major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  KILN_CHECK(major == 12) << "moe (native sm_120a): the block-scaled MMA kernels run on SM 12.x only; "
                          << "this device is sm_" << major * 10 + minor;
  KILN_CHECK(quant_sm120_native_available())
      << "moe (native sm_120a): this build has no sm_120a / sm_121a image for sm_" << major * 10 + minor
      << " (KILN_CUDA_ARCHS)";
  const int act_format = quant_native_act_format(f);
  KILN_CHECK(act_format >= 0) << "moe (native sm_120a): MXFP4 or NVFP4 experts only";
  KILN_CHECK(moe_native_quant_prefill(n_pairs, n_experts))
      << "moe (native sm_120a): prefill-shaped calls only (" << n_pairs << " pairs over " << n_experts << " experts)";
  KILN_CHECK(s.d_model % 8 == 0 && s.d_ff % 8 == 0) << "moe (native sm_120a): d_model and d_ff multiples of 8";
  const int n_slots = moe_tile_slots(n_pairs, n_experts, sm120::kBM);
  launch_moe_align(experts, n_pairs, n_experts, sm120::kBM, sc.perm, sc.tiles, n_slots, stream);
  const int64_t n_tokens = n_pairs / top_k;
  const QuantActBuffers xq = quant_act_buffers(act_format, act_scratch, n_tokens, s.d_model);
  const QuantActBuffers aq = quant_act_buffers(
      act_format, static_cast<uint8_t*>(act_scratch) + quant_act_bytes(act_format, n_tokens, s.d_model), n_pairs,
      s.d_ff);
  NativeParams p{};
  p.tiles = sc.tiles;
  p.perm = sc.perm;
  p.experts = table;
  p.top_k = top_k;
  p.d_ff = int(s.d_ff);
  p.s = s;
  p.act = sc.act;
  p.y = sc.y;
  if (ActFormat(act_format) == ActFormat::kE4m3) {
    run_native<ActFormat::kE4m3>(p, x, f, n_tokens, n_pairs, n_slots, xq, aq, sc.act, stream);
  } else {
    run_native<ActFormat::kE2m1>(p, x, f, n_tokens, n_pairs, n_slots, xq, aq, sc.act, stream);
  }
}

}  // namespace kiln::cuda
