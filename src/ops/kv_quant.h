// The FP8 KV cache (--kv-cache-dtype fp8): how values are scaled and rounded. Every
// backend stores exactly these bytes, so a CUDA cache can be compared with the CPU
// reference's byte for byte.
//
// Scales: one fp32 scale per stored row, computed when the row is stored:
//   GQA: per (token slot, kv head), for K and for V: k_scale, v_scale
//        [n_blocks, block_size, n_kv_heads];
//   MLA: per token slot, one for the latent part and one for the rope part:
//        latent_scale [n_blocks, block_size, 2] (latent, rope).
//   scale = absmax(row) / 448 (fp32 division rounded to nearest); 0 for an all-zero row
//   code  = e4m3(x / scale) (fp32 division rounded to nearest, then e4m3 rounded to
//           nearest even, saturating at +-448: f32_to_fp8_e4m3); 0 when scale is 0
//   value = e4m3_value(code) * scale
// So the largest |x| of a row maps to 448 and every value keeps e4m3's precision
// (3 mantissa bits): |value - x| <= 2^-4 |x| where |x| >= 2^-6 scale (normal codes),
// and <= 2^-10 scale below (subnormal codes, quantum 2^-9 scale); both are at most
// 2^-4 absmax. A per-row scale keeps an outlier token or head from crushing the others
// (vLLM's default is one per-tensor scale of 1.0, which saturates any |x| > 448 and
// loses precision below 2^-6); it costs 4 bytes per row, about 3% of a d_head 128 row.
// Checkpoint k_scale / v_scale tensors are not used: scales are computed at store time.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace kiln::ops {

constexpr float kE4m3Max = 448.0f;

// The scale of a row whose largest magnitude is absmax.
inline float kv_row_scale(float absmax) { return absmax / kE4m3Max; }

// The e4m3 code of x in a row of that scale.
inline uint8_t kv_quantize(float x, float scale) { return scale > 0.0f ? f32_to_fp8_e4m3(x / scale) : 0; }

// The value a code of a row of that scale stands for (fp32).
inline float kv_dequantize(uint8_t code, float scale) { return fp8_e4m3_to_f32(code) * scale; }

// Quantizes one row of n values: codes[i] = kv_quantize(x[i], scale); returns scale.
inline float kv_quantize_row(const float* x, int64_t n, uint8_t* codes) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
  const float scale = kv_row_scale(absmax);
  for (int64_t i = 0; i < n; ++i) codes[i] = kv_quantize(x[i], scale);
  return scale;
}

}  // namespace kiln::ops
