// The CPU reference of the paged KV cache ops: kv_store and attention (GQA,
// sliding window, sinks), mla_store and mla_attention (absorbed form, dense or over a
// DeepSeek sparse attention selection), dsa_index_store and dsa_select, over a cache
// of activations (f32) or of e4m3 codes with per-row scales (ops/kv_quant.h: stores
// quantize, attention dequantizes to fp32 and then computes exactly as over f32).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_internal.h"
#include "ops/kv_quant.h"

namespace kiln::cpu {
namespace {

// Checks the batch metadata against the activations and the cache, and returns
// the sequence of every token row.
std::vector<int32_t> check_batch(const ops::BatchMeta* batch, int64_t n_tokens, int64_t n_blocks,
                                 int64_t block_size, const char* op) {
  KILN_CHECK(batch != nullptr) << op << ": batch is null";
  const ops::BatchMeta& b = *batch;
  KILN_CHECK_EQ(int64_t(b.n_tokens()), n_tokens) << op << ": batch.n_tokens() vs activation rows";
  KILN_CHECK_EQ(b.slot_mapping.size(), b.positions.size()) << op << ": batch.slot_mapping.size()";
  KILN_CHECK_EQ(int64_t(b.block_size), block_size) << op << ": batch.block_size vs cache.dim(1)";
  const int32_t n_seqs = b.n_seqs();
  KILN_CHECK_EQ(b.q_start.size(), size_t(n_seqs) + 1) << op << ": batch.q_start.size()";
  KILN_CHECK_EQ(b.block_table.size(), size_t(n_seqs) * size_t(b.max_blocks_per_seq))
      << op << ": batch.block_table.size() vs n_seqs * max_blocks_per_seq";
  KILN_CHECK_EQ(b.q_start[0], 0) << op << ": batch.q_start[0]";
  KILN_CHECK_EQ(int64_t(b.q_start[n_seqs]), n_tokens) << op << ": batch.q_start[n_seqs]";
  std::vector<int32_t> seq_of(size_t(n_tokens), -1);
  for (int32_t s = 0; s < n_seqs; ++s) {
    KILN_CHECK_LE(b.q_start[s], b.q_start[s + 1]) << op << ": batch.q_start of sequence " << s;
    KILN_CHECK_LE(int64_t(b.context_len[s]), int64_t(b.max_blocks_per_seq) * block_size)
        << op << ": batch.context_len of sequence " << s << " vs its block table";
    const int32_t n_blocks_used = (b.context_len[s] + b.block_size - 1) / b.block_size;
    for (int32_t i = 0; i < n_blocks_used; ++i) {
      const int32_t blk = b.block_table[size_t(s) * b.max_blocks_per_seq + i];
      KILN_CHECK(blk >= 0 && blk < n_blocks)
          << op << ": block " << blk << " of sequence " << s << " outside cache of " << n_blocks;
    }
    for (int32_t t = b.q_start[s]; t < b.q_start[s + 1]; ++t) {
      seq_of[t] = s;
      KILN_CHECK(b.positions[t] >= 0 && b.positions[t] < b.context_len[s])
          << op << ": position " << b.positions[t] << " of row " << t << " vs context_len "
          << b.context_len[s] << " of sequence " << s;
    }
  }
  return seq_of;
}

// Slots are in the cache, or kPadSlot (a padding row: nothing is stored).
void check_slots(const ops::BatchMeta& b, int64_t n_slots, const char* op) {
  for (int32_t t = 0; t < b.n_tokens(); ++t) {
    KILN_CHECK(b.slot_mapping[t] == ops::kPadSlot || (b.slot_mapping[t] >= 0 && b.slot_mapping[t] < n_slots))
        << op << ": slot " << b.slot_mapping[t] << " of row " << t << " outside cache of "
        << n_slots << " slots";
  }
}

// ---- the cache's storage ----------------------------------------------------------

// A paged cache tensor [n_blocks, block_size, ...] with slots of `row` values: f32, or
// e4m3 with `scale` [n_blocks, block_size, n_scales] f32 (one scale per quantized row).
struct PagedCache {
  Tensor data, scale;
  int64_t row = 0, n_scales = 0;
  bool fp8() const { return data.dtype == DType::kF8E4M3; }
};

// Checks a cache and its scales (present exactly for an e4m3 cache) and describes them.
PagedCache check_cache(const Tensor& cache, const Tensor& scale, int rank, int64_t n_scales, const char* what) {
  KILN_CHECK(cache.defined()) << "cpu backend: " << what << " is undefined";
  PagedCache c{.data = cache, .scale = scale, .row = 1, .n_scales = n_scales};
  if (cache.dtype != DType::kF8E4M3) {
    check_activation(cache, what, rank);
    KILN_CHECK(!scale.defined()) << "cpu backend: " << what << " is " << dtype_name(cache.dtype)
                                 << " but has scales (only an e4m3 cache has them)";
  } else {
    KILN_CHECK(cache.device == Device::kHost) << "cpu backend: " << what << " is not in host memory";
    KILN_CHECK_EQ(cache.rank(), rank) << "cpu backend: rank of " << what << " " << cache.shape;
    KILN_CHECK(scale.defined() && scale.device == Device::kHost && scale.dtype == DType::kF32)
        << "cpu backend: the e4m3 " << what << " needs f32 host scales";
    KILN_CHECK(scale.rank() == 3 && scale.dim(0) == cache.dim(0) && scale.dim(1) == cache.dim(1) &&
               scale.dim(2) == n_scales)
        << "cpu backend: scales of " << what << " " << scale.shape << " vs cache " << cache.shape << " and "
        << n_scales << " scales per slot";
  }
  for (int d = 2; d < rank; ++d) c.row *= cache.dim(d);
  return c;
}

// e4m3 code -> value (fp8_e4m3_to_f32), once per code.
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = fp8_e4m3_to_f32(uint8_t(c));
    return t;
  }();
  return table;
}

