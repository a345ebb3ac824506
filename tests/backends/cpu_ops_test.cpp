// CPU reference backend: memory ops, embedding, rms_norm, linear, rope, glu, add.
// Expectations come from naive double-precision loops written here, never from
// the backend itself.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/quant_random.h"
#include "formats/quant.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

// ---- memory -----------------------------------------------------------------

TEST(CpuBackend, UploadIsZeroCopyAndHostCopiesConvert) {
  auto be = make_cpu_backend(1);
  EXPECT_EQ(be->activation_dtype(), DType::kF32);
  std::vector<float> v = {1.5f, -2.25f, 3.0f, 0.125f};
  Tensor w = make_tensor(DType::kBF16, {2, 2}, v);
  Tensor up = be->upload(w);
  EXPECT_EQ(up.data, w.data);
  EXPECT_EQ(up.dtype, DType::kBF16);
  float host[4];
  be->to_host_f32(up, host);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(host[i], v[i]);

  Tensor act = be->alloc(DType::kF32, {4});
  be->from_host_f32(v.data(), act);
  float back[4];
  be->to_host_f32(act, back);
  EXPECT_EQ(std::memcmp(back, v.data(), sizeof(back)), 0);
}

TEST(CpuBackend, EmbeddingGathersRowsOfABf16Table) {
  std::mt19937 rng(1);
  auto be = make_cpu_backend(2);
  const int64_t vocab = 10, d_model = 6;
  std::vector<float> table = random_values(rng, vocab * d_model);
  Tensor table_t = make_tensor(DType::kBF16, {vocab, d_model}, table);
  Tensor ids = host_tensor(DType::kI32, {4});
  const int32_t id_values[4] = {7, 0, 7, 9};
  std::memcpy(ids.data, id_values, sizeof(id_values));
  Tensor out = be->alloc(DType::kF32, {4, d_model});
  be->embedding({.table = table_t, .ids = ids, .out = out});
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < d_model; ++i)
      EXPECT_EQ(out.as<float>()[t * d_model + i], table[id_values[t] * d_model + i]);
}

// ---- linear -----------------------------------------------------------------

std::vector<double> linear_reference(const std::vector<float>& x, const TestWeight& tw,
                                     int64_t n_tokens, int64_t n_in, int64_t n_out) {
  std::vector<double> y(n_tokens * n_out);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t o = 0; o < n_out; ++o) {
      double acc = tw.bias.empty() ? 0.0 : tw.bias[o];
      for (int64_t i = 0; i < n_in; ++i) acc += double(x[t * n_in + i]) * tw.logical[o * n_in + i];
      y[t * n_out + o] = acc;
    }
  return y;
}

struct LinearCase {
  DType w_dtype;
  bool transposed;
  bool with_bias;
  DType bias_dtype;
};

TEST(CpuLinear, MatchesNaiveDoubleForEveryStoredDtypeAndLayout) {
  const LinearCase cases[] = {
      {DType::kF32, false, false, DType::kF32}, {DType::kBF16, false, false, DType::kF32},
      {DType::kF16, false, false, DType::kF32}, {DType::kBF16, true, false, DType::kF32},
      {DType::kF32, false, true, DType::kF32},  {DType::kBF16, false, true, DType::kBF16},
      {DType::kF16, true, true, DType::kF16},
  };
  std::mt19937 rng(2);
  auto be = make_cpu_backend(3);
  const int64_t n_tokens = 5, n_in = 96, n_out = 37;
  for (const LinearCase& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.w_dtype)) + (c.transposed ? " transposed" : "") +
                 (c.with_bias ? " bias " + std::string(dtype_name(c.bias_dtype)) : ""));
    TestWeight tw = make_weight(rng, c.w_dtype, n_out, n_in, c.transposed, c.with_bias, c.bias_dtype);
    std::vector<float> x = random_values(rng, n_tokens * n_in);
    Tensor x_t = make_tensor(DType::kF32, {n_tokens, n_in}, x);
    Tensor out = be->alloc(DType::kF32, {n_tokens, n_out});
    be->linear({.x = x_t, .w = &tw.w, .out = out});
    expect_close(out.as<float>(), linear_reference(x, tw, n_tokens, n_in, n_out), 1e-5);
  }
}

