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

#include "backends/cpu/cpu_backend.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

// One sequence of a step: its context after the step, how many of its newest
// tokens are queried in the step, and its (deliberately scattered) blocks.
struct SeqSpec {
  int32_t context_len;
  int32_t n_query;
  std::vector<int32_t> blocks;
};

// The batch of a step. `all_positions`: every context position is a row (used to
// fill the cache); else the newest n_query positions of each sequence.
ops::BatchMeta make_batch(const std::vector<SeqSpec>& seqs, int32_t block_size, bool all_positions) {
  ops::BatchMeta b;
  b.block_size = block_size;
  for (const SeqSpec& s : seqs)
    b.max_blocks_per_seq = std::max(b.max_blocks_per_seq, int32_t(s.blocks.size()));
  for (const SeqSpec& s : seqs) {
    b.context_len.push_back(s.context_len);
    for (int32_t i = 0; i < b.max_blocks_per_seq; ++i)
      b.block_table.push_back(i < int32_t(s.blocks.size()) ? s.blocks[i] : -1);
  }
  b.q_start.push_back(0);
  for (int32_t si = 0; si < int32_t(seqs.size()); ++si) {
    const SeqSpec& s = seqs[si];
    const int32_t first = all_positions ? 0 : s.context_len - s.n_query;
    for (int32_t p = first; p < s.context_len; ++p) {
      b.positions.push_back(p);
      b.slot_mapping.push_back(int32_t(b.slot(si, p)));
    }
    b.q_start.push_back(b.n_tokens());
  }
  return b;
}

// A mixed step: chunked prefill (3 of 11), full prefill (6 of 6) and decode
// (1 of 9), block size 4 with non-contiguous block tables.
const std::vector<SeqSpec> kMixedStep = {
    {.context_len = 11, .n_query = 3, .blocks = {7, 2, 12}},
    {.context_len = 6, .n_query = 6, .blocks = {5, 0}},
    {.context_len = 9, .n_query = 1, .blocks = {9, 3, 14}},
};
constexpr int32_t kBlockSize = 4, kNumBlocks = 16;

// ---- GQA attention ------------------------------------------------------------

struct AttentionFixture {
  int64_t n_heads = 4, n_kv_heads = 2, d_head = 8;
  std::vector<SeqSpec> seqs;
  std::vector<std::vector<float>> k, v;  // per sequence [context_len, n_kv_heads, d_head]
  std::vector<float> q;                  // [n_tokens, n_heads, d_head] of the step
  Tensor k_cache, v_cache, q_t;
  ops::BatchMeta fill, step;

  AttentionFixture(ops::Backend& be, std::mt19937& rng, std::vector<SeqSpec> specs)
      : seqs(std::move(specs)) {
    fill = make_batch(seqs, kBlockSize, true);
    step = make_batch(seqs, kBlockSize, false);
    const int64_t row = n_kv_heads * d_head;
    std::vector<float> k_all, v_all;
    for (const SeqSpec& s : seqs) {
      k.push_back(random_values(rng, s.context_len * row));
      v.push_back(random_values(rng, s.context_len * row));
      k_all.insert(k_all.end(), k.back().begin(), k.back().end());
      v_all.insert(v_all.end(), v.back().begin(), v.back().end());
    }
    k_cache = be.alloc(DType::kF32, {kNumBlocks, kBlockSize, n_kv_heads, d_head});
    v_cache = be.alloc(DType::kF32, {kNumBlocks, kBlockSize, n_kv_heads, d_head});
    const int64_t n_fill = fill.n_tokens();
    be.kv_store({.k = make_tensor(DType::kF32, {n_fill, n_kv_heads, d_head}, k_all),
                 .v = make_tensor(DType::kF32, {n_fill, n_kv_heads, d_head}, v_all),
                 .k_cache = k_cache, .v_cache = v_cache, .batch = &fill});
    q = random_values(rng, step.n_tokens() * n_heads * d_head);
    q_t = make_tensor(DType::kF32, {step.n_tokens(), n_heads, d_head}, q);
  }

  Tensor run(ops::Backend& be, float scale, int32_t window, const Tensor& sinks) {
    Tensor out = be.alloc(DType::kF32, {step.n_tokens(), n_heads, d_head});
    be.attention({.q = q_t, .k_cache = k_cache, .v_cache = v_cache, .out = out, .sinks = sinks,
                  .batch = &step, .scale = scale, .sliding_window = window});
    return out;
  }

  // Naive attention over the per-sequence arrays, positions driving the mask.
  std::vector<double> reference(double scale, int32_t window, const std::vector<float>& sinks) {
    std::vector<double> out(q.size());
    const int64_t group = n_heads / n_kv_heads;
    for (int32_t s = 0; s < int32_t(seqs.size()); ++s)
      for (int32_t t = step.q_start[s]; t < step.q_start[s + 1]; ++t)
        for (int64_t h = 0; h < n_heads; ++h) {
          const int32_t p = step.positions[t];
          const int32_t lo = window > 0 ? std::max(0, p - window + 1) : 0;
          const int64_t kvh = h / group;
          std::vector<double> score;
          for (int32_t j = lo; j <= p; ++j) {
            double dot = 0.0;
            for (int64_t d = 0; d < d_head; ++d)
              dot += double(q[(t * n_heads + h) * d_head + d]) * k[s][(j * n_kv_heads + kvh) * d_head + d];
            score.push_back(scale * dot);
          }
          double m = sinks.empty() ? -1e300 : double(sinks[h]);
          for (double x : score) m = std::max(m, x);
          double denom = sinks.empty() ? 0.0 : std::exp(sinks[h] - m);
          for (double x : score) denom += std::exp(x - m);
          for (int32_t j = lo; j <= p; ++j) {
            const double pj = std::exp(score[j - lo] - m) / denom;
            for (int64_t d = 0; d < d_head; ++d)
              out[(t * n_heads + h) * d_head + d] += pj * v[s][(j * n_kv_heads + kvh) * d_head + d];
          }
        }
    return out;
  }
};

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

