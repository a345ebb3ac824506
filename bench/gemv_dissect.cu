// Where does the 4-bit MoE GEMV's time go at one token? (docs/PERF.md, "Quantized MoE
// decode".) gpt-oss-120b's one-token up projection (4 of 128 experts, 5760 x 2944 MXFP4
// inputs, 36 MB of codes and scales) streamed by a copy of quant_gemv.cu's inner loop with
// its parts switched on one at a time:
//   codes            the 16-byte code loads of the register ring, nothing else;
//   + scales         and the scale byte of each lane's chunk;
//   + decode         and the e2m1 -> bf16 decoding times the scale (no tensor cores);
//   full             and the activation row staged in shared memory and mma.sync (the kernel);
// and variants of the full loop: ring depth, L2 prefetch, the codes through a per-warp
// shared-memory ring filled by cp.async (gemv_async: D blocks in flight without holding
// registers; slower than the register ring at every depth), and how the k loop is written
// (kLoop: a constant block count, a runtime one with every block guarded, as quant_gemv.cu
// had it, or a runtime one with an unguarded steady state, as it has now). At 4 experts per
// launch (one token) and 31 (eight tokens). Launched 64 times back to back over different
// experts (L2 cold), as a decode step's kernels run; TB/s counts codes and scales.
//   nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/gemv_dissect bench/gemv_dissect.cu && /tmp/gemv_dissect
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CHECK(x)                                                          \
  do {                                                                    \
    const cudaError_t e = (x);                                            \
    if (e != cudaSuccess) {                                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                 \
      return 1;                                                           \
    }                                                                     \
  } while (0)

constexpr int kExperts = 128, kTopK = 4, kRows = 5760, kK = 2880, kKp = 2944, kBlocks = kKp / 128;
constexpr int kCodeRow = kBlocks * 64, kScaleRow = kBlocks * 4, kUnits = kRows / 16, kWarps = 4;
constexpr int64_t kExpertCodes = int64_t(kRows) * kCodeRow, kExpertScales = int64_t(kRows) * kScaleRow;

enum Mode { kCodes, kScales, kDecode, kFull, kFullNoScale };

__device__ __forceinline__ uint32_t decode_pair(uint32_t w, int i) {
  const uint32_t u = w << (12 - 4 * i);
  return (u & 0x80008000u) | ((u & 0x70007000u) >> 6);
}
__device__ __forceinline__ uint32_t pre_scale(uint32_t bits) {
  if (bits - 1u < 154u) return ((bits + 100u) << 7) * 0x10001u;
  return 0x3f803f80u;
}
__device__ __forceinline__ uint32_t hmul(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a), y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 r = __hmul2(x, y);
  return *reinterpret_cast<uint32_t*>(&r);
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct Slot {
  uint32_t w[2][4];
  uint32_t s[2];
};

// kPrefetch: 0 none; D > 0: each lane asks L2 for its chunk of block b + D when it loads
// block b (prefetch.global.L2, no registers); -1: the warp asks for all of its rows at the
// start (cp.async.bulk.prefetch.L2, one per row).
// kLoop: 0 the block count a compile-time constant (the compiler unrolls the whole
// k loop); 1 a kernel argument, every block's load and compute guarded (quant_gemv.cu's
// loop); 2 a kernel argument, the steady state unguarded and only the last R blocks guarded.
template <int kMode, int R, int kPrefetch = 0, int kLoop = 0, bool kUnitMajor = false>
__global__ void __launch_bounds__(128) gemv(int n_blocks, const uint8_t* __restrict__ codes_base,
                                            const uint8_t* __restrict__ scales_base, const int* __restrict__ experts,
                                            const __nv_bfloat16* __restrict__ x, __nv_bfloat16* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int e = experts[blockIdx.x];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int unit = blockIdx.y * kWarps + warp;
  const uint8_t* codes[2];
  const uint8_t* scales[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int f = 2 * (8 * unit + g) + h;
    if (kUnitMajor) {  // a unit's 16 rows block by block: 1 KB of codes, 64 bytes of scales per block
      codes[h] = codes_base + e * kExpertCodes + int64_t(unit) * kBlocks * 1024 + (f - 16 * unit) * 64 + t * 16;
      scales[h] = scales_base + e * kExpertScales + int64_t(unit) * kBlocks * 64 + (f - 16 * unit) * 4 + t;
    } else {
      codes[h] = codes_base + e * kExpertCodes + int64_t(f) * kCodeRow + t * 16;
      scales[h] = scales_base + e * kExpertScales + int64_t(f) * kScaleRow + t;
    }
  }
  constexpr int kCodeStep = kUnitMajor ? 1024 : 64, kScaleStep = kUnitMajor ? 64 : 4;
  if (kPrefetch < 0 && t == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(codes[h]), "r"(kCodeRow) : "memory");
  }
  const auto load = [&](int blk, Slot& st) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (kPrefetch > 0 && blk + kPrefetch < kBlocks)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(codes[h] + (blk + kPrefetch) * 64));
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(codes[h] + blk * kCodeStep));
      st.w[h][0] = q.x, st.w[h][1] = q.y, st.w[h][2] = q.z, st.w[h][3] = q.w;
      st.s[h] = kMode >= kScales ? __ldg(scales[h] + blk * kScaleStep) : 0u;
    }
  };
  const int nb = kLoop == 0 ? kBlocks : n_blocks;
  Slot ring[R];