TEST(CpuLinear, ReadsAndWritesSlicesOfLargerTensors) {
  std::mt19937 rng(3);
  auto be = make_cpu_backend(2);
  const int64_t n_in = 24, n_out = 10;
  TestWeight tw = make_weight(rng, DType::kBF16, n_out, n_in, false, false);
  std::vector<float> x = random_values(rng, 6 * n_in);
  Tensor x_all = make_tensor(DType::kF32, {6, n_in}, x);
  Tensor out_all = be->alloc(DType::kF32, {6, n_out});
  be->linear({.x = x_all.slice0(2, 5), .w = &tw.w, .out = out_all.slice0(1, 4)});
  const std::vector<double> ref = linear_reference(x, tw, 6, n_in, n_out);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t o = 0; o < n_out; ++o)
      EXPECT_NEAR(out_all.as<float>()[(1 + t) * n_out + o], ref[(2 + t) * n_out + o], 1e-5);
  for (int64_t o = 0; o < n_out; ++o) {
    EXPECT_EQ(out_all.as<float>()[o], 0.0f);                  // row 0 untouched
    EXPECT_EQ(out_all.as<float>()[4 * n_out + o], 0.0f);      // row 4 untouched
  }
}

TEST(CpuLinear, OneAndFourThreadsGiveBitIdenticalResults) {
  std::mt19937 rng(4);
  auto be1 = make_cpu_backend(1);
  auto be4 = make_cpu_backend(4);
  const int64_t n_tokens = 7, n_in = 130, n_out = 203;
  for (bool transposed : {false, true}) {
    TestWeight tw = make_weight(rng, DType::kBF16, n_out, n_in, transposed, true, DType::kF32);
    std::vector<float> x = random_values(rng, n_tokens * n_in);
    Tensor x_t = make_tensor(DType::kF32, {n_tokens, n_in}, x);
    Tensor out1 = be1->alloc(DType::kF32, {n_tokens, n_out});
    Tensor out4 = be4->alloc(DType::kF32, {n_tokens, n_out});
    be1->linear({.x = x_t, .w = &tw.w, .out = out1});
    be4->linear({.x = x_t, .w = &tw.w, .out = out4});
    EXPECT_EQ(std::memcmp(out1.data, out4.data, out1.nbytes()), 0) << "transposed " << transposed;
  }
}

// CpuOptions::fp8_activations (the W8A8 reference): an FP8 weight with a scale per 128
// inputs multiplies x quantized per 128-input block (formats::fake_quantize_fp8_act),
// exactly; other quantized weights, and FP8 with 64-input blocks, read x as it is.
TEST(CpuLinear, Fp8ActivationsQuantizeTheInputsOfW8a8WeightsOnly) {
  std::mt19937 rng(11);
  auto plain = make_cpu_backend(1);
  auto fp8 = make_cpu_backend({.n_threads = 1, .fp8_activations = true});
  const int64_t n_tokens = 3, n_in = 296, n_out = 40;
  std::vector<float> x = random_values(rng, n_tokens * n_in), xq(x.size());
  for (int64_t t = 0; t < n_tokens; ++t) formats::fake_quantize_fp8_act(&x[t * n_in], n_in, &xq[t * n_in]);
  ASSERT_NE(x, xq);
  const Tensor x_t = make_tensor(DType::kF32, {n_tokens, n_in}, x), xq_t = make_tensor(DType::kF32, {n_tokens, n_in}, xq);
  using formats::QuantKind;
  for (const cuda::QuantCase& c : {cuda::QuantCase{QuantKind::kFp8Block, 128, 128, DType::kF32},
                                   cuda::QuantCase{QuantKind::kFp8Channel, 0, 0, DType::kF32},
                                   cuda::QuantCase{QuantKind::kFp8Block, 64, 64, DType::kF32},
                                   cuda::QuantCase{QuantKind::kMxfp4}}) {
    SCOPED_TRACE(c.name());
    ops::Weight w;
    w.quant = cuda::random_quantized(c, n_out, c.kind == QuantKind::kMxfp4 ? 288 : n_in, rng);
    const int64_t k = w.n_in();
    std::vector<float> xs_v(x.begin(), x.begin() + n_tokens * k);  // MXFP4: 288 inputs (a multiple of 32)
    const Tensor xs = make_tensor(DType::kF32, {n_tokens, k}, xs_v);
    Tensor got = fp8->alloc(DType::kF32, {n_tokens, n_out}), want = plain->alloc(DType::kF32, {n_tokens, n_out});
    const bool w8a8 = formats::fp8_w8a8_eligible(w.quant);
    EXPECT_EQ(w8a8, c.kind != QuantKind::kMxfp4 && c.group != 64);
    fp8->linear({.x = k == n_in ? x_t : xs, .w = &w, .out = got});
    plain->linear({.x = w8a8 ? xq_t : (k == n_in ? x_t : xs), .w = &w, .out = want});
    EXPECT_EQ(std::memcmp(got.data, want.data, got.nbytes()), 0);
  }
}

