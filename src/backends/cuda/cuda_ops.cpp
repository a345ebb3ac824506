// CudaBackend's ops: argument checks at entry, then the kernels of kernels/.
#include "backends/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace kiln::cuda {
namespace {

// Rows per MoE GEMV tile: the next power of two from twice the mean rows a routed expert
// receives (n_pairs over the experts expected to be hit, routing taken as uniform), at
// most max_rows. A tile's CTA stages max_rows activation rows in shared memory whatever
// its expert receives, which bounds the CTAs per SM; tiles of 8 rows for experts of one
// or two tokens cost gpt-oss-120b MXFP4 / FP8 9-14% at 8 and 32 tokens on the H100
// (kiln bench op: 283 -> 258 us, 717 -> 617), and fewer rows than twice the mean re-stream
// experts that receive more (Qwen3-30B-A3B at 32 tokens, 2.3 rows per expert: 175 us with 8,
// 202 with 2).
// Then the CTAs: 16 warps per SM (the 4-bit instances' registers allow no more), as 4
// CTAs of 4 warps or, where their staged rows do not fit 4 times (an SM120 SM's 100 KB,
// emulated on the H100 by KILN_SM_SMEM_CAP=102400), 2 of 8 (quant_gemv_moe_warps). Where
// routed experts average under 2 rows, tiles are first cut to 4-warp CTAs if a tile that
// still holds the mean fits them: the cut tiles rarely re-stream an expert, and the 8-warp
// CTAs over the uncut rows measured 2-4% slower there (gpt-oss-120b MXFP4 at 8 / 32 tokens,
// 177.7 / 434.5 us per layer against 181.9 / 449.8). Otherwise the rows stay, cut only to
// fit 8-warp CTAs: against 4-warp CTAs over cut tiles, gpt-oss-20b at 32 tokens (4 rows per
// routed expert) 250 -> 201 us, Qwen3-30B-A3B at 64 tokens 188 -> 165, the DeepSeek-like
// shape at 8 / 32 tokens (3-row tiles of 7168 inputs, cut to 2 rows at 3 CTAs per SM) 491
// / 1520 -> 443 / 1308 (docs/perf/quantized-moe-decode.md, eleventh pass). On the H100's
// 228 KB every tile keeps its rows in 4-warp CTAs.
int moe_gemv_tile_rows(int64_t n_pairs, int n_experts, int max_rows, int64_t n_in) {
  const double hit = double(n_experts) * (1.0 - std::pow(1.0 - 1.0 / double(n_experts), double(n_pairs)));
  const double mean = double(n_pairs) / std::max(1.0, hit);
  int rows = 1;
  while (rows < max_rows && rows < 2.0 * mean) rows *= 2;
  rows = std::max(1, std::min(rows, max_rows));
  if (mean < 2.0) {
    int cut = rows;
    while (cut > 1 && cut - 1 >= mean && quant_gemv_moe_warps(cut, n_in) != 4) --cut;
    if (quant_gemv_moe_warps(cut, n_in) == 4) return cut;
  }
  while (rows > 1 && quant_gemv_moe_warps(rows, n_in) == 0) --rows;
  return rows;
}

void check_act(const Tensor& t, const char* what) {
  KILN_CHECK(t.defined() && t.device == Device::kCuda && t.dtype == DType::kBF16)
      << "cuda: " << what << " must be a bf16 device tensor (dtype " << dtype_name(t.dtype) << ")";
}

bool same_format(const QuantFormat& a, const QuantFormat& b) {
  return a.value == b.value && a.scale_kind == b.scale_kind && a.scale_bytes == b.scale_bytes && a.group == b.group;
}

const float* vec_or_null(const Tensor& t, const char* what) {
  if (!t.defined()) return nullptr;
  KILN_CHECK(t.device == Device::kCuda && t.dtype == DType::kF32) << "cuda: " << what << " must be an fp32 vector";
  return t.as<float>();
}

// A paged cache tensor: bf16 without scales, or e4m3 with its fp32 scales
// [n_blocks, block_size, n_scales]. Returns whether it is e4m3.
bool check_cache(const Tensor& cache, const Tensor& scale, int64_t n_scales, const char* what) {
  KILN_CHECK(cache.defined() && cache.device == Device::kCuda &&
             (cache.dtype == DType::kBF16 || cache.dtype == DType::kF8E4M3))
      << "cuda: " << what << " must be a bf16 or e4m3 device tensor (dtype " << dtype_name(cache.dtype) << ")";
  const bool fp8 = cache.dtype == DType::kF8E4M3;
  if (!fp8) {
    KILN_CHECK(!scale.defined()) << "cuda: bf16 " << what << " with scales (only an e4m3 cache has them)";
    return false;
  }
  KILN_CHECK(scale.defined() && scale.device == Device::kCuda && scale.dtype == DType::kF32 && scale.rank() == 3 &&
             scale.dim(0) == cache.dim(0) && scale.dim(1) == cache.dim(1) && scale.dim(2) == n_scales)
      << "cuda: e4m3 " << what << " " << cache.shape << " needs f32 scales [" << cache.dim(0) << ", " << cache.dim(1)
      << ", " << n_scales << "] (got " << scale.shape << ")";
  return true;
}

// The local experts' shapes against d_model and d_ff (a d_ff slice under tensor
// parallelism), one storage kind and quantized format for all, bias sizes.
void check_experts(const ops::MoeExperts& ex, int64_t d_model) {
  const int64_t d_ff = ex.d_ff;
  const bool fused = !ex.gate_up.empty(), quant = ex.down[0].quantized();
  const auto check = [&](const ops::Weight& w, const char* what, int64_t e, int64_t n_out, int64_t n_in) {
    KILN_CHECK(w.defined() && w.quantized() == quant)
        << "moe: " << what << " of local expert " << e << (quant ? " not quantized" : " quantized")
        << " unlike down of local expert 0";
    KILN_CHECK(w.n_out() == n_out && w.n_in() == n_in)
        << "moe: " << what << " of local expert " << e << " is [" << w.n_out() << ", " << w.n_in() << "], expected ["
        << n_out << ", " << n_in << "] (d_model " << d_model << ", d_ff " << d_ff << ")";
    KILN_CHECK(!w.bias.defined() || w.bias.numel() == n_out)
        << "moe: " << what << " bias of local expert " << e << " has " << w.bias.numel() << " values, expected "
        << n_out;
    if (quant) {
      const QuantFormat f = quant_format(w.quant), f0 = quant_format(ex.down[0].quant);
      KILN_CHECK(f.value == f0.value && f.scale_kind == f0.scale_kind && f.group == f0.group)
          << "moe: " << what << " of local expert " << e << " in another quantized format than down of expert 0";
    } else {
      KILN_CHECK(w.data.dtype == DType::kBF16 && w.transposed == ex.down[0].transposed)
          << "moe: " << what << " of local expert " << e << " must be bf16, stored like down of expert 0";
    }
  };
  for (int64_t e = 0; e < int64_t(ex.down.size()); ++e) {
    if (fused) {
      check(ex.gate_up[size_t(e)], "gate_up", e, 2 * d_ff, d_model);
    } else {
      check(ex.gate[size_t(e)], "gate", e, d_ff, d_model);
      check(ex.up[size_t(e)], "up", e, d_ff, d_model);
    }
    check(ex.down[size_t(e)], "down", e, d_model, d_ff);
  }
}

}  // namespace

