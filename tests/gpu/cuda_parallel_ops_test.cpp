// The op contracts tensor / expert parallelism adds (ops/backend.h), CUDA against the
// CPU reference in its bf16-activation mode, outputs poisoned with NaN before each
// call: vocab-parallel embedding (id_begin / vocab_size, also from a batch inside a
// recorded CUDA graph), slice_columns into a dst column offset, and MoE layers whose
// experts are a rank's slice: an expert range (first_expert, n_local of n_experts) or a
// d_ff slice (gate / up rows and down columns [f0, f1), the down bias on rank 0 only),
// for bf16 experts on both paths and for MXFP4, NVFP4, INT4 and FP8-block experts, at
// decode-shaped (GEMV) and prefill-shaped (grouped GEMM) token counts. Summing the
// ranks' outputs must give the unsliced layer: that is what the parallel model relies on.
//
// Bounds: copies (embedding, slice_columns) are exact. A rank's MoE output is within
// 3 x 2^-8 of max|ref| of the CPU's (as tests/gpu/cuda_quant_test.cpp: the bf16 act
// between the GEMMs and the INT4 / FP8 weights' bf16 rounding); the sum of the ranks'
// GPU outputs is within 4 x 2^-8 x sum over ranks of max|ref_rank| of the unsliced CPU
// layer (each rank's error, plus each rank's own bf16 output rounding).
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cuda/cuda_backend_impl.h"
#include "backends/cuda/quant_random.h"
#include "gpu/gpu_test_util.h"
#include "ops/batch.h"

namespace kiln {
namespace {

using gpu_testing::kBf16Tol;
using formats::QuantKind;

// Rows [r0, r1) and bytes [b0, b1) of each row of a host tensor seen as `rows` rows.
Tensor slice_bytes(const Tensor& t, int64_t rows, int64_t r0, int64_t r1, int64_t b0, int64_t b1) {
  const int64_t row_bytes = int64_t(t.nbytes()) / rows;
  KILN_CHECK(r0 >= 0 && r1 <= rows && b0 >= 0 && b1 <= row_bytes && (b1 - b0) * 8 % dtype_bits(t.dtype) == 0);
  Tensor out = host_tensor(t.dtype, {r1 - r0, (b1 - b0) * 8 / dtype_bits(t.dtype)});
  for (int64_t r = r0; r < r1; ++r)
    std::memcpy(static_cast<uint8_t*>(out.data) + (r - r0) * (b1 - b0),
                static_cast<const uint8_t*>(t.data) + r * row_bytes + b0, size_t(b1 - b0));
  return out;
}

// Elements [a, b) of a host vector.
Tensor slice_vec(const Tensor& v, int64_t a, int64_t b) {
  const int bytes = dtype_bits(v.dtype) / 8;
  return slice_bytes(v, 1, 0, 1, a * bytes, b * bytes).reshape({b - a});
}

// Rows [o0, o1) and inputs [k0, k1) of a weight W [n_out, n_in] in its checkpoint form:
// what a tensor-parallel loader hands a rank.
ops::Weight slice_weight(const ops::Weight& w, int64_t o0, int64_t o1, int64_t k0, int64_t k1) {
  ops::Weight s;
  if (w.bias.defined()) s.bias = slice_vec(w.bias, o0, o1);
  if (!w.quantized()) {
    const int eb = dtype_bits(w.data.dtype) / 8;
    s.data = slice_bytes(w.data, w.n_out(), o0, o1, k0 * eb, k1 * eb);
    return s;
  }
  const formats::QuantizedTensor& q = w.quant;
  formats::QuantizedTensor& r = s.quant;
  r = q;
  r.n_out = o1 - o0;
  r.n_in = k1 - k0;
  const bool fp8 = q.kind == QuantKind::kFp8Block || q.kind == QuantKind::kFp8Channel || q.kind == QuantKind::kFp8Tensor;
  const int bits = fp8 ? 8 : 4, sb = dtype_bits(q.scale.dtype) / 8;
  r.data = slice_bytes(q.data, q.n_out, o0, o1, k0 * bits / 8, k1 * bits / 8);
  int64_t g = 0;
  switch (q.kind) {
    case QuantKind::kMxfp4: g = 32; break;
    case QuantKind::kNvfp4: g = 16; break;
    case QuantKind::kInt4Group: g = q.block_k; break;
    case QuantKind::kFp8Block: {
      const int64_t bn = q.block_n, bk = q.block_k;
      KILN_CHECK(o0 % bn == 0 && k0 % bk == 0 && (o1 % bn == 0 || o1 == q.n_out) && (k1 % bk == 0 || k1 == q.n_in));
      r.scale = slice_bytes(q.scale, (q.n_out + bn - 1) / bn, o0 / bn, (o1 + bn - 1) / bn, k0 / bk * sb,
                            (k1 + bk - 1) / bk * sb);
      return s;
    }
    case QuantKind::kFp8Channel: r.scale = slice_bytes(q.scale, q.n_out, o0, o1, 0, sb); return s;
    default: return s;  // per tensor: the one scale
  }
  KILN_CHECK(k0 % g == 0 && k1 % g == 0) << "a slice across scale groups";
  r.scale = slice_bytes(q.scale, q.n_out, o0, o1, k0 / g * sb, k1 / g * sb);
  return s;
}

// A whole MoE layer in checkpoint form (host), and the slices ranks hold.
struct MoeLayer {
  ops::MoeExperts host;  // every expert, the whole d_ff
  int n_experts = 0, top_k = 0;
  int64_t d_model = 0;
  Tensor router;  // [n_experts, d_model] bf16 host
  ops::RouterParams routing;
  ops::GluParams glu;
};

class CudaParallelOps : public gpu_testing::GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    cpu_ = cpu::make_cpu_backend({.bf16_activations = true});
    // What is checked here is the slicing; FP8 experts stay W8A16 at every shape so that
    // the W8A16 reference applies (the W8A8 GEMMs: cuda_quant_test.cpp, against theirs).
    dynamic_cast<cuda::CudaBackend&>(*gpu_).set_w8a8(false);
  }