// Stores x[0, n) at values [begin, begin + n) of a slot: copied, or quantized as one
// row with scale number scale_index (ops/kv_quant.h).
void store_values(const PagedCache& c, int64_t slot, int64_t begin, const float* x, int64_t n, int64_t scale_index) {
  if (!c.fp8()) {
    std::memcpy(c.data.as<float>() + slot * c.row + begin, x, size_t(n) * sizeof(float));
    return;
  }
  c.scale.as<float>()[slot * c.n_scales + scale_index] =
      ops::kv_quantize_row(x, n, c.data.as<uint8_t>() + slot * c.row + begin);
}

// Values [begin, begin + n) of a slot as fp32: a view of an f32 cache, or an e4m3 row
// (scale number scale_index) dequantized into buf.
const float* load_values(const PagedCache& c, int64_t slot, int64_t begin, int64_t n, int64_t scale_index,
                         float* buf) {
  if (!c.fp8()) return c.data.as<float>() + slot * c.row + begin;
  const std::array<float, 256>& value = e4m3_values();
  const uint8_t* codes = c.data.as<uint8_t>() + slot * c.row + begin;
  const float scale = c.scale.as<float>()[slot * c.n_scales + scale_index];
  for (int64_t i = 0; i < n; ++i) buf[i] = value[codes[i]] * scale;  // = ops::kv_dequantize
  return buf;
}

// In place: scores[j] <- softmax weight of j. With a sink, the denominator also
// has exp(sink - max), where max includes the sink.
void softmax_in_place(std::vector<float>& scores, int64_t n, bool has_sink, float sink) {
  float m = has_sink ? sink : -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, scores[j]);
  float denom = has_sink ? std::exp(sink - m) : 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - m);
    denom += scores[j];
  }
  for (int64_t j = 0; j < n; ++j) scores[j] /= denom;
}

}  // namespace

// ---- kv_store -----------------------------------------------------------------

