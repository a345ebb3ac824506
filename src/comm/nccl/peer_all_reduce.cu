// The one-shot all-reduce kernel (peer_all_reduce.h says how and why it is correct).
#include "comm/nccl/peer_all_reduce.h"

#include <cuda_bf16.h>

namespace kiln::comm {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 256;  // a grid-stride loop beyond: every block stays resident
constexpr uint32_t kBusyPolls = 64;  // a waiting thread's polls before it sleeps between them
constexpr int kMaxRanks = PeerAllReduce::kMaxRanks;
constexpr uint32_t kEmpty = PeerAllReduce::kEmptyWord;  // two bf16 -0, or one f32 subnormal: "not arrived"
// 16-byte vectors of one row per thread in the fused form.
constexpr int kNormVecs = int(PeerAllReduce::kMaxNormDim / 8 / kThreads);

// A dependent launch (the backend's pdl.cuh, which this layer cannot include): wait for
// the kernel before, then let the next one be scheduled; nothing without the attribute.
__device__ __forceinline__ void wait_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Loads and stores that reach the L2 (where a peer's stores land) every time.
__device__ __forceinline__ uint4 load_volatile(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void store_volatile(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Whether every element of `v` has arrived (none holds the empty pattern).
template <bool kF32>
__device__ __forceinline__ bool arrived(uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  bool ok = true;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kF32) ok = ok && w[i] != kEmpty;
    else ok = ok && (w[i] & 0xffffu) != 0x8000u && (w[i] >> 16) != 0x8000u;
  }
  return ok;
}

// `v` with no element equal to the empty pattern: bf16 -0 -> +0, that f32 subnormal -> -0.
template <bool kF32>
__device__ __forceinline__ uint4 never_empty(uint4 v) {
  uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kF32) {
      if (w[i] == kEmpty) w[i] = 0x80000000u;
    } else {
      if ((w[i] & 0xffffu) == 0x8000u) w[i] &= 0xffff0000u;
      if ((w[i] >> 16) == 0x8000u) w[i] &= 0x0000ffffu;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Adds the 16 bytes `x` (8 bf16 or 4 f32) into acc.
template <bool kF32>
__device__ __forceinline__ void accumulate(float* acc, uint4 x) {
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kF32) {
      acc[i] += __uint_as_float(w[i]);
    } else {
      acc[2 * i] += __uint_as_float(w[i] << 16);
      acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}

template <bool kF32>
__device__ __forceinline__ uint4 pack(const float* acc) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kF32) {
      w[i] = __float_as_uint(acc[i]);
    } else {
      const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * i]));
      const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * i + 1]));
      w[i] = lo | (hi << 16);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void unpack_bf16(uint4 x, float* v) {
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// The elements [first, n) of a tensor of 4-byte (f32) or 2-byte elements as the low bytes
// of a 16-byte vector, zeros after: the partial last vector. Out of line: it is rarely
// taken, and inlined into every load (with the rank loop unrolled) it made the fused
// kernel 176 KB of code with 516 bytes of register spills on sm_90 (now 32 KB, none).
__device__ __noinline__ uint4 load_partial(const void* data, int64_t first, int64_t n, bool f32) {
  uint64_t w[2] = {0, 0};
  const int width = f32 ? 4 : 2;
  for (int64_t i = first; i < n; ++i) {
    const int byte = int(i - first) * width;
    const uint64_t x = f32 ? static_cast<const uint32_t*>(data)[i] : static_cast<const uint16_t*>(data)[i];
    w[byte / 8] |= x << (8 * (byte % 8));
  }
  return make_uint4(uint32_t(w[0]), uint32_t(w[0] >> 32), uint32_t(w[1]), uint32_t(w[1] >> 32));
}

template <bool kF32>
struct Call {
  static constexpr int kPerVec = kF32 ? 4 : 8;  // elements in 16 bytes
  const PeerReduceLaunch& l;
  size_t half;  // byte offset of this call's half in a receive buffer

  // Vector v of this rank's tensor; past n (the partial last vector), zeros.
  __device__ uint4 load(int64_t v) const {
    if ((v + 1) * kPerVec <= l.n) return static_cast<const uint4*>(l.data)[v];
    return load_partial(l.data, v * kPerVec, l.n, kF32);
  }

  // Step 1: vector v into this rank's slot of every peer's receive buffer (a rank's own
  // slot stays empty: receive reads its own vector from the tensor, which with host
  // staging halves the bytes each GPU moves over its bus).
  __device__ void send(int64_t v) const {
    const uint4 x = never_empty<kF32>(load(v));
    const size_t slot = half + size_t(l.rank) * l.slot_bytes;
#pragma unroll
    for (int p = 0; p < kMaxRanks; ++p)
      if (p < l.size && p != l.rank)
        store_volatile(reinterpret_cast<uint4*>(static_cast<char*>(l.receive[p]) + slot) + v, x);
  }

  // Steps 2 and 3: acc = the sum of every rank's vector v, in rank order, each peer's
  // slot put back to empty once read. An abort ends the waits (the sum is then meaningless).
  __device__ void receive(int64_t v, float* acc) const {
#pragma unroll
    for (int k = 0; k < kPerVec; ++k) acc[k] = 0.0f;
    char* mine = static_cast<char*>(l.receive[l.rank]) + half;
    const uint4 own = never_empty<kF32>(load(v));  // the same bits a peer received (send)
    // Rank by rank (not unrolled: each waits for its peer's stores in turn anyway).
#pragma unroll 1
    for (int r = 0; r < l.size; ++r) {
      if (r == l.rank) {
        accumulate<kF32>(acc, own);
        continue;
      }
      uint4* src = reinterpret_cast<uint4*>(mine + size_t(r) * l.slot_bytes) + v;
      // Polled back to back at first (in step, a peer's vector lands within a few
      // polls), then about once a microsecond. Busy polling throughout made the first
      // replay of a new recording at 96-256 rows take 56-88 ms instead of ~13 whenever
      // the ranks started it 0.5-2.6 ms apart (they record at their own pace); likely
      // (inferred, not profiled) up to 64K threads' loads crowding out the peer's stores
      // into the same memory (docs/perf/multi-gpu.md, twenty-sixth section).
      uint4 x = load_volatile(src);
      for (uint32_t spins = 1; !arrived<kF32>(x); ++spins) {
        if ((spins & 1023u) == 0 && *l.abort != 0) break;
        if (spins >= kBusyPolls) __nanosleep(1024);
        x = load_volatile(src);
      }
      accumulate<kF32>(acc, x);
      store_volatile(src, make_uint4(kEmpty, kEmpty, kEmpty, kEmpty));
    }
  }

  // The sum of vector v written over the tensor (the partial last vector element-wise).
  __device__ void store(int64_t v, const float* acc) const {
    if ((v + 1) * kPerVec <= l.n) {
      static_cast<uint4*>(l.data)[v] = pack<kF32>(acc);
      return;
    }
    for (int64_t i = v * kPerVec; i < l.n; ++i) {
      const float x = acc[i - v * kPerVec];
      if constexpr (kF32) static_cast<float*>(l.data)[i] = x;
      else static_cast<__nv_bfloat16*>(l.data)[i] = __float2bfloat16_rn(x);
    }
  }
};

template <bool kF32>
__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(PeerReduceLaunch l) {
  __shared__ uint32_t call;
  wait_previous_kernel();
  if (threadIdx.x == 0) call = *reinterpret_cast<volatile uint32_t*>(l.state);
  __syncthreads();
  const Call<kF32> c{l, size_t(call & 1) * size_t(l.size) * l.slot_bytes};
  const int64_t n_vec = (l.n + Call<kF32>::kPerVec - 1) / Call<kF32>::kPerVec;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t v = first; v < n_vec; v += stride) c.send(v);
  for (int64_t v = first; v < n_vec; v += stride) {
    float acc[Call<kF32>::kPerVec];
    c.receive(v, acc);
    c.store(v, acc);
  }
  __syncthreads();  // the last block to finish advances the call count
  if (threadIdx.x == 0 && atomicAdd(l.state + 1, 1u) == gridDim.x - 1) {
    l.state[1] = 0;
    l.state[0] = call + 1;
  }
}

