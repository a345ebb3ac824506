#include "model/loader.h"

#include <cmath>

#include "ops/random.h"

namespace kiln::model {
namespace {

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Tensor WeightLoader::uploaded(const Tensor& t) {
  Tensor out = backend_.upload(t);
  bytes_done_ += uint64_t(t.nbytes());
  if (progress_) progress_(bytes_done_, ckpt_->total_bytes());
  return out;
}

Tensor WeightLoader::generated(const std::string& name, const Shape& shape) {
  Tensor t = backend_.alloc(shape.rank >= 2 ? DType::kBF16 : DType::kF32, shape);
  const bool norm = name.find("norm") != std::string::npos;
  const bool vector = shape.rank < 2;
  float mean = 0.0f, stddev = 0.02f;
  if (norm && vector) {
    mean = 1.0f;  // RMSNorm gains
  } else if (name.find("sinks") != std::string::npos) {
    stddev = 1.0f;  // attention sink logits
  } else if (!vector) {
    stddev = float(1.0 / std::sqrt(double(shape.dims[1])));  // [n_out, n_in] or [experts, n_in, n_out]
  }
  uint64_t seed = dummy_seed_;
  for (unsigned char c : name) seed = ops::splitmix64(seed ^ c);
  backend_.fill_random({.out = t, .seed = seed, .mean = mean, .stddev = stddev});
  used_.insert(name);
  return t;
}

Result<Tensor> WeightLoader::typed(const std::string& name, std::initializer_list<DType> dtypes,
                                   const Shape& shape) {
  KILN_ASSIGN_OR_RETURN(Tensor t, host_typed(name, dtypes, shape));
  return uploaded(t);
}

Result<Tensor> WeightLoader::host_typed(const std::string& name, std::initializer_list<DType> dtypes,
                                        const Shape& shape) {
  if (ckpt_ == nullptr) return unsupported("dummy weights are bf16; " + name + " would be quantized");
  KILN_ASSIGN_OR_RETURN(Tensor t, ckpt_->get(name, shape));
  bool ok = false;
  for (DType d : dtypes) ok = ok || t.dtype == d;
  if (!ok) {
    return corrupt("tensor " + name + " has dtype " + std::string(dtype_name(t.dtype)) + ", expected " +
                   dtype_list(dtypes));
  }
  used_.insert(name);
  return t;
}

Result<formats::QuantizedTensor> WeightLoader::uploaded(const formats::QuantizedTensor& q) {
  KILN_ASSIGN_OR_RETURN(formats::QuantizedTensor out, backend_.upload_quantized(q));
  bytes_done_ += uint64_t(q.nbytes());
  if (progress_) progress_(bytes_done_, ckpt_->total_bytes());
  return out;
}

Result<Tensor> WeightLoader::tensor(const std::string& name, const Shape& shape) {
  if (ckpt_ == nullptr) return generated(name, shape);
  KILN_ASSIGN_OR_RETURN(Tensor t, ckpt_->get(name, shape));
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return unsupported("tensor " + name + " has dtype " + std::string(dtype_name(t.dtype)) +
                       "; this path takes f32, bf16 or f16 weights" +
                       (quant_.quantized() ? "" : " (the config has no quantization_config)"));
  }
  used_.insert(name);
  return uploaded(t);
}

Result<Tensor> WeightLoader::optional_tensor(const std::string& name, const Shape& shape) {
  if (!has(name)) return Tensor{};
  return tensor(name, shape);
}

Result<ops::Weight> WeightLoader::dense_linear(const std::string& prefix, int64_t n_out, int64_t n_in,
                                               bool bias) {
  ops::Weight w;
  for (const char* packed : {".weight_packed", ".weight_scale", ".weight_scale_inv"}) {
    if (!has(prefix + packed)) continue;
    return corrupt(prefix + packed + " says " + prefix + " is stored quantized, but " +
                   (quant_.quantized() ? "quantization_config excludes it" : "config.json has no quantization_config"));
  }
  KILN_ASSIGN_OR_RETURN(w.data, tensor(prefix + ".weight", {n_out, n_in}));
  if (bias) {
    KILN_ASSIGN_OR_RETURN(w.bias, tensor(prefix + ".bias", {n_out}));
  }
  return w;
}

Result<ops::Weight> WeightLoader::linear(const std::string& prefix, int64_t n_out, int64_t n_in, bool bias) {
  if (!quant_.is_quantized(prefix) || quant_.kind == formats::QuantKind::kMxfp4) {
    return dense_linear(prefix, n_out, n_in, bias);
  }
  ops::Weight w;
  auto q = quantized(prefix, n_out, n_in);
  if (!q.ok()) {
    return q.status().with_context(prefix + " is quantized (" + std::string(formats::quant_kind_name(quant_.kind)) +
                                   ", " + quant_.method + " quantization_config)");
  }
  w.quant = std::move(q).value();
  if (bias) {
    KILN_ASSIGN_OR_RETURN(w.bias, tensor(prefix + ".bias", {n_out}));
  }
  return w;
}

Result<formats::QuantizedTensor> WeightLoader::quantized(const std::string& p, int64_t n_out, int64_t n_in) {
  using formats::QuantKind;
  formats::QuantizedTensor q;
  q.kind = quant_.kind;
  q.n_out = n_out;
  q.n_in = n_in;
  const auto need_divisible = [&](int64_t group, const char* what) -> Status {
    if (n_in % group == 0) return Status::Ok();
    return corrupt(std::string(what) + " group size " + std::to_string(group) + " does not divide the input size " +
                   std::to_string(n_in) + " of " + p + ".weight");
  };
  const std::initializer_list<DType> float_scale = {DType::kF32, DType::kBF16, DType::kF16};
  switch (quant_.kind) {
    case QuantKind::kFp8Block: {
      q.block_n = quant_.block_n;
      q.block_k = quant_.block_k;
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight", {DType::kF8E4M3}, {n_out, n_in}));
      // DeepSeek's native name is weight_scale_inv (multiplied despite the name).
      const std::string scale = quant_.method == "fp8" ? p + ".weight_scale_inv" : p + ".weight_scale";
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(scale, float_scale, {ceil_div(n_out, q.block_n), ceil_div(n_in, q.block_k)}));
      return uploaded(q);
    }
    case QuantKind::kFp8Channel: {
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight", {DType::kF8E4M3}, {n_out, n_in}));
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(p + ".weight_scale", float_scale, {n_out, 1}));
      return uploaded(q);
    }
    case QuantKind::kFp8Tensor: {
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight", {DType::kF8E4M3}, {n_out, n_in}));
      const formats::TensorInfo* info = ckpt_->info(p + ".weight_scale");
      const Shape s = info && info->shape.rank == 0 ? Shape{} : Shape{1};
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(p + ".weight_scale", float_scale, s));
      return uploaded(q);
    }
    case QuantKind::kNvfp4: {
      KILN_RETURN_IF_ERROR(need_divisible(16, "NVFP4"));
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight", {DType::kU8}, {n_out, n_in / 2}));
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(p + ".weight_scale", {DType::kF8E4M3}, {n_out, n_in / 16}));
      const formats::TensorInfo* info = ckpt_->info(p + ".weight_scale_2");
      const Shape s = info && info->shape.rank == 0 ? Shape{} : Shape{1};
      KILN_ASSIGN_OR_RETURN(q.scale2, host_typed(p + ".weight_scale_2", {DType::kF32}, s));
      // The static activation scale is for FP4 activations; the reference computes
      // activations in fp32 and does not use it.
      if (has(p + ".input_scale")) used_.insert(p + ".input_scale");
      return uploaded(q);
    }
    case QuantKind::kInt4Group: {
      const int64_t group = quant_.group_size;
      q.block_k = int32_t(group);
      KILN_RETURN_IF_ERROR(need_divisible(group, "INT4"));
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight_packed", {DType::kI32}, {n_out, ceil_div(n_in, 8)}));
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(p + ".weight_scale", float_scale, {n_out, n_in / group}));
      if (has(p + ".weight_zero_point")) {
        return unsupported(p + ".weight_zero_point: asymmetric INT4 is not supported");
      }
      if (has(p + ".weight_shape")) {
        KILN_ASSIGN_OR_RETURN(Tensor shape, ckpt_->get(p + ".weight_shape", {2}));
        if (shape.dtype != DType::kI32 && shape.dtype != DType::kI64) {
          return corrupt("tensor " + p + ".weight_shape has dtype " + std::string(dtype_name(shape.dtype)));
        }
        const int64_t rows = shape.dtype == DType::kI32 ? shape.as<int32_t>()[0] : shape.as<int64_t>()[0];
        const int64_t cols = shape.dtype == DType::kI32 ? shape.as<int32_t>()[1] : shape.as<int64_t>()[1];
        if (rows != n_out || cols != n_in) {
          return corrupt("tensor " + p + ".weight_shape says [" + std::to_string(rows) + ", " + std::to_string(cols) +
                         "], the config implies [" + std::to_string(n_out) + ", " + std::to_string(n_in) + "]");
        }
        used_.insert(p + ".weight_shape");
      }
      return uploaded(q);
    }
    case QuantKind::kMxfp4:
    case QuantKind::kNone: break;
  }
  return internal_error("no loader for " + std::string(formats::quant_kind_name(quant_.kind)) + " linears");
}

