// Checked CUDA / cuBLAS calls. Inside ops a failing call is a bug or a device
// fault: abort with the call and the error string. At start-up (device
// discovery) errors are Status values the CLI reports.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/check.h"

#define KILN_CUDA_CHECK(expr)                                                             \
  do {                                                                                    \
    const cudaError_t kiln_cuda_err_ = (expr);                                            \
    KILN_CHECK(kiln_cuda_err_ == cudaSuccess) << #expr << ": " << cudaGetErrorName(kiln_cuda_err_) \
                                              << ": " << cudaGetErrorString(kiln_cuda_err_);      \
  } while (0)

#define KILN_CUBLAS_CHECK(expr)                                                                   \
  do {                                                                                            \
    const cublasStatus_t kiln_cublas_st_ = (expr);                                                \
    KILN_CHECK(kiln_cublas_st_ == CUBLAS_STATUS_SUCCESS) << #expr << ": cublas status "           \
                                                         << int(kiln_cublas_st_);                 \
  } while (0)

// After a kernel launch: configuration errors surface here, at the launch site.
#define KILN_CUDA_LAUNCH_CHECK() KILN_CUDA_CHECK(cudaGetLastError())
