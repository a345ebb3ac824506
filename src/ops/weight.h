// Weight: a matrix used as y = x W^T. Logically W is [n_out, n_in]. It stays in
// its checkpoint form, never converted at load: either a dense tensor (bf16 /
// fp16 / fp32) or a quantized one (formats/quant.h: FP8, MXFP4, NVFP4, INT4).
#pragma once

#include "core/tensor.h"
#include "formats/quant.h"

namespace kiln::ops {

struct Weight {
  Tensor data;             // dense: [n_out, n_in], or [n_in, n_out] when `transposed`
  bool transposed = false; // gpt-oss bf16 experts are stored input-major
  Tensor bias;             // [n_out] or undefined
  formats::QuantizedTensor quant;  // quantized: the packed form (then `data` is undefined)

  bool defined() const { return data.defined() || quant.defined(); }
  bool quantized() const { return quant.defined(); }
  int64_t n_out() const { return quantized() ? quant.n_out : transposed ? data.dim(1) : data.dim(0); }
  int64_t n_in() const { return quantized() ? quant.n_in : transposed ? data.dim(0) : data.dim(1); }
  // Bytes the weight occupies as stored (data or packed data + scales, plus bias).
  size_t nbytes() const { return (quantized() ? quant.nbytes() : data.nbytes()) + bias.nbytes(); }
};

}  // namespace kiln::ops
