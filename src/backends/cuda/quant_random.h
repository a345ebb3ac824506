// Random quantized weights in their checkpoint layouts (formats/quant.h), for the
// start-up self-test of the quantized kernels (selftest.cpp), the CUDA packing test
// (CPU) and the quantized GEMM tests (GPU). Codes cover every value but NaN; scales
// keep weights in a trained model's range.
#pragma once

#include <cmath>
#include <random>
#include <string>

#include "core/tensor.h"
#include "formats/quant.h"

namespace kiln::cuda {

struct QuantCase {
  formats::QuantKind kind;
  int32_t group = 0;               // INT4 group / FP8 block_k
  int32_t block_n = 128;           // FP8 block rows
  DType scale_dtype = DType::kBF16;  // INT4 and FP8 scales
  std::string name() const {
    return std::string(formats::quant_kind_name(kind)) + (group ? "/g" + std::to_string(group) : "") + "/" +
           std::string(dtype_name(scale_dtype));
  }
};

// Every format and scale variant the CUDA kernels take.
inline std::vector<QuantCase> quant_cases() {
  using formats::QuantKind;
  return {{QuantKind::kMxfp4}, {QuantKind::kNvfp4},
          {QuantKind::kInt4Group, 32, 0, DType::kBF16}, {QuantKind::kInt4Group, 128, 0, DType::kF16},
          {QuantKind::kInt4Group, 16, 0, DType::kF32},
          {QuantKind::kFp8Block, 128, 128, DType::kF32}, {QuantKind::kFp8Channel, 0, 0, DType::kF32},
          {QuantKind::kFp8Tensor, 0, 0, DType::kBF16}};
}

inline void put_scale(Tensor& t, int64_t i, float v) {
  switch (t.dtype) {
    case DType::kF32: t.as<float>()[i] = v; break;
    case DType::kBF16: t.as<uint16_t>()[i] = f32_to_bf16(v); break;
    case DType::kF16: t.as<uint16_t>()[i] = f32_to_f16(v); break;
    default: KILN_CHECK(false) << "scale dtype " << dtype_name(t.dtype);
  }
}

// A random [n_out, n_in] weight of case c whose dequantized values are about `amp` in size.
inline formats::QuantizedTensor random_quantized(const QuantCase& c, int64_t n_out, int64_t n_in, std::mt19937& rng,
                                                 float amp = 0.05f) {
  using formats::QuantKind;
  formats::QuantizedTensor q;
  q.kind = c.kind;
  q.n_out = n_out;
  q.n_in = n_in;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> unit(0.5f, 1.5f);
  auto bytes = [&](Tensor& t) {
    for (size_t i = 0; i < t.nbytes(); ++i) static_cast<uint8_t*>(t.data)[i] = uint8_t(byte(rng));
  };
  switch (c.kind) {
    case QuantKind::kMxfp4: {  // e2m1 up to 6, scale 2^e around amp / 3
      q.data = host_tensor(DType::kU8, {n_out, n_in / 2});
      bytes(q.data);
      q.scale = host_tensor(DType::kU8, {n_out, n_in / 32});
      const int e0 = 127 + int(std::floor(std::log2(amp / 3)));
      std::uniform_int_distribution<int> e(e0 - 2, e0 + 1);
      for (int64_t i = 0; i < q.scale.numel(); ++i) q.scale.as<uint8_t>()[i] = uint8_t(e(rng));
      return q;
    }
    case QuantKind::kNvfp4: {  // e4m3 block scales in [16, 448) times a global scale
      q.data = host_tensor(DType::kU8, {n_out, n_in / 2});
      bytes(q.data);
      q.scale = host_tensor(DType::kF8E4M3, {n_out, n_in / 16});
      std::uniform_int_distribution<int> s(0x50, 0x7e);  // positive normal e4m3, not NaN
      for (int64_t i = 0; i < q.scale.numel(); ++i) q.scale.as<uint8_t>()[i] = uint8_t(s(rng));
      q.scale2 = host_tensor(DType::kF32, {});
      q.scale2.as<float>()[0] = amp / (3 * 128) * unit(rng);
      return q;
    }
    case QuantKind::kInt4Group: {
      q.block_k = c.group;
      q.data = host_tensor(DType::kI32, {n_out, n_in / 8});
      bytes(q.data);
      q.scale = host_tensor(c.scale_dtype, {n_out, n_in / c.group});
      for (int64_t i = 0; i < q.scale.numel(); ++i) put_scale(q.scale, i, amp / 5 * unit(rng));
      return q;
    }
    default: break;
  }
  // FP8: e4m3 codes (no NaN), scales around amp / 100 (codes reach 448).
  q.data = host_tensor(DType::kF8E4M3, {n_out, n_in});
  for (int64_t i = 0; i < q.data.numel(); ++i) {
    uint8_t v = uint8_t(byte(rng));
    if ((v & 0x7f) == 0x7f) v ^= 1;  // 0x7f / 0xff are NaN
    q.data.as<uint8_t>()[i] = v;
  }
  if (c.kind == QuantKind::kFp8Block) {
    q.block_n = c.block_n;
    q.block_k = c.group;
    q.scale = host_tensor(c.scale_dtype, {(n_out + c.block_n - 1) / c.block_n, (n_in + c.group - 1) / c.group});
  } else if (c.kind == QuantKind::kFp8Channel) {
    q.scale = host_tensor(c.scale_dtype, {n_out, 1});
  } else {
    q.scale = host_tensor(c.scale_dtype, {});
  }
  for (int64_t i = 0; i < q.scale.numel(); ++i) put_scale(q.scale, i, amp / 100 * unit(rng));
  return q;
}

// The smallest input size multiple a case needs (its packing unit).
inline int64_t quant_k_unit(const QuantCase& c) {
  switch (c.kind) {
    case formats::QuantKind::kMxfp4: return 32;
    case formats::QuantKind::kNvfp4: return 16;
    case formats::QuantKind::kInt4Group: return c.group;
    default: return 8;
  }
}

}  // namespace kiln::cuda