// k_cache[slot_mapping[t]] = k[t], v_cache[slot_mapping[t]] = v[t] (an e4m3 cache:
// each kv head's row quantized with its own scale).
void CpuBackend::kv_store(const ops::KvStoreArgs& a) {
  check_activation(a.k, "kv_store k", 3);
  check_activation(a.v, "kv_store v", 3);
  const int64_t n_kv_heads = a.k.dim(1), d_head = a.k.dim(2);
  const PagedCache kc = check_cache(a.k_cache, a.k_scale, 4, n_kv_heads, "kv_store k_cache");
  const PagedCache vc = check_cache(a.v_cache, a.v_scale, 4, n_kv_heads, "kv_store v_cache");
  KILN_CHECK_EQ(a.v.shape, a.k.shape) << "kv_store: v.shape vs k.shape";
  KILN_CHECK_EQ(a.v_cache.shape, a.k_cache.shape) << "kv_store: v_cache.shape vs k_cache.shape";
  KILN_CHECK(a.v_cache.dtype == a.k_cache.dtype) << "kv_store: v_cache vs k_cache dtype";
  KILN_CHECK_EQ(a.k_cache.dim(2), n_kv_heads) << "kv_store: k_cache.dim(2) vs k.dim(1) (n_kv_heads)";
  KILN_CHECK_EQ(a.k_cache.dim(3), d_head) << "kv_store: k_cache.dim(3) vs k.dim(2) (d_head)";
  KILN_CHECK(a.batch != nullptr) << "kv_store: batch is null";
  KILN_CHECK_EQ(int64_t(a.batch->n_tokens()), a.k.dim(0)) << "kv_store: batch.n_tokens() vs k.dim(0)";
  KILN_CHECK_EQ(int64_t(a.batch->block_size), a.k_cache.dim(1))
      << "kv_store: batch.block_size vs k_cache.dim(1)";
  check_slots(*a.batch, a.k_cache.dim(0) * a.k_cache.dim(1), "kv_store");
  for (int64_t t = 0; t < a.k.dim(0); ++t) {
    const int64_t slot = a.batch->slot_mapping[t];
    if (slot == ops::kPadSlot) continue;
    for (int64_t h = 0; h < n_kv_heads; ++h) {
      const int64_t at = (t * n_kv_heads + h) * d_head;
      store_values(kc, slot, h * d_head, a.k.as<float>() + at, d_head, h);
      store_values(vc, slot, h * d_head, a.v.as<float>() + at, d_head, h);
    }
  }
}

// ---- attention ------------------------------------------------------------------