  std::vector<float> host_values(const Tensor& t) {
    return std::vector<float>(t.as<float>(), t.as<float>() + t.numel());
  }

  // One weight random in case c (quantized) or bf16 (c == nullptr).
  ops::Weight random_weight(const cuda::QuantCase* c, int64_t n_out, int64_t n_in, bool bias) {
    ops::Weight w;
    if (c != nullptr) w.quant = cuda::random_quantized(*c, n_out, n_in, rng_);
    else w.data = as_bf16(random({n_out, n_in}, 0.05f));
    if (bias) w.bias = random({n_out}, 0.1f);
    return w;
  }

  MoeLayer make_layer(const cuda::QuantCase* c, bool gpt_oss, int n_experts, int top_k, int64_t d_model,
                      int64_t d_ff) {
    MoeLayer l;
    l.n_experts = n_experts, l.top_k = top_k, l.d_model = d_model;
    l.host.d_ff = d_ff;
    l.host.gate_up_interleaved = gpt_oss;
    for (int e = 0; e < n_experts; ++e) {
      if (gpt_oss) {
        l.host.gate_up.push_back(random_weight(c, 2 * d_ff, d_model, true));
      } else {
        l.host.gate.push_back(random_weight(c, d_ff, d_model, false));
        l.host.up.push_back(random_weight(c, d_ff, d_model, false));
      }
      l.host.down.push_back(random_weight(c, d_model, d_ff, gpt_oss));
    }
    l.router = as_bf16(random({n_experts, d_model}, 0.05f));
    l.routing = {.kind = gpt_oss ? ops::RouterKind::kTopKSoftmax : ops::RouterKind::kSoftmaxTopK,
                 .n_experts = n_experts, .top_k = top_k, .norm_topk_prob = true};
    l.glu = {.kind = gpt_oss ? ops::GluKind::kGptOssClamp : ops::GluKind::kSilu};
    return l;
  }

