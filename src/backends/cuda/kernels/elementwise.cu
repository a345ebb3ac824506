// Embedding / row gather, add, bias, column slices, GLU activations, casts, random fill.
#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/kernels/pdl.cuh"
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

struct ColumnParts {
  ColumnPart p[kMaxColumnParts];
  int n;
};

// A thread per 8 columns of a row (every part's width a multiple of 8): one 16-byte
// load of a bf16 product (two of an fp32 one), one 16-byte store. The element-wise
// form took 4.9 us for 64 rows of 2,560 (a Qwen3-30B-A3B TP2 rank's q, k and v).
template <bool kF32>
__global__ void split_columns_kernel(const void* y, int64_t n_all, const ColumnParts parts, int64_t rows) {
  pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, per_row = n_all / 8;
  if (i >= rows * per_row) return;
  const int64_t r = i / per_row;
  int64_t c = (i % per_row) * 8;
  int k = 0;
  while (k + 1 < parts.n && c >= parts.p[k].n) c -= parts.p[k++].n;
  const ColumnPart& part = parts.p[k];
  uint4 v;
  if constexpr (kF32) {
    const float4* src = static_cast<const float4*>(y) + 2 * i;
    const float4 a = src[0], b = src[1];
    float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    if (part.bias != nullptr)
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] += part.bias[c + j];
    auto* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
  } else {
    v = static_cast<const uint4*>(y)[i];
  }
  *reinterpret_cast<uint4*>(part.out + r * part.n + c) = v;
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

void launch_split_columns(const void* y, bool f32, int64_t n_all, const ColumnPart* parts, int n_parts, int64_t rows,
                          cudaStream_t stream) {
  KILN_CHECK(n_parts >= 1 && n_parts <= kMaxColumnParts) << "split_columns: " << n_parts << " parts";
  ColumnParts ps{};
  int64_t n = 0;
  for (int i = 0; i < n_parts; ++i) ps.p[i] = parts[i], n += parts[i].n;
  ps.n = n_parts;
  KILN_CHECK_EQ(n, n_all) << "split_columns: the parts' columns";
  KILN_CHECK(std::all_of(parts, parts + n_parts, [](const ColumnPart& p) { return p.n % 8 == 0; }))
      << "split_columns: parts of a multiple of 8 columns";
  KILN_CHECK(f32 || std::all_of(parts, parts + n_parts, [](const ColumnPart& p) { return p.bias == nullptr; }))
      << "split_columns: a bias on a bf16 product";
  if (rows * n_all == 0) return;
  KILN_CHECK(reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
             std::all_of(parts, parts + n_parts, [](const ColumnPart& p) { return uintptr_t(p.out) % 16 == 0; }))
      << "split_columns: 16-byte aligned product and outputs";
  const auto kernel = f32 ? split_columns_kernel<true> : split_columns_kernel<false>;
  launch_dependent(kernel, unsigned(ceil_div(rows * n_all / 8, kThreads)), kThreads, 0, stream, y, n_all, ps, rows);
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
