#include "core/dtype.h"

#include <limits>

namespace kiln {

int dtype_bits(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: return 64;
    case DType::kF32: case DType::kI32: return 32;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 16;
    case DType::kF8E4M3: case DType::kF8E5M2: case DType::kE8M0: case DType::kU8:
    case DType::kI8: case DType::kBool: return 8;
    case DType::kE2M1: case DType::kI4: return 4;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
    case DType::kE2M1: return "e2m1";
    case DType::kE8M0: return "e8m0";
    case DType::kI4: return "i4";
    case DType::kU8: return "u8";
    case DType::kI8: return "i8";
    case DType::kI16: return "i16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kBool: return "bool";
  }
  return "?";
}

bool dtype_is_float(DType t) {
  switch (t) {
    case DType::kF32: case DType::kF64: case DType::kF16: case DType::kBF16:
    case DType::kF8E4M3: case DType::kF8E5M2: case DType::kE2M1: return true;
    default: return false;
  }
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    float f = std::ldexp(float(man), -24);
    return sign ? -f : f;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to inf
  if (a < 6.103515625e-05f) {                // subnormal range: quantum 2^-24
    const float q = std::nearbyint(a * 16777216.0f);  // round half even
    return sign | uint16_t(q);
  }
  // normal: round mantissa to 10 bits, ties to even
  uint32_t x = std::bit_cast<uint32_t>(a);
  x += 0xfffu + ((x >> 13) & 1u);
  const uint32_t exp = (x >> 23) - 112;
  return sign | uint16_t((exp << 10) | ((x >> 13) & 0x3ff));
}

float fp8_e4m3_to_f32(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  float f;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) f = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  else f = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return neg ? -f : f;
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate (e4m3fn has no infinity)
  if (a < 0.015625f) {                  // subnormal range (below 2^-6): quantum 2^-9
    return sign | uint8_t(std::nearbyint(a * 512.0f));  // round half even; 8 is 2^-6, the first normal
  }
  // normal: round the mantissa to 3 bits, ties to even (a carry moves the exponent up)
  uint32_t x = std::bit_cast<uint32_t>(a);
  x += 0x7ffffu + ((x >> 20) & 1u);
  const uint32_t exp = (x >> 23) - 120;  // rebias 127 -> 7
  return sign | uint8_t((exp << 3) | ((x >> 20) & 0x7u));
}

float fp8_e5m2_to_f32(uint8_t v) { return f16_to_f32(uint16_t(v) << 8); }

float fp4_e2m1_to_f32(uint8_t nibble) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[nibble & 0xf];
}

float e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(v) - 127);
}

}  // namespace kiln
