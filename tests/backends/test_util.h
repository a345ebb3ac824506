// Small helpers shared by the CPU backend tests (cpu_ops_test, cpu_attention_test,
// cpu_moe_test): random inputs, host tensors holding exactly-representable values,
// random weights with their logical (row-major [n_out, n_in]) values, and a
// relative closeness check against a double-precision reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"

namespace kiln::cpu {

inline std::vector<float> random_values(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// x rounded to the nearest value of dtype (exact for f32).
inline float round_to(DType dt, float x) {
  if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(x));
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(x));
  return x;
}

// A host tensor of dtype dt (f32, bf16 or f16) holding `v`. v is rounded to dt in
// place so a reference can use the exact stored values.
inline Tensor make_tensor(DType dt, Shape s, std::vector<float>& v) {
  Tensor t = host_tensor(dt, s);
  EXPECT_EQ(t.numel(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = round_to(dt, v[i]);
    if (dt == DType::kF32) t.as<float>()[i] = v[i];
    if (dt == DType::kBF16) t.as<uint16_t>()[i] = f32_to_bf16(v[i]);
    if (dt == DType::kF16) t.as<uint16_t>()[i] = f32_to_f16(v[i]);
  }
  return t;
}

// A random weight, logically W [n_out, n_in] (row-major in `logical`), stored in
// dt, as [n_in, n_out] when transposed.
struct TestWeight {
  ops::Weight w;
  std::vector<float> logical;  // [n_out, n_in], exact stored values
  std::vector<float> bias;     // [n_out] or empty
};

// Which layout the weight's random values are drawn in: row by row of the logical
// W [n_out, n_in], or in the order they are stored (differs only when transposed).
enum class WeightDrawOrder { kLogical, kStored };

// The weight's values are drawn first, then (with_bias) the bias's, stored in bias_dt.
inline TestWeight make_weight(std::mt19937& rng, DType dt, int64_t n_out, int64_t n_in, bool transposed,
                              bool with_bias, DType bias_dt = DType::kF32,
                              WeightDrawOrder order = WeightDrawOrder::kLogical) {
  TestWeight tw;
  const std::vector<float> drawn = random_values(rng, n_out * n_in);
  tw.logical.resize(drawn.size());
  std::vector<float> stored(drawn.size());
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t i = 0; i < n_in; ++i) {
      const int64_t logical_at = o * n_in + i, stored_at = transposed ? i * n_out + o : logical_at;
      const int64_t drawn_at = order == WeightDrawOrder::kStored ? stored_at : logical_at;
      tw.logical[logical_at] = round_to(dt, drawn[drawn_at]);
      stored[stored_at] = tw.logical[logical_at];
    }
  tw.w.data = transposed ? make_tensor(dt, {n_in, n_out}, stored) : make_tensor(dt, {n_out, n_in}, stored);
  tw.w.transposed = transposed;
  if (with_bias) {
    tw.bias = random_values(rng, n_out);
    tw.w.bias = make_tensor(bias_dt, {n_out}, tw.bias);
  }
  return tw;
}

// |got - ref| <= rel_tol * max|ref| for every element.
inline void expect_close(const float* got, const std::vector<double>& ref, double rel_tol) {
  double max_ref = 0.0;
  for (double r : ref) max_ref = std::max(max_ref, std::abs(r));
  ASSERT_GT(max_ref, 1e-3) << "degenerate reference";
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(got[i], ref[i], rel_tol * max_ref) << "element " << i;
}

}  // namespace kiln::cpu