Status CudaBackend::supports_kv_cache(DType dtype) const {
  if (dtype == DType::kBF16 || dtype == DType::kF8E4M3) return Status::Ok();
  return ops::Backend::supports_kv_cache(dtype);
}

void CudaBackend::embedding(const ops::EmbeddingArgs& a) {
  const ScratchScope scratch_scope(op_scratch_);
  check_act(a.table, "embedding table");
  check_act(a.out, "embedding out");
  KILN_CHECK_EQ(a.out.dim(1), a.table.dim(1)) << "embedding: out.dim(1) vs table.dim(1)";
  const int64_t rows = a.table.dim(0), vocab = a.vocab_size > 0 ? a.vocab_size : rows;
  KILN_CHECK(a.id_begin >= 0 && a.id_begin + rows <= vocab)
      << "embedding: table rows [" << a.id_begin << ", " << a.id_begin + rows << ") of vocab " << vocab;
  if (a.from_batch == ops::BatchIds::kNone && a.ids.device == Device::kCuda) {  // ids made here (argmax)
    KILN_CHECK(a.ids.dtype == DType::kI32 && a.ids.rank() == 1 && a.ids.dim(0) == a.out.dim(0))
        << "embedding: device ids " << dtype_name(a.ids.dtype) << " " << a.ids.shape << " for " << a.out.dim(0) << " rows";
    launch_embedding(a.table.as<bf16>(), a.ids.as<int32_t>(), a.out.dim(0), a.table.dim(1), a.id_begin, rows,
                     a.out.as<bf16>(), stream_);
    return;
  }
  const std::span<const int32_t> host = ops::embedding_ids(a);
  KILN_CHECK_EQ(a.out.dim(0), int64_t(host.size())) << "embedding: out.dim(0) vs the number of ids";
  for (size_t i = 0; i < host.size(); ++i)
    KILN_CHECK(host[i] >= 0 && host[i] < vocab)
        << "embedding: id " << host[i] << " at row " << i << " outside [0, " << vocab << ")";
  const int32_t* ids = nullptr;
  if (a.from_batch == ops::BatchIds::kNone) {
    ids = device_ids(a.ids, op_scratch_);
  } else {
    KILN_CHECK(a.batch == host_batch_) << "embedding: ids from a batch other than the step's";
    ids = a.from_batch == ops::BatchIds::kTokens      ? batch_.token_ids
          : a.from_batch == ops::BatchIds::kLogitRows ? batch_.logit_rows
                                                      : batch_.input_rows;
  }
  launch_embedding(a.table.as<bf16>(), ids, int64_t(host.size()), a.table.dim(1), a.id_begin, rows,
                   a.out.as<bf16>(), stream_);
}

void CudaBackend::rms_norm(const ops::RmsNormArgs& a) {
  check_act(a.x, "rms_norm x");
  check_act(a.out, "rms_norm out");
  KILN_CHECK_EQ(a.weight.numel(), a.x.dim(1)) << "rms_norm: weight size vs x.dim(1)";
  bf16* residual = nullptr;
  if (a.residual.defined()) {
    check_act(a.residual, "rms_norm residual");
    residual = a.residual.as<bf16>();
  }
  launch_rms_norm(a.x.as<bf16>(), residual, vec_or_null(a.weight, "rms_norm weight"), a.out.as<bf16>(), a.x.dim(0),
                  a.x.dim(1), a.eps, stream_);
}

std::optional<CudaBackend::GemvLinear> CudaBackend::gemv_linear(const ops::LinearArgs& a) const {
  const ops::Weight& w = *a.w;
  const int64_t rows = a.x.dim(0);
  if (rows < 1 || rows > quant_gemv_max_rows(w.n_in())) return std::nullopt;
  GemvLinear g{.part = {.n_out = w.n_out(), .out = a.out.as<bf16>()}};
  if (w.quantized()) {
    g.format = quant_format(w.quant);
    g.part.w = quant_mat(w.quant);
  } else if (bf16_gemv_weight(w) && w.data.dtype == DType::kBF16 &&
             reinterpret_cast<uintptr_t>(w.data.data) % 16 == 0 && (!w.bias.defined() || w.bias.dtype == DType::kF32)) {
    // Batch 1-8 over a row-major bf16 weight: the streaming GEMV (quant_gemv.cu). The
    // largest weights (an lm_head) stay on cuBLASLt, which streams those near bandwidth.
    g.format = kBf16GemvFormat;
    g.part.w = QuantMat{.codes = w.data.as<uint8_t>()};
  } else {
    return std::nullopt;
  }
  g.part.bias = vec_or_null(w.bias, "linear bias");
  return g;
}

