// Ceiling for the quantized MoE GEMV at one token (docs/PERF.md, "Quantized MoE decode"):
// how fast can one kernel only *load* gpt-oss-120b's one-token up projection (4 of 128
// experts, 5760 x 2944 MXFP4 codes each, 36 MB) in the GEMV's access pattern, with no
// decoding at all? Launched 64 times back to back over different experts (L2 cold), as a
// decode step's kernels run. Patterns, per warp of 16 weight rows and 128-input blocks:
//   row-major 64 B: quant_gemv.cu's (lane (g, t) loads 16 bytes of rows g and g + 8 at
//                   block * 64 + 16 t), a ring of 4 or 8 blocks in flight per warp;
//   tiled 1 KB:     the same bytes if a warp's block were 1 KB contiguous (a repacked layout);
// each with the unit's k range split over 1, 2 or 4 warps; and a plain grid-stride read.
//   nvcc -O3 -arch=sm_90 -o /tmp/gemv_stream_bandwidth bench/gemv_stream_bandwidth.cu && /tmp/gemv_stream_bandwidth
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(x)                                                          \
  do {                                                                    \
    const cudaError_t e = (x);                                            \
    if (e != cudaSuccess) {                                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                 \
      return 1;                                                           \
    }                                                                     \
  } while (0)

constexpr int kExperts = 128, kTopK = 4, kRows = 5760, kBlocks = 23;  // 2944 / 128 inputs
constexpr int kRowBytes = kBlocks * 64, kUnits = kRows / 16;
constexpr int64_t kExpertBytes = int64_t(kRows) * kRowBytes;

template <bool kTiled, int kRing>
__global__ void stream_kernel(const uint8_t* __restrict__ base, const int* __restrict__ experts, int split,
                              unsigned* out) {
  const int warp = int((blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = int(threadIdx.x % 32);
  const int per_expert = kUnits * split, e = warp / per_expert, u = warp % per_expert / split, s = warp % split;
  if (e >= kTopK) return;
  const uint8_t* w = base + int64_t(experts[e]) * kExpertBytes;
  const int per = (kBlocks + split - 1) / split, b0 = s * per, b1 = min(kBlocks, b0 + per);
  const int g = lane / 4, t = lane % 4;
  const auto at = [&](int b, int h) {
    const int64_t off = kTiled ? (int64_t(u) * kBlocks + b) * 1024 + h * 512 + lane * 16
                               : int64_t(16 * u + g + 8 * h) * kRowBytes + b * 64 + t * 16;
    return reinterpret_cast<const uint4*>(w + off);
  };
  unsigned acc = 0;
  uint4 ring[kRing][2];
  for (int b = b0; b < b1; b += kRing) {
#pragma unroll
    for (int j = 0; j < kRing; ++j)
      if (b + j < b1) ring[j][0] = __ldg(at(b + j, 0)), ring[j][1] = __ldg(at(b + j, 1));
#pragma unroll
    for (int j = 0; j < kRing; ++j)
      if (b + j < b1) acc ^= ring[j][0].x + ring[j][0].y + ring[j][0].z + ring[j][0].w + ring[j][1].x + ring[j][1].y;
  }
  if (acc == 0x12345678u) out[0] = acc;  // keeps the loads
}

__global__ void read_kernel(const uint4* __restrict__ a, int64_t n, unsigned* out) {
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(a + i);
    acc ^= v.x + v.y + v.z + v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

int main() {
  constexpr int kIters = 64;
  uint8_t* base = nullptr;
  unsigned* out = nullptr;
  int* experts = nullptr;
  CHECK(cudaMalloc(&base, kExpertBytes * kExperts));
  CHECK(cudaMemset(base, 1, kExpertBytes * kExperts));
  CHECK(cudaMalloc(&out, 4));
  CHECK(cudaMalloc(&experts, sizeof(int) * kTopK * kIters));
  std::vector<int> host(kTopK * kIters);
  for (size_t i = 0; i < host.size(); ++i) host[i] = int((i * 37 + 11) % kExperts);
  CHECK(cudaMemcpy(experts, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const double bytes = double(kTopK) * kExpertBytes;
  const auto timed = [&](const char* name, auto launch) {
    for (int i = 0; i < 3; ++i) launch(i);
    cudaEventRecord(e0);
    for (int i = 0; i < kIters; ++i) launch(i);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = 1000.0 * ms / kIters;
    std::printf("%-32s %7.1f us  %5.2f TB/s\n", name, us, bytes / us / 1e6);
  };
  char name[64];
  for (int split : {1, 2, 4}) {
    const int blocks = kTopK * kUnits * split * 32 / 128;
    const auto run = [&](const char* pattern, auto kernel) {
      std::snprintf(name, sizeof(name), "%s split %d", pattern, split);
      timed(name, [&](int i) { kernel<<<blocks, 128>>>(base, experts + kTopK * i, split, out); });
    };
    run("row-major 64 B, ring 4", stream_kernel<false, 4>);
    run("row-major 64 B, ring 8", stream_kernel<false, 8>);
    run("tiled 1 KB, ring 4", stream_kernel<true, 4>);
    run("tiled 1 KB, ring 8", stream_kernel<true, 8>);
  }
  timed("contiguous read", [&](int i) {
    read_kernel<<<132 * 8, 256>>>(reinterpret_cast<const uint4*>(base + (i % 16) * kTopK * kExpertBytes),
                                  int64_t(bytes) / 16, out);
  });
  CHECK(cudaGetLastError());
  return 0;
}
