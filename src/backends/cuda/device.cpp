#include "backends/cuda/device.h"

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

Result<DeviceInfo> query_device(int index) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return unsupported(std::string("no CUDA device: ") + cudaGetErrorString(e));
  }
  if (index < 0 || index >= n) {
    return invalid_argument("CUDA device " + std::to_string(index) + " does not exist (" + std::to_string(n) +
                            " present)");
  }
  DeviceInfo d;
  d.index = index;
  cudaDeviceProp p{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, index));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, index));
  KILN_CUDA_CHECK(cudaSetDevice(index));
  KILN_CUDA_CHECK(cudaMemGetInfo(&d.free_memory, &d.total_memory));
  KILN_CUDA_CHECK(cudaDriverGetVersion(&d.driver_version));
  KILN_CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}

}  // namespace kiln::cuda