// The fused form: a block per row (bf16), then residual add and RMSNorm.
__global__ void __launch_bounds__(kThreads) peer_all_reduce_norm_kernel(PeerReduceLaunch l) {
  __shared__ uint32_t call;
  __shared__ float partial[kWarps];
  wait_previous_kernel();
  if (threadIdx.x == 0) call = *reinterpret_cast<volatile uint32_t*>(l.state);
  __syncthreads();
  const Call<false> c{l, size_t(call & 1) * size_t(l.size) * l.slot_bytes};
  const PeerAllReduce::AddRmsNorm& nm = l.norm;
  const int64_t vecs = nm.dim / 8;  // per row
  for (int64_t row = blockIdx.x; row < nm.rows; row += gridDim.x)
#pragma unroll
    for (int k = 0; k < kNormVecs; ++k)
      if (const int64_t col = threadIdx.x + int64_t(k) * kThreads; col < vecs) c.send(row * vecs + col);

  for (int64_t row = blockIdx.x; row < nm.rows; row += gridDim.x) {
    float val[kNormVecs][8];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kNormVecs; ++k) {
      const int64_t col = threadIdx.x + int64_t(k) * kThreads;
      if (col >= vecs) continue;
      const int64_t v = row * vecs + col;
      float acc[8], r[8];
      c.receive(v, acc);
      const uint4 sum = pack<false>(acc);
      static_cast<uint4*>(l.data)[v] = sum;
      unpack_bf16(sum, acc);
      uint4* res = static_cast<uint4*>(nm.residual) + v;
      unpack_bf16(*res, r);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        val[k][j] = __bfloat162float(__float2bfloat16_rn(r[j] + acc[j]));
        ss += val[k][j] * val[k][j];
      }
      *res = pack<false>(val[k]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += partial[w];
    const float inv = rsqrtf(total / float(nm.dim) + nm.eps);
#pragma unroll
    for (int k = 0; k < kNormVecs; ++k) {
      const int64_t col = threadIdx.x + int64_t(k) * kThreads;
      if (col >= vecs) continue;
      const float4 w0 = reinterpret_cast<const float4*>(nm.weight)[2 * col];
      const float4 w1 = reinterpret_cast<const float4*>(nm.weight)[2 * col + 1];
      const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
      float y[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = val[k][j] * inv * w[j];
      static_cast<uint4*>(nm.out)[row * vecs + col] = pack<false>(y);
    }
    __syncthreads();  // `partial` is reused by the next row
  }
  if (threadIdx.x == 0 && atomicAdd(l.state + 1, 1u) == gridDim.x - 1) {
    l.state[1] = 0;
    l.state[0] = call + 1;
  }
}

__global__ void clear_kernel(uint32_t* p, size_t words) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x)
    p[i] = kEmpty;
}

