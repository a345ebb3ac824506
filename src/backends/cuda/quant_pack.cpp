#include "backends/cuda/quant_pack.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

namespace kiln::cuda {
namespace {

using formats::QuantKind;

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// Scale of a checkpoint scale tensor at flat index i, as fp32 (the same reading as
// formats::dequantize_row's).
float host_scale(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.as<float>()[i];
    case DType::kBF16: return bf16_to_f32(t.as<uint16_t>()[i]);
    case DType::kF16: return f16_to_f32(t.as<uint16_t>()[i]);
    default: break;
  }
  KILN_CHECK(false) << "scale of dtype " << dtype_name(t.dtype);
  return 0.0f;
}

Status need(bool ok, const formats::QuantizedTensor& q, const std::string& why) {
  if (ok) return Status::Ok();
  return unsupported("the CUDA kernels take no " + std::string(formats::quant_kind_name(q.kind)) + " weight " +
                     std::to_string(q.n_out) + " x " + std::to_string(q.n_in) + " with " + why);
}

// The unit-major order (kernels/quant_layout.h) of row-major [rows, row_bytes] bytes
// (rows a whole number of units): each row's block of blk bytes moves to its place.
std::vector<uint8_t> unit_major(const std::vector<uint8_t>& row_major, int64_t rows, int64_t row_bytes, int blk) {
  std::vector<uint8_t> out(row_major.size());
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t b = 0; b < row_bytes / blk; ++b)
      std::memcpy(&out[size_t(quant_block_offset(o, b, row_bytes, blk))], &row_major[size_t(o * row_bytes + b * blk)],
                  size_t(blk));
  return out;
}

}  // namespace

int PackedQuant::scale_bytes() const { return dtype_bits(scale_dtype) / 8; }

float packed_scale(DType dtype, const uint8_t* b) {
  switch (dtype) {
    case DType::kE8M0: return e8m0_to_f32(b[0]);
    case DType::kF8E4M3: return fp8_e4m3_to_f32(b[0]);
    case DType::kBF16: { uint16_t v; std::memcpy(&v, b, 2); return bf16_to_f32(v); }
    case DType::kF16: { uint16_t v; std::memcpy(&v, b, 2); return f16_to_f32(v); }
    case DType::kF32: { float v; std::memcpy(&v, b, 4); return v; }
    default: break;
  }
  KILN_CHECK(false) << "packed scale of dtype " << dtype_name(dtype);
  return 0.0f;
}

