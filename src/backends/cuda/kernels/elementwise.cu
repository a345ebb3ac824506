// Embedding / row gather, add, bias, column slices, GLU activations, casts, random fill.
#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "ops/random.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_kernel(const bf16* table, const int32_t* ids, int64_t d, int64_t id_begin,
                                 int64_t table_rows, bf16* out) {
  const int64_t row = blockIdx.x, src_row = int64_t(ids[row]) - id_begin;
  if (src_row < 0 || src_row >= table_rows) {  // another rank's slice of the vocabulary
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[row * d + i] = __float2bfloat16(0.0f);
    return;
  }
  const bf16* src = table + src_row * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[row * d + i] = src[i];
}

__global__ void patch_ids_kernel(int32_t* dst, const int32_t* at, const int32_t* src, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && at[i] >= 0) dst[i] = src[at[i]];
}

// ops::FillRandomArgs: element i from the shared host/device formula (ops/random.h).
template <typename T>
__global__ void fill_random_kernel(T* out, int64_t n, uint64_t seed, float mean, float stddev) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = mean + stddev * ops::unit_normal(seed, uint64_t(i));
    if constexpr (std::is_same_v<T, float>) out[i] = v;
    else out[i] = __float2bfloat16(v);
  }
}

__global__ void add_kernel(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(to_f(a[i]) + to_f(b[i]));
}

__global__ void add_bias_kernel(bf16* y, const float* bias, int64_t rows, int64_t cols) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) y[i] = __float2bfloat16(to_f(y[i]) + bias[i % cols]);
}

__global__ void add_bias_f32_kernel(float* y, const float* bias, int64_t rows, int64_t cols) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) y[i] += bias[i % cols];
}

__global__ void bias_round_kernel(const float* y, const float* bias, bf16* out, int64_t rows, int64_t cols) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) out[i] = __float2bfloat16(y[i] + bias[i % cols]);
}

// A block copies up to kSliceCols columns of one row: rows on the grid's x, pieces of a
// row on its y, so a few wide rows spread over the GPU. (A block per whole row took 54 us
// for each rank's part of a decode step's logits at TP2, one row of 75,968 columns.)
constexpr int64_t kSliceCols = 8 * kThreads;

__global__ void slice_columns_kernel(const bf16* src, int64_t n_src, int64_t col_begin, bf16* dst, int64_t n_dst,
                                     int64_t dst_col_begin, int64_t n_cols) {
  const int64_t r = blockIdx.x, first = int64_t(blockIdx.y) * kSliceCols;
  const int64_t end = n_cols - first < kSliceCols ? n_cols : first + kSliceCols;
  for (int64_t c = first + threadIdx.x; c < end; c += blockDim.x)
    dst[r * n_dst + dst_col_begin + c] = src[r * n_src + col_begin + c];
}

__global__ void glu_kernel(const bf16* gate, const bf16* up, bf16* out, int64_t n, int kind, float alpha,
                           float limit) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = __float2bfloat16(glu_value(to_f(gate[i]), to_f(up[i]), kind, alpha, limit));
}

__global__ void bf16_to_f32_kernel(const bf16* in, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = to_f(in[i]);
}

__global__ void f32_to_bf16_kernel(const float* in, bf16* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(in[i]);
}

}  // namespace

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, add_kernel);
  cudaGetLastError();  // do not leave the error sticky for the next launch
  return e;
}

void launch_embedding(const bf16* table, const int32_t* ids, int64_t n_rows, int64_t d, int64_t id_begin,
                      int64_t table_rows, bf16* out, cudaStream_t stream) {
  if (n_rows == 0) return;
  embedding_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(table, ids, d, id_begin, table_rows, out);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_patch_ids(int32_t* dst, const int32_t* at, const int32_t* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  patch_ids_kernel<<<ceil_div(n, kThreads), kThreads, 0, stream>>>(dst, at, src, n);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_add(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<ceil_div(n, kThreads), kThreads, 0, stream>>>(a, b, out, n);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_add_bias(bf16* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  add_bias_kernel<<<ceil_div(rows * cols, kThreads), kThreads, 0, stream>>>(y, bias, rows, cols);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_add_bias_f32(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  add_bias_f32_kernel<<<ceil_div(rows * cols, kThreads), kThreads, 0, stream>>>(y, bias, rows, cols);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_bias_round(const float* y, const float* bias, bf16* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  bias_round_kernel<<<ceil_div(rows * cols, kThreads), kThreads, 0, stream>>>(y, bias, out, rows, cols);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_slice_columns(const bf16* src, int64_t n_src, int64_t col_begin, bf16* dst, int64_t n_dst,
                          int64_t dst_col_begin, int64_t n_cols, int64_t rows, cudaStream_t stream) {
  if (rows == 0 || n_cols == 0) return;
  const int64_t pieces = ceil_div(n_cols, kSliceCols);
  KILN_CHECK(rows <= INT32_MAX && pieces <= 65535) << "slice_columns: " << rows << " rows of " << n_cols << " columns";
  slice_columns_kernel<<<dim3(unsigned(rows), unsigned(pieces)), kThreads, 0, stream>>>(src, n_src, col_begin, dst,
                                                                                      n_dst, dst_col_begin, n_cols);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_glu(const bf16* gate, const bf16* up, bf16* out, int64_t n, int kind, float alpha, float limit,
                cudaStream_t stream) {
  if (n == 0) return;
  glu_kernel<<<ceil_div(n, kThreads), kThreads, 0, stream>>>(gate, up, out, n, kind, alpha, limit);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_bf16_to_f32(const bf16* in, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<ceil_div(n, kThreads), kThreads, 0, stream>>>(in, out, n);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_f32_to_bf16(const float* in, bf16* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<ceil_div(n, kThreads), kThreads, 0, stream>>>(in, out, n);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_fill_random(void* out, bool bf16_out, int64_t n, uint64_t seed, float mean, float stddev,
                        cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(n, kThreads), 65535));
  if (bf16_out) fill_random_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<bf16*>(out), n, seed, mean, stddev);
  else fill_random_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(out), n, seed, mean, stddev);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
