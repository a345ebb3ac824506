// WeightLoader: binds checkpoint tensors to model blocks, checking names, shapes
// and dtypes against config, and uploading them to the backend. Every error names
// the tensor and the problem.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/safetensors.h"
#include "ops/backend.h"

namespace kiln::model {

class WeightLoader {
 public:
  WeightLoader(const formats::Checkpoint& ckpt, ops::Backend& backend)
      : ckpt_(ckpt), backend_(backend) {}

  bool has(const std::string& name) const { return ckpt_.has(name); }

  // A float tensor (f32 / bf16 / f16) of exactly `shape`.
  Result<Tensor> tensor(const std::string& name, const Shape& shape);
  // Like tensor(), or an undefined Tensor when the checkpoint has no such name.
  Result<Tensor> optional_tensor(const std::string& name, const Shape& shape);
  // prefix.weight [n_out, n_in] (+ prefix.bias [n_out] when `bias`).
  Result<ops::Weight> linear(const std::string& prefix, int64_t n_out, int64_t n_in, bool bias);

  // Checkpoint tensors no block asked for (e.g. an MTP layer kiln skips).
  std::vector<std::string> unused() const;

 private:
  const formats::Checkpoint& ckpt_;
  ops::Backend& backend_;
  std::set<std::string> used_;
};

}  // namespace kiln::model