void CudaBackend::linear(const ops::LinearArgs& a) {
  const ScratchScope scratch_scope(op_scratch_);
  check_act(a.x, "linear x");
  check_act(a.out, "linear out");
  const ops::Weight& w = *a.w;
  KILN_CHECK(a.x.dim(1) == w.n_in() && a.out.dim(1) == w.n_out() && a.out.dim(0) == a.x.dim(0))
      << "linear: x " << a.x.shape << ", out " << a.out.shape << " vs weight [" << w.n_out() << ", " << w.n_in() << "]";
  if (w.quantized()) {
    KILN_CHECK_LE(quant_gemm_smem_bytes(), smem_cap_) << "linear: the quantized GEMMs' shared memory vs --smem-cap";
  }
  const int64_t rows = a.x.dim(0);
  if (rows == 0) return;
  if (const std::optional<GemvLinear> g = gemv_linear(a)) {
    launch_quant_gemv_linears(a.x.as<bf16>(), &g->part, 1, g->format, rows, w.n_in(), stream_);
  } else if (!w.quantized()) {
    Tensor out = a.out;
    gemm(a.x, w, out);
  } else if (const int64_t pass = gemv_pass_rows(w, rows); pass > 0) {
    for (int64_t r0 = 0; r0 < rows; r0 += pass) {
      const GemvPart part{.w = quant_mat(w.quant), .bias = vec_or_null(w.bias, "linear bias"), .n_out = w.n_out(),
                          .out = a.out.as<bf16>() + r0 * w.n_out()};
      launch_quant_gemv_linears(a.x.as<bf16>() + r0 * w.n_in(), &part, 1, quant_format(w.quant),
                                std::min(pass, rows - r0), w.n_in(), stream_);
    }
  } else if (!quant_gemm_decode_rows(rows) && use_w8a8(quant_format(w.quant))) {
    void* act_q = scratch<uint8_t>(int64_t(quant_w8a8_act_bytes(rows, w.n_in())), op_scratch_);
    launch_quant_linear_w8a8(a.x.as<bf16>(), quant_mat(w.quant), quant_format(w.quant),
                             vec_or_null(w.bias, "linear bias"), rows, w.n_out(), w.n_in(), a.out.as<bf16>(), act_q,
                             stream_);
  } else {
    const QuantFormat f = quant_format(w.quant);
    const int splits = quant_linear_k_splits(rows, w.n_out(), w.n_in(), f);
    float* partial = splits > 1 ? scratch<float>(int64_t(splits) * rows * w.n_out(), op_scratch_) : nullptr;
    launch_quant_linear(a.x.as<bf16>(), quant_mat(w.quant), f, vec_or_null(w.bias, "linear bias"), rows, w.n_out(),
                        w.n_in(), a.out.as<bf16>(), stream_, splits, partial);
  }
}

// Linears of one input that all take the GEMV in one format run as one launch (a decode
// layer's q, k and v: k and v alone are 32 CTAs each on gpt-oss); otherwise one by one.
void CudaBackend::linears(const ops::LinearsArgs& a) {
  std::array<GemvPart, kGemvParts> parts{};
  std::optional<QuantFormat> format;
  size_t n = 0;
  bool fused = true;
  for (; n < a.w.size() && a.w[n] != nullptr && fused; ++n) {
    const ops::Weight& w = *a.w[n];
    // A shape mismatch takes the one-by-one path, whose linear says what is wrong.
    const bool shapes = w.n_in() == a.x.dim(1) && a.out[n].dim(0) == a.x.dim(0) && a.out[n].dim(1) == w.n_out();
    const std::optional<GemvLinear> g = shapes ? gemv_linear({.x = a.x, .w = &w, .out = a.out[n]}) : std::nullopt;
    fused = g && (!format || same_format(*format, g->format));
    if (fused) format = g->format, parts[n] = g->part;
  }
  if (!fused || n < 2) {
    if (!adjacent_gemm(a)) ops::Backend::linears(a);
    return;
  }
  check_act(a.x, "linears x");
  for (size_t i = 0; i < n; ++i) check_act(a.out[i], "linears out");
  launch_quant_gemv_linears(a.x.as<bf16>(), parts.data(), int(n), *format, a.x.dim(0), a.x.dim(1), stream_);
}

// Adjacent linears take one GEMM up to kMaxGraphTokens rows (decode and verify steps): the
// split's copy grows with the rows while the launches it saves do not. Qwen3-30B-A3B at 64
// rows, TP2: one GEMM of 6.7 us and the split against 17-18 us for three GEMMs (traced), but
// steps carrying a 2,048-token prefill chunk ran ~2.5% slower with it at TP1 (42.9 against
// 41.9 ms served; docs/perf/multi-gpu.md, twenty-first section).
bool CudaBackend::adjacent_gemm(const ops::LinearsArgs& a) {
  if (!fuse_linears_ || a.x.dim(0) > kMaxGraphTokens) return false;
  std::array<ColumnPart, kMaxColumnParts> parts{};
  size_t n = 0;
  int64_t n_all = 0;
  bool bias = false;
  static_assert(kMaxColumnParts >= std::tuple_size_v<decltype(a.w)>);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  for (; n < a.w.size() && a.w[n] != nullptr; ++n) {
    const ops::Weight& w = *a.w[n];
    if (w.quantized() || w.transposed || w.data.dtype != DType::kBF16 || w.data.device != Device::kCuda ||
        w.n_in() != a.x.dim(1) || a.out[n].dim(0) != a.x.dim(0) || a.out[n].dim(1) != w.n_out() ||
        w.n_out() % 8 != 0 || !aligned(a.out[n].data))
      return false;
    // Views of one allocation (WeightLoader::adjacent_linears), each after the one before: not
    // weights that merely landed next to each other (the weight slab packs them so).
    if (n > 0 && (w.data.owner.get() != a.w[0]->data.owner.get() ||
                  w.data.data != static_cast<const char*>(a.w[n - 1]->data.data) + a.w[n - 1]->data.nbytes()))
      return false;
    parts[n] = {.out = nullptr, .bias = vec_or_null(w.bias, "linears bias"), .n = w.n_out()};
    n_all += w.n_out();
    bias = bias || w.bias.defined();
  }
  if (n < 2) return false;
  const ScratchScope scratch_scope(op_scratch_);
  check_act(a.x, "linears x");
  for (size_t i = 0; i < n; ++i) {
    check_act(a.out[i], "linears out");
    parts[i].out = a.out[i].as<bf16>();
  }
  const int64_t rows = a.x.dim(0), n_in = a.x.dim(1);
  if (rows == 0) return true;
  const auto* w = static_cast<const bf16*>(a.w[0]->data.data);
  void* y = nullptr;
  if (bias) {  // fp32 products: each bias added before the one rounding
    y = scratch<float>(rows * n_all, op_scratch_);
    gemm_f32(a.x.as<bf16>(), w, rows, n_all, n_in, static_cast<float*>(y));
  } else {
    ops::Weight all;
    all.data = a.w[0]->data;
    all.data.shape = Shape{n_all, n_in};
    Tensor out = a.out[0];
    out.data = y = scratch<bf16>(rows * n_all, op_scratch_);
    out.shape = Shape{rows, n_all};
    gemm(a.x, all, out);
  }
  launch_split_columns(y, bias, n_all, parts.data(), int(n), rows, stream_);
  ++adjacent_gemms_;
  return true;
}

void CudaBackend::rope(const ops::RopeArgs& a) {
  check_act(a.x, "rope x");
  const DeviceBatch& b = batch_for(a.batch);
  KILN_CHECK_EQ(a.x.dim(0), int64_t(b.n_tokens)) << "rope: x.dim(0) vs batch tokens";
  launch_rope(a.x.as<bf16>(), a.x.dim(0), a.x.dim(1), a.x.dim(2), rope_table(*a.table), a.table->d_rot,
              a.table->attention_factor, a.table->style == ops::RopeStyle::kInterleaved, b.positions, stream_);
}

