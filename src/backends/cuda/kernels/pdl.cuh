// Programmatic dependent launch (SM 9.0+) for the short kernels of a decode step, each
// reading what the one before wrote (norms, RoPE, the KV store, split-KV attention, the
// GEMVs, a MoE layer's router, route, align and combine), where every launch's ramp and
// the previous kernel's tail are a large part of the time. A kernel launched with
// launch_dependent may be scheduled while the kernel before it on the stream still runs
// (once every block of that one has called pdl_trigger or exited), and:
//   - calls pdl_wait() before it reads anything the previous kernel wrote and before
//     it writes anything: pdl_wait returns once that kernel has completed and its
//     writes are visible;
//   - may read before pdl_wait what kernels before the previous one wrote, as long as
//     the previous kernel calls pdl_trigger only after its own pdl_wait (so they had
//     completed when this kernel was scheduled): every kernel here does.
// Without the launch attribute (other devices, KILN_PDL=0, plain launches of the same
// kernels) pdl_wait and pdl_trigger do nothing.
#pragma once

#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device may overlap: SM 9.0+ and KILN_PDL is not 0.
inline bool pdl_enabled() {
  static const bool off = [] {
    const char* v = std::getenv("KILN_PDL");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  if (off) return false;
  int device = 0, major = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

// kernel<<<grid, block, smem, stream>>>(args...) as a dependent launch (see above).
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace kiln::cuda
