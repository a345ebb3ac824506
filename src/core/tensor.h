// Shape and Tensor: a typed, contiguous, row-major block of memory on one device.
// A Tensor may own its memory (shared, via `owner`) or borrow it (a view into
// an mmapped checkpoint, a slice of another tensor).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace kiln {

inline constexpr int kMaxRank = 6;

struct Shape {
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    KILN_CHECK_LE(int(d.size()), kMaxRank);
    for (int64_t x : d) dims[rank++] = x;
  }
  int64_t operator[](int i) const {
    KILN_CHECK(i >= 0 && i < rank) << "dim " << i << " of rank " << rank;
    return dims[i];
  }
  int64_t& operator[](int i) {
    KILN_CHECK(i >= 0 && i < rank) << "dim " << i << " of rank " << rank;
    return dims[i];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  void push_back(int64_t d) {
    KILN_CHECK_LT(rank, kMaxRank);
    dims[rank++] = d;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string to_string() const;  // "[4, 64]"
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

enum class Device : uint8_t { kHost, kCuda };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Device device = Device::kHost;
  int device_index = 0;
  std::shared_ptr<void> owner;  // keeps the memory alive; null for borrowed memory

  bool defined() const { return data != nullptr; }
  int64_t numel() const { return shape.numel(); }
  int64_t dim(int i) const { return shape[i]; }
  int rank() const { return shape.rank; }
  // Bytes of the whole tensor (packed 4-bit types round up to a byte).
  size_t nbytes() const { return size_t((numel() * dtype_bits(dtype) + 7) / 8); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }

  // Row-major view of the same memory with another shape of equal numel.
  Tensor reshape(Shape s) const;
  // Sub-tensor [i] along dim 0 (a view): shape drops the first dim.
  Tensor index0(int64_t i) const;
  // Rows [begin, end) along dim 0 (a view).
  Tensor slice0(int64_t begin, int64_t end) const;
};

// Host tensor with freshly allocated, 64-byte aligned, zero-filled memory.
Tensor host_tensor(DType dtype, Shape shape);

// Convert any float-like host tensor to fp32 values (for tests and references).
void to_f32(const Tensor& t, float* out);

}  // namespace kiln