namespace {

// kv_store's arguments checked; whether the caches hold e4m3 codes.
bool check_kv_store(const ops::KvStoreArgs& a) {
  check_act(a.k, "kv_store k");
  check_act(a.v, "kv_store v");
  KILN_CHECK(a.k_cache.rank() == 4 && a.v_cache.shape == a.k_cache.shape && a.v_cache.dtype == a.k_cache.dtype &&
             a.k.dim(1) == a.k_cache.dim(2) && a.k.dim(2) == a.k_cache.dim(3) && a.v.shape == a.k.shape)
      << "kv_store: k " << a.k.shape << ", v " << a.v.shape << " vs caches " << a.k_cache.shape << " / "
      << a.v_cache.shape;
  const bool fp8 = check_cache(a.k_cache, a.k_scale, a.k.dim(1), "k_cache");
  check_cache(a.v_cache, a.v_scale, a.k.dim(1), "v_cache");
  return fp8;
}

}  // namespace

void CudaBackend::qk_norm_rope(const ops::QkNormRopeArgs& a) {
  check_act(a.q, "qk_norm_rope q");
  check_act(a.k, "qk_norm_rope k");
  const int64_t d_head = a.q.dim(2);
  const int d_rot = a.table->d_rot;
  if (d_head > kQkNormRopeMaxHead || a.k.dim(2) != d_head || d_rot > d_head || d_rot % 2 != 0) {
    ops::Backend::qk_norm_rope(a);  // the ops one after the other
    return;
  }
  const DeviceBatch& b = batch_for(a.batch);
  // A bf16 cache is written in the same launch; an e4m3 one by kv_store after it.
  QkStore store;
  bool store_after = false;
  if (a.store != nullptr) {
    KILN_CHECK(a.store->k.data == a.k.data && a.store->k.shape == a.k.shape && a.store->batch == a.batch)
        << "qk_norm_rope: store.k must be the k this op rotates, in its batch";
    if (check_kv_store(*a.store)) {
      store_after = true;
    } else {
      store = {.v = a.store->v.as<bf16>(), .k_cache = a.store->k_cache.as<bf16>(),
               .v_cache = a.store->v_cache.as<bf16>(), .slot_mapping = b.slot_mapping};
    }
  }
  KILN_CHECK(a.q.dim(0) == int64_t(b.n_tokens) && a.k.dim(0) == int64_t(b.n_tokens))
      << "qk_norm_rope: q " << a.q.shape << ", k " << a.k.shape << " vs " << b.n_tokens << " batch tokens";
  for (const Tensor* w : {&a.q_norm, &a.k_norm})
    KILN_CHECK(!w->defined() || w->numel() == d_head)
        << "qk_norm_rope: norm weight of " << w->numel() << " for heads of " << d_head;
  launch_qk_norm_rope(a.q.as<bf16>(), a.k.as<bf16>(), vec_or_null(a.q_norm, "q_norm"), vec_or_null(a.k_norm, "k_norm"),
                      a.q.dim(0), int(a.q.dim(1)), int(a.k.dim(1)), int(d_head), a.eps, rope_table(*a.table), d_rot,
                      a.table->attention_factor, a.table->style == ops::RopeStyle::kInterleaved, b.positions, store,
                      stream_);
  if (store_after) kv_store(*a.store);
}

void CudaBackend::kv_store(const ops::KvStoreArgs& a) {
  const DeviceBatch& b = batch_for(a.batch);
  const bool fp8 = check_kv_store(a);
  const int64_t n_kv_heads = a.k.dim(1), d_head = a.k.dim(2), row = n_kv_heads * d_head;
  if (fp8) {  // each (token, kv head) row quantized with its own scale
    launch_store_rows_e4m3(a.k.as<bf16>(), a.k_cache.as<uint8_t>(), a.k_scale.as<float>(), b.slot_mapping,
                           b.n_tokens, int(n_kv_heads), d_head, row, 0, int(n_kv_heads), 0, stream_);
    launch_store_rows_e4m3(a.v.as<bf16>(), a.v_cache.as<uint8_t>(), a.v_scale.as<float>(), b.slot_mapping,
                           b.n_tokens, int(n_kv_heads), d_head, row, 0, int(n_kv_heads), 0, stream_);
    return;
  }
  const StoreRowSet kv[2] = {{.x = a.k.as<bf16>(), .cache = a.k_cache.as<bf16>(), .row_elems = row},
                             {.x = a.v.as<bf16>(), .cache = a.v_cache.as<bf16>(), .row_elems = row}};
  launch_store_rows(kv, 2, b.slot_mapping, b.n_tokens, row, stream_);
}

void CudaBackend::attention(const ops::AttentionArgs& a) {
  const ScratchScope scratch_scope(op_scratch_);
  const DeviceBatch& b = batch_for(a.batch);
  check_act(a.q, "attention q");
  check_act(a.out, "attention out");
  KILN_CHECK(a.k_cache.rank() == 4 && a.v_cache.shape == a.k_cache.shape && a.v_cache.dtype == a.k_cache.dtype &&
             a.k_cache.dim(3) == a.q.dim(2))
      << "attention: q " << a.q.shape << " vs caches " << a.k_cache.shape << " / " << a.v_cache.shape;
  const int n_heads = int(a.q.dim(1)), d_head = int(a.q.dim(2)), n_kv_heads = int(a.k_cache.dim(2));
  KILN_CHECK_EQ(n_heads % n_kv_heads, 0) << "attention: n_heads vs n_kv_heads";
  const bool fp8 = check_cache(a.k_cache, a.k_scale, n_kv_heads, "k_cache");
  check_cache(a.v_cache, a.v_scale, n_kv_heads, "v_cache");
  const KvCacheView kv{.k = a.k_cache.data, .v = a.v_cache.data,
                       .k_scale = fp8 ? a.k_scale.as<float>() : nullptr,
                       .v_scale = fp8 ? a.v_scale.as<float>() : nullptr, .fp8 = fp8};
  AttentionPath path = forced_attention_path_;
  if (path == AttentionPath::kAuto) {
    path = choose_attention_path(b, d_head, smem_cap_, fp8);
    for (AttentionPath off : disabled_attention_paths_)
      if (path == off) path = AttentionPath::kWarp;  // failed its self-test
  }
  AttentionOptions opt{.path = path};
  const size_t bytes =
      attention_scratch_bytes(b, n_heads, n_kv_heads, d_head, a.sliding_window, smem_cap_, fp8, opt);
  if (bytes > 0) opt.scratch = scratch<char>(int64_t(bytes), op_scratch_);
  launch_attention(a.q.as<bf16>(), kv, a.out.as<bf16>(), vec_or_null(a.sinks, "sinks"), b, n_heads, n_kv_heads,
                   d_head, a.scale, a.sliding_window, stream_, smem_cap_, opt);
}

