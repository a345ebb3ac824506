// The shared memory a kernel's launches may use, and the emulation of a smaller GPU's
// SM. `--smem-cap` bounds what one block asks for (SM120: 101,376 B), but an H100 SM
// still holds 228 KB of blocks where an SM120 SM holds 100 KB, so a kernel of 25-76 KB
// per block runs 2-4x as many blocks per SM on the H100 as it would there. With an SM
// limit set (KILN_SM_SMEM_CAP, read by make_cuda_backend), every kernel launched through
// prepare_smem prefers the smallest shared-memory carveout that holds the limit, which
// on the H100 is exactly 100 KB: its configurations are 0, 8, 16, 32, 64, 100, 132,
// 164, 196 and 228 KB. (The carveout is a preference the driver may overrule to launch
// a kernel at all. Other SM120 limits are not emulated: 48 resident warps per SM, not
// 64.)
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

// Bytes of shared memory per SM to emulate (0: the device's own). Process-wide, as the
// function attributes it sets are.
inline int& sm_smem_limit() {
  static int bytes = 0;
  return bytes;
}

// An attribute of the current device.
inline int device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

// Whether `count` blocks of `bytes` of shared memory fit one SM of the current device (or
// of the emulated limit, if smaller), each with the block reservation the driver adds:
// for a kernel that has a deeper-pipelined instance and one sized for SMs of about 100
// KB (SM120, SM 8.6 / 8.9), so that those still run two blocks per SM.
inline bool blocks_fit_sm(int bytes, int count) {
  int per_sm = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  if (const int limit = sm_smem_limit(); limit > 0 && limit < per_sm) per_sm = limit;
  return int64_t(count) * (bytes + device_attribute(cudaDevAttrReservedSharedMemoryPerBlock)) <= per_sm;
}

// Call before launching `kernel` with `dynamic` bytes of dynamic shared memory, besides
// `static_bytes` of its own (past 48 KB of both together a kernel must opt in).
template <typename Kernel>
void prepare_smem(Kernel* kernel, int dynamic, int static_bytes = 0) {
  if (dynamic + static_bytes > 48 * 1024)
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
  if (const int limit = sm_smem_limit(); limit > 0) {
    const int per_sm = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
    // A percentage of the SM's maximum, rounded down: the driver takes the smallest
    // configuration at or above it.
    if (limit < per_sm)
      KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           int(int64_t(limit) * 100 / per_sm)));
  }
}

}  // namespace kiln::cuda
