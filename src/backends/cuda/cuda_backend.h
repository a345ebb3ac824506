// The CUDA backend: ops::Backend on one GPU, bf16 activations and KV cache.
// Upload rule: floating-point matrices (rank >= 2) become bf16, vectors (norm
// weights, biases, sinks, routing biases) fp32; other tensors are copied as is.
// Quantized weight formats are the next part of this backend: supports() refuses
// them with a clear error at load.
#pragma once

#include <memory>

#include <cuda_runtime_api.h>

#include "backends/cuda/device.h"
#include "core/status.h"
#include "ops/backend.h"

namespace kiln::cuda {

struct CudaOptions {
  int device = 0;
  int smem_cap = 0;  // bytes of shared memory per block every kernel must fit; 0: the device's opt-in limit
  bool graphs = true;  // record decode steps as CUDA graphs and replay them (env KILN_CUDA_GRAPHS=0: off)
};

Result<std::unique_ptr<ops::Backend>> make_cuda_backend(const CudaOptions& options);

// The stream a CUDA backend queues every op on, and its device: where the communicator
// of that backend's rank enqueues its collectives (comm/nccl), ordered with the ops.
// `backend` must come from make_cuda_backend.
cudaStream_t stream_of(ops::Backend& backend);
int device_of(ops::Backend& backend);

}  // namespace kiln::cuda
