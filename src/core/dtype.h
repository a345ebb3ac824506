// Element types kiln stores and computes with, and scalar conversions to fp32.
// The scalar conversions are the reference: every kernel is checked against them.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kiln {

enum class DType : uint8_t {
  kF32,
  kF64,
  kF16,
  kBF16,
  kF8E4M3,  // OCP e4m3fn: no inf, 0x7f/0xff = NaN, max 448
  kF8E5M2,
  kE2M1,    // fp4, two per byte, low nibble = even element
  kE8M0,    // power-of-two scale: 2^(v - 127), 0xff = NaN
  kI4,      // signed 4-bit, two per byte
  kU8,
  kI8,
  kI16,
  kI32,
  kI64,
  kBool,
};

// Size in bits of one element (4 for the packed nibble types).
int dtype_bits(DType t);
std::string_view dtype_name(DType t);
bool dtype_is_float(DType t);

// bf16 / fp16 stored as raw bits.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

// Round to nearest even, NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// OCP FP8 e4m3fn (bias 7, no infinities, S.1111.111 = NaN).
float fp8_e4m3_to_f32(uint8_t v);
// f to e4m3fn, rounded to nearest even and saturating: |f| > 448 becomes +-448 (what
// CUDA's __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3) does); subnormals are
// multiples of 2^-9; the sign of zero is kept; NaN becomes 0x7f.
uint8_t f32_to_fp8_e4m3(float f);
// OCP FP8 e5m2 (bias 15, IEEE-like with inf/NaN).
float fp8_e5m2_to_f32(uint8_t v);
// e2m1 nibble (low 4 bits): values 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives.
float fp4_e2m1_to_f32(uint8_t nibble);
// e8m0 scale: 2^(v-127); 0xff is NaN.
float e8m0_to_f32(uint8_t v);

}  // namespace kiln
