// A kernel over the SM120 budget: 40 KiB static + 64 KiB declared dynamic shared
// memory. scripts/check-kernel-smem must reject it (ctest cuda_smem_check_rejects_over_budget).
__global__ void over_budget_kernel(float* out) {
  __shared__ float tile[10240];  // 40,960 bytes static
  extern __shared__ float dyn[];
  tile[threadIdx.x] = dyn[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = tile[(threadIdx.x + 1) % 10240];
}