  // A rank's experts: global experts [e0, e1), d_ff columns [f0, f1); the down bias
  // only with `down_bias` (under tensor parallelism one rank adds it, the others have
  // none). The host (CPU) form goes to *cpu, the uploaded one to *gpu.
  void slice_layer(const MoeLayer& l, int e0, int e1, int64_t f0, int64_t f1, bool down_bias, ops::MoeExperts* cpu,
                   ops::MoeExperts* gpu) {
    const ops::MoeExperts& h = l.host;
    cpu->d_ff = gpu->d_ff = f1 - f0;
    cpu->gate_up_interleaved = gpu->gate_up_interleaved = h.gate_up_interleaved;
    cpu->first_expert = gpu->first_expert = e0;
    const auto add = [&](std::vector<ops::Weight>& to_cpu, std::vector<ops::Weight>& to_gpu, ops::Weight w) {
      ops::Weight g;
      if (w.quantized()) {
        auto packed = gpu_->upload_quantized(w.quant);
        KILN_CHECK(packed.ok()) << packed.status().to_string();
        g.quant = std::move(packed).value();
      } else {
        g.data = gpu_->upload(w.data);
      }
      if (w.bias.defined()) g.bias = gpu_->upload(w.bias);
      to_cpu.push_back(std::move(w));
      to_gpu.push_back(std::move(g));
    };
    const int64_t d_ff = h.d_ff;
    for (int e = e0; e < e1; ++e) {
      if (!h.gate_up.empty()) {  // interleaved: output i is rows 2i, 2i + 1
        add(cpu->gate_up, gpu->gate_up, slice_weight(h.gate_up[size_t(e)], 2 * f0, 2 * f1, 0, l.d_model));
      } else {
        add(cpu->gate, gpu->gate, slice_weight(h.gate[size_t(e)], f0, f1, 0, l.d_model));
        add(cpu->up, gpu->up, slice_weight(h.up[size_t(e)], f0, f1, 0, l.d_model));
      }
      ops::Weight down = slice_weight(h.down[size_t(e)], 0, l.d_model, f0, f1);
      if (!down_bias) down.bias = Tensor{};
      add(cpu->down, gpu->down, std::move(down));
    }
    KILN_CHECK(f1 <= d_ff);
  }

  // The layer on the CPU and on the GPU with the given experts; returns the GPU's
  // output and writes the CPU's to *ref. Checks the rank bound.
  std::vector<float> run_moe(const MoeLayer& l, const ops::MoeExperts& ec, const ops::MoeExperts& eg, const Tensor& x,
                             Tensor* ref, const std::string& what) {
    ops::Weight rc{.data = l.router}, rg{.data = gpu_->upload(l.router)};
    *ref = host_tensor(DType::kF32, x.shape);
    cpu_->moe({.x = x, .router = &rc, .experts = &ec, .routing = l.routing, .glu = l.glu, .out = *ref});
    Tensor out = poisoned(x.shape);
    gpu_->moe({.x = to_gpu(x), .router = &rg, .experts = &eg, .routing = l.routing, .glu = l.glu, .out = out});
    std::vector<float> got = from_gpu(out);
    double max_ref = 0.0, max_err = 0.0;
    for (int64_t i = 0; i < ref->numel(); ++i) {
      EXPECT_FALSE(std::isnan(got[size_t(i)])) << what << ": element " << i << " not written (or NaN)";
      if (std::isnan(got[size_t(i)])) return got;
      max_ref = std::max(max_ref, double(std::abs(ref->as<float>()[i])));
      max_err = std::max(max_err, std::abs(double(got[size_t(i)]) - ref->as<float>()[i]));
    }
    EXPECT_LE(max_err, 3 * kBf16Tol * max_ref + 1e-6) << what << ": max error " << max_err << " vs max|ref| " << max_ref;
    std::printf("%s: max error / max|ref| %.3g (max|ref| %.3g)\n", what.c_str(), max_ref > 0 ? max_err / max_ref : 0.0,
                max_ref);
    return got;
  }