// out[t, h] = sum_j softmax_j(scale * q[t, h] . k_j) v_j over cached positions
// j in [lo, p] of the token's sequence, p = positions[t],
// lo = max(0, p - sliding_window + 1) with a window, else 0.
void CpuBackend::attention(const ops::AttentionArgs& a) {
  check_activation(a.q, "attention q", 3);
  check_activation(a.out, "attention out", 3);
  KILN_CHECK(a.k_cache.defined() && a.k_cache.rank() == 4) << "attention: k_cache " << a.k_cache.shape;
  const int64_t n_tokens = a.q.dim(0), n_heads = a.q.dim(1), d_head = a.q.dim(2);
  const int64_t n_kv_heads = a.k_cache.dim(2);
  const PagedCache kc = check_cache(a.k_cache, a.k_scale, 4, n_kv_heads, "attention k_cache");
  const PagedCache vc = check_cache(a.v_cache, a.v_scale, 4, n_kv_heads, "attention v_cache");
  KILN_CHECK_EQ(a.out.shape, a.q.shape) << "attention: out.shape vs q.shape";
  KILN_CHECK_EQ(a.v_cache.shape, a.k_cache.shape) << "attention: v_cache.shape vs k_cache.shape";
  KILN_CHECK(a.v_cache.dtype == a.k_cache.dtype) << "attention: v_cache vs k_cache dtype";
  KILN_CHECK_EQ(a.k_cache.dim(3), d_head) << "attention: k_cache.dim(3) vs q.dim(2) (d_head)";
  KILN_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0)
      << "attention: n_heads " << n_heads << " not a multiple of n_kv_heads " << n_kv_heads;
  const bool has_sinks = a.sinks.defined();
  if (has_sinks) {
    check_float_dtype(a.sinks, "attention sinks");
    KILN_CHECK_EQ(a.sinks.numel(), n_heads) << "attention: sinks.numel() vs q.dim(1) (n_heads)";
  }
  KILN_CHECK_GE(a.sliding_window, 0) << "attention: sliding_window";
  const std::vector<int32_t> seq_of =
      check_batch(a.batch, n_tokens, a.k_cache.dim(0), a.k_cache.dim(1), "attention");
  const ops::BatchMeta& b = *a.batch;
  const int64_t group = n_heads / n_kv_heads;
  const float* q = a.q.as<float>();
  float* out = a.out.as<float>();

  pool_.parallel_for(n_tokens * n_heads, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores, buf(static_cast<size_t>(d_head));
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t t = w / n_heads, h = w % n_heads, kvh = h / group;
      const int32_t s = seq_of[t], p = b.positions[t];
      const int32_t lo = a.sliding_window > 0 ? std::max(0, p - a.sliding_window + 1) : 0;
      const int64_t n = p - lo + 1;
      const float* qv = q + (t * n_heads + h) * d_head;
      scores.assign(size_t(n), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float* kv = load_values(kc, b.slot(s, lo + int32_t(j)), kvh * d_head, d_head, kvh, buf.data());
        float dot = 0.0f;
        for (int64_t d = 0; d < d_head; ++d) dot += qv[d] * kv[d];
        scores[j] = a.scale * dot;
      }
      softmax_in_place(scores, n, has_sinks, has_sinks ? load_f32(a.sinks, h) : 0.0f);
      float* o = out + (t * n_heads + h) * d_head;
      for (int64_t d = 0; d < d_head; ++d) o[d] = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float* vv = load_values(vc, b.slot(s, lo + int32_t(j)), kvh * d_head, d_head, kvh, buf.data());
        for (int64_t d = 0; d < d_head; ++d) o[d] += scores[j] * vv[d];
      }
    }
  });
  round_output(a.out);
}

// ---- MLA ----------------------------------------------------------------------

// latent_cache[slot_mapping[t]] = concat(kv_latent[t], k_rope[t]) (an e4m3 cache: the
// latent and the rope part quantized as two rows, scales 0 and 1 of the slot).
void CpuBackend::mla_store(const ops::MlaStoreArgs& a) {
  check_activation(a.kv_latent, "mla_store kv_latent", 2);
  check_activation(a.k_rope, "mla_store k_rope", 2);
  const PagedCache cache = check_cache(a.latent_cache, a.latent_scale, 3, 2, "mla_store latent_cache");
  const int64_t n_tokens = a.kv_latent.dim(0), d_latent = a.kv_latent.dim(1);
  const int64_t d_rope = a.k_rope.dim(1);
  KILN_CHECK_EQ(a.k_rope.dim(0), n_tokens) << "mla_store: k_rope.dim(0) vs kv_latent.dim(0)";
  KILN_CHECK_EQ(a.latent_cache.dim(2), d_latent + d_rope)
      << "mla_store: latent_cache.dim(2) vs d_latent + d_rope";
  KILN_CHECK(a.batch != nullptr) << "mla_store: batch is null";
  KILN_CHECK_EQ(int64_t(a.batch->n_tokens()), n_tokens) << "mla_store: batch.n_tokens() vs kv_latent.dim(0)";
  KILN_CHECK_EQ(int64_t(a.batch->block_size), a.latent_cache.dim(1))
      << "mla_store: batch.block_size vs latent_cache.dim(1)";
  check_slots(*a.batch, a.latent_cache.dim(0) * a.latent_cache.dim(1), "mla_store");
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t slot = a.batch->slot_mapping[t];
    if (slot == ops::kPadSlot) continue;
    store_values(cache, slot, 0, a.kv_latent.as<float>() + t * d_latent, d_latent, 0);
    store_values(cache, slot, d_latent, a.k_rope.as<float>() + t * d_rope, d_rope, 1);
  }
}

