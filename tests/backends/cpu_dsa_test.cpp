// DeepSeek sparse attention on the CPU reference: layer_norm against a double reference,
// dsa_index_store writing each key (and its e4m3 scale) at its slot, dsa_select's
// top-k against a naive selection over per-sequence keys (paging, causality, ties, the
// dense case with -1 padding), and mla_attention over a selection equal to dense MLA
// over a cache holding only the selected tokens.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "attention_fixture.h"
#include "backends/cpu/cpu_backend.h"
#include "ops/kv_quant.h"

namespace kiln::cpu {
namespace {

TEST(CpuLayerNorm, MatchesDoubleReferenceWithWeightAndBias) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(1);
  const int64_t rows = 5, dim = 32;
  std::vector<float> x = random_values(rng, rows * dim, 3.0f), w = random_values(rng, dim), b = random_values(rng, dim);
  for (float& v : x) v += 1.5f;  // a mean far from zero
  Tensor xt = make_tensor(DType::kF32, {rows, dim}, x);
  Tensor wt = make_tensor(DType::kBF16, {dim}, w), bt = make_tensor(DType::kBF16, {dim}, b);
  Tensor out = be->alloc(DType::kF32, {rows, dim});
  be->layer_norm({.x = xt, .weight = wt, .bias = bt, .out = out, .eps = 1e-6f});
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
    mean /= double(dim);
    for (int64_t i = 0; i < dim; ++i) var += std::pow(x[r * dim + i] - mean, 2);
    const double inv = 1.0 / std::sqrt(var / double(dim) + 1e-6);
    for (int64_t i = 0; i < dim; ++i) {
      const double want = (x[r * dim + i] - mean) * inv * w[i] + b[i];
      EXPECT_NEAR(out.as<float>()[r * dim + i], want, 1e-5) << r << " " << i;
    }
  }
  be->layer_norm({.x = xt, .weight = wt, .out = xt, .eps = 1e-6f});  // no bias, in place
  EXPECT_NEAR(xt.as<float>()[0], out.as<float>()[0] - b[0], 1e-5);
}

// Keys of every position of kMixedStep's sequences in an index cache, and the step's
// queries and head weights.
struct IndexProblem {
  int64_t n_heads = 3, d_index = 16;
  std::vector<SeqSpec> seqs = kMixedStep;
  std::vector<std::vector<float>> k;  // per sequence [context_len, d_index] (as the cache holds them)
  std::vector<float> q, w;            // [n_tokens, n_heads, d_index], [n_tokens, n_heads]
  Tensor cache, scale, q_t, w_t;
  ops::BatchMeta fill, step;

  IndexProblem(ops::Backend& be, std::mt19937& rng, DType dt) {
    fill = make_batch(seqs, kBlockSize, true);
    step = make_batch(seqs, kBlockSize, false);
    std::vector<float> all;
    for (const SeqSpec& s : seqs) {
      k.push_back(random_values(rng, s.context_len * d_index));
      all.insert(all.end(), k.back().begin(), k.back().end());
    }
    cache = zeros(be, dt, {kNumBlocks, kBlockSize, d_index});
    if (dt == DType::kF8E4M3) scale = zeros(be, DType::kF32, {kNumBlocks, kBlockSize});
    be.dsa_index_store({.k = make_tensor(DType::kF32, {fill.n_tokens(), d_index}, all), .index_cache = cache,
                        .index_scale = scale, .batch = &fill});
    if (dt == DType::kF8E4M3) {  // the values the cache stands for
      for (int32_t s = 0; s < int32_t(seqs.size()); ++s)
        for (int32_t j = 0; j < seqs[s].context_len; ++j)
          dequantize_into(cache, scale, fill.slot(s, j), 0, 1, d_index, k[s].data() + j * d_index);
    }
    q = random_values(rng, step.n_tokens() * n_heads * d_index);
    w = random_values(rng, step.n_tokens() * n_heads);
    q_t = make_tensor(DType::kF32, {step.n_tokens(), n_heads, d_index}, q);
    w_t = make_tensor(DType::kF32, {step.n_tokens(), n_heads}, w);
  }

  std::vector<int32_t> run(ops::Backend& be, int64_t top_k) {
    Tensor sel = be.alloc(DType::kI32, {step.n_tokens(), top_k});
    be.dsa_select({.q = q_t, .weights = w_t, .index_cache = cache, .index_scale = scale, .selected = sel,
                   .batch = &step, .scale = 0.25f, .weight_scale = 0.5f});
    return {sel.as<int32_t>(), sel.as<int32_t>() + sel.numel()};
  }