int blocks_for(int64_t work) { return int(work < 1 ? 1 : work < kMaxBlocks ? work : kMaxBlocks); }

}  // namespace

cudaError_t launch_peer_all_reduce(const PeerReduceLaunch& l, cudaStream_t stream) {
  const int per_vec = l.f32 ? 4 : 8;
  const bool fused = l.norm.rows > 0;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(fused ? blocks_for(l.norm.rows)
                                       : blocks_for(((l.n + per_vec - 1) / per_vec + kThreads - 1) / kThreads)));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (l.dependent_launch) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  if (fused) return cudaLaunchKernelEx(&config, peer_all_reduce_norm_kernel, l);
  if (l.f32) return cudaLaunchKernelEx(&config, peer_all_reduce_kernel<true>, l);
  return cudaLaunchKernelEx(&config, peer_all_reduce_kernel<false>, l);
}

cudaError_t load_peer_reduce_kernels() {
  cudaFuncAttributes a{};
  cudaError_t e = cudaFuncGetAttributes(&a, peer_all_reduce_norm_kernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, peer_all_reduce_kernel<true>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, peer_all_reduce_kernel<false>);
  return e;
}

cudaError_t launch_peer_reduce_clear(void* p, size_t words, cudaStream_t stream) {
  clear_kernel<<<256, 256, 0, stream>>>(static_cast<uint32_t*>(p), words);
  return cudaGetLastError();
}

}  // namespace kiln::comm