// Absorbed form, per query token t and head h (c_j, r_j: latent and rope parts
// of cached position j; j over all positions <= p, or over the DSA selection in its order):
//   q_lat = W_uk[h]^T q_nope[t, h]                               [d_latent]
//   p_j = softmax_j(scale * (q_lat . c_j + q_rope[t, h] . r_j))
//   out[t, h] = W_uv[h] (sum_j p_j c_j)                          [d_v]
// which equals attention with k_j = concat(W_uk[h] c_j, r_j), v_j = W_uv[h] c_j.
void CpuBackend::mla_attention(const ops::MlaArgs& a) {
  check_activation(a.q_nope, "mla_attention q_nope", 3);
  check_activation(a.q_rope, "mla_attention q_rope", 3);
  const PagedCache cache = check_cache(a.latent_cache, a.latent_scale, 3, 2, "mla_attention latent_cache");
  check_activation(a.out, "mla_attention out", 3);
  KILN_CHECK(a.kv_b != nullptr) << "mla_attention: kv_b is null";
  check_weight(*a.kv_b, "mla_attention kv_b");
  // A kv_b bias would shift every key by a constant (cancels in softmax) and add
  // W_uv's bias to out; no MLA checkpoint has one, so it is not part of the contract.
  KILN_CHECK(!a.kv_b->bias.defined()) << "mla_attention: kv_b with a bias is not supported";
  const int64_t n_tokens = a.q_nope.dim(0), n_heads = a.q_nope.dim(1);
  const int64_t d_nope = a.q_nope.dim(2), d_rope = a.q_rope.dim(2), d_v = a.out.dim(2);
  const int64_t d_latent = a.latent_cache.dim(2) - d_rope;
  KILN_CHECK_EQ(a.q_rope.dim(0), n_tokens) << "mla_attention: q_rope.dim(0) vs q_nope.dim(0)";
  KILN_CHECK_EQ(a.q_rope.dim(1), n_heads) << "mla_attention: q_rope.dim(1) vs q_nope.dim(1)";
  KILN_CHECK_EQ(a.out.dim(0), n_tokens) << "mla_attention: out.dim(0) vs q_nope.dim(0)";
  KILN_CHECK_EQ(a.out.dim(1), n_heads) << "mla_attention: out.dim(1) vs q_nope.dim(1)";
  KILN_CHECK_GT(d_latent, 0) << "mla_attention: latent_cache.dim(2) vs q_rope.dim(2)";
  KILN_CHECK_EQ(a.kv_b->n_in(), d_latent) << "mla_attention: kv_b.n_in() vs d_latent";
  KILN_CHECK_EQ(a.kv_b->n_out(), n_heads * (d_nope + d_v))
      << "mla_attention: kv_b.n_out() vs n_heads * (d_nope + d_v)";
  const std::vector<int32_t> seq_of = check_batch(a.batch, n_tokens, a.latent_cache.dim(0),
                                                  a.latent_cache.dim(1), "mla_attention");
  const ops::BatchMeta& b = *a.batch;
  const ops::Weight& kv_b = *a.kv_b;
  const int32_t* sel = nullptr;
  int64_t top_k = 0;
  if (a.selected.defined()) {
    KILN_CHECK(a.selected.dtype == DType::kI32 && a.selected.device == Device::kHost && a.selected.rank() == 2 &&
               a.selected.dim(0) == n_tokens)
        << "mla_attention: selected must be host i32 [n_tokens, top_k], got " << dtype_name(a.selected.dtype) << " "
        << a.selected.shape;
    sel = a.selected.as<int32_t>();
    top_k = a.selected.dim(1);
  }

  pool_.parallel_for(n_tokens * n_heads, [&](int64_t w0, int64_t w1) {
    std::vector<float> q_lat(d_latent), o_lat(d_latent), uk(d_latent), scores, buf(size_t(d_latent + d_rope));
    std::vector<int32_t> cols;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t t = w / n_heads, h = w % n_heads;
      const int64_t uk_row = h * (d_nope + d_v);  // W_uk[h] = kv_b rows [uk_row, +d_nope)
      const int64_t uv_row = uk_row + d_nope;     // W_uv[h] = kv_b rows [uv_row, +d_v)
      const float* qn = a.q_nope.as<float>() + (t * n_heads + h) * d_nope;
      const float* qr = a.q_rope.as<float>() + (t * n_heads + h) * d_rope;
      // q_lat[c] = sum_d q_nope[d] W_uk[h][d, c], ascending d.
      std::fill(q_lat.begin(), q_lat.end(), 0.0f);
      for (int64_t d = 0; d < d_nope; ++d) {
        weight_row(kv_b, uk_row + d, uk.data(), bf16_activations_);
        for (int64_t c = 0; c < d_latent; ++c) q_lat[c] += qn[d] * uk[c];
      }

      const int32_t s = seq_of[t], p = b.positions[t];
      // The attended positions: all j <= p, or the indexer's selection (DSA).
      cols.clear();
      if (sel != nullptr) {
        for (int64_t i = 0; i < top_k; ++i) {
          const int32_t j = sel[t * top_k + i];
          if (j < 0) continue;
          KILN_CHECK(j <= p) << "mla_attention: row " << t << " selects position " << j << " past its own " << p;
          cols.push_back(j);
        }
      } else {
        for (int32_t j = 0; j <= p; ++j) cols.push_back(j);
      }
      const int64_t n = int64_t(cols.size());
      scores.assign(size_t(n), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t slot = b.slot(s, cols[size_t(j)]);
        const float* cj = load_values(cache, slot, 0, d_latent, 0, buf.data());
        const float* rj = load_values(cache, slot, d_latent, d_rope, 1, buf.data() + d_latent);
        float dot = 0.0f;
        for (int64_t c = 0; c < d_latent; ++c) dot += q_lat[c] * cj[c];
        for (int64_t r = 0; r < d_rope; ++r) dot += qr[r] * rj[r];
        scores[j] = a.scale * dot;
      }
      softmax_in_place(scores, n, false, 0.0f);
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float* cj = load_values(cache, b.slot(s, cols[size_t(j)]), 0, d_latent, 0, buf.data());
        for (int64_t c = 0; c < d_latent; ++c) o_lat[c] += scores[j] * cj[c];
      }
      float* o = a.out.as<float>() + (t * n_heads + h) * d_v;
      matvec(kv_b, o_lat.data(), o, uv_row, uv_row + d_v, {.bf16_tiles = bf16_activations_});  // bf16 on the GPU
    }
  });
  round_output(a.out);
}

