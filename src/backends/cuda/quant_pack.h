// The CUDA backend's layout of quantized weights: every checkpoint format
// (formats/quant.h) is repacked once at load into the one layout the quantized
// GEMM kernels read (kernels/quant_gemm.cu). Pure host code, tested on the CPU
// (tests/backends/cuda_quant_pack_test.cpp) so the layout is checked without a GPU.
//
// A weight is logically W [n_out, n_in] (y = x W^T). With Kp = n_in rounded up to
// kQuantKTile (the kernels' k step) and N = n_out rounded up to kQuantUnitRows:
//   codes   u8 [N, Kp * bits / 8]. 4-bit formats: element k in byte k / 2, low
//           nibble for even k: the checkpoints' own order (MXFP4 / NVFP4 bytes and
//           INT4's little-endian int32 words are copied as they are). FP8: one e4m3
//           per byte. Padding (k >= n_in, rows >= n_out) holds the code of zero.
//   scales  [N, Kp / group] of scale_dtype, one per `group` consecutive k of a
//           row; group divides kQuantKTile and one tile's scales of a row are a
//           multiple of 4 bytes (the kernels fetch them with 4-byte cp.async):
//             MXFP4  e8m0, group 32          NVFP4  e4m3, group 16
//             INT4   the checkpoint's bf16 / f16 / f32, group min(g, 64) (a larger
//                    group's scale is repeated)
//             FP8    f32, group min(block_k, 128) (a block scale is repeated over its
//                    block's rows; per-channel and per-tensor scales along k)
//   scale2  NVFP4's global scale, applied by the kernels to the fp32 result; else 1.
// Both arrays are unit-major (kernels/quant_layout.h): a row's 128-input block of codes
// (64 or 128 bytes) or of scales (tile_scale_bytes) lies at quant_block_offset(o, b, ...),
// 16 rows' blocks side by side: the repack is a permutation inside each 16-row unit.
// Element value: W[o][k] = value(code) * scale[o][k / group] * scale2 with value the
// e2m1 number (MXFP4, NVFP4), code - 8 (INT4) or the e4m3 number (FP8): exactly the
// numbers formats::dequantize_row gives.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cuda/kernels/quant_layout.h"
#include "core/status.h"
#include "formats/quant.h"

namespace kiln::cuda {

inline constexpr int kQuantKTile = 128;
inline constexpr int kQuantMaxTileScaleBytes = 32;  // per row per k tile (f32, group 16)

// How a code becomes a number (the kernels' template parameter).
enum class QuantValue : uint8_t { kE2m1, kInt4, kE4m3 };

struct PackedQuant {
  formats::QuantKind kind = formats::QuantKind::kNone;
  QuantValue value = QuantValue::kE2m1;
  int64_t n_out = 0, n_in = 0, k_padded = 0;
  int bits = 0;   // 4 or 8
  int group = 0;  // k elements per scale
  DType scale_dtype = DType::kF32;
  std::vector<uint8_t> codes;   // [rows(), code_row_bytes()], unit-major
  std::vector<uint8_t> scales;  // [rows(), scale_row_bytes()], unit-major
  bool has_scale2 = false;
  float scale2 = 1.0f;

  int64_t rows() const { return quant_rows_padded(n_out); }  // stored rows
  int64_t code_row_bytes() const { return k_padded * bits / 8; }
  int code_block_bytes() const { return kQuantKTile * bits / 8; }  // a row's per 128 inputs
  int scale_bytes() const;  // bytes of one scale
  int64_t scale_row_bytes() const { return k_padded / group * scale_bytes(); }
  int tile_scale_bytes() const { return kQuantKTile / group * scale_bytes(); }
};

// The packed form of a checkpoint-layout quantized weight (host tensors), or why
// this layout cannot hold it (a clear unsupported error).
Result<PackedQuant> pack_quantized(const formats::QuantizedTensor& q);
// The same checks and sizes, codes and scales left empty: reads only the tensors'
// shapes and dtypes (sizing a model without its values or a GPU).
Result<PackedQuant> packed_layout(const formats::QuantizedTensor& q);
// Bytes of the packed codes, scales and scale2 the CUDA backend holds for `q`.
inline int64_t packed_bytes(const PackedQuant& p) {
  return p.rows() * (p.code_row_bytes() + p.scale_row_bytes()) + (p.has_scale2 ? 4 : 0);
}

// value(code) * scale of element (o, k) of the packed form, scale2 not applied: what
// the kernels put into their bf16 tiles before rounding.
float packed_element(const PackedQuant& p, int64_t o, int64_t k);

// The scale of the given dtype stored at `bytes` as fp32.
float packed_scale(DType dtype, const uint8_t* bytes);

}  // namespace kiln::cuda
