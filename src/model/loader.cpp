#include "model/loader.h"

namespace kiln::model {

Result<Tensor> WeightLoader::tensor(const std::string& name, const Shape& shape) {
  KILN_ASSIGN_OR_RETURN(Tensor t, ckpt_.get(name, shape));
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return unsupported("tensor " + name + " has dtype " + std::string(dtype_name(t.dtype)) +
                       "; this path takes f32, bf16 or f16 weights (quantized formats are loaded "
                       "through their quantization_config)");
  }
  used_.insert(name);
  return backend_.upload(t);
}

Result<Tensor> WeightLoader::optional_tensor(const std::string& name, const Shape& shape) {
  if (!ckpt_.has(name)) return Tensor{};
  return tensor(name, shape);
}

Result<ops::Weight> WeightLoader::linear(const std::string& prefix, int64_t n_out, int64_t n_in,
                                         bool bias) {
  ops::Weight w;
  KILN_ASSIGN_OR_RETURN(w.data, tensor(prefix + ".weight", {n_out, n_in}));
  if (bias) {
    KILN_ASSIGN_OR_RETURN(w.bias, tensor(prefix + ".bias", {n_out}));
  }
  return w;
}

std::vector<std::string> WeightLoader::unused() const {
  std::vector<std::string> out;
  for (const std::string& n : ckpt_.names())
    if (!used_.count(n)) out.push_back(n);
  return out;
}

}  // namespace kiln::model