TEST(CpuLinearDeathTest, QuantizedWeightDtypeFailsNamingTheDtype) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = make_cpu_backend(1);
  ops::Weight w;
  w.data = host_tensor(DType::kF8E4M3, {4, 8});
  Tensor x = host_tensor(DType::kF32, {1, 8});
  Tensor out = host_tensor(DType::kF32, {1, 4});
  EXPECT_DEATH(be->linear({.x = x, .w = &w, .out = out}), "f8e4m3");
}

TEST(CpuLinearDeathTest, ShapeMismatchPrintsBothValues) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = make_cpu_backend(1);
  ops::Weight w;
  w.data = host_tensor(DType::kF32, {4, 8});
  Tensor x = host_tensor(DType::kF32, {1, 9});
  Tensor out = host_tensor(DType::kF32, {1, 4});
  EXPECT_DEATH(be->linear({.x = x, .w = &w, .out = out}), "9 vs 8");
}

// ---- rms_norm ---------------------------------------------------------------

// HF semantics: v / sqrt(mean(v^2) + eps) * weight, row by row.
std::vector<double> rms_norm_reference(const std::vector<double>& v, const std::vector<float>& w,
                                       int64_t rows, int64_t dim, double eps) {
  std::vector<double> y(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += v[r * dim + i] * v[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = v[r * dim + i] * inv * w[i];
  }
  return y;
}

TEST(CpuRmsNorm, NormalisesRowsWithABf16Weight) {
  std::mt19937 rng(5);
  auto be = make_cpu_backend(2);
  const int64_t rows = 6, dim = 64;
  const float eps = 1e-5f;
  std::vector<float> x = random_values(rng, rows * dim), w = random_values(rng, dim);
  Tensor x_t = make_tensor(DType::kF32, {rows, dim}, x);
  Tensor w_t = make_tensor(DType::kBF16, {dim}, w);
  Tensor out = be->alloc(DType::kF32, {rows, dim});
  be->rms_norm({.x = x_t, .weight = w_t, .residual = {}, .out = out, .eps = eps});
  const std::vector<double> xd(x.begin(), x.end());
  expect_close(out.as<float>(), rms_norm_reference(xd, w, rows, dim, eps), 1e-6);
}

TEST(CpuRmsNorm, AddsIntoTheResidualThenNormalisesIt) {
  std::mt19937 rng(6);
  auto be = make_cpu_backend(2);
  const int64_t rows = 5, dim = 48;
  std::vector<float> x = random_values(rng, rows * dim), res = random_values(rng, rows * dim);
  std::vector<float> w = random_values(rng, dim);
  Tensor x_t = make_tensor(DType::kF32, {rows, dim}, x);
  Tensor res_t = make_tensor(DType::kF32, {rows, dim}, res);
  Tensor w_t = make_tensor(DType::kF32, {dim}, w);
  Tensor out = be->alloc(DType::kF32, {rows, dim});
  be->rms_norm({.x = x_t, .weight = w_t, .residual = res_t, .out = out, .eps = 1e-6f});
  std::vector<double> sum(rows * dim);
  for (int64_t i = 0; i < rows * dim; ++i) {
    sum[i] = double(x[i]) + res[i];
    EXPECT_EQ(res_t.as<float>()[i], x[i] + res[i]) << "residual updated in place, element " << i;
    EXPECT_EQ(x_t.as<float>()[i], x[i]) << "x unchanged, element " << i;
  }
  expect_close(out.as<float>(), rms_norm_reference(sum, w, rows, dim, 1e-6), 1e-6);
}

TEST(CpuRmsNorm, OutMayAliasX) {
  std::mt19937 rng(7);
  auto be = make_cpu_backend(2);
  const int64_t rows = 3, dim = 32;
  std::vector<float> w = random_values(rng, dim);
  Tensor w_t = make_tensor(DType::kF16, {dim}, w);
  for (bool with_residual : {false, true}) {
    std::vector<float> x = random_values(rng, rows * dim), res = random_values(rng, rows * dim);
    Tensor x_t = make_tensor(DType::kF32, {rows, dim}, x);
    Tensor res_t = make_tensor(DType::kF32, {rows, dim}, res);
    std::vector<double> v(rows * dim);
    for (int64_t i = 0; i < rows * dim; ++i) v[i] = with_residual ? double(x[i]) + res[i] : x[i];
    ops::RmsNormArgs args{.x = x_t, .weight = w_t, .residual = {}, .out = x_t};
    if (with_residual) args.residual = res_t;
    be->rms_norm(args);
    SCOPED_TRACE(with_residual ? "with residual" : "without residual");
    expect_close(x_t.as<float>(), rms_norm_reference(v, w, rows, dim, 1e-6), 1e-6);
  }
}

// ---- rope -------------------------------------------------------------------

ops::RopeTable make_table(int d_rot, double theta, float attention_factor, ops::RopeStyle style) {
  ops::RopeTable tab{.d_rot = d_rot, .inv_freq = {}, .attention_factor = attention_factor, .style = style};
  for (int i = 0; i < d_rot / 2; ++i) tab.inv_freq.push_back(float(std::pow(theta, -2.0 * i / d_rot)));
  return tab;
}

// Rotates pairs of the first d_rot dims: angle = float(pos) * inv_freq[i] in fp32
// (as the contract says), then cos / sin in double, times attention_factor.
std::vector<double> rope_reference(const std::vector<float>& x, const std::vector<int32_t>& pos,
                                   int64_t n_heads, int64_t d_head, const ops::RopeTable& tab) {
  std::vector<double> y(x.begin(), x.end());
  const int half = tab.d_rot / 2;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int64_t h = 0; h < n_heads; ++h)
      for (int i = 0; i < half; ++i) {
        const float angle = float(pos[t]) * tab.inv_freq[i];
        const double c = std::cos(double(angle)) * tab.attention_factor;
        const double s = std::sin(double(angle)) * tab.attention_factor;
        const bool halves = tab.style == ops::RopeStyle::kHalf;
        const int64_t base = (int64_t(t) * n_heads + h) * d_head;
        const int64_t i1 = base + (halves ? i : 2 * i), i2 = base + (halves ? i + half : 2 * i + 1);
        y[i1] = double(x[i1]) * c - double(x[i2]) * s;
        y[i2] = double(x[i2]) * c + double(x[i1]) * s;
      }
  return y;
}