void CudaBackend::mla_store(const ops::MlaStoreArgs& a) {
  const DeviceBatch& b = batch_for(a.batch);
  check_act(a.kv_latent, "mla_store kv_latent");
  check_act(a.k_rope, "mla_store k_rope");
  const int64_t d_latent = a.kv_latent.dim(1), d_rope = a.k_rope.dim(1), row = a.latent_cache.dim(2);
  KILN_CHECK_EQ(d_latent + d_rope, row) << "mla_store: d_latent + d_rope vs cache row";
  if (check_cache(a.latent_cache, a.latent_scale, 2, "latent_cache")) {  // latent and rope: two rows, two scales
    uint8_t* cache = a.latent_cache.as<uint8_t>();
    float* scales = a.latent_scale.as<float>();
    launch_store_rows_e4m3(a.kv_latent.as<bf16>(), cache, scales, b.slot_mapping, b.n_tokens, 1, d_latent, row, 0,
                           2, 0, stream_);
    launch_store_rows_e4m3(a.k_rope.as<bf16>(), cache, scales, b.slot_mapping, b.n_tokens, 1, d_rope, row, d_latent,
                           2, 1, stream_);
    return;
  }
  bf16* cache = a.latent_cache.as<bf16>();
  const StoreRowSet sets[2] = {{.x = a.kv_latent.as<bf16>(), .cache = cache, .row_elems = d_latent},
                               {.x = a.k_rope.as<bf16>(), .cache = cache, .row_elems = d_rope, .col_offset = d_latent}};
  launch_store_rows(sets, 2, b.slot_mapping, b.n_tokens, row, stream_);
}

void CudaBackend::mla_attention(const ops::MlaArgs& a) {
  const ScratchScope scratch_scope(op_scratch_);
  const DeviceBatch& b = batch_for(a.batch);
  check_act(a.q_nope, "mla q_nope");
  check_act(a.out, "mla out");
  const int n_heads = int(a.q_nope.dim(1)), d_nope = int(a.q_nope.dim(2)), d_rope = int(a.q_rope.dim(2));
  const int d_v = int(a.out.dim(2)), d_latent = int(a.latent_cache.dim(2)) - d_rope;
  KILN_CHECK(!a.kv_b->bias.defined() && (a.kv_b->quantized() || a.kv_b->data.dtype == DType::kBF16))
      << "mla: kv_b must be bf16 or quantized, without bias";
  const bool fp8 = check_cache(a.latent_cache, a.latent_scale, 2, "latent_cache");
  const MlaCacheView cache{.data = a.latent_cache.data, .scale = fp8 ? a.latent_scale.as<float>() : nullptr,
                           .fp8 = fp8};
  // The MLA kernels read kv_b as bf16: a quantized one is dequantized once (as vLLM does).
  const bf16* kv_b = a.kv_b->quantized() ? dequantized(*a.kv_b) : a.kv_b->data.as<bf16>();
  MlaPath path = forced_mla_path_;
  if (path == MlaPath::kAuto) {
    const bool mma =
        mla_mma_supported(d_latent, d_rope) && mla_mma_smem_bytes(fp8) <= smem_cap_ && !mla_mma_disabled_;
    path = mma ? MlaPath::kMma : MlaPath::kWarp;
  }
  // DeepSeek sparse attention: each row's selection compacted (valid entries first) for
  // the kernels.
  MlaSelection sel;
  if (a.selected.defined()) {
    KILN_CHECK(a.selected.device == Device::kCuda && a.selected.dtype == DType::kI32 && a.selected.rank() == 2 &&
               a.selected.dim(0) == b.n_tokens && a.selected.dim(1) > 0)
        << "mla_attention: selected must be a device i32 [n_tokens, top_k], got " << dtype_name(a.selected.dtype)
        << " " << a.selected.shape;
    sel.top_k = int(a.selected.dim(1));
    int32_t* list = scratch<int32_t>(int64_t(b.n_tokens) * (sel.top_k + 1), op_scratch_);
    sel.list = list;
    sel.count = list + int64_t(b.n_tokens) * sel.top_k;
    launch_dsa_compact(a.selected.as<int32_t>(), sel.top_k, b, list, list + int64_t(b.n_tokens) * sel.top_k, stream_);
  }
  const int64_t floats = int64_t(b.n_tokens) * n_heads * d_latent * 2 +
                         (path == MlaPath::kMma ? int64_t(mla_mma_scratch_floats(b, n_heads, sel.top_k)) : 0);
  float* scratch_f = scratch<float>(floats, op_scratch_);
  launch_mla(a.q_nope.as<bf16>(), a.q_rope.as<bf16>(), cache, kv_b, a.out.as<bf16>(), scratch_f, b, n_heads, d_nope,
             d_rope, d_v, d_latent, a.scale, path, stream_, sel);
}

void CudaBackend::glu(const ops::GluArgs& a) {
  check_act(a.gate, "glu gate");
  KILN_CHECK(a.up.shape == a.gate.shape && a.out.shape == a.gate.shape) << "glu: shapes";
  launch_glu(a.gate.as<bf16>(), a.up.as<bf16>(), a.out.as<bf16>(), a.gate.numel(),
             a.params.kind == ops::GluKind::kSilu ? 0 : 1, a.params.alpha, a.params.limit, stream_);
}

void CudaBackend::fill_random(const ops::FillRandomArgs& a) {
  KILN_CHECK(a.out.device == Device::kCuda && (a.out.dtype == DType::kBF16 || a.out.dtype == DType::kF32))
      << "fill_random: a bf16 or f32 device tensor (" << dtype_name(a.out.dtype) << ")";
  launch_fill_random(a.out.data, a.out.dtype == DType::kBF16, a.out.numel(), a.seed, a.mean, a.stddev, stream_);
}

void CudaBackend::add(const ops::AddArgs& a) {
  check_act(a.a, "add a");
  KILN_CHECK(a.b.shape == a.a.shape && a.out.shape == a.a.shape) << "add: shapes";
  launch_add(a.a.as<bf16>(), a.b.as<bf16>(), a.out.as<bf16>(), a.a.numel(), stream_);
}