// ---- DeepSeek sparse attention: the indexer cache and top-k ------------------------

namespace {

// The index cache as a PagedCache: one row of d_index per slot, one scale per slot (the
// [n_blocks, block_size] scales viewed as [n_blocks, block_size, 1]).
PagedCache check_index_cache(const Tensor& cache, const Tensor& scale, const char* what) {
  Tensor s = scale;
  if (s.defined()) {
    KILN_CHECK_EQ(s.rank(), 2) << "cpu backend: scales of " << what << " " << s.shape;
    s = s.reshape({s.dim(0), s.dim(1), 1});
  }
  return check_cache(cache, s, 3, 1, what);
}

}  // namespace

// index_cache[slot_mapping[t]] = k[t] (an e4m3 cache: one row, one scale).
void CpuBackend::dsa_index_store(const ops::DsaIndexStoreArgs& a) {
  check_activation(a.k, "dsa_index_store k", 2);
  const PagedCache cache = check_index_cache(a.index_cache, a.index_scale, "dsa_index_store index_cache");
  const int64_t n_tokens = a.k.dim(0), d_index = a.k.dim(1);
  KILN_CHECK_EQ(a.index_cache.dim(2), d_index) << "dsa_index_store: index_cache.dim(2) vs k.dim(1) (d_index)";
  KILN_CHECK(a.batch != nullptr) << "dsa_index_store: batch is null";
  KILN_CHECK_EQ(int64_t(a.batch->n_tokens()), n_tokens) << "dsa_index_store: batch.n_tokens() vs k.dim(0)";
  KILN_CHECK_EQ(int64_t(a.batch->block_size), a.index_cache.dim(1))
      << "dsa_index_store: batch.block_size vs index_cache.dim(1)";
  check_slots(*a.batch, a.index_cache.dim(0) * a.index_cache.dim(1), "dsa_index_store");
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t slot = a.batch->slot_mapping[t];
    if (slot == ops::kPadSlot) continue;
    store_values(cache, slot, 0, a.k.as<float>() + t * d_index, d_index, 0);
  }
}