#pragma unroll
  for (int j = 0; j < R - 1; ++j)
    if (j < nb) load(j, ring[j]);
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem);
  if (kMode >= kFull) {
    for (int c = threadIdx.x; c < kKp / 8; c += 128) {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (c * 8 < kK) v = *reinterpret_cast<const uint4*>(x + c * 8);
      *reinterpret_cast<uint4*>(xs + c * 8) = v;
    }
    __syncthreads();
  }
  const __nv_bfloat16* xg = xs + 32 * t;
  float acc[4] = {0, 0, 0, 0};
  uint32_t sum = 0;
  const auto compute = [&](const Slot& st, int blk) {
    if (kMode <= kScales) {
      sum ^= st.w[0][0] + st.w[0][1] + st.w[0][2] + st.w[0][3] + st.w[1][0] + st.w[1][1] + st.w[1][2] + st.w[1][3] +
             st.s[0] + st.s[1];
      return;
    }
    uint32_t sf[2] = {pre_scale(st.s[0]), pre_scale(st.s[1])};
    float part[2][4] = {};
#pragma unroll
    for (int step = 0; step < 8; ++step) {
      uint32_t a[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t w = st.w[h][step / 2];
        const uint32_t lo = decode_pair(w, 2 * (step % 2)), hi = decode_pair(w, 2 * (step % 2) + 1);
        a[h] = kMode == kFullNoScale ? lo : hmul(lo, sf[h]);
        a[2 + h] = kMode == kFullNoScale ? hi : hmul(hi, sf[h]);
      }
      if (kMode == kDecode) {
        sum ^= a[0] + a[1] + a[2] + a[3];
      } else {
        const uint2 b = *reinterpret_cast<const uint2*>(xg + blk * 128 + 4 * step);
        mma_bf16(part[step % 2], a, b.x, b.y);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] += part[0][j] + part[1][j];
  };
  int b0 = 0;
  if (kLoop == 2) {
    for (; b0 + 2 * R - 1 <= nb; b0 += R) {
#pragma unroll
      for (int j = 0; j < R; ++j) {
        load(b0 + j + R - 1, ring[(j + R - 1) % R]);
        compute(ring[j], b0 + j);
      }
    }
  }
  for (; b0 < nb; b0 += R) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int blk = b0 + j;
      if (blk < nb) {
        if (blk + R - 1 < nb) load(blk + R - 1, ring[(j + R - 1) % R]);
        compute(ring[j], blk);
      }
    }
  }
  if (kMode <= kDecode) {
    if (sum == 0x12345678u) out[0] = __float2bfloat16(1.0f);
    return;
  }
  if (t == 0) out[int64_t(blockIdx.x) * kRows + 8 * unit + g] = __float2bfloat16(acc[0] * acc[2] + acc[1] * acc[3]);
}