void CudaBackend::slice_columns(const ops::SliceColumnsArgs& a) {
  check_act(a.src, "slice_columns src");
  check_act(a.dst, "slice_columns dst");
  KILN_CHECK(a.src.rank() == 2 && a.dst.rank() == 2 && a.dst.dim(0) == a.src.dim(0))
      << "slice_columns: src " << a.src.shape << ", dst " << a.dst.shape;
  const int64_t n_src = a.src.dim(1), n_dst = a.dst.dim(1), n = ops::slice_width(a);
  KILN_CHECK(a.col_begin >= 0 && n > 0 && a.col_begin + n <= n_src)
      << "slice_columns: columns [" << a.col_begin << ", " << a.col_begin + n << ") of " << n_src;
  KILN_CHECK(a.dst_col_begin >= 0 && a.dst_col_begin + n <= n_dst)
      << "slice_columns: dst columns [" << a.dst_col_begin << ", " << a.dst_col_begin + n << ") of " << n_dst;
  launch_slice_columns(a.src.as<bf16>(), n_src, a.col_begin, a.dst.as<bf16>(), n_dst, a.dst_col_begin, n,
                       a.src.dim(0), stream_);
}

CudaBackend::ExpertTables CudaBackend::expert_table(const ops::MoeExperts& ex, int64_t d_model) {
  // Identity of the experts as the caller holds them: every weight and bias pointer.
  std::vector<const void*> sources;
  for (const auto* list : {&ex.gate_up, &ex.gate, &ex.up, &ex.down})
    for (const ops::Weight& w : *list) sources.insert(sources.end(), {w.data.data, w.quant.data.data, w.bias.data});
  auto it = expert_tables_.find(&ex);
  if (it != expert_tables_.end() && it->second.sources == sources) return it->second.device;
  check_experts(ex, d_model);  // once per expert list: the table is built from these shapes
  ExpertTable table;
  table.sources = std::move(sources);
  table.keep.emplace_back();  // slot 0: the device table itself
  // Biases may be views of a stacked [n_experts, n] tensor, uploaded as a bf16
  // matrix: give the kernels fp32 copies.
  auto bias = [&](const Tensor& t) -> const float* {
    if (!t.defined()) return nullptr;
    KILN_CHECK(t.device == Device::kCuda) << "moe: expert bias not on the device";
    if (t.dtype == DType::kF32) return t.as<float>();
    KILN_CHECK(t.dtype == DType::kBF16) << "moe: expert bias of dtype " << dtype_name(t.dtype);
    table.keep.push_back(allocator_->allocate(size_t(t.numel()) * sizeof(float)));
    auto* f = static_cast<float*>(table.keep.back().get());
    launch_bf16_to_f32(t.as<bf16>(), f, t.numel(), stream_);
    return f;
  };
  const size_t n = ex.down.size();
  const bool quant = n > 0 && ex.down[0].quantized();
  // bf16 experts stored row-major also get a QuantExpert view (codes = the bf16 rows).
  const bool bf16_view = !quant && n > 0 && !ex.down[0].transposed;
  std::vector<ExpertWeights> dense(quant ? 0 : n);
  std::vector<QuantExpert> packed(quant || bf16_view ? n : 0);
  const auto rows = [](const ops::Weight& w) { return QuantMat{.codes = static_cast<const uint8_t*>(w.data.data)}; };
  for (size_t e = 0; e < n; ++e) {
    const bool fused = !ex.gate_up.empty();
    const float* gate_up_bias = fused ? bias(ex.gate_up[e].bias) : nullptr;
    const float* down_bias = bias(ex.down[e].bias);
    if (quant) {
      QuantExpert& t = packed[e];
      if (fused) {
        t.gate_up = quant_mat(ex.gate_up[e].quant);
      } else {
        t.gate = quant_mat(ex.gate[e].quant);
        t.up = quant_mat(ex.up[e].quant);
      }
      t.down = quant_mat(ex.down[e].quant);
      t.gate_up_bias = gate_up_bias;
      t.down_bias = down_bias;
    } else {
      ExpertWeights& t = dense[e];
      if (fused) {
        t.gate_up = ex.gate_up[e].data.as<bf16>();
      } else {
        t.gate = ex.gate[e].data.as<bf16>();
        t.up = ex.up[e].data.as<bf16>();
      }
      t.down = ex.down[e].data.as<bf16>();
      t.gate_up_bias = gate_up_bias;
      t.down_bias = down_bias;
      if (bf16_view) {
        QuantExpert& v = packed[e];
        if (fused) {
          v.gate_up = rows(ex.gate_up[e]);
        } else {
          v.gate = rows(ex.gate[e]);
          v.up = rows(ex.up[e]);
        }
        v.down = rows(ex.down[e]);
        v.gate_up_bias = gate_up_bias;
        v.down_bias = down_bias;
      }
    }
  }
  // One device block: the table, then (bf16 experts) their QuantExpert view.
  const size_t main_bytes = quant ? n * sizeof(QuantExpert) : n * sizeof(ExpertWeights);
  const size_t view_bytes = bf16_view ? n * sizeof(QuantExpert) : 0;
  table.keep[0] = allocator_->allocate(main_bytes + view_bytes);
  auto* base = static_cast<unsigned char*>(table.keep[0].get());
  const void* host = quant ? static_cast<const void*>(packed.data()) : dense.data();
  KILN_CUDA_CHECK(cudaMemcpyAsync(base, host, main_bytes, cudaMemcpyHostToDevice, stream_));
  if (bf16_view)
    KILN_CUDA_CHECK(cudaMemcpyAsync(base + main_bytes, packed.data(), view_bytes, cudaMemcpyHostToDevice, stream_));
  synchronize();
  table.device = {.table = base,
                  .bf16_gemv = bf16_view ? reinterpret_cast<const QuantExpert*>(base + main_bytes) : nullptr};
  const ExpertTables device = table.device;
  expert_tables_[&ex] = std::move(table);
  return device;
}

