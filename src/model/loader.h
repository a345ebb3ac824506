// WeightLoader: binds checkpoint tensors to model blocks, checking names, shapes
// and dtypes against config, and uploading them to the backend. Every error names
// the tensor and the problem.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/quant_config.h"
#include "formats/safetensors.h"
#include "ops/backend.h"

namespace kiln::model {

class WeightLoader {
 public:
  WeightLoader(const formats::Checkpoint& ckpt, ops::Backend& backend,
               formats::QuantConfig quant = {})
      : ckpt_(&ckpt), backend_(backend), quant_(std::move(quant)) {}

  // --load-format dummy: no checkpoint; every tensor a block asks for is made on the
  // backend (Backend::fill_random) at the shape the config implies, in bf16 (vectors in
  // f32), seeded by its name: norms near 1, biases near 0, matrices with a standard
  // deviation of 1/sqrt(fan-in) so activations and routing behave like a trained model's.
  // Optional tensors (has()) are absent.
  static WeightLoader dummy(ops::Backend& backend, uint64_t seed) { return WeightLoader(backend, seed); }

  const formats::QuantConfig& quant() const { return quant_; }

  bool has(const std::string& name) const { return ckpt_ != nullptr && ckpt_->has(name); }

  // A float tensor (f32 / bf16 / f16) of exactly `shape`.
  Result<Tensor> tensor(const std::string& name, const Shape& shape);
  // Like tensor(), or an undefined Tensor when the checkpoint has no such name.
  Result<Tensor> optional_tensor(const std::string& name, const Shape& shape);
  // The linear layer `prefix` (an nn.Linear of the checkpoint): prefix.weight
  // [n_out, n_in] (+ prefix.bias [n_out] when `bias`), or its quantized tensors when
  // quantization_config says this layer is quantized (formats/quant.h layouts).
  Result<ops::Weight> linear(const std::string& prefix, int64_t n_out, int64_t n_in, bool bias);
  // A matrix that is never quantized (MoE routers, lm_head): prefix.weight (+ bias).
  Result<ops::Weight> dense_linear(const std::string& prefix, int64_t n_out, int64_t n_in, bool bias);
  // gpt-oss MXFP4 experts: NAME_blocks u8 [n_experts, n_out, n_in/32, 16] and
  // NAME_scales e8m0 [n_experts, n_out, n_in/32], one QuantizedTensor per expert.
  Result<std::vector<formats::QuantizedTensor>> mxfp4_experts(const std::string& name, int64_t n_experts,
                                                               int64_t n_out, int64_t n_in);

  // Checkpoint tensors no block asked for (e.g. an MTP layer kiln skips).
  std::vector<std::string> unused() const;

  // Called after each tensor is uploaded: checkpoint bytes bound so far, and the
  // checkpoint's total (a progress bar; the total includes tensors a family skips).
  void set_progress(std::function<void(uint64_t done, uint64_t total)> progress) { progress_ = std::move(progress); }

 private:
  // A tensor of exactly `dtype` (one of `dtypes`) and `shape`, uploaded.
  Result<Tensor> typed(const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape);
  // The same checks, the checkpoint's host tensor (a quantized weight's parts, uploaded together).
  Result<Tensor> host_typed(const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape);
  // A quantized weight's host tensors made the backend's (Backend::upload_quantized).
  Result<formats::QuantizedTensor> uploaded(const formats::QuantizedTensor& q);
  Result<formats::QuantizedTensor> quantized(const std::string& prefix, int64_t n_out, int64_t n_in);

  WeightLoader(ops::Backend& backend, uint64_t seed) : ckpt_(nullptr), backend_(backend), dummy_seed_(seed) {}
  // A dummy tensor (see dummy()).
  Tensor generated(const std::string& name, const Shape& shape);

  const formats::Checkpoint* ckpt_;  // null in dummy mode
  ops::Backend& backend_;
  uint64_t dummy_seed_ = 0;
  formats::QuantConfig quant_;
  std::set<std::string> used_;
  std::function<void(uint64_t, uint64_t)> progress_;
  uint64_t bytes_done_ = 0;
  Tensor uploaded(const Tensor& t);
};

}  // namespace kiln::model
