#include "core/tensor.h"

#include <cstdlib>
#include <ostream>
#include <sstream>

namespace kiln {

std::string Shape::to_string() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << "[";
  for (int i = 0; i < s.rank; ++i) os << (i ? ", " : "") << s.dims[i];
  return os << "]";
}

Tensor Tensor::reshape(Shape s) const {
  KILN_CHECK_EQ(s.numel(), numel()) << shape << " -> " << s;
  Tensor t = *this;
  t.shape = s;
  return t;
}

Tensor Tensor::index0(int64_t i) const {
  KILN_CHECK(rank() >= 1 && i >= 0 && i < shape[0]) << "index " << i << " of " << shape;
  Shape s;
  for (int d = 1; d < rank(); ++d) s.push_back(shape[d]);
  const int64_t row_elems = s.numel();
  KILN_CHECK_EQ(row_elems * dtype_bits(dtype) % 8, 0) << "sub-byte row";
  Tensor t = *this;
  t.shape = s;
  t.data = static_cast<char*>(data) + i * row_elems * dtype_bits(dtype) / 8;
  return t;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  KILN_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape[0])
      << "slice [" << begin << ", " << end << ") of " << shape;
  const int64_t row_elems = numel() / (shape[0] == 0 ? 1 : shape[0]);
  Tensor t = *this;
  t.shape[0] = end - begin;
  t.data = static_cast<char*>(data) + begin * row_elems * dtype_bits(dtype) / 8;
  return t;
}

Tensor host_tensor(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  const size_t bytes = (t.nbytes() + 63) / 64 * 64 + 64;
  void* p = std::aligned_alloc(64, bytes);
  KILN_CHECK(p != nullptr) << "host allocation of " << bytes << " bytes failed";
  std::memset(p, 0, bytes);
  t.owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data = p;
  return t;
}

void to_f32(const Tensor& t, float* out) {
  KILN_CHECK(t.device == Device::kHost);
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::kF32: std::memcpy(out, t.data, size_t(n) * 4); break;
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) out[i] = float(t.as<double>()[i]);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(t.as<uint16_t>()[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(t.as<uint16_t>()[i]);
      break;
    case DType::kF8E4M3:
      for (int64_t i = 0; i < n; ++i) out[i] = fp8_e4m3_to_f32(t.as<uint8_t>()[i]);
      break;
    case DType::kF8E5M2:
      for (int64_t i = 0; i < n; ++i) out[i] = fp8_e5m2_to_f32(t.as<uint8_t>()[i]);
      break;
    default: KILN_CHECK(false) << "to_f32 of " << dtype_name(t.dtype);
  }
}

}  // namespace kiln