TEST(CpuRope, HalfInterleavedAndPartialRotationMatchNaive) {
  struct Case {
    int d_rot;
    float attention_factor;
    ops::RopeStyle style;
    const char* name;
  };
  const Case cases[] = {
      {16, 1.0f, ops::RopeStyle::kHalf, "half, full rotation"},
      {16, 1.0f, ops::RopeStyle::kInterleaved, "interleaved, full rotation"},
      {8, 1.25f, ops::RopeStyle::kHalf, "half, partial rotation, attention_factor"},
      {6, 0.8f, ops::RopeStyle::kInterleaved, "interleaved, partial rotation, attention_factor"},
  };
  std::mt19937 rng(8);
  auto be = make_cpu_backend(2);
  const int64_t n_heads = 3, d_head = 16;
  const std::vector<int32_t> pos = {0, 1, 7, 100, 4095};
  const int64_t n_tokens = int64_t(pos.size());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ops::RopeTable tab = make_table(c.d_rot, 10000.0, c.attention_factor, c.style);
    std::vector<float> x = random_values(rng, n_tokens * n_heads * d_head);
    Tensor x_t = make_tensor(DType::kF32, {n_tokens, n_heads, d_head}, x);
    ops::BatchMeta batch;
    batch.positions = pos;
    be->rope({.x = x_t, .batch = &batch, .table = &tab});
    const std::vector<double> ref = rope_reference(x, pos, n_heads, d_head, tab);
    expect_close(x_t.as<float>(), ref, 1e-6);
    for (int64_t r = 0; r < n_tokens * n_heads; ++r)  // dims >= d_rot untouched, bit for bit
      for (int64_t d = c.d_rot; d < d_head; ++d)
        ASSERT_EQ(x_t.as<float>()[r * d_head + d], x[r * d_head + d]);
  }
}

