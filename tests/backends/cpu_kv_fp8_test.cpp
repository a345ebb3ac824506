// The FP8 KV cache on the CPU reference (ops/kv_quant.h): the row quantization against
// hand-computed e4m3 values (rounding ties to even, saturation, signed zero, subnormal
// codes, all-zero rows), kv_store / mla_store writing exactly those codes and scales,
// attention and MLA reading them as code * scale, and the answer against the same
// problem over an unquantized cache within a bound derived from e4m3's precision.
//
// The bound. A row with scale s stores x as v with |v - x| <= dk(x) = max(2^-4 |x|,
// 2^-10 s) (3 mantissa bits: half a step is 2^-4 of the value; below 2^-6 s the codes
// are subnormal, quantum 2^-9 s). A score s_j = scale * q . k_j then moves by at most
// E_j = scale * sum_d |q_d| dk(k_jd); the softmax weights by at most |p' - p|_1 <=
// exp(2 max_j E_j) - 1; and out = sum_j p_j v_j by at most
//   max_j dv(v_j) + (exp(2 max_j E_j) - 1) * max_j |v_j|   (per output dimension).
// (MLA: the same over the latent and rope parts, then through W_uv.) This is a worst
// case (every rounding error aligned); the measured errors are far inside it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "attention_fixture.h"
#include "backends/cpu/cpu_backend.h"
#include "ops/kv_quant.h"

namespace kiln::cpu {
namespace {

// The rounding error bound of one stored value x in a row of scale s.
double value_bound(double x, double s) { return std::max(std::ldexp(std::abs(x), -4), std::ldexp(s, -10)); }

TEST(KvQuant, RowQuantizationMatchesHandComputedE4m3) {
  // absmax 896: scale 2, so each x is stored as e4m3(x / 2).
  const std::vector<float> x = {
      896.0f,              // 448 -> 0x7e, the largest code
      -448.0f,             // -224 = -1.75 * 2^7 -> 0xf6
      1.0f,                // 0.5 -> 0x30
      2.125f,              // 1.0625: halfway between 1 and 1.125, ties to even -> 1 (0x38): 2
      2.375f,              // 1.1875: halfway between 1.125 and 1.25, ties to even -> 1.25 (0x3a): 2.5
      -0.0f,               // signed zero -> 0x80
      0.0078125f,          // 2^-7 -> 2^-8 = 2 * 2^-9: subnormal code 0x02, exact
      0.0009765625f,       // 2^-10 -> 2^-11: a quarter of the subnormal quantum -> 0
      -0.005859375f,       // -3 * 2^-9 -> -1.5 * 2^-9: halfway, ties to even -> -2 * 2^-9 (0x82)
      0.029296875f,        // 15 * 2^-9 -> 7.5 * 2^-9: halfway between 0x07 and 0x08 -> 0x08 (2^-6)
  };
  const std::vector<uint8_t> want = {0x7e, 0xf6, 0x30, 0x38, 0x3a, 0x80, 0x02, 0x00, 0x82, 0x08};
  const std::vector<float> value = {896.0f, -448.0f, 1.0f, 2.0f, 2.5f, -0.0f, 0.0078125f, 0.0f,
                                    -0.0078125f, 0.03125f};
  std::vector<uint8_t> codes(x.size());
  const float scale = ops::kv_quantize_row(x.data(), int64_t(x.size()), codes.data());
  EXPECT_EQ(scale, 2.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(int(codes[i]), int(want[i])) << "x = " << x[i];
    EXPECT_EQ(ops::kv_dequantize(codes[i], scale), value[i]) << "x = " << x[i];
  }
  EXPECT_TRUE(std::signbit(ops::kv_dequantize(codes[5], scale)));  // -0 stays -0
}

TEST(KvQuant, SaturatesAtTheLargestCodeAndRoundsScaleToNearest) {
  // The scale is absmax / 448 rounded to fp32, so absmax / scale may land just above 448:
  // the conversion saturates there instead of making the NaN code 0x7f.
  for (float absmax : {1.0f, 3.0f, 0.1f, 1000.0f, 7.0e-3f}) {
    const std::vector<float> x = {absmax, -absmax, absmax / 3.0f};
    std::vector<uint8_t> codes(x.size());
    const float scale = ops::kv_quantize_row(x.data(), 3, codes.data());
    EXPECT_EQ(scale, absmax / 448.0f);
    EXPECT_EQ(int(codes[0]), 0x7e) << absmax;
    EXPECT_EQ(int(codes[1]), 0xfe) << absmax;
  }
  // Outside a row's own scale (a caller's fixed scale), values saturate at +-448.
  EXPECT_EQ(int(ops::kv_quantize(1.0e6f, 1.0f)), 0x7e);
  EXPECT_EQ(int(ops::kv_quantize(-500.0f, 1.0f)), 0xfe);
  EXPECT_EQ(int(ops::kv_quantize(464.0f, 1.0f)), 0x7e);  // would round to 480, which e4m3fn lacks
}

TEST(KvQuant, AllZeroRowHasScaleZeroAndZeroCodes) {
  const std::vector<float> x = {0.0f, -0.0f, 0.0f};
  std::vector<uint8_t> codes(3, 0xaa);
  EXPECT_EQ(ops::kv_quantize_row(x.data(), 3, codes.data()), 0.0f);
  for (uint8_t c : codes) EXPECT_EQ(int(c), 0);
}

TEST(KvQuant, EveryValueWithinE4m3PrecisionOfItsRow) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-12.0f, 12.0f);
  for (int trial = 0; trial < 200; ++trial) {
    // Values spread over 2^-12 .. 2^12 of each other, so some codes are subnormal.
    std::vector<float> x(64);
    for (float& v : x) v = std::ldexp(1.0f, int(mag(rng))) * (rng() % 2 ? 1.0f : -1.0f) * float(1 + rng() % 1000) / 1000.0f;
    std::vector<uint8_t> codes(x.size());
    const float scale = ops::kv_quantize_row(x.data(), int64_t(x.size()), codes.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const double err = std::abs(double(ops::kv_dequantize(codes[i], scale)) - double(x[i]));
      ASSERT_LE(err, value_bound(x[i], scale) * (1.0 + 0x1p-20)) << "x " << x[i] << " scale " << scale;
    }
  }
}