struct MlaFixture {
  int64_t n_heads = 3, d_nope = 8, d_rope = 4, d_latent = 16, d_v = 6;
  std::vector<SeqSpec> seqs = kMixedStep;
  std::vector<std::vector<float>> lat, rope;  // per sequence [context_len, d_latent | d_rope]
  std::vector<float> q_nope, q_rope, kv_b_values;  // kv_b: [n_heads * (d_nope + d_v), d_latent]
  Tensor cache, q_nope_t, q_rope_t;
  ops::Weight kv_b;
  ops::BatchMeta fill, step;

  MlaFixture(ops::Backend& be, std::mt19937& rng) {
    fill = make_batch(seqs, kBlockSize, true);
    step = make_batch(seqs, kBlockSize, false);
    std::vector<float> lat_all, rope_all;
    for (const SeqSpec& s : seqs) {
      lat.push_back(random_values(rng, s.context_len * d_latent));
      rope.push_back(random_values(rng, s.context_len * d_rope));
      lat_all.insert(lat_all.end(), lat.back().begin(), lat.back().end());
      rope_all.insert(rope_all.end(), rope.back().begin(), rope.back().end());
    }
    cache = be.alloc(DType::kF32, {kNumBlocks, kBlockSize, d_latent + d_rope});
    const int64_t n_fill = fill.n_tokens();
    be.mla_store({.kv_latent = make_tensor(DType::kF32, {n_fill, d_latent}, lat_all),
                  .k_rope = make_tensor(DType::kF32, {n_fill, d_rope}, rope_all),
                  .latent_cache = cache, .batch = &fill});
    const int64_t n = step.n_tokens();
    q_nope = random_values(rng, n * n_heads * d_nope);
    q_rope = random_values(rng, n * n_heads * d_rope);
    q_nope_t = make_tensor(DType::kF32, {n, n_heads, d_nope}, q_nope);
    q_rope_t = make_tensor(DType::kF32, {n, n_heads, d_rope}, q_rope);
    kv_b_values = random_values(rng, n_heads * (d_nope + d_v) * d_latent);
    kv_b.data = make_tensor(DType::kBF16, {n_heads * (d_nope + d_v), d_latent}, kv_b_values);
  }

  Tensor run(ops::Backend& be, float scale) {
    Tensor out = be.alloc(DType::kF32, {step.n_tokens(), n_heads, d_v});
    be.mla_attention({.q_nope = q_nope_t, .q_rope = q_rope_t, .latent_cache = cache, .kv_b = &kv_b,
                      .out = out, .batch = &step, .scale = scale});
    return out;
  }

  // The un-absorbed form: expand k_j = concat(W_uk c_j, r_j) and v_j = W_uv c_j
  // explicitly, then plain attention with q = concat(q_nope, q_rope).
  std::vector<double> reference(double scale) {
    std::vector<double> out(step.n_tokens() * n_heads * d_v);
    const auto w = [&](int64_t row, int64_t c) { return double(kv_b_values[row * d_latent + c]); };
    for (int32_t s = 0; s < int32_t(seqs.size()); ++s)
      for (int32_t t = step.q_start[s]; t < step.q_start[s + 1]; ++t)
        for (int64_t h = 0; h < n_heads; ++h) {
          const int32_t p = step.positions[t];
          std::vector<double> score;
          std::vector<std::vector<double>> values;
          for (int32_t j = 0; j <= p; ++j) {
            std::vector<double> key(d_nope + d_rope, 0.0), value(d_v, 0.0);
            for (int64_t d = 0; d < d_nope; ++d)
              for (int64_t c = 0; c < d_latent; ++c)
                key[d] += w(h * (d_nope + d_v) + d, c) * lat[s][j * d_latent + c];
            for (int64_t r = 0; r < d_rope; ++r) key[d_nope + r] = rope[s][j * d_rope + r];
            for (int64_t e = 0; e < d_v; ++e)
              for (int64_t c = 0; c < d_latent; ++c)
                value[e] += w(h * (d_nope + d_v) + d_nope + e, c) * lat[s][j * d_latent + c];
            double dot = 0.0;
            for (int64_t d = 0; d < d_nope; ++d) dot += double(q_nope[(t * n_heads + h) * d_nope + d]) * key[d];
            for (int64_t r = 0; r < d_rope; ++r)
              dot += double(q_rope[(t * n_heads + h) * d_rope + r]) * key[d_nope + r];
            score.push_back(scale * dot);
            values.push_back(value);
          }
          const double m = *std::max_element(score.begin(), score.end());
          double denom = 0.0;
          for (double x : score) denom += std::exp(x - m);
          for (int32_t j = 0; j <= p; ++j)
            for (int64_t e = 0; e < d_v; ++e)
              out[(t * n_heads + h) * d_v + e] += std::exp(score[j] - m) / denom * values[j][e];
        }
    return out;
  }
};

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
