// Programmatic dependent launch (SM 9.0+) for the short kernels of a decode step, each
// reading what the one before wrote (norms, RoPE, the KV store, split-KV attention, the
// GEMVs, a MoE layer's router, route, align and combine), where every launch's ramp and
// the previous kernel's tail are a large part of the time. A kernel launched with
// launch_dependent may be scheduled while the kernel before it on the stream still runs
// (once every block of that one has passed its pdl_wait or exited), and:
//   - calls pdl_wait() before it reads anything the previous kernel wrote and before
//     it writes anything: pdl_wait returns once that kernel has completed and its
//     writes are visible;
//   - may read before pdl_wait what kernels before the previous one wrote: pdl_wait lets
//     the next kernel be scheduled only after it has waited, so when this kernel starts
//     those had completed.
// Without the launch attribute (other devices, KILN_PDL=0, plain launches of the same
// kernels) pdl_wait does nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

// Waits for the previous kernel, then lets the next one be scheduled (in that order: the
// rule on early reads above depends on it).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device may overlap: SM 9.0+ and KILN_PDL is not 0.
// Asked per launch, so the answer is kept per device (0 unknown, 1 no, 2 yes).
inline bool pdl_enabled() {
  static const bool off = [] {
    const char* v = std::getenv("KILN_PDL");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  if (off) return false;
  constexpr int kDevices = 64;
  static std::atomic<int8_t> known[kDevices] = {};
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kDevices) return false;
  int8_t v = known[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    v = major >= 9 ? 2 : 1;
    known[device].store(v, std::memory_order_relaxed);
  }
  return v == 2;
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