// ---- the cache ops ------------------------------------------------------------------

TEST(CpuKvStoreFp8, WritesEachHeadRowsCodesAndScaleAtItsSlot) {
  std::mt19937 rng(40);
  auto be = make_cpu_backend(2);
  std::mt19937 same(40);
  AttentionFixture ref(*be, same, kMixedStep);  // the unquantized values
  AttentionFixture f(*be, rng, kMixedStep, DType::kF8E4M3);
  const int64_t d = f.d_head, n_kv = f.n_kv_heads;
  std::vector<char> written(kNumBlocks * kBlockSize, 0);
  std::vector<uint8_t> want(size_t(d), 0);
  for (int32_t s = 0; s < int32_t(f.seqs.size()); ++s)
    for (int32_t j = 0; j < f.seqs[s].context_len; ++j)
      for (int64_t h = 0; h < n_kv; ++h) {
        const int64_t slot = f.fill.slot(s, j), at = (j * n_kv + h) * d;
        written[slot] = 1;
        for (const auto& [cache, scale, values] : {std::tuple{f.k_cache, f.k_scale, &ref.k[s]},
                                                   std::tuple{f.v_cache, f.v_scale, &ref.v[s]}}) {
          const float want_scale = ops::kv_quantize_row(values->data() + at, d, want.data());
          ASSERT_EQ(scale.as<float>()[slot * n_kv + h], want_scale) << "seq " << s << " pos " << j;
          ASSERT_EQ(std::memcmp(cache.as<uint8_t>() + (slot * n_kv + h) * d, want.data(), size_t(d)), 0)
              << "seq " << s << " pos " << j << " head " << h;
        }
      }
  for (int64_t slot = 0; slot < kNumBlocks * kBlockSize; ++slot)
    if (!written[slot]) {
      for (int64_t i = 0; i < n_kv * d; ++i) ASSERT_EQ(int(f.k_cache.as<uint8_t>()[slot * n_kv * d + i]), 0) << slot;
      ASSERT_EQ(f.k_scale.as<float>()[slot * n_kv], 0.0f) << slot;
    }
}

TEST(CpuAttentionFp8, ReadsTheCacheAsCodeTimesScale) {
  // The fixture's K / V are the dequantized cache contents: attention over the e4m3
  // cache must equal plain attention over those values.
  std::mt19937 rng(41);
  auto be = make_cpu_backend(3);
  AttentionFixture f(*be, rng, kMixedStep, DType::kF8E4M3);
  std::vector<float> sinks = {1.5f, -0.75f, 0.25f, 3.0f};
  Tensor sinks_t = make_tensor(DType::kF32, {4}, sinks);
  for (int32_t window : {0, 3}) {
    SCOPED_TRACE(window);
    Tensor out = f.run(*be, 0.35f, window, Tensor{});
    expect_close(out.as<float>(), f.reference(0.35f, window, {}), 1e-5);
    Tensor out_s = f.run(*be, 0.35f, window, sinks_t);
    expect_close(out_s.as<float>(), f.reference(0.35f, window, sinks), 1e-5);
  }
}

