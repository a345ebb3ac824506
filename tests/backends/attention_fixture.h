// Shared by the CPU attention tests (cpu_attention_test, cpu_kv_fp8_test): paged
// batches over scattered block tables, and GQA / MLA problems whose caches are filled
// through kv_store / mla_store, with naive double-precision references over
// per-sequence K/V arrays (no paging).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "test_util.h"

namespace kiln::cpu {

// A zero-filled tensor of the backend (an e4m3 zero is the byte 0).
inline Tensor zeros(ops::Backend& be, DType dt, Shape s) {
  Tensor t = be.alloc(dt, s);
  std::memset(t.data, 0, t.nbytes());
  return t;
}

// The values an e4m3 cache row stands for: code * scale (ops/kv_quant.h), head h of a slot.
inline void dequantize_into(const Tensor& cache, const Tensor& scale, int64_t slot, int64_t h, int64_t n_heads,
                            int64_t d, float* out) {
  const uint8_t* codes = cache.as<uint8_t>() + (slot * n_heads + h) * d;
  const float sc = scale.as<float>()[slot * n_heads + h];
  for (int64_t i = 0; i < d; ++i) out[i] = fp8_e4m3_to_f32(codes[i]) * sc;
}

// One sequence of a step: its context after the step, how many of its newest
// tokens are queried in the step, and its (deliberately scattered) blocks.
struct SeqSpec {
  int32_t context_len;
  int32_t n_query;
  std::vector<int32_t> blocks;
};

// The batch of a step. `all_positions`: every context position is a row (used to
// fill the cache); else the newest n_query positions of each sequence.
inline ops::BatchMeta make_batch(const std::vector<SeqSpec>& seqs, int32_t block_size, bool all_positions) {
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
inline const std::vector<SeqSpec> kMixedStep = {
    {.context_len = 11, .n_query = 3, .blocks = {7, 2, 12}},
    {.context_len = 6, .n_query = 6, .blocks = {5, 0}},
    {.context_len = 9, .n_query = 1, .blocks = {9, 3, 14}},
};
constexpr int32_t kBlockSize = 4, kNumBlocks = 16;

struct AttentionFixture {
  int64_t n_heads = 4, n_kv_heads = 2, d_head = 8;
  std::vector<SeqSpec> seqs;
  std::vector<std::vector<float>> k, v;  // per sequence [context_len, n_kv_heads, d_head]
  std::vector<float> q;                  // [n_tokens, n_heads, d_head] of the step
  Tensor k_cache, v_cache, k_scale, v_scale, q_t;
  ops::BatchMeta fill, step;

  // cache_dtype f32 (the values as they are) or e4m3: then k and v hold the values the
  // cache stands for (codes times scales), so reference() is attention over them.
  AttentionFixture(ops::Backend& be, std::mt19937& rng, std::vector<SeqSpec> specs,
                   DType cache_dtype = DType::kF32)
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
    k_cache = zeros(be, cache_dtype, {kNumBlocks, kBlockSize, n_kv_heads, d_head});
    v_cache = zeros(be, cache_dtype, {kNumBlocks, kBlockSize, n_kv_heads, d_head});
    if (cache_dtype == DType::kF8E4M3) {
      k_scale = zeros(be, DType::kF32, {kNumBlocks, kBlockSize, n_kv_heads});
      v_scale = zeros(be, DType::kF32, {kNumBlocks, kBlockSize, n_kv_heads});
    }
    const int64_t n_fill = fill.n_tokens();
    be.kv_store({.k = make_tensor(DType::kF32, {n_fill, n_kv_heads, d_head}, k_all),
                 .v = make_tensor(DType::kF32, {n_fill, n_kv_heads, d_head}, v_all),
                 .k_cache = k_cache, .v_cache = v_cache, .k_scale = k_scale, .v_scale = v_scale, .batch = &fill});
    if (cache_dtype == DType::kF8E4M3) {
      for (int32_t s = 0; s < int32_t(seqs.size()); ++s)
        for (int32_t j = 0; j < seqs[s].context_len; ++j)
          for (int64_t h = 0; h < n_kv_heads; ++h) {
            const int64_t slot = fill.slot(s, j), at = (j * n_kv_heads + h) * d_head;
            dequantize_into(k_cache, k_scale, slot, h, n_kv_heads, d_head, k[s].data() + at);
            dequantize_into(v_cache, v_scale, slot, h, n_kv_heads, d_head, v[s].data() + at);
          }
    }
    q = random_values(rng, step.n_tokens() * n_heads * d_head);
    q_t = make_tensor(DType::kF32, {step.n_tokens(), n_heads, d_head}, q);
  }

  Tensor run(ops::Backend& be, float scale, int32_t window, const Tensor& sinks) {
    Tensor out = be.alloc(DType::kF32, {step.n_tokens(), n_heads, d_head});
    be.attention({.q = q_t, .k_cache = k_cache, .v_cache = v_cache, .k_scale = k_scale, .v_scale = v_scale,
                  .out = out, .sinks = sinks, .batch = &step, .scale = scale, .sliding_window = window});
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

// ---- MLA ----------------------------------------------------------------------

struct MlaFixture {
  int64_t n_heads = 3, d_nope = 8, d_rope = 4, d_latent = 16, d_v = 6;
  std::vector<SeqSpec> seqs = kMixedStep;
  std::vector<std::vector<float>> lat, rope;  // per sequence [context_len, d_latent | d_rope]
  std::vector<float> q_nope, q_rope, kv_b_values;  // kv_b: [n_heads * (d_nope + d_v), d_latent]
  Tensor cache, latent_scale, q_nope_t, q_rope_t;
  ops::Weight kv_b;
  ops::BatchMeta fill, step;

  // cache_dtype as AttentionFixture's: with e4m3, lat and rope hold the cached values.
  MlaFixture(ops::Backend& be, std::mt19937& rng, DType cache_dtype = DType::kF32) {
    fill = make_batch(seqs, kBlockSize, true);
    step = make_batch(seqs, kBlockSize, false);
    std::vector<float> lat_all, rope_all;
    for (const SeqSpec& s : seqs) {
      lat.push_back(random_values(rng, s.context_len * d_latent));
      rope.push_back(random_values(rng, s.context_len * d_rope));
      lat_all.insert(lat_all.end(), lat.back().begin(), lat.back().end());
      rope_all.insert(rope_all.end(), rope.back().begin(), rope.back().end());
    }
    cache = zeros(be, cache_dtype, {kNumBlocks, kBlockSize, d_latent + d_rope});
    if (cache_dtype == DType::kF8E4M3) latent_scale = zeros(be, DType::kF32, {kNumBlocks, kBlockSize, 2});
    const int64_t n_fill = fill.n_tokens();
    be.mla_store({.kv_latent = make_tensor(DType::kF32, {n_fill, d_latent}, lat_all),
                  .k_rope = make_tensor(DType::kF32, {n_fill, d_rope}, rope_all),
                  .latent_cache = cache, .latent_scale = latent_scale, .batch = &fill});
    if (cache_dtype == DType::kF8E4M3) {
      for (int32_t s = 0; s < int32_t(seqs.size()); ++s)
        for (int32_t j = 0; j < seqs[s].context_len; ++j) {
          const int64_t slot = fill.slot(s, j), row = d_latent + d_rope;
          const uint8_t* codes = cache.as<uint8_t>() + slot * row;
          const float* sc = latent_scale.as<float>() + slot * 2;
          for (int64_t c = 0; c < d_latent; ++c) lat[s][j * d_latent + c] = fp8_e4m3_to_f32(codes[c]) * sc[0];
          for (int64_t r = 0; r < d_rope; ++r) rope[s][j * d_rope + r] = fp8_e4m3_to_f32(codes[d_latent + r]) * sc[1];
        }
    }
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
    be.mla_attention({.q_nope = q_nope_t, .q_rope = q_rope_t, .latent_cache = cache,
                      .latent_scale = latent_scale, .kv_b = &kv_b, .out = out, .batch = &step, .scale = scale});
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

}  // namespace kiln::cpu