// Expert parallelism: the expert lists hold experts [first_expert, first_expert +
// n_local) only. Routing runs over all n_experts (the router is whole); launch_route
// writes local expert indices and marks the pairs of other ranks' experts -1 (weight 0),
// and from there on everything works over the n_local-entry expert table: the tile
// tables and GEMV work lists get no row for a -1 pair, so none of its weights is read,
// and the combine skips it. With every expert local (n_local == n_experts) this is the
// same launches as before. The grouped paths' tile-shape heuristic (moe_grouped_bm)
// sees n_pairs / n_local rows per expert, more than the n_pairs / n_experts a rank
// expects under expert parallelism: a tuner's place, as for every shape choice.
void CudaBackend::moe(const ops::MoeArgs& a) {
  const ScratchScope scratch_scope(op_scratch_);
  check_act(a.x, "moe x");
  check_act(a.out, "moe out");
  const int64_t n_tokens = a.x.dim(0), d_model = a.x.dim(1);
  const ops::MoeExperts& ex = *a.experts;
  const int n_experts = a.routing.n_experts, top_k = a.routing.top_k, n_local = ex.n_local();
  KILN_CHECK(ex.first_expert >= 0 && n_local > 0 && ex.first_expert + n_local <= n_experts)
      << "moe: experts [" << ex.first_expert << ", " << ex.first_expert + n_local << ") of " << n_experts;
  if (!ex.gate_up.empty()) {
    KILN_CHECK(ex.gate_up.size() == size_t(n_local) && ex.gate.empty() && ex.up.empty())
        << "moe: " << ex.gate_up.size() << " gate_up for " << n_local << " local experts (and no gate / up)";
  } else {
    KILN_CHECK(ex.gate.size() == size_t(n_local) && ex.up.size() == size_t(n_local))
        << "moe: " << ex.gate.size() << " gate, " << ex.up.size() << " up for " << n_local << " local experts";
  }
  KILN_CHECK_GT(ex.d_ff, 0) << "moe: experts.d_ff";
  KILN_CHECK(!a.router->transposed && a.router->data.dtype == DType::kBF16 && a.router->n_out() == n_experts &&
             a.router->n_in() == d_model)
      << "moe: router must be bf16 row-major [" << n_experts << ", " << d_model << "]";
  KILN_CHECK(a.out.shape == a.x.shape) << "moe: out " << a.out.shape << " vs x " << a.x.shape;
  const bool transposed = ex.down[0].transposed;
  float* logits = scratch<float>(n_tokens * n_experts, op_scratch_);
  int32_t* chosen = scratch<int32_t>(n_tokens * top_k, op_scratch_);
  float* weights = scratch<float>(n_tokens * top_k, op_scratch_);
  // The router: launch_router_logits below kRouterGemmTokens (a block per expert up to 8
  // tokens, then a warp per logit); a GEMM from there (2048 tokens x 128 experts of
  // Qwen3-30B-A3B: 128 us as 262,144 warps), where the rows are 16-byte multiples.
  const float* router_bias = vec_or_null(a.router->bias, "router bias");
  if (n_tokens >= kRouterGemmTokens && d_model % 8 == 0 && n_experts % 4 == 0) {
    gemm_f32(a.x.as<bf16>(), a.router->data.as<bf16>(), n_tokens, n_experts, d_model, logits);
    if (router_bias) launch_add_bias_f32(logits, router_bias, n_tokens, n_experts, stream_);
  } else {
    launch_router_logits(a.x.as<bf16>(), a.router->data.as<bf16>(), router_bias, n_tokens, n_experts, d_model, logits,
                         stream_);
  }
  const MoeRouting r{.kind = int(a.routing.kind), .n_experts = n_experts, .top_k = top_k,
                     .n_group = a.routing.n_group, .topk_group = a.routing.topk_group,
                     .norm_topk_prob = a.routing.norm_topk_prob,
                     .routed_scaling_factor = a.routing.routed_scaling_factor,
                     .first_local = ex.first_expert, .n_local = n_local};
  const float* correction = vec_or_null(a.correction_bias, "correction bias");
  const auto route = [&] { launch_route(logits, correction, r, n_tokens, chosen, weights, stream_); };
  const MoeShape s{.d_model = d_model, .d_ff = ex.d_ff, .interleaved = ex.gate_up_interleaved,
                   .transposed = transposed, .glu_kind = a.glu.kind == ops::GluKind::kSilu ? 0 : 1,
                   .alpha = a.glu.alpha, .limit = a.glu.limit};
  const int64_t n_pairs = n_tokens * top_k;
  float* y = scratch<float>(n_pairs * d_model, op_scratch_);
  const auto grouped_scratch = [&] {
    const int slots = moe_tile_slots(n_pairs, n_local, moe_grouped_bm(n_pairs, n_local));
    return MoeGroupedScratch{.perm = scratch<int32_t>(n_pairs, op_scratch_),
                             .tiles = scratch<int4>(slots, op_scratch_),
                             .act = scratch<bf16>(n_pairs * ex.d_ff, op_scratch_),
                             .y = y};
  };
  const ExpertTables tables = expert_table(ex, d_model);
  // Decode: a few rows per expert (a token meets an expert once), weights streamed
  // into registers (quant_gemv.cu), packed codes or bf16 rows.
  const int gemv_rows = int(std::min<int64_t>(n_tokens, quant_gemv_max_rows(std::max(d_model, ex.d_ff))));
  const auto stream_gemv = [&](const QuantExpert* table, const QuantFormat& f) {
    const int rows = moe_gemv_tile_rows(n_pairs, n_local, gemv_rows, std::max(d_model, ex.d_ff));
    const int slots = moe_tile_slots(n_pairs, n_local, rows);
    int32_t* perm = scratch<int32_t>(n_pairs, op_scratch_);
    int4* tiles = scratch<int4>(slots, op_scratch_);
    bf16* act = scratch<bf16>(n_pairs * ex.d_ff, op_scratch_);
    if (n_tokens <= kRouteAlignMaxTokens) {
      launch_route_align(logits, correction, r, n_tokens, chosen, weights, n_local, rows, perm, tiles, slots, stream_);
    } else {
      route();
      launch_moe_align(chosen, n_pairs, n_local, rows, perm, tiles, slots, stream_);
    }
    launch_moe_gemv_quant(a.x.as<bf16>(), table, f, s, top_k, rows, n_pairs, perm, tiles, slots, act, y, stream_);
  };
  if (ex.down[0].quantized()) {  // packed experts: the quantized grouped GEMMs
    KILN_CHECK(moe_grouped_supported(s, !ex.gate_up.empty(), n_local))
        << "moe: quantized experts need d_model and d_ff multiples of 8 (" << d_model << ", " << ex.d_ff << ")";
    KILN_CHECK_LE(quant_gemm_smem_bytes(), smem_cap_) << "moe: the quantized GEMMs' shared memory vs --smem-cap";
    const auto* table = static_cast<const QuantExpert*>(tables.table);
    const QuantFormat f = quant_format(ex.down[0].quant);
    if (moe_stream_gemv(n_tokens, n_pairs, n_local, gemv_rows, kQuantGemvTilesPerExpert)) {
      stream_gemv(table, f);
    } else {
      route();
      MoeGroupedScratch sc = grouped_scratch();
      // Prefill-shaped MXFP4 / NVFP4 layers on SM 12.x: the block-scaled tensor cores,
      // once the self-test has proved them here (enable_native_quant_moe).
      const int act_format = quant_native_act_format(f);
      if (act_format >= 0 && native_quant_moe_[act_format] && moe_native_quant_prefill(n_pairs, n_local) &&
          quant_native_smem_bytes() <= smem_cap_) {
        void* act_q = scratch<uint8_t>(int64_t(moe_native_quant_scratch_bytes(act_format, s, n_pairs, top_k)),
                                       op_scratch_);
        launch_moe_grouped_quant_sm120(a.x.as<bf16>(), table, f, chosen, s, n_pairs, n_local, top_k, sc, act_q,
                                       stream_);
      } else if (use_w8a8(f) && moe_native_quant_prefill(n_pairs, n_local)) {
        void* act_q = scratch<uint8_t>(int64_t(moe_w8a8_act_bytes(s, n_pairs, top_k)), op_scratch_);
        launch_moe_grouped_quant_w8a8(a.x.as<bf16>(), table, f, chosen, s, n_pairs, n_local, top_k, sc, act_q,
                                      stream_);
      } else {
        launch_moe_grouped_quant(a.x.as<bf16>(), table, f, chosen, s, n_pairs, n_local, top_k, sc, stream_);
      }
    }
    launch_moe_combine(y, chosen, weights, n_tokens, top_k, d_model, a.out.as<bf16>(), stream_);
    return;
  }
  const bool grouped_ok = moe_grouped_supported(s, !ex.gate_up.empty(), n_local) &&
                          moe_grouped_smem_bytes() <= smem_cap_;
  // The streaming GEMV takes row-major bf16 experts (the table's QuantExpert view) under
  // the quantized experts' rule, while the bf16 GEMV is on (self-test, KILN_BF16_GEMV).
  const bool stream_ok = tables.bf16_gemv != nullptr && gemv_rows > 0 &&
                         moe_grouped_supported(s, !ex.gate_up.empty(), n_local);
  MoePath path = forced_moe_path_;
  if (path == MoePath::kAuto) {
    if (stream_ok && bf16_gemv_ && moe_stream_gemv(n_tokens, n_pairs, n_local, gemv_rows, kBf16GemvTilesPerExpert))
      path = MoePath::kStreamGemv;
    else path = grouped_ok && !grouped_moe_disabled_ ? MoePath::kGrouped : MoePath::kGemv;
  }
  KILN_CHECK(path != MoePath::kGrouped || grouped_ok) << "moe: the grouped path does not take this layout";
  KILN_CHECK(path != MoePath::kStreamGemv || stream_ok) << "moe: the streaming GEMV does not take this layout";
  const auto* table = static_cast<const ExpertWeights*>(tables.table);
  if (path == MoePath::kStreamGemv) {
    stream_gemv(tables.bf16_gemv, kBf16GemvFormat);
  } else if (path == MoePath::kGrouped) {
    route();
    MoeGroupedScratch sc = grouped_scratch();
    launch_moe_grouped(a.x.as<bf16>(), table, chosen, s, n_pairs, n_local, top_k, sc, stream_);
  } else {
    route();
    launch_moe_gemv(a.x.as<bf16>(), table, chosen, s, n_tokens, top_k, y, smem_cap_, stream_);
  }
  launch_moe_combine(y, chosen, weights, n_tokens, top_k, d_model, a.out.as<bf16>(), stream_);
}