// Per query token: score[j] = sum_h w[h] * weight_scale * relu(scale * q[h] . k_j) over
// j <= p (fp32, heads ascending, d ascending), then the top_k by (score descending,
// position ascending), listed in ascending position order.
void CpuBackend::dsa_select(const ops::DsaSelectArgs& a) {
  check_activation(a.q, "dsa_select q", 3);
  check_activation(a.weights, "dsa_select weights", 2);
  const PagedCache cache = check_index_cache(a.index_cache, a.index_scale, "dsa_select index_cache");
  const int64_t n_tokens = a.q.dim(0), n_heads = a.q.dim(1), d_index = a.q.dim(2);
  KILN_CHECK_EQ(a.index_cache.dim(2), d_index) << "dsa_select: index_cache.dim(2) vs q.dim(2) (d_index)";
  KILN_CHECK(a.weights.dim(0) == n_tokens && a.weights.dim(1) == n_heads)
      << "dsa_select: weights " << a.weights.shape << " vs q " << a.q.shape;
  KILN_CHECK(a.selected.defined() && a.selected.dtype == DType::kI32 && a.selected.device == Device::kHost &&
             a.selected.rank() == 2 && a.selected.dim(0) == n_tokens && a.selected.dim(1) > 0)
      << "dsa_select: selected must be host i32 [n_tokens, top_k], got " << dtype_name(a.selected.dtype) << " "
      << a.selected.shape;
  const std::vector<int32_t> seq_of = check_batch(a.batch, n_tokens, a.index_cache.dim(0),
                                                  a.index_cache.dim(1), "dsa_select");
  const ops::BatchMeta& b = *a.batch;
  const int64_t top_k = a.selected.dim(1);
  const float* q = a.q.as<float>();
  const float* wts = a.weights.as<float>();
  int32_t* sel = a.selected.as<int32_t>();

  pool_.parallel_for(n_tokens, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores, buf(static_cast<size_t>(d_index));
    std::vector<int32_t> order;
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t s = seq_of[t], p = b.positions[t];
      const int64_t n = int64_t(p) + 1;
      int32_t* row = sel + t * top_k;
      std::fill(row, row + top_k, -1);
      if (n <= top_k) {  // every position fits: dense
        for (int32_t j = 0; j <= p; ++j) row[j] = j;
        continue;
      }
      scores.assign(size_t(n), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = load_values(cache, b.slot(s, int32_t(j)), 0, d_index, 0, buf.data());
        float score = 0.0f;
        for (int64_t h = 0; h < n_heads; ++h) {
          const float* qh = q + (t * n_heads + h) * d_index;
          float dot = 0.0f;
          for (int64_t d = 0; d < d_index; ++d) dot += qh[d] * kj[d];
          score += wts[t * n_heads + h] * a.weight_scale * std::max(a.scale * dot, 0.0f);
        }
        scores[size_t(j)] = score;
      }
      order.resize(size_t(n));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t x, int32_t y) {
        return scores[size_t(x)] != scores[size_t(y)] ? scores[size_t(x)] > scores[size_t(y)] : x < y;
      });
      order.resize(size_t(top_k));
      std::sort(order.begin(), order.end());
      std::copy(order.begin(), order.end(), row);  // the rest of the row stays -1
    }
  });
}

}  // namespace kiln::cpu