  // Ranks as (experts [e0, e1), d_ff [f0, f1)) slices of layer l; every rank's output
  // against the CPU's and, when the ranks cover the layer (`whole`), their sum against
  // the unsliced CPU layer.
  void check_ranks(const MoeLayer& l, const std::vector<std::array<int64_t, 4>>& ranks, const std::string& name,
                   bool whole = true) {
    for (int tokens : {1, 8, 200}) {
      const std::string what = name + ", " + std::to_string(tokens) + " tokens";
      SCOPED_TRACE(what);
      Tensor x = random({tokens, l.d_model});
      Tensor full_ref;
      ops::MoeExperts full_c, full_g;
      slice_layer(l, 0, l.n_experts, 0, l.host.d_ff, true, &full_c, &full_g);
      run_moe(l, full_c, full_g, x, &full_ref, what + " unsliced");
      std::vector<double> sum(size_t(x.numel()), 0.0), cpu_sum(size_t(x.numel()), 0.0);
      double bound = 0.0;
      for (size_t r = 0; r < ranks.size(); ++r) {
        const auto [e0, e1, f0, f1] = ranks[r];
        std::deque<ops::MoeExperts> keep(2);
        // The down bias is added once: by the rank holding d_ff columns from 0.
        slice_layer(l, int(e0), int(e1), f0, f1, f0 == 0, &keep[0], &keep[1]);
        Tensor ref;
        const std::string rank_what = what + " rank " + std::to_string(r) + " (experts [" + std::to_string(e0) + ", " +
                                      std::to_string(e1) + "), d_ff [" + std::to_string(f0) + ", " +
                                      std::to_string(f1) + "))";
        const std::vector<float> got = run_moe(l, keep[0], keep[1], x, &ref, rank_what);
        double max_ref = 0.0;
        for (int64_t i = 0; i < x.numel(); ++i) {
          sum[size_t(i)] += got[size_t(i)];
          cpu_sum[size_t(i)] += ref.as<float>()[i];
          max_ref = std::max(max_ref, double(std::abs(ref.as<float>()[i])));
        }
        bound += max_ref;
      }
      if (!whole) continue;
      double err = 0.0, cpu_err = 0.0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        err = std::max(err, std::abs(sum[size_t(i)] - full_ref.as<float>()[i]));
        cpu_err = std::max(cpu_err, std::abs(cpu_sum[size_t(i)] - full_ref.as<float>()[i]));
      }
      EXPECT_LE(err, 4 * kBf16Tol * bound + 1e-6) << what << ": sum of the ranks' GPU outputs vs the unsliced layer";
      EXPECT_LE(cpu_err, 2 * kBf16Tol * bound + 1e-6) << what << ": sum of the ranks' CPU outputs vs the unsliced layer";
      std::printf("%s: sum of %zu ranks vs unsliced: GPU %.3g, CPU %.3g of sum max|ref_rank| %.3g\n", what.c_str(),
                  ranks.size(), err / bound, cpu_err / bound, bound);
    }
  }
};

// A decode-shaped batch of n sequences, one token each (what run_step records).
ops::BatchMeta decode_batch(const std::vector<int32_t>& ids) {
  ops::BatchMeta b;
  const int32_t n = int32_t(ids.size());
  b.token_ids = ids;
  for (int32_t s = 0; s < n; ++s) {
    b.positions.push_back(0);
    b.slot_mapping.push_back(ops::kPadSlot);
    b.q_start.push_back(s);
    b.context_len.push_back(1);
    b.block_table.push_back(0);
  }
  b.q_start.push_back(n);
  b.max_blocks_per_seq = 1;
  return b;
}