Result<PackedQuant> packed_layout(const formats::QuantizedTensor& q) {
  PackedQuant p;
  p.kind = q.kind;
  p.n_out = q.n_out;
  p.n_in = q.n_in;
  p.k_padded = round_up(q.n_in, kQuantKTile);
  KILN_RETURN_IF_ERROR(need(q.n_in % 8 == 0, q, "an input size not a multiple of 8"));
  const int64_t n_out = q.n_out, n_in = q.n_in;
  switch (q.kind) {
    case QuantKind::kMxfp4:
      p.value = QuantValue::kE2m1, p.bits = 4, p.group = 32, p.scale_dtype = DType::kE8M0;
      break;
    case QuantKind::kNvfp4:
      p.value = QuantValue::kE2m1, p.bits = 4, p.group = 16, p.scale_dtype = DType::kF8E4M3;
      p.has_scale2 = true;
      break;
    case QuantKind::kInt4Group: {
      KILN_RETURN_IF_ERROR(need(q.block_k >= 8 && (q.block_k <= 64 ? 64 % q.block_k == 0 : q.block_k % 64 == 0), q,
                                "group size " + std::to_string(q.block_k) + " (8, 16, 32 or a multiple of 64)"));
      const DType sd = q.scale.dtype;
      KILN_RETURN_IF_ERROR(need(sd == DType::kBF16 || sd == DType::kF16 || sd == DType::kF32, q,
                                std::string("scales of dtype ") + std::string(dtype_name(sd))));
      p.value = QuantValue::kInt4, p.bits = 4, p.group = std::min(q.block_k, 64), p.scale_dtype = sd;
      break;
    }
    case QuantKind::kFp8Block:
    case QuantKind::kFp8Channel:
    case QuantKind::kFp8Tensor: {
      int group = kQuantKTile;
      if (q.kind == QuantKind::kFp8Block) {
        const int bk = q.block_k;
        KILN_RETURN_IF_ERROR(need(bk > 0 && (bk % kQuantKTile == 0 || (kQuantKTile % bk == 0 && bk >= 16)), q,
                                  "block size " + std::to_string(bk) + " along the input (16..128 dividing 128, or a multiple of 128)"));
        group = std::min(bk, kQuantKTile);
      }
      p.value = QuantValue::kE4m3, p.bits = 8, p.group = group, p.scale_dtype = DType::kF32;
      break;
    }
    case QuantKind::kNone: return internal_error("pack_quantized of a dense weight");
  }
  // The checkpoint tensors' sizes (formats/quant.h), so a weight sliced off its scale
  // groups (a tensor-parallel d_ff slice that is not a whole number of groups) is an
  // error here rather than scales read from the wrong place.
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  int64_t want_scales = 1;
  switch (q.kind) {
    case QuantKind::kMxfp4:
      KILN_RETURN_IF_ERROR(need(n_in % 32 == 0, q, "an input size not a multiple of its 32-input scale groups"));
      want_scales = n_out * (n_in / 32);
      break;
    case QuantKind::kNvfp4:
      KILN_RETURN_IF_ERROR(need(n_in % 16 == 0, q, "an input size not a multiple of its 16-input scale groups"));
      want_scales = n_out * (n_in / 16);
      break;
    case QuantKind::kInt4Group: want_scales = n_out * ceil_div(n_in, q.block_k); break;
    case QuantKind::kFp8Block:
      KILN_RETURN_IF_ERROR(need(q.block_n > 0, q, "no block size along the output"));
      want_scales = ceil_div(n_out, q.block_n) * ceil_div(n_in, q.block_k);
      break;
    case QuantKind::kFp8Channel: want_scales = n_out; break;
    default: break;
  }
  KILN_RETURN_IF_ERROR(need(q.scale.numel() == want_scales, q,
                            std::to_string(q.scale.numel()) + " scales (expected " + std::to_string(want_scales) + ")"));
  KILN_RETURN_IF_ERROR(need(int64_t(q.data.nbytes()) == n_out * n_in * p.bits / 8, q,
                            std::to_string(q.data.nbytes()) + " bytes of codes (expected " +
                                std::to_string(n_out * n_in * p.bits / 8) + ")"));
  KILN_RETURN_IF_ERROR(need(p.tile_scale_bytes() <= kQuantMaxTileScaleBytes, q,
                            std::to_string(p.tile_scale_bytes()) + " bytes of scales per row per " +
                                std::to_string(kQuantKTile) + " inputs (at most " +
                                std::to_string(kQuantMaxTileScaleBytes) + ")"));
  KILN_CHECK_EQ(p.tile_scale_bytes() % 4, 0);
  return p;
}

