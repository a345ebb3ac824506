// How fast can a one-row bf16 linear y[N] = W[N, K] x[K] be, and in what shape of kernel?
// (docs/perf/multi-gpu.md, thirtieth section: what led to src/backends/cuda/kernels/row_gemv.cu.)
// For decode-sized shapes, each kernel launched over distinct weights (together > 4x the
// L2, so every weight comes from DRAM), the launches captured as one CUDA graph with
// programmatic dependent launches and replayed, us a launch and the weight's bytes over
// it, and the first weight's outputs checked against a host reference:
//   read (ceiling)      a grid-stride read of the weight, nothing computed;
//   row rpw R u U       a warp per R rows, lanes over K in 16-byte chunks, U of each row
//                       in flight (ldcs: evict-first loads; ldg: the default);
//   split rpw R u U s S a CTA of S warps over R rows, each warp a 1/S slice of K, the
//                       slices' sums through shared memory (row_gemv.cu's form).
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/row_gemv_ceiling bench/row_gemv_ceiling.cu && /tmp/row_gemv_ceiling
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                           \
  do {                                                                                     \
    const cudaError_t e = (x);                                                             \
    if (e != cudaSuccess) {                                                                \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));        \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

using bf16 = __nv_bfloat16;

__device__ __forceinline__ void pdl() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&x);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(a[i]), fb = __bfloat1622float2(b[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

template <int kMode>
__device__ __forceinline__ uint4 ldw(const uint4* p) {
  if constexpr (kMode == 0) return __ldg(p);
  else return __ldcs(p);
}

// A warp's sums of kRpw weight rows (row stride nc chunks; rows past `rows` read as zeros)
// times x over chunks [0, n) of both, lanes striding the chunks with kU of each row in
// flight; every lane gets the warp's sums.
template <int kRpw, int kU, int kMode>
__device__ __forceinline__ void warp_sums(const uint4* wv, const uint4* xv, int64_t nc, int n, int rows,
                                          float (&acc)[kRpw]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRpw; ++r) acc[r] = 0.0f;
  for (int c0 = lane; c0 < n; c0 += 32 * kU) {
    uint4 w[kRpw][kU], xx[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + 32 * u;
      if (c < n) {
#pragma unroll
        for (int r = 0; r < kRpw; ++r) w[r][u] = r < rows ? ldw<kMode>(wv + int64_t(r) * nc + c) : make_uint4(0, 0, 0, 0);
        xx[u] = __ldg(xv + c);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (c0 + 32 * u < n)
#pragma unroll
        for (int r = 0; r < kRpw; ++r) acc[r] += dot8(w[r][u], xx[u]);
  }
#pragma unroll
  for (int r = 0; r < kRpw; ++r)
#pragma unroll
    for (int o = 16; o > 0; o /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
}

// A warp per kRpw rows; lanes stride K in 16-byte chunks, kU chunks of each row in flight.
template <int kRpw, int kU, int kMode>
__global__ void __launch_bounds__(128) row_gemv(const bf16* __restrict__ W, const bf16* __restrict__ x,
                                                bf16* __restrict__ y, int N, int K) {
  pdl();
  const int r0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * kRpw;
  if (r0 >= N) return;
  const int nc = K / 8;
  float acc[kRpw];
  warp_sums<kRpw, kU, kMode>(reinterpret_cast<const uint4*>(W) + int64_t(r0) * nc, reinterpret_cast<const uint4*>(x),
                             nc, nc, N - r0, acc);
#pragma unroll
  for (int r = 0; r < kRpw; ++r)
    if (threadIdx.x % 32 == 0 && r0 + r < N) y[r0 + r] = __float2bfloat16(acc[r]);
}

// Split-K over the kS warps of a CTA: a CTA of 32 kS threads takes kRpw rows, each warp a
// 1/kS slice of K, partial sums through shared memory.
template <int kRpw, int kU, int kS>
__global__ void __launch_bounds__(32 * kS) row_gemv_split(const bf16* __restrict__ W, const bf16* __restrict__ x,
                                                          bf16* __restrict__ y, int N, int K) {
  pdl();
  __shared__ float part[kS][kRpw];
  const int warp = threadIdx.x / 32;
  const int r0 = blockIdx.x * kRpw;
  const int nc = K / 8, per = nc / kS, cb = warp * per;
  float acc[kRpw];
  warp_sums<kRpw, kU, 1>(reinterpret_cast<const uint4*>(W) + int64_t(r0) * nc + cb,
                         reinterpret_cast<const uint4*>(x) + cb, nc, per, kRpw, acc);
#pragma unroll
  for (int r = 0; r < kRpw; ++r)
    if (threadIdx.x % 32 == 0) part[warp][r] = acc[r];
  __syncthreads();
  if (threadIdx.x < kRpw) {
    float v = 0.0f;
#pragma unroll
    for (int s = 0; s < kS; ++s) v += part[s][threadIdx.x];
    y[r0 + threadIdx.x] = __float2bfloat16(v);
  }
}

__global__ void read_kernel(const uint4* __restrict__ a, int64_t n, unsigned* out) {
  pdl();
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(a + i);
    acc ^= v.x + v.y + v.z + v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__global__ void fill(bf16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    p[i] = __float2bfloat16((float(h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}

template <typename Kernel>
void launch(Kernel k, dim3 grid, dim3 block, cudaStream_t s, const bf16* W, const bf16* x, bf16* y, int N, int K) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr, cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, k, W, x, y, N, K));
}

struct Shape {
  const char* name;
  int K, N;
};

int main() {
  const Shape shapes[] = {{"qkv 2048->5120", 2048, 5120},
                          {"o 4096->2048", 4096, 2048},
                          {"qkv TP2 2048->2560", 2048, 2560},
                          {"o TP2 2048->2048", 2048, 2048},
                          {"gate_up 4096->28672", 4096, 28672}};
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (const Shape& sh : shapes) {
    const int64_t wn = int64_t(sh.N) * sh.K, wbytes = wn * 2;
    const int L = int(std::min<int64_t>(64, std::max<int64_t>(4, (400LL << 20) / wbytes)));
    bf16 *W, *x, *y;
    unsigned* out;
    CHECK(cudaMalloc(&W, wbytes * L));
    CHECK(cudaMalloc(&x, sh.K * 2));
    CHECK(cudaMalloc(&y, int64_t(sh.N) * 2 * L));
    CHECK(cudaMalloc(&out, 4));
    fill<<<1024, 256>>>(W, wn * L, 1);
    fill<<<16, 256>>>(x, sh.K, 7);
    CHECK(cudaDeviceSynchronize());
    // Host reference for weight 0.
    std::vector<bf16> hw(wn), hx(sh.K);
    CHECK(cudaMemcpy(hw.data(), W, wbytes, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hx.data(), x, sh.K * 2, cudaMemcpyDeviceToHost));
    std::vector<double> ref(sh.N);
    for (int n = 0; n < sh.N; ++n) {
      double a = 0;
      for (int k = 0; k < sh.K; ++k) a += double(__bfloat162float(hw[int64_t(n) * sh.K + k])) * double(__bfloat162float(hx[k]));
      ref[n] = a;
    }
    const auto timed = [&](const char* name, auto one) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int l = 0; l < L; ++l) one(l);
      CHECK(cudaStreamEndCapture(s, &g));
      CHECK(cudaGraphInstantiate(&ge, g, 0));
      for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(ge, s));
      CHECK(cudaStreamSynchronize(s));
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0), cudaEventCreate(&e1);
      const int reps = 20;
      cudaEventRecord(e0, s);
      for (int i = 0; i < reps; ++i) CHECK(cudaGraphLaunch(ge, s));
      cudaEventRecord(e1, s);
      CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      const double us = 1000.0 * ms / (reps * L);
      // Check weight 0's output.
      std::vector<bf16> hy(sh.N);
      CHECK(cudaMemcpy(hy.data(), y, sh.N * 2, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (int n = 0; n < sh.N; ++n) worst = std::max(worst, std::fabs(double(__bfloat162float(hy[n])) - ref[n]));
      std::printf("%-22s %-34s %7.2f us %5.2f TB/s  max|err| %.2e\n", sh.name, name, us, double(wbytes) / us / 1e6, worst);
      cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
      CHECK(cudaMemset(y, 0, int64_t(sh.N) * 2 * L));
    };
    char name[96];
    timed("read (ceiling)", [&](int l) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(sms * 4), cfg.blockDim = dim3(512), cfg.stream = s;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr, cfg.numAttrs = 1;
      CHECK(cudaLaunchKernelEx(&cfg, read_kernel, reinterpret_cast<const uint4*>(W + wn * l), wn / 8, out));
    });
#define ROW(RPW, U, M)                                                                                    \
  std::snprintf(name, sizeof(name), "row rpw %d u %d %s", RPW, U, M ? "ldcs" : "ldg");                  \
  timed(name, [&](int l) {                                                                               \
    const int warps = (sh.N + RPW - 1) / RPW;                                                            \
    launch(row_gemv<RPW, U, M>, dim3((warps + 3) / 4), dim3(128), s, W + wn * l, x, y + int64_t(sh.N) * l, \
           sh.N, sh.K);                                                                                  \
  });
    ROW(1, 4, 1) ROW(1, 8, 1) ROW(1, 16, 1) ROW(2, 4, 1) ROW(2, 8, 1) ROW(4, 4, 1) ROW(1, 8, 0) ROW(2, 4, 0)
#define SPLIT(RPW, U, S)                                                                                  \
  std::snprintf(name, sizeof(name), "split rpw %d u %d s %d", RPW, U, S);                                \
  timed(name, [&](int l) {                                                                               \
    launch(row_gemv_split<RPW, U, S>, dim3(sh.N / RPW), dim3(32 * S), s, W + wn * l, x,                  \
           y + int64_t(sh.N) * l, sh.N, sh.K);                                                           \
  });
    SPLIT(2, 4, 2) SPLIT(2, 4, 4) SPLIT(4, 4, 2) SPLIT(4, 2, 4) SPLIT(8, 2, 4) SPLIT(4, 4, 4)
    CHECK(cudaFree(W));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(out));
  }
  return 0;
}
