// Quantized weight formats as checkpoints ship them, and the scalar dequant
// reference of each: the specification every CPU and GPU path is checked
// against. Layouts and sources: shared/research/kernels-sm120.md section 4.
//
// A quantized linear is logically W [n_out, n_in] (y = x W^T). Per format:
//   kFp8Block   data e4m3 [n_out, n_in]; scale fp32 [ceil(n_out/bn), ceil(n_in/bk)]
//               W = e4m3 * scale[o/bn, i/bk]   (DeepSeek "weight_scale_inv": multiplied)
//   kFp8Channel data e4m3 [n_out, n_in]; scale fp32/bf16 [n_out, 1]; W = e4m3 * scale[o]
//   kFp8Tensor  data e4m3 [n_out, n_in]; scale fp32 [] or [1];       W = e4m3 * scale
//   kMxfp4      data u8 [n_out, n_in/32, 16] (two e2m1 per byte, low nibble = even k);
//               scale e8m0 u8 [n_out, n_in/32];  W = e2m1 * 2^(scale - 127)
//   kNvfp4      data u8 [n_out, n_in/2] (low nibble = even k); scale e4m3 [n_out, n_in/16];
//               scale2 fp32 scalar;               W = e2m1 * e4m3(scale) * scale2
//   kInt4Group  data i32 [n_out, n_in/8] (element k = nibble k%8 of word k/8, LSB first,
//               stored q + 8); scale bf16/f16/f32 [n_out, n_in/group]; W = (nib - 8) * scale
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace kiln::formats {

enum class QuantKind : uint8_t { kNone, kFp8Block, kFp8Channel, kFp8Tensor, kMxfp4, kNvfp4, kInt4Group };

std::string_view quant_kind_name(QuantKind k);

// A weight in a quantized format: the packed tensors and the logical shape.
struct QuantizedTensor {
  QuantKind kind = QuantKind::kNone;
  int64_t n_out = 0, n_in = 0;
  int32_t block_n = 0, block_k = 0;  // kFp8Block block size; kInt4Group: block_k = group
  Tensor data;
  Tensor scale;
  Tensor scale2;  // kNvfp4 global scale (fp32 scalar)
  // > 0: data and scale are in a backend's own packed layout, with this many inputs per
  // scale (Backend::upload_quantized; the CUDA layout is backends/cuda/quant_pack.h):
  // only that backend's ops read them, and dequantize_row does not apply.
  int32_t packed_group = 0;

  bool defined() const { return kind != QuantKind::kNone; }
  // Bytes of packed data + scales.
  size_t nbytes() const { return data.nbytes() + scale.nbytes() + scale2.nbytes(); }
};

// Writes the n_in fp32 values of logical row `o` (the reference dequantization).
void dequantize_row(const QuantizedTensor& q, int64_t o, float* out);

// FP8 activations of the W8A8 GEMMs (DeepSeek-V3's act_quant, 1 x 128 blocks): each
// block of kFp8ActBlock consecutive inputs of a row becomes e4m3 codes (round to nearest
// even, saturating) with one fp32 scale s = amax / 448 (1 for an all-zero block), so
// x ~ e4m3(x / s) * s. quantize_fp8_act_block writes n <= kFp8ActBlock codes and returns
// s; fake_quantize_fp8_act replaces a row of n inputs by those values (what a W8A8 GEMM
// multiplies), the CPU reference's emulation of the GPU's quantized activations.
inline constexpr int kFp8ActBlock = 128;
float quantize_fp8_act_block(const float* x, int n, uint8_t* codes);
void fake_quantize_fp8_act(const float* x, int64_t n, float* out);
// Whether W8A8 applies to a weight: FP8 whose scale is one number over each block of 128
// inputs of a row (block FP8 with block_k a multiple of 128, per channel, per tensor).
bool fp8_w8a8_eligible(const QuantizedTensor& q);

// Element scalars used by dequantize_row, exposed for tests.
// INT4 nibble k of a row of packed int32 words, as the signed value (nibble - 8).
inline int int4_at(const int32_t* row, int64_t k) {
  return int((uint32_t(row[k / 8]) >> (4 * (k % 8))) & 0xf) - 8;
}
// e2m1 element k of a row of packed bytes (low nibble = even k).
inline float e2m1_at(const uint8_t* row, int64_t k) {
  const uint8_t b = row[k / 2];
  return fp4_e2m1_to_f32(k % 2 ? uint8_t(b >> 4) : uint8_t(b & 0xf));
}

}  // namespace kiln::formats