Result<PackedQuant> pack_quantized(const formats::QuantizedTensor& q) {
  KILN_CHECK(q.data.device == Device::kHost) << "pack_quantized reads host tensors";
  KILN_ASSIGN_OR_RETURN(PackedQuant p, packed_layout(q));
  const int64_t n_out = q.n_out, n_in = q.n_in;
  if (q.kind == QuantKind::kNvfp4) {
    p.scale2 = q.scale2.dtype == DType::kF32 ? q.scale2.as<float>()[0] : host_scale(q.scale2, 0);
  }
  if (q.kind == QuantKind::kMxfp4) {
    int top = 0;  // the largest exponent field but NaN (255)
    const auto* e = q.scale.as<uint8_t>();
    for (int64_t i = 0; i < q.scale.numel(); ++i)
      if (e[i] != 255) top = std::max<int>(top, e[i]);
    KILN_RETURN_IF_ERROR(need(top <= kQuantMaxE8m0, q,
                              "a scale of 2^" + std::to_string(top - 127) + " (the GEMV takes MXFP4 scales up to 2^" +
                                  std::to_string(kQuantMaxE8m0 - 127) + ")"));
  }
  if (q.kind == QuantKind::kNvfp4) {
    // NVFP4 block scales are unsigned e4m3: the SM120 tensor cores read a scale byte as a
    // ue4m3 (quant_gemm_sm120.cu), where a sign bit set would not negate the block. Refused
    // on every device, so that no checkpoint loads here and computes otherwise there.
    const uint8_t* s = q.scale.as<uint8_t>();
    const uint8_t* end = s + q.scale.numel();
    const uint8_t* neg = std::find_if(s, end, [](uint8_t b) { return (b & 0x80) != 0; });
    if (neg != end) {
      const int64_t i = neg - s, per_row = n_in / 16;
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", unsigned(*neg));
      return need(false, q,
                  "a block scale with its sign bit set (" + std::string(byte) + ", scale " +
                      std::to_string(i % per_row) + " of row " + std::to_string(i / per_row) +
                      "; NVFP4 scales are unsigned e4m3)");
    }
  }

  // Codes: rows copied as they are, the padding set to the code of zero.
  const int64_t src_row = n_in * p.bits / 8, dst_row = p.code_row_bytes();
  const uint8_t zero = p.value == QuantValue::kInt4 ? 0x88 : 0x00;
  std::vector<uint8_t> codes(size_t(p.rows() * dst_row), zero);
  const auto* src = static_cast<const uint8_t*>(q.data.data);
  for (int64_t o = 0; o < n_out; ++o) std::memcpy(&codes[size_t(o * dst_row)], src + o * src_row, size_t(src_row));
  p.codes = unit_major(codes, p.rows(), dst_row, p.code_block_bytes());

  // Scales: one per group of k; past n_in zero (the codes there are zero too).
  const int sb = p.scale_bytes();
  const int64_t per_row = p.k_padded / p.group;
  std::vector<uint8_t> scales(size_t(p.rows() * per_row * sb), 0);
  for (int64_t o = 0; o < n_out; ++o) {
    uint8_t* row = &scales[size_t(o * per_row * sb)];
    for (int64_t j = 0; j < per_row; ++j) {
      const int64_t k = j * p.group;  // first element of this scale group
      if (k >= n_in) break;
      uint8_t* dst = row + j * sb;
      switch (q.kind) {
        case QuantKind::kMxfp4: dst[0] = q.scale.as<uint8_t>()[o * (n_in / 32) + k / 32]; break;
        case QuantKind::kNvfp4: dst[0] = q.scale.as<uint8_t>()[o * (n_in / 16) + k / 16]; break;
        case QuantKind::kInt4Group: {
          const int64_t i = o * ((n_in + q.block_k - 1) / q.block_k) + k / q.block_k;  // a partial last group
          std::memcpy(dst, static_cast<const uint8_t*>(q.scale.data) + i * sb, size_t(sb));
          break;
        }
        default: {  // FP8: fp32 of the checkpoint's block / channel / tensor scale
          int64_t i = 0;
          if (q.kind == QuantKind::kFp8Block) i = (o / q.block_n) * ((n_in + q.block_k - 1) / q.block_k) + k / q.block_k;
          else if (q.kind == QuantKind::kFp8Channel) i = o;
          const float s = host_scale(q.scale, i);
          std::memcpy(dst, &s, 4);
        }
      }
    }
  }
  p.scales = unit_major(scales, p.rows(), p.scale_row_bytes(), p.tile_scale_bytes());
  return p;
}

float packed_element(const PackedQuant& p, int64_t o, int64_t k) {
  const int64_t b = k / kQuantKTile, kb = k % kQuantKTile;  // block, and k within it
  const uint8_t* codes = &p.codes[size_t(quant_block_offset(o, b, p.code_row_bytes(), p.code_block_bytes()))];
  float v = 0.0f;
  if (p.bits == 4) {
    const uint8_t nib = kb % 2 ? uint8_t(codes[kb / 2] >> 4) : uint8_t(codes[kb / 2] & 0xf);
    v = p.value == QuantValue::kInt4 ? float(int(nib) - 8) : fp4_e2m1_to_f32(nib);
  } else {
    v = fp8_e4m3_to_f32(codes[kb]);
  }
  const uint8_t* s = &p.scales[size_t(quant_block_offset(o, b, p.scale_row_bytes(), p.tile_scale_bytes()) +
                                      (kb / p.group) * p.scale_bytes())];
  return v * packed_scale(p.scale_dtype, s);
}

}  // namespace kiln::cuda