// The derived bound of the header, per output element of a GQA problem.
std::vector<double> gqa_bound(const AttentionFixture& ref, double scale, int32_t window) {
  const int64_t nh = ref.n_heads, nkv = ref.n_kv_heads, d = ref.d_head, group = nh / nkv;
  std::vector<double> bound(ref.q.size(), 0.0);
  for (int32_t s = 0; s < int32_t(ref.seqs.size()); ++s)
    for (int32_t t = ref.step.q_start[s]; t < ref.step.q_start[s + 1]; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const int32_t p = ref.step.positions[t], lo = window > 0 ? std::max(0, p - window + 1) : 0;
        const int64_t kvh = h / group;
        double e_max = 0.0;
        std::vector<double> dv_max(size_t(d), 0.0), v_max(size_t(d), 0.0);
        for (int32_t j = lo; j <= p; ++j) {
          const float* k = ref.k[s].data() + (j * nkv + kvh) * d;
          const float* v = ref.v[s].data() + (j * nkv + kvh) * d;
          double k_abs = 0.0, v_abs = 0.0;
          for (int64_t i = 0; i < d; ++i) k_abs = std::max(k_abs, double(std::abs(k[i]))), v_abs = std::max(v_abs, double(std::abs(v[i])));
          double e = 0.0;
          for (int64_t i = 0; i < d; ++i)
            e += std::abs(double(ref.q[(t * nh + h) * d + i])) * value_bound(k[i], k_abs / 448.0);
          e_max = std::max(e_max, scale * e);
          for (int64_t i = 0; i < d; ++i) {
            dv_max[size_t(i)] = std::max(dv_max[size_t(i)], value_bound(v[i], v_abs / 448.0));
            v_max[size_t(i)] = std::max(v_max[size_t(i)], double(std::abs(v[i])));
          }
        }
        for (int64_t i = 0; i < d; ++i)
          bound[size_t((t * nh + h) * d + i)] = dv_max[size_t(i)] + std::expm1(2.0 * e_max) * v_max[size_t(i)];
      }
  return bound;
}

// Every |got - ref| within its bound; the errors are not all zero (the cache quantized).
void expect_within(const float* got, const float* ref, const std::vector<double>& bound) {
  double worst = 0.0, max_err = 0.0;
  for (size_t i = 0; i < bound.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(ref[i]));
    ASSERT_LE(err, bound[i]) << "element " << i;
    worst = std::max(worst, err / bound[i]);
    max_err = std::max(max_err, err);
  }
  EXPECT_GT(max_err, 0.0) << "the fp8 cache changed nothing: was it quantized?";
  ::testing::Test::RecordProperty("worst_error_over_bound", std::to_string(worst));
}

TEST(CpuAttentionFp8, WithinE4m3PrecisionOfTheUnquantizedCache) {
  auto be = make_cpu_backend(3);
  std::vector<float> sinks = {0.5f, -0.5f, 1.0f, 0.0f};
  Tensor sinks_t = make_tensor(DType::kF32, {4}, sinks);
  for (int32_t window : {0, 4}) {
    SCOPED_TRACE(window);
    std::mt19937 rng_a(42), rng_b(42);
    AttentionFixture ref(*be, rng_a, kMixedStep);
    AttentionFixture f(*be, rng_b, kMixedStep, DType::kF8E4M3);
    const std::vector<double> bound = gqa_bound(ref, 0.35, window);
    Tensor want = ref.run(*be, 0.35f, window, sinks_t), got = f.run(*be, 0.35f, window, sinks_t);
    expect_within(got.as<float>(), want.as<float>(), bound);
  }
}

TEST(CpuAttentionFp8, OneAndFourThreadsGiveBitIdenticalResults) {
  std::mt19937 rng(43);
  auto be1 = make_cpu_backend(1);
  auto be4 = make_cpu_backend(4);
  AttentionFixture f(*be1, rng, kMixedStep, DType::kF8E4M3);
  Tensor out1 = f.run(*be1, 0.35f, 5, Tensor{});
  Tensor out4 = f.run(*be4, 0.35f, 5, Tensor{});
  EXPECT_EQ(std::memcmp(out1.data, out4.data, out1.nbytes()), 0);
}

// ---- MLA --------------------------------------------------------------------------------

