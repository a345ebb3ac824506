#include "core/dtype.h"

#include <cmath>

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(DType, Bf16RoundTripsAndRoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even -> 1+2^-6.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16ConvertsNormalsSubnormalsAndInfinity) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(f)), f) << f;
  }
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
}

TEST(DType, Fp8E4m3EdgeValues) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);   // largest finite
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
}

TEST(DType, F32ToFp8E4m3RoundsToNearestEvenAndSaturates) {
  for (int c = 0; c < 256; ++c) {  // every finite code round-trips, -0 (0x80) included
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(int(f32_to_fp8_e4m3(fp8_e4m3_to_f32(uint8_t(c)))), c);
  }
  EXPECT_EQ(f32_to_fp8_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), 0x38);    // halfway 1 / 1.125: to the even mantissa
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), 0x3a);    // halfway 1.125 / 1.25: to the even mantissa
  EXPECT_EQ(f32_to_fp8_e4m3(-1.07f), 0xb9);     // nearer 1.125
  EXPECT_EQ(f32_to_fp8_e4m3(240.0f), 0x77);     // 1.875 * 2^7
  EXPECT_EQ(f32_to_fp8_e4m3(15.5f), 0x58);      // halfway 15 / 16: 16 (the exponent carries)
  EXPECT_EQ(f32_to_fp8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(463.0f), 0x7e);     // saturating: never the NaN code 0x7f
  EXPECT_EQ(f32_to_fp8_e4m3(1.0e9f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -9)), 0x01);          // smallest subnormal
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);         // half of it: ties to even (0)
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.5f, -9)), 0x02);          // 1.5 quanta: ties to even (2)
  EXPECT_EQ(f32_to_fp8_e4m3(-std::ldexp(1.2f, -10)), 0x81);        // above half a quantum
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(7.5f, -9)), 0x08);          // halfway 7 / 8 quanta: the first normal
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0625f, -6)), 0x08);       // halfway in the first binade: even
  EXPECT_EQ(f32_to_fp8_e4m3(NAN), 0x7f);
}

TEST(DType, Fp4AndE8m0EdgeValues) {
  EXPECT_EQ(fp4_e2m1_to_f32(0x7), 6.0f);
  EXPECT_EQ(fp4_e2m1_to_f32(0xf), -6.0f);
  EXPECT_TRUE(std::signbit(fp4_e2m1_to_f32(0x8)));
  EXPECT_EQ(fp4_e2m1_to_f32(0x8), 0.0f);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

}  // namespace
}  // namespace kiln
