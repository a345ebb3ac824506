#include "formats/quant.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace kiln::formats {
namespace {

// Scalar of a scale tensor in its stored dtype (f32 / bf16 / f16 / e4m3 / e8m0).
float scale_at(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.as<float>()[i];
    case DType::kBF16: return bf16_to_f32(t.as<uint16_t>()[i]);
    case DType::kF16: return f16_to_f32(t.as<uint16_t>()[i]);
    case DType::kF8E4M3: return fp8_e4m3_to_f32(t.as<uint8_t>()[i]);
    case DType::kU8:  // e8m0 scales ship as uint8
    case DType::kE8M0: return e8m0_to_f32(t.as<uint8_t>()[i]);
    default: break;
  }
  KILN_CHECK(false) << "quantized scale of dtype " << dtype_name(t.dtype);
  return 0.0f;
}

}  // namespace

std::string_view quant_kind_name(QuantKind k) {
  switch (k) {
    case QuantKind::kNone: return "dense";
    case QuantKind::kFp8Block: return "fp8-block";
    case QuantKind::kFp8Channel: return "fp8-channel";
    case QuantKind::kFp8Tensor: return "fp8-tensor";
    case QuantKind::kMxfp4: return "mxfp4";
    case QuantKind::kNvfp4: return "nvfp4";
    case QuantKind::kInt4Group: return "int4-group";
  }
  return "?";
}

void dequantize_row(const QuantizedTensor& q, int64_t o, float* out) {
  KILN_CHECK(o >= 0 && o < q.n_out) << "row " << o << " of " << q.n_out;
  KILN_CHECK_EQ(q.packed_group, 0) << "dequantize_row of a backend's packed layout";
  const int64_t n_in = q.n_in;
  switch (q.kind) {
    case QuantKind::kFp8Block: {
      const uint8_t* row = q.data.as<uint8_t>() + o * n_in;
      const int64_t k_blocks = (n_in + q.block_k - 1) / q.block_k;
      const int64_t scale_row = (o / q.block_n) * k_blocks;
      for (int64_t i = 0; i < n_in; ++i)
        out[i] = fp8_e4m3_to_f32(row[i]) * scale_at(q.scale, scale_row + i / q.block_k);
      return;
    }
    case QuantKind::kFp8Channel: {
      const uint8_t* row = q.data.as<uint8_t>() + o * n_in;
      const float s = scale_at(q.scale, o);
      for (int64_t i = 0; i < n_in; ++i) out[i] = fp8_e4m3_to_f32(row[i]) * s;
      return;
    }
    case QuantKind::kFp8Tensor: {
      const uint8_t* row = q.data.as<uint8_t>() + o * n_in;
      const float s = scale_at(q.scale, 0);
      for (int64_t i = 0; i < n_in; ++i) out[i] = fp8_e4m3_to_f32(row[i]) * s;
      return;
    }
    case QuantKind::kMxfp4: {
      const uint8_t* row = q.data.as<uint8_t>() + o * (n_in / 2);
      const int64_t groups = n_in / 32;
      for (int64_t i = 0; i < n_in; ++i) out[i] = e2m1_at(row, i) * scale_at(q.scale, o * groups + i / 32);
      return;
    }
    case QuantKind::kNvfp4: {
      const uint8_t* row = q.data.as<uint8_t>() + o * (n_in / 2);
      const int64_t groups = n_in / 16;
      const float s2 = scale_at(q.scale2, 0);
      for (int64_t i = 0; i < n_in; ++i)
        // (e2m1 * block scale) is exact in fp32; one rounding at * scale2, as ModelOpt computes it.
        out[i] = (e2m1_at(row, i) * scale_at(q.scale, o * groups + i / 16)) * s2;
      return;
    }
    case QuantKind::kInt4Group: {
      const int32_t* row = q.data.as<int32_t>() + o * ((n_in + 7) / 8);
      const int64_t groups = (n_in + q.block_k - 1) / q.block_k;
      for (int64_t i = 0; i < n_in; ++i)
        out[i] = float(int4_at(row, i)) * scale_at(q.scale, o * groups + i / q.block_k);
      return;
    }
    case QuantKind::kNone: break;
  }
  KILN_CHECK(false) << "dequantize_row of a dense weight";
}

float quantize_fp8_act_block(const float* x, int n, uint8_t* codes) {
  KILN_CHECK(n >= 0 && n <= kFp8ActBlock) << "fp8 activation block of " << n;
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  float s = amax / 448.0f;
  if (!(s > 0.0f)) s = 1.0f;
  for (int i = 0; i < n; ++i) codes[i] = f32_to_fp8_e4m3(x[i] / s);
  return s;
}

void fake_quantize_fp8_act(const float* x, int64_t n, float* out) {
  uint8_t codes[kFp8ActBlock];
  for (int64_t b = 0; b < n; b += kFp8ActBlock) {
    const int len = int(std::min<int64_t>(kFp8ActBlock, n - b));
    const float s = quantize_fp8_act_block(x + b, len, codes);
    for (int i = 0; i < len; ++i) out[b + i] = fp8_e4m3_to_f32(codes[i]) * s;
  }
}

bool fp8_w8a8_eligible(const QuantizedTensor& q) {
  switch (q.kind) {
    case QuantKind::kFp8Block: return q.block_k > 0 && q.block_k % kFp8ActBlock == 0;
    case QuantKind::kFp8Channel:
    case QuantKind::kFp8Tensor: return true;
    default: return false;
  }
}

}  // namespace kiln::formats