bool CudaBackend::bf16_gemv_weight(const ops::Weight& w) const {
  return bf16_gemv_dense() && !w.quantized() && !w.transposed && w.n_out() * w.n_in() <= kBf16GemvMaxWeights &&
         quant_gemv_max_rows(w.n_in()) > 0;
}

std::string CudaBackend::weight_path(const ops::Weight& w, bool expert) const {
  if (!w.quantized()) {
    if (!expert) {
      if (!bf16_gemv_weight(w)) return "cuBLASLt bf16 GEMM";
      return "<= " + std::to_string(quant_gemv_max_rows(w.n_in())) +
             " rows: bf16 GEMV (weights streamed as mma.sync fragments); more: cuBLASLt bf16 GEMM";
    }
    if (forced_moe_path_ == MoePath::kGemv || grouped_moe_disabled_) return "per-pair bf16 GEMV (grouped GEMMs off)";
    const std::string grouped =
        "grouped bf16 mma.sync GEMMs over expert-sorted tiles (per-pair GEMV where the layout does not fit)";
    if (!bf16_gemv_ || w.transposed) return grouped;
    return "<= 16 tokens or <= " + std::to_string(kBf16GemvTilesPerExpert) +
           " GEMV tile per expert: bf16 GEMV (weights streamed as mma.sync fragments); more: " + grouped;
  }
  const std::string kind(formats::quant_kind_name(w.quant.kind));
  const std::string gemv = kind + " GEMV (codes decoded into bf16 mma.sync fragments in registers)";
  const std::string tiles = kind + " mma.sync tiles (64 inputs dequantized to bf16 in shared memory)";
  // A packed weight, or (kiln inspect) the checkpoint's, whose packing gives 128-input groups.
  const bool w8a8 = w.quant.packed_group > 0 ? use_w8a8(quant_format(w.quant))
                                             : formats::fp8_w8a8_eligible(w.quant) &&
                                                   use_w8a8({.value = 2, .scale_kind = 4, .scale_bytes = 4, .group = 128});
  const std::string w8a8_path = "W8A8 e4m3 mma.sync (activations quantized to e4m3 per 128 inputs)";
  if (!expert) {
    const int64_t pass = quant_gemv_max_rows(w.n_in());
    const std::string passes = quant_gemv_rows_ > pass && pass > 0 ? "; <= " + std::to_string(quant_gemv_rows_) +
                                                                         " rows: the GEMV in passes of " +
                                                                         std::to_string(pass) + " rows"
                                                                   : "";
    return "<= " + std::to_string(pass) + " rows: " + gemv + passes + "; more: " + tiles +
           (w8a8 ? "; >= 32 rows: " + w8a8_path : "");
  }
  const int act = w.quant.kind == formats::QuantKind::kMxfp4 ? 0 : w.quant.kind == formats::QuantKind::kNvfp4 ? 1 : -1;
  const std::string rule = quant_gemv_moe_tokens_ >= 0
                               ? "<= " + std::to_string(quant_gemv_moe_tokens_) + " tokens"
                               : "<= 16 tokens or <= " + std::to_string(kQuantGemvTilesPerExpert) +
                                     " GEMV tiles per expert on average";
  std::string path = rule + ": " + gemv + " over expert-sorted tiles; more: grouped " + tiles;
  if (act >= 0 && native_quant_moe_[act]) path += "; 64-row tiles: native sm_120a block-scaled mma (self-tested)";
  if (w8a8) path += "; 64-row tiles: " + w8a8_path;
  return path;
}

}  // namespace kiln::cuda
