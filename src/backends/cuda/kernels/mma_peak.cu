// The tensor cores' mma.sync peak on this device, measured: the ceiling the prefill-
// shaped GEMMs are reported against (kiln bench op, docs/PERF.md). Every warp issues
// kChains independent chains of mma.sync on register operands (no memory traffic in
// the loop), so the rate is the tensor pipe's, not a kernel's: FLOPs = 2 m n k per mma.
// The operands are made from the thread index (not constants the compiler could fold)
// and the accumulators are written out only if a sum is impossible, so nothing is
// dead code.
//
// The chains multiply a 4 x 8 grid of A and B fragments, as a GEMM's 64 x 64 warp tile
// does, and every fragment changes each iteration (one XOR per register, 0.75 per mma): with
// fixed operands ptxas hoists whatever it can out of the loop. That matters where an
// instruction is not native: SM 9.0 (H100) has no e4m3 mma.sync and runs it as a
// conversion to fp16 and fp16 tensor-core work (a product it could hoist, leaving only
// the adds: an earlier version of this kernel measured 1530 "TFLOP/s" there, 2.8x the
// bf16 rate, which no GEMM could approach).
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/kernels.h"

// e4m3 mma.sync exists from SM 8.9 (Ada) on; other targets compile a trap that the host
// never launches (mma_peak_supported).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define KILN_MMA_E4M3 1
#else
#define KILN_MMA_E4M3 0
#endif

namespace kiln::cuda {
namespace {

constexpr int kA = 4, kB = 8;  // A and B fragments per warp: a 64 x 64 warp tile's (m16 x n8 tiles)
constexpr int kChains = kA * kB;  // independent accumulators per warp: covers the mma latency
constexpr int kThreads = 256;     // one CTA per SM (the accumulators' registers): 2 warps per sub-core
constexpr int kIters = 256;

template <MmaKind K>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (K == MmaKind::kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
#if KILN_MMA_E4M3
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();
#endif
  }
}

template <MmaKind K>
__global__ void __launch_bounds__(kThreads, 1) mma_peak_kernel(float* sink) {
  // Chain (i, j) multiplies A fragment i by B fragment j.
  const uint32_t seed = threadIdx.x * 0x9e3779b9u + blockIdx.x;
  // Small finite values in both formats: bytes 0x00-0x3c (e4m3 up to 1.5, bf16 halves
  // with a small exponent), kept so by the per-iteration XOR of bits 2-4.
  uint32_t a[kA][4], b[kB][2];
#pragma unroll
  for (int i = 0; i < kA; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[i][r] = (seed >> ((i + r) % 8)) & 0x20202020u;
#pragma unroll
  for (int j = 0; j < kB; ++j) b[j][0] = (seed >> ((3 + j) % 8)) & 0x20202020u, b[j][1] = b[j][0] ^ 0x04040404u;
  float d[kChains][4] = {};
  for (int it = 0; it < kIters; ++it) {
    const uint32_t x = (uint32_t(it) * 0x04040404u) & 0x1c1c1c1cu;
#pragma unroll
    for (int i = 0; i < kA; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) a[i][r] ^= x;
#pragma unroll
    for (int j = 0; j < kB; ++j) b[j][0] ^= x, b[j][1] ^= x;
#pragma unroll
    for (int c = 0; c < kChains; ++c) mma<K>(d[c], a[c / kB], b[c % kB]);
  }
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  if (s == 1.2345e-30f) sink[threadIdx.x] = s;  // never true for these operands; keeps the loop
}

constexpr int64_t flops_per_mma(MmaKind k) { return k == MmaKind::kBf16 ? 2LL * 16 * 8 * 16 : 2LL * 16 * 8 * 32; }

}  // namespace

bool mma_peak_supported(MmaKind kind) {
  if (kind == MmaKind::kBf16) return true;
  int device = 0, major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor >= 89;
}

double measure_mma_peak_tflops(MmaKind kind, cudaStream_t stream) {
  if (!mma_peak_supported(kind)) return 0.0;
  int device = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto kernel = kind == MmaKind::kBf16 ? mma_peak_kernel<MmaKind::kBf16> : mma_peak_kernel<MmaKind::kE4m3>;
  const int blocks = sms * 8;  // 8 waves of one CTA per SM
  float* sink = nullptr;
  KILN_CUDA_CHECK(cudaMallocAsync(&sink, kThreads * sizeof(float), stream));
  cudaEvent_t begin, end;
  KILN_CUDA_CHECK(cudaEventCreate(&begin));
  KILN_CUDA_CHECK(cudaEventCreate(&end));
  std::vector<float> ms;
  for (int rep = 0; rep < 4; ++rep) {  // the first is a warm-up (clocks ramp)
    KILN_CUDA_CHECK(cudaEventRecord(begin, stream));
    kernel<<<blocks, kThreads, 0, stream>>>(sink);
    KILN_CUDA_LAUNCH_CHECK();
    KILN_CUDA_CHECK(cudaEventRecord(end, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(end));
    float t = 0.0f;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&t, begin, end));
    if (rep > 0) ms.push_back(t);
  }
  KILN_CUDA_CHECK(cudaEventDestroy(begin));
  KILN_CUDA_CHECK(cudaEventDestroy(end));
  KILN_CUDA_CHECK(cudaFreeAsync(sink, stream));
  float best = ms[0];
  for (float t : ms) best = t < best ? t : best;
  const double flops = double(blocks) * (kThreads / 32) * kIters * kChains * flops_per_mma(kind);
  return flops / (double(best) * 1e-3) / 1e12;
}

}  // namespace kiln::cuda
