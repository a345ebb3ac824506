// The GPU kiln runs on: its properties and the shared-memory cap every tile
// choice respects (--smem-cap; default the device's opt-in limit).
#pragma once

#include <string>

#include "core/status.h"

namespace kiln::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;   // compute capability
  int sm_count = 0;
  int smem_per_block_optin = 0;     // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
  int smem_per_sm = 0;
  size_t total_memory = 0, free_memory = 0;
  int driver_version = 0, runtime_version = 0;

  int cc() const { return cc_major * 10 + cc_minor; }  // e.g. 90, 120
};

// Properties of GPU `index`, or an error saying why there is none.
Result<DeviceInfo> query_device(int index);
int device_count();  // 0 when no driver or GPU is present

}  // namespace kiln::cuda