TEST(CpuRope, HandCheckedQuarterTurn) {
  // inv_freq = pi/2 at position 1: (x1, x2) -> (-x2, x1), scaled by 2.
  auto be = make_cpu_backend(1);
  ops::RopeTable tab{.d_rot = 2, .inv_freq = {float(std::numbers::pi / 2)}, .attention_factor = 2.0f};
  std::vector<float> x = {3.0f, 5.0f, 7.0f};  // d_head 3: the last dim is not rotated
  Tensor x_t = make_tensor(DType::kF32, {1, 1, 3}, x);
  ops::BatchMeta batch;
  batch.positions = {1};
  be->rope({.x = x_t, .batch = &batch, .table = &tab});
  EXPECT_NEAR(x_t.as<float>()[0], -10.0f, 1e-5);
  EXPECT_NEAR(x_t.as<float>()[1], 6.0f, 1e-5);
  EXPECT_EQ(x_t.as<float>()[2], 7.0f);
}

// qk_norm_rope (Backend's default, the CPU's): q normed per head with its weight, k
// without one, then both rotated; the plain references of rms_norm and rope composed.
TEST(CpuQkNormRope, NormsEachHeadThenRotatesQAndK) {
  std::mt19937 rng(10);
  auto be = make_cpu_backend(2);
  const int64_t n_q = 4, n_k = 2, d_head = 16;
  const std::vector<int32_t> pos = {0, 3, 77};
  const int64_t n_tokens = int64_t(pos.size());
  const ops::RopeTable tab = make_table(8, 10000.0, 1.1f, ops::RopeStyle::kHalf);
  std::vector<float> q = random_values(rng, n_tokens * n_q * d_head), k = random_values(rng, n_tokens * n_k * d_head);
  std::vector<float> w = random_values(rng, d_head);
  Tensor q_t = make_tensor(DType::kF32, {n_tokens, n_q, d_head}, q);
  Tensor k_t = make_tensor(DType::kF32, {n_tokens, n_k, d_head}, k);
  ops::BatchMeta batch;
  batch.positions = pos;
  be->qk_norm_rope({.q = q_t, .k = k_t, .q_norm = make_tensor(DType::kF32, {d_head}, w), .k_norm = {},
                    .eps = 1e-6f, .batch = &batch, .table = &tab});
  const std::vector<double> q_normed = rms_norm_reference(std::vector<double>(q.begin(), q.end()), w,
                                                          n_tokens * n_q, d_head, 1e-6);
  const std::vector<float> q_normed_f(q_normed.begin(), q_normed.end());
  expect_close(q_t.as<float>(), rope_reference(q_normed_f, pos, n_q, d_head, tab), 1e-5);
  expect_close(k_t.as<float>(), rope_reference(k, pos, n_k, d_head, tab), 1e-6);
}

