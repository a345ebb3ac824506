// CPU reference backend: kv_store, attention (GQA, paged, mixed prefill/decode,
// sliding window, sinks), mla_store and mla_attention. Expectations come from
// naive double-precision loops over per-sequence K/V arrays (no paging).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "attention_fixture.h"
#include "backends/cpu/cpu_backend.h"

namespace kiln::cpu {
namespace {

TEST(CpuKvStore, WritesEachTokenAtItsSlotAndNothingElse) {
  std::mt19937 rng(20);
  auto be = make_cpu_backend(2);
  AttentionFixture f(*be, rng, kMixedStep);
  const int64_t row = f.n_kv_heads * f.d_head;
  std::vector<char> written(kNumBlocks * kBlockSize, 0);
  for (int32_t s = 0; s < int32_t(f.seqs.size()); ++s)
    for (int32_t j = 0; j < f.seqs[s].context_len; ++j) {
      const int64_t slot = f.fill.slot(s, j);
      written[slot] = 1;
      for (int64_t i = 0; i < row; ++i) {
        ASSERT_EQ(f.k_cache.as<float>()[slot * row + i], f.k[s][j * row + i]) << "seq " << s << " pos " << j;
        ASSERT_EQ(f.v_cache.as<float>()[slot * row + i], f.v[s][j * row + i]) << "seq " << s << " pos " << j;
      }
    }
  for (int64_t slot = 0; slot < kNumBlocks * kBlockSize; ++slot)
    if (!written[slot]) {
      for (int64_t i = 0; i < row; ++i) ASSERT_EQ(f.k_cache.as<float>()[slot * row + i], 0.0f) << slot;
    }
}

TEST(CpuAttention, GqaPagedMixedPrefillAndDecodeMatchesNaive) {
  std::mt19937 rng(21);
  auto be = make_cpu_backend(3);
  AttentionFixture f(*be, rng, kMixedStep);
  Tensor out = f.run(*be, 0.35f, 0, Tensor{});
  expect_close(out.as<float>(), f.reference(0.35f, 0, {}), 1e-5);
}

TEST(CpuAttention, SlidingWindowShorterThanTheContext) {
  std::mt19937 rng(22);
  auto be = make_cpu_backend(3);
  AttentionFixture f(*be, rng, kMixedStep);
  Tensor out = f.run(*be, 0.35f, 3, Tensor{});
  expect_close(out.as<float>(), f.reference(0.35f, 3, {}), 1e-5);
  // The window changes the answer (a wrong mask could not pass both tests).
  const std::vector<double> full = f.reference(0.35f, 0, {});
  double max_diff = 0.0;
  for (size_t i = 0; i < full.size(); ++i) max_diff = std::max(max_diff, std::abs(out.as<float>()[i] - full[i]));
  EXPECT_GT(max_diff, 1e-2);
}

TEST(CpuAttention, SinksAddToTheDenominatorOnly) {
  std::mt19937 rng(23);
  auto be = make_cpu_backend(3);
  AttentionFixture f(*be, rng, kMixedStep);
  std::vector<float> sinks = {1.5f, -0.75f, 0.25f, 3.0f};  // head 3's sink dominates the max
  Tensor sinks_t = make_tensor(DType::kBF16, {4}, sinks);
  for (int32_t window : {0, 4}) {
    SCOPED_TRACE(window);
    Tensor out = f.run(*be, 0.35f, window, sinks_t);
    expect_close(out.as<float>(), f.reference(0.35f, window, sinks), 1e-5);
  }
}

TEST(CpuAttention, HandCheckedSoftmaxWithAndWithoutSink) {
  // One head, d_head 2, q = [1, 0], k0 = [0, 0], k1 = [ln 3, 0], v0 = [1, 0], v1 = [0, 1].
  // Row at position 1: weights 1/4, 3/4; with sink ln 4: 1/8, 3/8 (denominator 2).
  // Row at position 0: weight 1; with sink ln 4: 1/5.
  auto be = make_cpu_backend(1);
  const std::vector<SeqSpec> seqs = {{.context_len = 2, .n_query = 2, .blocks = {1}}};
  ops::BatchMeta b = make_batch(seqs, kBlockSize, false);
  Tensor k_cache = be->alloc(DType::kF32, {2, kBlockSize, 1, 2});
  Tensor v_cache = be->alloc(DType::kF32, {2, kBlockSize, 1, 2});
  std::vector<float> k = {0.0f, 0.0f, float(std::log(3.0)), 0.0f}, v = {1.0f, 0.0f, 0.0f, 1.0f};
  be->kv_store({.k = make_tensor(DType::kF32, {2, 1, 2}, k), .v = make_tensor(DType::kF32, {2, 1, 2}, v),
                .k_cache = k_cache, .v_cache = v_cache, .batch = &b});
  std::vector<float> q = {1.0f, 0.0f, 1.0f, 0.0f};
  Tensor q_t = make_tensor(DType::kF32, {2, 1, 2}, q);
  Tensor out = be->alloc(DType::kF32, {2, 1, 2});
  be->attention({.q = q_t, .k_cache = k_cache, .v_cache = v_cache, .out = out, .sinks = {}, .batch = &b});
  const float* o = out.as<float>();
  EXPECT_NEAR(o[0], 1.0f, 1e-6);
  EXPECT_NEAR(o[1], 0.0f, 1e-6);
  EXPECT_NEAR(o[2], 0.25f, 1e-6);
  EXPECT_NEAR(o[3], 0.75f, 1e-6);
  std::vector<float> sink = {float(std::log(4.0))};
  be->attention({.q = q_t, .k_cache = k_cache, .v_cache = v_cache, .out = out,
                 .sinks = make_tensor(DType::kF32, {1}, sink), .batch = &b});
  EXPECT_NEAR(o[0], 0.2f, 1e-6);
  EXPECT_NEAR(o[1], 0.0f, 1e-6);
  EXPECT_NEAR(o[2], 0.125f, 1e-6);
  EXPECT_NEAR(o[3], 0.375f, 1e-6);
}

TEST(CpuAttention, OneAndFourThreadsGiveBitIdenticalResults) {
  std::mt19937 rng(24);
  auto be1 = make_cpu_backend(1);
  auto be4 = make_cpu_backend(4);
  AttentionFixture f(*be1, rng, kMixedStep);
  std::vector<float> sinks = {0.5f, -0.5f, 1.0f, 0.0f};
  Tensor sinks_t = make_tensor(DType::kF32, {4}, sinks);
  Tensor out1 = f.run(*be1, 0.35f, 5, sinks_t);
  Tensor out4 = f.run(*be4, 0.35f, 5, sinks_t);
  EXPECT_EQ(std::memcmp(out1.data, out4.data, out1.nbytes()), 0);
}

// ---- MLA ----------------------------------------------------------------------

TEST(CpuMla, StoreWritesLatentThenRopePartAtTheSlot) {
  std::mt19937 rng(30);
  auto be = make_cpu_backend(2);
  MlaFixture f(*be, rng);
  const int64_t row = f.d_latent + f.d_rope;
  for (int32_t s = 0; s < int32_t(f.seqs.size()); ++s)
    for (int32_t j = 0; j < f.seqs[s].context_len; ++j) {
      const float* c = f.cache.as<float>() + f.fill.slot(s, j) * row;
      for (int64_t i = 0; i < f.d_latent; ++i) ASSERT_EQ(c[i], f.lat[s][j * f.d_latent + i]);
      for (int64_t r = 0; r < f.d_rope; ++r) ASSERT_EQ(c[f.d_latent + r], f.rope[s][j * f.d_rope + r]);
    }
}

TEST(CpuMla, AbsorbedAttentionMatchesExplicitlyExpandedKeysAndValues) {
  std::mt19937 rng(31);
  auto be = make_cpu_backend(3);
  MlaFixture f(*be, rng);
  Tensor out = f.run(*be, 0.3f);
  expect_close(out.as<float>(), f.reference(0.3f), 1e-5);
}

TEST(CpuMla, OneAndFourThreadsGiveBitIdenticalResults) {
  std::mt19937 rng(32);
  auto be1 = make_cpu_backend(1);
  auto be4 = make_cpu_backend(4);
  MlaFixture f(*be1, rng);
  Tensor out1 = f.run(*be1, 0.3f);
  Tensor out4 = f.run(*be4, 0.3f);
  EXPECT_EQ(std::memcmp(out1.data, out4.data, out1.nbytes()), 0);
}

}  // namespace
}  // namespace kiln::cpu
