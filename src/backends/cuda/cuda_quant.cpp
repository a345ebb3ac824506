// CudaBackend's quantized weights: the load-time repack into the kernels' layout
// (quant_pack.h), and the bf16 copy of a quantized weight where a kernel reads bf16.
#include "backends/cuda/cuda_backend_impl.h"
#include "backends/cuda/quant_pack.h"

namespace kiln::cuda {

QuantMat quant_mat(const formats::QuantizedTensor& q) {
  KILN_CHECK(q.packed_group > 0 && q.data.device == Device::kCuda) << "cuda: a quantized weight not packed for CUDA";
  return {.codes = q.data.as<uint8_t>(), .scales = q.scale.as<uint8_t>(),
          .scale2 = q.scale2.defined() ? q.scale2.as<float>() : nullptr};
}

QuantFormat quant_format(const formats::QuantizedTensor& q) {
  using formats::QuantKind;
  QuantFormat f;
  f.value = q.kind == QuantKind::kMxfp4 || q.kind == QuantKind::kNvfp4 ? 0 : q.kind == QuantKind::kInt4Group ? 1 : 2;
  switch (q.scale.dtype) {
    case DType::kE8M0: f.scale_kind = 0; break;
    case DType::kF8E4M3: f.scale_kind = 1; break;
    case DType::kBF16: f.scale_kind = 2; break;
    case DType::kF16: f.scale_kind = 3; break;
    default: f.scale_kind = 4;
  }
  f.scale_bytes = dtype_bits(q.scale.dtype) / 8;
  f.group = q.packed_group;
  return f;
}

Result<int64_t> CudaBackend::quantized_bytes(const formats::QuantizedTensor& q) const {
  KILN_ASSIGN_OR_RETURN(const PackedQuant p, packed_layout(q));
  return packed_bytes(p);
}

Result<formats::QuantizedTensor> CudaBackend::upload_quantized(const formats::QuantizedTensor& q) {
  if (!quantized_disabled_.empty()) {
    return unsupported("quantized weights are disabled on this GPU: the start-up self-test failed (" +
                       quantized_disabled_ + ")");
  }
  KILN_ASSIGN_OR_RETURN(PackedQuant p, pack_quantized(q));
  formats::QuantizedTensor out;
  out.kind = q.kind;
  out.n_out = q.n_out;
  out.n_in = q.n_in;
  out.block_n = q.block_n;
  out.block_k = q.block_k;
  out.packed_group = p.group;
  out.data = alloc_tensor(DType::kU8, {p.rows(), p.code_row_bytes()}, true);
  out.scale = alloc_tensor(p.scale_dtype, {p.rows(), p.k_padded / p.group}, true);
  KILN_CHECK_EQ(out.data.nbytes(), p.codes.size());
  KILN_CHECK_EQ(out.scale.nbytes(), p.scales.size());
  KILN_CUDA_CHECK(cudaMemcpyAsync(out.data.data, p.codes.data(), p.codes.size(), cudaMemcpyHostToDevice, stream_));
  KILN_CUDA_CHECK(cudaMemcpyAsync(out.scale.data, p.scales.data(), p.scales.size(), cudaMemcpyHostToDevice, stream_));
  if (p.has_scale2) {
    out.scale2 = alloc_tensor(DType::kF32, {1}, true);
    KILN_CUDA_CHECK(cudaMemcpyAsync(out.scale2.data, &p.scale2, 4, cudaMemcpyHostToDevice, stream_));
  }
  synchronize();  // the host buffers die here
  return out;
}

const bf16* CudaBackend::dequantized(const ops::Weight& w) {
  auto it = dequantized_.find(&w);
  if (it != dequantized_.end() && it->second.first == w.quant.data.data) return it->second.second.as<bf16>();
  Tensor t = alloc_tensor(DType::kBF16, {w.n_out(), w.n_in()}, true);  // kept like a weight
  launch_dequantize(quant_mat(w.quant), quant_format(w.quant), w.n_out(), w.n_in(), t.as<bf16>(), stream_);
  dequantized_[&w] = {w.quant.data.data, t};
  return t.as<bf16>();
}

}  // namespace kiln::cuda
