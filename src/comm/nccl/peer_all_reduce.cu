// The one-shot all-reduce kernel (peer_all_reduce.h says how and why it is correct).
#include "comm/nccl/peer_all_reduce.h"

#include <cuda_bf16.h>

namespace kiln::comm {
namespace {

constexpr int kThreads = 512;
constexpr int kMaxRanks = PeerAllReduce::kMaxRanks;

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
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

template <bool kF32>
__device__ __forceinline__ float load_one(const void* p, int64_t i) {
  if constexpr (kF32) return static_cast<const volatile float*>(p)[i];
  else return __uint_as_float(uint32_t(static_cast<const volatile uint16_t*>(p)[i]) << 16);
}

template <bool kF32>
__device__ __forceinline__ void store_one(void* p, int64_t i, float v) {
  if constexpr (kF32) static_cast<float*>(p)[i] = v;
  else static_cast<uint16_t*>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <bool kF32>
__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(PeerReduceLaunch l) {
  constexpr int kPerVec = kF32 ? 4 : 8;  // elements in 16 bytes
  __shared__ uint32_t call;
  if (threadIdx.x == 0) call = l.counters[blockIdx.x] + 1;
  __syncthreads();
  const uint32_t e = call;
  const size_t half = (e & 1) ? l.capacity : 0;
  const int64_t n_full = l.n / kPerVec;                        // whole 16-byte vectors
  const int64_t n_vec = (l.n + kPerVec - 1) / kPerVec;         // and a partial last one
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x;

  // 1. This rank's part into its staging half.
  auto* mine = reinterpret_cast<uint4*>(static_cast<char*>(l.staging[l.rank]) + half);
  auto* data = static_cast<uint4*>(l.data);
  for (int64_t v = first; v < n_vec; v += stride) {
    if (v < n_full) {
      mine[v] = data[v];
    } else {
      for (int64_t i = v * kPerVec; i < l.n; ++i) {
        if constexpr (kF32) reinterpret_cast<float*>(mine)[i] = static_cast<const float*>(l.data)[i];
        else reinterpret_cast<uint16_t*>(mine)[i] = static_cast<const uint16_t*>(l.data)[i];
      }
    }
  }

  // 2. Arrive at every peer's block, and wait for theirs.
  __syncthreads();
  if (int(threadIdx.x) < l.size) {
    __threadfence_system();
    store_release_sys(l.flags[threadIdx.x] + blockIdx.x * kMaxRanks + l.rank, e);
    const uint32_t* from = l.flags[l.rank] + blockIdx.x * kMaxRanks + threadIdx.x;
    for (uint32_t spins = 0; int32_t(load_acquire_sys(from) - e) < 0; ++spins) {
      if ((spins & 255u) == 255u && *l.abort != 0) break;
    }
  }
  __syncthreads();

  // 3. The sum of every rank's part, in fp32 and in rank order.
  for (int64_t v = first; v < n_vec; v += stride) {
    if (v < n_full) {
      float acc[kPerVec];
#pragma unroll
      for (int k = 0; k < kPerVec; ++k) acc[k] = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxRanks; ++r) {
        if (r < l.size) {
          const auto* src = reinterpret_cast<const uint4*>(static_cast<const char*>(l.staging[r]) + half);
          accumulate<kF32>(acc, __ldcv(src + v));
        }
      }
      data[v] = pack<kF32>(acc);
    } else {
      for (int64_t i = v * kPerVec; i < l.n; ++i) {
        float acc = 0.0f;
        for (int r = 0; r < l.size; ++r) acc += load_one<kF32>(static_cast<const char*>(l.staging[r]) + half, i);
        store_one<kF32>(l.data, i, acc);
      }
    }
  }
  if (threadIdx.x == 0) l.counters[blockIdx.x] = e;
}

}  // namespace

cudaError_t launch_peer_all_reduce(const PeerReduceLaunch& l, cudaStream_t stream) {
  if (l.f32) peer_all_reduce_kernel<true><<<kPeerReduceBlocks, kThreads, 0, stream>>>(l);
  else peer_all_reduce_kernel<false><<<kPeerReduceBlocks, kThreads, 0, stream>>>(l);
  return cudaGetLastError();
}

}  // namespace kiln::comm