  // The naive selection: scores in double over the per-sequence keys, the top_k by
  // (score descending, position ascending), ascending; -1 padded.
  std::vector<int32_t> reference(int64_t top_k) const {
    std::vector<int32_t> out;
    for (int32_t s = 0; s < int32_t(seqs.size()); ++s)
      for (int32_t t = step.q_start[s]; t < step.q_start[s + 1]; ++t) {
        const int32_t p = step.positions[t];
        std::vector<double> score(size_t(p) + 1);
        for (int32_t j = 0; j <= p; ++j)
          for (int64_t h = 0; h < n_heads; ++h) {
            double dot = 0.0;
            for (int64_t d = 0; d < d_index; ++d) dot += double(q[(t * n_heads + h) * d_index + d]) * k[s][j * d_index + d];
            score[size_t(j)] += double(w[t * n_heads + h]) * 0.5 * std::max(0.25 * dot, 0.0);
          }
        std::vector<int32_t> order(size_t(p) + 1);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
        order.resize(size_t(std::min<int64_t>(top_k, p + 1)));
        std::sort(order.begin(), order.end());
        order.resize(size_t(top_k), -1);
        out.insert(out.end(), order.begin(), order.end());
      }
    return out;
  }
};

TEST(CpuDsa, IndexStoreWritesEachKeyAtItsSlot) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(2);
  for (DType dt : {DType::kF32, DType::kF8E4M3}) {
    IndexProblem p(*be, rng, dt);
    const std::vector<float>& k0 = p.k[1];  // sequence 1's keys as stored
    for (int32_t j = 0; j < p.seqs[1].context_len; ++j) {
      const int64_t slot = p.fill.slot(1, j);
      if (dt == DType::kF32) {
        for (int64_t d = 0; d < p.d_index; ++d) EXPECT_EQ(p.cache.as<float>()[slot * p.d_index + d], k0[j * p.d_index + d]);
      } else {
        EXPECT_GT(p.scale.as<float>()[slot], 0.0f) << "slot " << slot;
      }
    }
  }
}

TEST(CpuDsa, FP8IndexStoreQuantizesEachKeyAsOneRow) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(3);
  const int64_t d_index = 16;
  std::vector<float> key = random_values(rng, d_index, 5.0f);
  const ops::BatchMeta b = make_batch({{.context_len = 1, .n_query = 1, .blocks = {3}}}, kBlockSize, true);
  Tensor cache = zeros(*be, DType::kF8E4M3, {kNumBlocks, kBlockSize, d_index});
  Tensor scale = zeros(*be, DType::kF32, {kNumBlocks, kBlockSize});
  be->dsa_index_store({.k = make_tensor(DType::kF32, {1, d_index}, key), .index_cache = cache, .index_scale = scale,
                       .batch = &b});
  std::vector<uint8_t> want(static_cast<size_t>(d_index));
  const float want_scale = ops::kv_quantize_row(key.data(), d_index, want.data());
  const int64_t slot = 3 * kBlockSize;
  EXPECT_EQ(scale.as<float>()[slot], want_scale);
  for (int64_t d = 0; d < d_index; ++d) EXPECT_EQ(cache.as<uint8_t>()[slot * d_index + d], want[size_t(d)]) << d;
}

TEST(CpuDsa, SelectMatchesNaiveTopKOverPagedKeys) {
  auto be = make_cpu_backend(2);
  for (DType dt : {DType::kF32, DType::kF8E4M3}) {
    std::mt19937 rng(4);
    IndexProblem p(*be, rng, dt);
    // top_k 5: the 11- and 9-token sequences are sparse, the 6-token prefill dense for
    // its first 5 rows; top_k 20: every row dense, padded with -1.
    for (int64_t top_k : {1, 5, 20}) {
      EXPECT_EQ(p.run(*be, top_k), p.reference(top_k)) << dtype_name(dt) << " top_k " << top_k;
    }
  }
}

TEST(CpuDsa, TiesGoToTheLowerPosition) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(5);
  IndexProblem p(*be, rng, DType::kF32);
  std::fill(p.w_t.as<float>(), p.w_t.as<float>() + p.w_t.numel(), 0.0f);  // every score 0
  const std::vector<int32_t> got = p.run(*be, 3);
  for (int32_t t = 0; t < p.step.n_tokens(); ++t) {
    const int32_t pos = p.step.positions[t];
    for (int32_t i = 0; i < 3; ++i) EXPECT_EQ(got[t * 3 + i], i <= pos ? i : -1) << "row " << t;
  }
}