// qk_norm_rope with a store: the cache rows hold the keys as this op leaves them and the
// values, as kv_store after it writes them; a padding row (kPadSlot) stores nothing.
TEST(CpuQkNormRope, WithAStoreWritesTheCacheAsKvStoreAfterIt) {
  std::mt19937 rng(11);
  auto be = make_cpu_backend(2);
  const int64_t n_q = 4, n_k = 2, d_head = 16, block_size = 4, n_blocks = 2;
  const ops::RopeTable tab = make_table(16, 10000.0, 1.0f, ops::RopeStyle::kHalf);
  ops::BatchMeta batch;
  batch.positions = {0, 3, 77};
  batch.slot_mapping = {5, 2, ops::kPadSlot};
  batch.block_size = int32_t(block_size);
  const int64_t n_tokens = 3;
  std::vector<float> q = random_values(rng, n_tokens * n_q * d_head), k = random_values(rng, n_tokens * n_k * d_head);
  std::vector<float> v = random_values(rng, n_tokens * n_k * d_head), w = random_values(rng, d_head);
  std::vector<float> before = random_values(rng, n_blocks * block_size * n_k * d_head);
  const Shape cache{n_blocks, block_size, n_k, d_head};
  struct Run {
    Tensor q, k, v, k_cache, v_cache;
  };
  Run runs[2];
  for (Run& r : runs) {
    r = {make_tensor(DType::kF32, {n_tokens, n_q, d_head}, q), make_tensor(DType::kF32, {n_tokens, n_k, d_head}, k),
         make_tensor(DType::kF32, {n_tokens, n_k, d_head}, v), make_tensor(DType::kF32, cache, before),
         make_tensor(DType::kF32, cache, before)};
  }
  for (int i = 0; i < 2; ++i) {
    Run& r = runs[i];
    const ops::KvStoreArgs store{.k = r.k, .v = r.v, .k_cache = r.k_cache, .v_cache = r.v_cache, .batch = &batch};
    be->qk_norm_rope({.q = r.q, .k = r.k, .q_norm = make_tensor(DType::kF32, {d_head}, w), .k_norm = {},
                      .eps = 1e-6f, .batch = &batch, .table = &tab, .store = i == 0 ? &store : nullptr});
    if (i == 1) be->kv_store(store);
  }
  for (auto member : {&Run::q, &Run::k, &Run::k_cache, &Run::v_cache}) {
    const Tensor &a = runs[0].*member, &b = runs[1].*member;
    EXPECT_EQ(0, std::memcmp(a.data, b.data, size_t(a.nbytes())));
  }
  // Slot 2 holds token 1's keys as rotated (position 3: not its inputs) and its values;
  // slots the step did not name are as before.
  const int64_t row = n_k * d_head;
  EXPECT_NE(0, std::memcmp(runs[0].k.as<float>() + row, k.data() + row, size_t(row) * 4));
  EXPECT_EQ(0, std::memcmp(runs[0].k_cache.as<float>() + 2 * row, runs[0].k.as<float>() + row, size_t(row) * 4));
  EXPECT_EQ(0, std::memcmp(runs[0].v_cache.as<float>() + 2 * row, v.data() + row, size_t(row) * 4));
  EXPECT_EQ(0, std::memcmp(runs[0].k_cache.as<float>() + 5 * row, runs[0].k.as<float>(), size_t(row) * 4));
  for (int64_t slot : {0, 1, 3, 4, 6, 7})
    EXPECT_EQ(0, std::memcmp(runs[0].k_cache.as<float>() + slot * row, before.data() + slot * row, size_t(row) * 4))
        << "slot " << slot;
}