Result<std::vector<formats::QuantizedTensor>> WeightLoader::mxfp4_experts(const std::string& name,
                                                                           int64_t n_experts, int64_t n_out,
                                                                           int64_t n_in) {
  if (n_in % 32 != 0) {
    return corrupt("MXFP4 group size 32 does not divide the input size " + std::to_string(n_in) + " of " + name);
  }
  KILN_ASSIGN_OR_RETURN(Tensor blocks, host_typed(name + "_blocks", {DType::kU8}, {n_experts, n_out, n_in / 32, 16}));
  KILN_ASSIGN_OR_RETURN(Tensor scales,
                        host_typed(name + "_scales", {DType::kU8, DType::kE8M0}, {n_experts, n_out, n_in / 32}));
  std::vector<formats::QuantizedTensor> out;
  for (int64_t e = 0; e < n_experts; ++e) {
    formats::QuantizedTensor q;
    q.kind = formats::QuantKind::kMxfp4;
    q.n_out = n_out;
    q.n_in = n_in;
    q.data = blocks.index0(e);
    q.scale = scales.index0(e);
    auto u = uploaded(q);
    if (!u.ok()) return u.status().with_context(name + " (MXFP4 experts)");
    out.push_back(std::move(u).value());
  }
  return out;
}

std::vector<std::string> WeightLoader::unused() const {
  std::vector<std::string> out;
  if (ckpt_ == nullptr) return out;
  for (const std::string& n : ckpt_->names())
    if (!used_.count(n)) out.push_back(n);
  return out;
}

}  // namespace kiln::model