TEST(CpuDsa, MlaOverASelectionEqualsDenseMlaOverTheSelectedTokens) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(6);
  const int64_t n_heads = 2, d_nope = 8, d_rope = 4, d_v = 8, d_latent = 16;
  TestWeight kv_b = make_weight(rng, DType::kBF16, n_heads * (d_nope + d_v), d_latent, false, false);
  // One sequence of 11 tokens, the last one queried; it attends to positions {1, 4, 5, 10}.
  const std::vector<int32_t> picked = {1, 4, 5, 10};
  std::vector<float> lat = random_values(rng, 11 * d_latent), rope = random_values(rng, 11 * d_rope);
  const ops::BatchMeta fill = make_batch({{.context_len = 11, .n_query = 11, .blocks = {7, 2, 12}}}, kBlockSize, true);
  Tensor cache = zeros(*be, DType::kF32, {kNumBlocks, kBlockSize, d_latent + d_rope});
  be->mla_store({.kv_latent = make_tensor(DType::kF32, {11, d_latent}, lat),
                 .k_rope = make_tensor(DType::kF32, {11, d_rope}, rope), .latent_cache = cache, .batch = &fill});
  // The same tokens alone, as a 4-token sequence.
  std::vector<float> lat4, rope4;
  for (int32_t j : picked) {
    lat4.insert(lat4.end(), lat.begin() + j * d_latent, lat.begin() + (j + 1) * d_latent);
    rope4.insert(rope4.end(), rope.begin() + j * d_rope, rope.begin() + (j + 1) * d_rope);
  }
  const ops::BatchMeta fill4 = make_batch({{.context_len = 4, .n_query = 4, .blocks = {9}}}, kBlockSize, true);
  Tensor cache4 = zeros(*be, DType::kF32, {kNumBlocks, kBlockSize, d_latent + d_rope});
  be->mla_store({.kv_latent = make_tensor(DType::kF32, {4, d_latent}, lat4),
                 .k_rope = make_tensor(DType::kF32, {4, d_rope}, rope4), .latent_cache = cache4, .batch = &fill4});

  std::vector<float> qn = random_values(rng, n_heads * d_nope), qr = random_values(rng, n_heads * d_rope);
  Tensor qn_t = make_tensor(DType::kF32, {1, n_heads, d_nope}, qn), qr_t = make_tensor(DType::kF32, {1, n_heads, d_rope}, qr);
  const ops::BatchMeta step = make_batch({{.context_len = 11, .n_query = 1, .blocks = {7, 2, 12}}}, kBlockSize, false);
  const ops::BatchMeta step4 = make_batch({{.context_len = 4, .n_query = 1, .blocks = {9}}}, kBlockSize, false);
  std::vector<int32_t> sel = {1, -1, 4, 5, 10, -1};
  Tensor sel_t = host_tensor(DType::kI32, {1, 6});
  std::copy(sel.begin(), sel.end(), sel_t.as<int32_t>());
  Tensor sparse = be->alloc(DType::kF32, {1, n_heads, d_v}), dense4 = be->alloc(DType::kF32, {1, n_heads, d_v});
  Tensor dense = be->alloc(DType::kF32, {1, n_heads, d_v});
  be->mla_attention({.q_nope = qn_t, .q_rope = qr_t, .latent_cache = cache, .kv_b = &kv_b.w, .out = sparse,
                     .batch = &step, .scale = 0.3f, .selected = sel_t});
  be->mla_attention({.q_nope = qn_t, .q_rope = qr_t, .latent_cache = cache4, .kv_b = &kv_b.w, .out = dense4,
                     .batch = &step4, .scale = 0.3f});
  be->mla_attention({.q_nope = qn_t, .q_rope = qr_t, .latent_cache = cache, .kv_b = &kv_b.w, .out = dense,
                     .batch = &step, .scale = 0.3f});
  bool differs = false;
  for (int64_t i = 0; i < n_heads * d_v; ++i) {
    EXPECT_EQ(sparse.as<float>()[i], dense4.as<float>()[i]) << i;  // the same sums in the same order
    differs |= sparse.as<float>()[i] != dense.as<float>()[i];
  }
  EXPECT_TRUE(differs) << "the selection changed nothing";
}

}  // namespace
}  // namespace kiln::cpu