// ---- glu, add -----------------------------------------------------------------

TEST(CpuGlu, SiluAndGptOssClampMatchNaive) {
  std::mt19937 rng(9);
  auto be = make_cpu_backend(1);
  const int64_t n = 4, d_ff = 50;
  // Values up to +-10 so the gpt-oss clamp (limit 7) bites on both sides.
  std::vector<float> g = random_values(rng, n * d_ff, 10.0f), u = random_values(rng, n * d_ff, 10.0f);
  Tensor g_t = make_tensor(DType::kF32, {n, d_ff}, g), u_t = make_tensor(DType::kF32, {n, d_ff}, u);
  Tensor out = be->alloc(DType::kF32, {n, d_ff});

  be->glu({.gate = g_t, .up = u_t, .out = out, .params = {.kind = ops::GluKind::kSilu}});
  std::vector<double> ref(n * d_ff);
  for (int64_t i = 0; i < n * d_ff; ++i) ref[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
  expect_close(out.as<float>(), ref, 1e-6);

  const ops::GluParams oss{.kind = ops::GluKind::kGptOssClamp, .alpha = 1.702f, .limit = 7.0f};
  be->glu({.gate = g_t, .up = u_t, .out = out, .params = oss});
  for (int64_t i = 0; i < n * d_ff; ++i) {
    const double gc = std::min(double(g[i]), 7.0), uc = std::clamp(double(u[i]), -7.0, 7.0);
    ref[i] = (uc + 1.0) * gc / (1.0 + std::exp(-1.702 * gc));
  }
  expect_close(out.as<float>(), ref, 1e-6);
}

TEST(CpuGlu, HandCheckedValues) {
  auto be = make_cpu_backend(1);
  std::vector<float> g = {0.0f, 9.0f}, u = {5.0f, -9.0f};
  Tensor g_t = make_tensor(DType::kF32, {1, 2}, g), u_t = make_tensor(DType::kF32, {1, 2}, u);
  Tensor out = be->alloc(DType::kF32, {1, 2});
  be->glu({.gate = g_t, .up = u_t, .out = out, .params = {.kind = ops::GluKind::kGptOssClamp}});
  EXPECT_EQ(out.as<float>()[0], 0.0f);  // gate 0: sigmoid(0) * 0
  // gate 9 -> 7, up -9 -> -7: (-7 + 1) * 7 * sigmoid(1.702 * 7)
  EXPECT_NEAR(out.as<float>()[1], -42.0 / (1.0 + std::exp(-1.702 * 7.0)), 1e-4);
}

TEST(CpuAdd, AddsElementwiseAndMayAliasAnInput) {
  std::mt19937 rng(10);
  auto be = make_cpu_backend(1);
  std::vector<float> a = random_values(rng, 12), b = random_values(rng, 12);
  Tensor a_t = make_tensor(DType::kF32, {3, 4}, a), b_t = make_tensor(DType::kF32, {3, 4}, b);
  be->add({.a = a_t, .b = b_t, .out = a_t});
  for (int i = 0; i < 12; ++i) EXPECT_EQ(a_t.as<float>()[i], a[i] + b[i]);
}

}  // namespace
}  // namespace kiln::cpu

namespace kiln::cpu {
namespace {

TEST(CpuSliceColumns, CopiesTheColumnRangeOfEveryRow) {
  auto be = make_cpu_backend(1);
  Tensor src = host_tensor(DType::kF32, {3, 5});
  for (int i = 0; i < 15; ++i) src.as<float>()[i] = float(i) + 0.5f;
  Tensor dst = host_tensor(DType::kF32, {3, 2});
  be->slice_columns({.src = src, .col_begin = 3, .dst = dst});
  const float expected[] = {3.5f, 4.5f, 8.5f, 9.5f, 13.5f, 14.5f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(dst.as<float>()[i], expected[i]) << i;
}

}  // namespace
}  // namespace kiln::cpu