// The same loop with the codes streamed through a per-warp shared-memory ring of D blocks
// by cp.async (D blocks in flight without holding registers); scales through a register
// ring of the same depth. kCodesOnly: read back and XOR, no decoding (the streaming bound).
template <int D, bool kCodesOnly>
__global__ void __launch_bounds__(128) gemv_async(int n_blocks, const uint8_t* __restrict__ codes_base,
                                                  const uint8_t* __restrict__ scales_base,
                                                  const int* __restrict__ experts,
                                                  const __nv_bfloat16* __restrict__ x, __nv_bfloat16* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int e = experts[blockIdx.x];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int unit = blockIdx.y * kWarps + warp;
  const uint8_t* codes[2];
  const uint8_t* scales[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int f = 2 * (8 * unit + g) + h;
    codes[h] = codes_base + e * kExpertCodes + int64_t(f) * kCodeRow + t * 16;
    scales[h] = scales_base + e * kExpertScales + int64_t(f) * kScaleRow + t;
  }
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem);
  uint4* ring = reinterpret_cast<uint4*>(smem + kKp * 2) + (warp * D * 32 + lane) * 2;  // stage s: + 64 s
  uint32_t sring[D][2];
  const auto issue = [&](int blk) {
    if (blk < kBlocks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(ring + (blk % D) * 64 + h));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(codes[h] + blk * 64) : "memory");
        sring[blk % D][h] = kCodesOnly ? 0u : __ldg(scales[h] + blk * 4);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
#pragma unroll
  for (int j = 0; j < D - 1; ++j) issue(j);
  if (!kCodesOnly) {
    for (int c = threadIdx.x; c < kKp / 8; c += 128) {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (c * 8 < kK) v = *reinterpret_cast<const uint4*>(x + c * 8);
      *reinterpret_cast<uint4*>(xs + c * 8) = v;
    }
    __syncthreads();
  }
  const __nv_bfloat16* xg = xs + 32 * t;
  float acc[4] = {0, 0, 0, 0};
  uint32_t sum = 0;
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    issue(blk + D - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(D - 1) : "memory");
    Slot st;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 q = ring[(blk % D) * 64 + h];
      st.w[h][0] = q.x, st.w[h][1] = q.y, st.w[h][2] = q.z, st.w[h][3] = q.w;
      st.s[h] = sring[blk % D][h];
    }
    if (kCodesOnly) {
      sum ^= st.w[0][0] + st.w[0][1] + st.w[0][2] + st.w[0][3] + st.w[1][0] + st.w[1][1] + st.w[1][2] + st.w[1][3];
      continue;
    }
    uint32_t sf[2] = {pre_scale(st.s[0]), pre_scale(st.s[1])};
    float part[2][4] = {};
#pragma unroll
    for (int step = 0; step < 8; ++step) {
      uint32_t a[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t w = st.w[h][step / 2];
        a[h] = hmul(decode_pair(w, 2 * (step % 2)), sf[h]);
        a[2 + h] = hmul(decode_pair(w, 2 * (step % 2) + 1), sf[h]);
      }
      const uint2 b = *reinterpret_cast<const uint2*>(xg + blk * 128 + 4 * step);
      mma_bf16(part[step % 2], a, b.x, b.y);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] += part[0][j] + part[1][j];
  }
  if (kCodesOnly) {
    if (sum == 0x12345678u) out[0] = __float2bfloat16(1.0f);
    return;
  }
  if (t == 0) out[int64_t(blockIdx.x) * kRows + 8 * unit + g] = __float2bfloat16(acc[0] * acc[2] + acc[1] * acc[3]);
}
template <int D, bool kCodesOnly>
constexpr int async_smem() { return kKp * 2 + kWarps * D * 1024; }

