// Weight: a matrix used as y = x W^T. Logically W is [n_out, n_in]; it is stored
// in its checkpoint dtype (bf16 / fp16 / fp32 here; quantized formats come later)
// and never converted at load.
#pragma once

#include "core/tensor.h"

namespace kiln::ops {

struct Weight {
  Tensor data;             // [n_out, n_in], or [n_in, n_out] when `transposed`
  bool transposed = false; // gpt-oss bf16 experts are stored input-major
  Tensor bias;             // [n_out] or undefined

  bool defined() const { return data.defined(); }
  int64_t n_out() const { return transposed ? data.dim(1) : data.dim(0); }
  int64_t n_in() const { return transposed ? data.dim(0) : data.dim(1); }
};

}  // namespace kiln::ops
