// The tensor cores' mma.sync peak on this device, measured: the ceiling the prefill-
// shaped GEMMs are reported against (kiln bench op, docs/PERF.md). Every warp issues
// kChains independent chains of mma.sync on register operands (no memory traffic in
// the loop), so the rate is the tensor pipe's, not a kernel's: FLOPs = 2 m n k per mma.
// The operands are made from the thread index (not constants the compiler could fold)
// and the accumulators are written out only if a sum is impossible, so nothing is
// dead code.
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

constexpr int kChains = 8;  // independent accumulators per warp: covers the mma latency
constexpr int kThreads = 256;
constexpr int kIters = 256;  // about 50 ms per run on an H100

template <MmaKind K>
__global__ void __launch_bounds__(kThreads) mma_peak_kernel(float* sink) {
  const uint32_t seed = threadIdx.x * 0x9e3779b9u + blockIdx.x;
  const uint32_t a0 = seed & 0x3c3c3c3cu, a1 = a0 ^ 0x04040404u, a2 = a0 ^ 0x08080808u, a3 = a0 ^ 0x0c0c0c0cu;
  const uint32_t b0 = (seed >> 3) & 0x3c3c3c3cu, b1 = b0 ^ 0x04040404u;
  float d[kChains][4] = {};
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (K == MmaKind::kBf16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
      } else {
#if KILN_MMA_E4M3
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
        __trap();
#endif
      }
    }
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
  const int blocks = sms * 4;  // 32 warps per SM: every sub-core has several to issue from
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