int main() {
  constexpr int kIters = 64;
  uint8_t *codes = nullptr, *scales = nullptr;
  __nv_bfloat16 *x = nullptr, *out = nullptr;
  int* experts = nullptr;
  CHECK(cudaMalloc(&codes, kExpertCodes * kExperts));
  CHECK(cudaMalloc(&scales, kExpertScales * kExperts));
  CHECK(cudaMemset(codes, 0x5a, kExpertCodes * kExperts));
  CHECK(cudaMemset(scales, 120, kExpertScales * kExperts));
  CHECK(cudaMalloc(&x, kKp * 2));
  CHECK(cudaMemset(x, 0x3c, kKp * 2));
  CHECK(cudaMalloc(&out, kRows * 32 * 2));
  CHECK(cudaMalloc(&experts, sizeof(int) * 1024));
  std::vector<int> host(1024);
  for (size_t i = 0; i < host.size(); ++i) host[i] = int((i * 37 + 11) % kExperts);
  CHECK(cudaMemcpy(experts, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  int n_experts = kTopK;  // experts per launch
  int smem_override = 0;  // the cp.async variants' rings
  const auto run = [&](const char* name, auto kernel) {
    const dim3 grid(n_experts, kUnits / kWarps);
    const double bytes = double(n_experts) * (kExpertCodes + kExpertScales);
    const int smem = std::max(kKp * 2, smem_override);
    if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const auto launch = [&](int i) { kernel<<<grid, 128, smem>>>(kBlocks, codes, scales, experts + n_experts * (i % 16), x, out); };
    for (int i = 0; i < 3; ++i) launch(i);
    cudaEventRecord(e0);
    for (int i = 0; i < kIters; ++i) launch(i);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = 1000.0 * ms / kIters;
    std::printf("%-28s %7.1f us  %5.2f TB/s\n", name, us, bytes / us / 1e6);
  };
  for (int n : {31, kTopK}) {
    n_experts = n;
    std::printf("== %d experts per launch\n", n);
    const auto run_async = [&](const char* name, auto kernel, int smem) {
      smem_override = smem;
      run(name, kernel);
      smem_override = 0;
    };
    run("unit-major: codes, ring 4", gemv<kCodes, 4, 0, 0, true>);
    run("unit-major: codes, ring 8", gemv<kCodes, 8, 0, 0, true>);
    run("unit-major: full, ring 4", gemv<kFull, 4, 0, 0, true>);
    run("unit-major: full, ring 4, runtime K, steady", gemv<kFull, 4, 0, 2, true>);
    run("unit-major: full, ring 8, runtime K, steady", gemv<kFull, 8, 0, 2, true>);
    run("row-major: codes, ring 4", gemv<kCodes, 4>);
    run("row-major: full, ring 4, runtime K, steady", gemv<kFull, 4, 0, 2>);
    run_async("async codes, D 4", gemv_async<4, true>, async_smem<4, true>());
    run_async("async codes, D 8", gemv_async<8, true>, async_smem<8, true>());
    run_async("async codes, D 12", gemv_async<12, true>, async_smem<12, true>());
    run_async("async full, D 4", gemv_async<4, false>, async_smem<4, false>());
    run_async("async full, D 6", gemv_async<6, false>, async_smem<6, false>());
    run_async("async full, D 8", gemv_async<8, false>, async_smem<8, false>());
    run_async("async full, D 12", gemv_async<12, false>, async_smem<12, false>());
    run("full, ring 4, runtime K", gemv<kFull, 4, 0, 1>);
    run("full, ring 4, runtime K, steady", gemv<kFull, 4, 0, 2>);
    run("full, ring 8, runtime K, steady", gemv<kFull, 8, 0, 2>);
    run("full, ring 3, runtime K, steady", gemv<kFull, 3, 0, 2>);
    run("codes, ring 4", gemv<kCodes, 4>);
    run("codes, ring 8", gemv<kCodes, 8>);
    run("+ scales, ring 4", gemv<kScales, 4>);
    run("+ decode, ring 4", gemv<kDecode, 4>);
    run("full, ring 4", gemv<kFull, 4>);
    run("full without scale, ring 4", gemv<kFullNoScale, 4>);
    run("full, ring 2", gemv<kFull, 2>);
    run("full, ring 8", gemv<kFull, 8>);
    run("full, ring 4, L2 prefetch 4", gemv<kFull, 4, 4>);
    run("full, ring 4, L2 prefetch 8", gemv<kFull, 4, 8>);
    run("full, ring 4, L2 prefetch 16", gemv<kFull, 4, 16>);
    run("full, ring 4, bulk prefetch", gemv<kFull, 4, -1>);
    run("codes, ring 4, bulk prefetch", gemv<kCodes, 4, -1>);
    run("codes, ring 4 (again)", gemv<kCodes, 4>);
  }
  CHECK(cudaGetLastError());
  return 0;
}