TEST_F(CudaParallelOps, VocabParallelEmbeddingGivesZerosOutsideTheSlice) {
  // 1003 ids over 4 ranks of 256 rows: the last slice is partial (235 rows).
  const int64_t vocab = 1003, d = 200, per_rank = 256;
  Tensor full = random({vocab, d});
  std::uniform_int_distribution<int32_t> any(0, int32_t(vocab - 1));
  std::vector<double> sum;
  Tensor full_ref;
  const int n_ids = 300;
  std::vector<int32_t> id_values;
  for (int i = 0; i < n_ids; ++i) id_values.push_back(any(rng_));
  for (int32_t edge : {0, 255, 256, 511, 512, 767, 768, 1002}) id_values.push_back(edge);  // every slice's ends
  Tensor ids = host_tensor(DType::kI32, {int64_t(id_values.size())});
  std::memcpy(ids.data, id_values.data(), id_values.size() * 4);
  full_ref = host_tensor(DType::kF32, {ids.numel(), d});
  cpu_->embedding({.table = full, .ids = ids, .out = full_ref});
  sum.assign(size_t(full_ref.numel()), 0.0);
  for (int64_t begin = 0; begin < vocab; begin += per_rank) {  // start, middle, end (partial)
    const int64_t rows = std::min(per_rank, vocab - begin);
    SCOPED_TRACE(::testing::Message() << "rows [" << begin << ", " << begin + rows << ")");
    Tensor slice = slice_bytes(full, vocab, begin, begin + rows, 0, d * 4);
    Tensor ref = host_tensor(DType::kF32, {ids.numel(), d});
    cpu_->embedding({.table = slice, .ids = ids, .out = ref, .id_begin = begin, .vocab_size = vocab});
    Tensor table = gpu_->upload(slice), out = poisoned({ids.numel(), d});
    gpu_->embedding({.table = table, .ids = ids, .out = out, .id_begin = begin, .vocab_size = vocab});
    const std::vector<float> got = from_gpu(out);
    int64_t bad = 0, zero_rows = 0;
    for (int64_t t = 0; t < ids.numel(); ++t) {
      const bool here = id_values[size_t(t)] >= begin && id_values[size_t(t)] < begin + rows;
      zero_rows += !here;
      for (int64_t i = 0; i < d; ++i) {
        const float g = got[size_t(t * d + i)], want = ref.as<float>()[t * d + i];
        if (!(g == want) && bad++ < 3) ADD_FAILURE() << "id " << id_values[size_t(t)] << " col " << i << ": " << g << " vs " << want;
        if (!here && !(g == 0.0f) && bad++ < 3) ADD_FAILURE() << "id " << id_values[size_t(t)] << " outside: " << g;
        sum[size_t(t * d + i)] += g;
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_GT(zero_rows, 0);
  }
  for (int64_t i = 0; i < full_ref.numel(); ++i)
    ASSERT_EQ(float(sum[size_t(i)]), full_ref.as<float>()[i]) << "sum of the slices at " << i;
}

TEST_F(CudaParallelOps, VocabParallelEmbeddingFromTheBatchReplaysInACudaGraph) {
  const int64_t vocab = 1000, d = 64, begin = 500, rows = 300;  // the middle slice [500, 800)
  Tensor slice = random({rows, d});
  Tensor table = gpu_->upload(slice);
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  ASSERT_NE(cuda, nullptr);
  const int64_t replays_before = cuda->graph_replays();
  std::uniform_int_distribution<int32_t> any(0, int32_t(vocab - 1));
  Tensor out_seen;
  for (int step = 0; step < 4; ++step) {  // eager, recorded, replayed, replayed
    SCOPED_TRACE(::testing::Message() << "step " << step);
    std::vector<int32_t> id_values(8);
    for (int32_t& v : id_values) v = any(rng_);
    id_values[0] = int32_t(begin), id_values[1] = int32_t(begin + rows - 1), id_values[2] = int32_t(begin - 1);
    id_values[3] = int32_t(begin + rows);
    const ops::BatchMeta b = decode_batch(id_values);
    if (out_seen.defined()) poison(out_seen);  // a replay must write every row again
    Tensor out = gpu_->run_step(b, 7, [&] {
      Tensor o = gpu_->alloc(DType::kBF16, {b.n_tokens(), d});
      gpu_->embedding({.table = table, .out = o, .from_batch = ops::BatchIds::kTokens, .batch = &b, .id_begin = begin,
                       .vocab_size = vocab});
      return o;
    });
    out_seen = out;
    Tensor ids = host_tensor(DType::kI32, {int64_t(id_values.size())});
    std::memcpy(ids.data, id_values.data(), id_values.size() * 4);
    Tensor ref = host_tensor(DType::kF32, {ids.numel(), d});
    cpu_->embedding({.table = slice, .ids = ids, .out = ref, .id_begin = begin, .vocab_size = vocab});
    EXPECT_EQ(from_gpu(out), host_values(ref));
  }
  EXPECT_GE(cuda->graph_replays() - replays_before, 2) << "the last steps replay the recorded graph";
}

TEST_F(CudaParallelOps, SliceColumnsWritesOnlyTheDstColumnRange) {
  const int64_t rows = 37, n_src = 300, n_dst = 500;
  Tensor src = random({rows, n_src}), dst0 = random({rows, n_dst});
  // (col_begin, dst_col_begin, n_cols): an interior range; n_cols 0 (to dst's end).
  for (auto [c0, d0, n] : {std::tuple<int64_t, int64_t, int64_t>{37, 123, 150}, {0, 260, 0}, {299, 0, 1}}) {
    SCOPED_TRACE(::testing::Message() << "src cols " << c0 << ", dst cols " << d0 << ", n " << n);
    Tensor ref = host_tensor(DType::kF32, dst0.shape);
    std::memcpy(ref.data, dst0.data, dst0.nbytes());
    cpu_->slice_columns({.src = src, .col_begin = c0, .dst = ref, .dst_col_begin = d0, .n_cols = n});
    Tensor dst = to_gpu(dst0);
    gpu_->slice_columns({.src = to_gpu(src), .col_begin = c0, .dst = dst, .dst_col_begin = d0, .n_cols = n});
    EXPECT_EQ(from_gpu(dst), host_values(ref));
  }
  // Vocab-parallel logits: two ranks' [rows, 250] slices assembled into [rows, 500].
  Tensor logits = poisoned({rows, n_dst});
  for (int64_t r = 0; r < 2; ++r) {
    Tensor part = slice_bytes(dst0, rows, 0, rows, r * 250 * 4, (r + 1) * 250 * 4);
    gpu_->slice_columns({.src = to_gpu(part), .dst = logits, .dst_col_begin = r * 250, .n_cols = 250});
  }
  EXPECT_EQ(from_gpu(logits), host_values(dst0));
  // Rows wider than one block's piece (2,048 columns): a decode step's logits at TP2.
  const int64_t wide_rows = 3, wide_src = 5000, wide_dst = 7000;
  Tensor wide = random({wide_rows, wide_src}), wide0 = random({wide_rows, wide_dst});
  Tensor wide_ref = host_tensor(DType::kF32, wide0.shape);
  std::memcpy(wide_ref.data, wide0.data, wide0.nbytes());
  cpu_->slice_columns({.src = wide, .col_begin = 17, .dst = wide_ref, .dst_col_begin = 1999, .n_cols = 4983});
  Tensor wide_out = to_gpu(wide0);
  gpu_->slice_columns({.src = to_gpu(wide), .col_begin = 17, .dst = wide_out, .dst_col_begin = 1999, .n_cols = 4983});
  EXPECT_EQ(from_gpu(wide_out), host_values(wide_ref));
}

// bf16 experts (Qwen-style gate / up / down): both expert paths; expert ranges of 2 of
// 4 ranks and all of them; d_ff slices 384 -> 96 (4 ranks) and 192.
TEST_F(CudaParallelOps, MoeBf16ExpertSlicesMatchCpuAndSumToTheLayer) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  ASSERT_NE(cuda, nullptr);
  const MoeLayer l = make_layer(nullptr, false, 16, 4, 512, 384);
  for (cuda::MoePath path : {cuda::MoePath::kGemv, cuda::MoePath::kGrouped}) {
    cuda->force_moe_path(path);
    const std::string p = cuda::moe_path_name(path);
    check_ranks(l, {{4, 8, 0, 384}, {12, 16, 0, 384}}, "bf16 " + p + " experts, ranks 1 and 3 of 4", false);
    check_ranks(l, {{0, 4, 0, 384}, {4, 8, 0, 384}, {8, 12, 0, 384}, {12, 16, 0, 384}}, "bf16 " + p + " EP 4");
    check_ranks(l, {{0, 16, 0, 96}, {0, 16, 96, 192}, {0, 16, 192, 288}, {0, 16, 288, 384}}, "bf16 " + p + " TP 4");
    check_ranks(l, {{0, 16, 0, 192}, {0, 16, 192, 384}}, "bf16 " + p + " TP 2");
  }
  cuda->force_moe_path(cuda::MoePath::kAuto);
}

// Quantized experts. gpt-oss's MXFP4 layer (fused interleaved gate_up with biases, the
// clamped SwiGLU): d_ff 2880 in two 1440 slices; the others (separate gate / up / down):
// d_ff 512 in 2 (256) and 4 (128) slices, and 8 (64) where the scale groups allow it.
TEST_F(CudaParallelOps, MoeQuantizedExpertSlicesMatchCpuAndSumToTheLayer) {
  const std::vector<cuda::QuantCase> cases = {{QuantKind::kMxfp4}, {QuantKind::kNvfp4},
                                              {QuantKind::kInt4Group, 32, 0, DType::kBF16},
                                              {QuantKind::kFp8Block, 128, 128, DType::kF32}};
  for (const cuda::QuantCase& c : cases) {
    SCOPED_TRACE(c.name());
    if (c.kind == QuantKind::kMxfp4) {
      const MoeLayer l = make_layer(&c, true, 8, 4, 512, 2880);
      check_ranks(l, {{2, 4, 0, 2880}, {6, 8, 0, 2880}}, c.name() + " experts, ranks 1 and 3 of 4", false);
      check_ranks(l, {{0, 2, 0, 2880}, {2, 4, 0, 2880}, {4, 6, 0, 2880}, {6, 8, 0, 2880}}, c.name() + " EP 4");
      check_ranks(l, {{0, 8, 0, 1440}, {0, 8, 1440, 2880}}, c.name() + " TP 2");
      continue;
    }
    const MoeLayer l = make_layer(&c, false, 16, 4, 1024, 512);
    check_ranks(l, {{4, 8, 0, 512}, {12, 16, 0, 512}}, c.name() + " experts, ranks 1 and 3 of 4", false);
    check_ranks(l, {{0, 4, 0, 512}, {4, 8, 0, 512}, {8, 12, 0, 512}, {12, 16, 0, 512}}, c.name() + " EP 4");
    check_ranks(l, {{0, 16, 0, 256}, {0, 16, 256, 512}}, c.name() + " TP 2");
    check_ranks(l, {{0, 16, 0, 128}, {0, 16, 128, 256}, {0, 16, 256, 384}, {0, 16, 384, 512}}, c.name() + " TP 4");
    if (c.kind != QuantKind::kFp8Block) {  // 64 is not a whole 128 x 128 scale block
      std::vector<std::array<int64_t, 4>> tp8;
      for (int64_t r = 0; r < 8; ++r) tp8.push_back({0, 16, 64 * r, 64 * (r + 1)});
      check_ranks(l, tp8, c.name() + " TP 8");
    }
  }
}

// Slices that split a scale group are refused at upload with the reason; a partial last
// INT4 group (the checkpoint's scales rounded up) packs and multiplies correctly.
TEST_F(CudaParallelOps, QuantizedSlicesOffTheScaleGroupsFailClearly) {
  auto q = cuda::random_quantized({QuantKind::kMxfp4}, 8, 48, rng_);  // 48 = 1.5 groups of 32
  auto p = gpu_->upload_quantized(q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("32-input scale groups"), std::string::npos) << p.status().message();
  q = cuda::random_quantized({QuantKind::kNvfp4}, 8, 40, rng_);
  p = gpu_->upload_quantized(q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("16-input scale groups"), std::string::npos) << p.status().message();
  q = cuda::random_quantized({QuantKind::kInt4Group, 128, 0, DType::kBF16}, 8, 1408, rng_);
  q.n_in = 1440;  // a scale tensor too short for 1440 inputs
  q.data = host_tensor(DType::kI32, {8, 1440 / 8});
  p = gpu_->upload_quantized(q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("scales (expected 96)"), std::string::npos) << p.status().message();

  // INT4 g128 over 1440 inputs: 12 groups a row, the last of 32 inputs.
  const int64_t n_out = 40, n_in = 1440;
  ops::Weight wc;
  wc.quant = cuda::random_quantized({QuantKind::kInt4Group, 32, 0, DType::kBF16}, n_out, n_in, rng_);
  wc.quant.block_k = 128;
  wc.quant.scale = host_tensor(DType::kBF16, {n_out, 12});
  std::uniform_real_distribution<float> unit(0.5f, 1.5f);
  for (int64_t i = 0; i < wc.quant.scale.numel(); ++i) cuda::put_scale(wc.quant.scale, i, 0.01f * unit(rng_));
  auto packed = gpu_->upload_quantized(wc.quant);
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  ops::Weight wg;
  wg.quant = std::move(packed).value();
  for (int rows : {3, 40}) {  // GEMV and tiles
    const auto [ref, got] = linear_on_both(wc, wg, random({rows, n_in}));
    double max_ref = 0.0, max_err = 0.0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      max_ref = std::max(max_ref, double(std::abs(ref.as<float>()[i])));
      max_err = std::max(max_err, std::abs(double(got[size_t(i)]) - ref.as<float>()[i]));
    }
    EXPECT_LE(max_err, 2 * kBf16Tol * max_ref) << rows << " rows: max error " << max_err << " of " << max_ref;
  }
}

}  // namespace
}  // namespace kiln