TEST(CpuMlaFp8, StoreQuantizesLatentAndRopeAsTwoRows) {
  std::mt19937 rng_a(50), rng_b(50);
  auto be = make_cpu_backend(2);
  MlaFixture ref(*be, rng_a);
  MlaFixture f(*be, rng_b, DType::kF8E4M3);
  const int64_t row = f.d_latent + f.d_rope;
  std::vector<uint8_t> lat(size_t(f.d_latent)), rope(size_t(f.d_rope));
  for (int32_t s = 0; s < int32_t(f.seqs.size()); ++s)
    for (int32_t j = 0; j < f.seqs[s].context_len; ++j) {
      const int64_t slot = f.fill.slot(s, j);
      const float s_lat = ops::kv_quantize_row(ref.lat[s].data() + j * f.d_latent, f.d_latent, lat.data());
      const float s_rope = ops::kv_quantize_row(ref.rope[s].data() + j * f.d_rope, f.d_rope, rope.data());
      ASSERT_EQ(f.latent_scale.as<float>()[slot * 2], s_lat);
      ASSERT_EQ(f.latent_scale.as<float>()[slot * 2 + 1], s_rope);
      const uint8_t* codes = f.cache.as<uint8_t>() + slot * row;
      ASSERT_EQ(std::memcmp(codes, lat.data(), lat.size()), 0) << "seq " << s << " pos " << j;
      ASSERT_EQ(std::memcmp(codes + f.d_latent, rope.data(), rope.size()), 0) << "seq " << s << " pos " << j;
    }
}

TEST(CpuMlaFp8, ReadsTheCacheAsCodeTimesScale) {
  std::mt19937 rng(51);
  auto be = make_cpu_backend(3);
  MlaFixture f(*be, rng, DType::kF8E4M3);
  Tensor out = f.run(*be, 0.3f);
  expect_close(out.as<float>(), f.reference(0.3f), 1e-5);
}

TEST(CpuMlaFp8, WithinE4m3PrecisionOfTheUnquantizedCache) {
  std::mt19937 rng_a(52), rng_b(52);
  auto be = make_cpu_backend(3);
  MlaFixture ref(*be, rng_a);
  MlaFixture f(*be, rng_b, DType::kF8E4M3);
  const double scale = 0.3;
  const int64_t nh = ref.n_heads, dn = ref.d_nope, dr = ref.d_rope, dl = ref.d_latent, dv = ref.d_v;
  const auto w = [&](int64_t r, int64_t c) { return double(ref.kv_b_values[r * dl + c]); };
  std::vector<double> bound(size_t(ref.step.n_tokens() * nh * dv), 0.0);
  for (int32_t s = 0; s < int32_t(ref.seqs.size()); ++s)
    for (int32_t t = ref.step.q_start[s]; t < ref.step.q_start[s + 1]; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        std::vector<double> q_lat(size_t(dl), 0.0);  // W_uk[h]^T q_nope
        for (int64_t d = 0; d < dn; ++d)
          for (int64_t c = 0; c < dl; ++c) q_lat[size_t(c)] += ref.q_nope[(t * nh + h) * dn + d] * w(h * (dn + dv) + d, c);
        double e_max = 0.0;
        std::vector<double> dc_max(size_t(dl), 0.0), c_max(size_t(dl), 0.0);
        for (int32_t j = 0; j <= ref.step.positions[t]; ++j) {
          const float* c = ref.lat[s].data() + j * dl;
          const float* r = ref.rope[s].data() + j * dr;
          double c_abs = 0.0, r_abs = 0.0;
          for (int64_t i = 0; i < dl; ++i) c_abs = std::max(c_abs, double(std::abs(c[i])));
          for (int64_t i = 0; i < dr; ++i) r_abs = std::max(r_abs, double(std::abs(r[i])));
          double e = 0.0;
          for (int64_t i = 0; i < dl; ++i) e += std::abs(q_lat[size_t(i)]) * value_bound(c[i], c_abs / 448.0);
          for (int64_t i = 0; i < dr; ++i)
            e += std::abs(double(ref.q_rope[(t * nh + h) * dr + i])) * value_bound(r[i], r_abs / 448.0);
          e_max = std::max(e_max, scale * e);
          for (int64_t i = 0; i < dl; ++i) {
            dc_max[size_t(i)] = std::max(dc_max[size_t(i)], value_bound(c[i], c_abs / 448.0));
            c_max[size_t(i)] = std::max(c_max[size_t(i)], double(std::abs(c[i])));
          }
        }
        for (int64_t e = 0; e < dv; ++e) {
          double b = 0.0;  // out = W_uv o_lat: the latent bound through |W_uv|
          for (int64_t c = 0; c < dl; ++c)
            b += std::abs(w(h * (dn + dv) + dn + e, c)) * (dc_max[size_t(c)] + std::expm1(2.0 * e_max) * c_max[size_t(c)]);
          bound[size_t((t * nh + h) * dv + e)] = b;
        }
      }
  Tensor want = ref.run(*be, float(scale)), got = f.run(*be, float(scale));
  expect_within(got.as<float>(), want.as<float>(), bound);
}

}  // namespace
}  // namespace kiln::cpu
