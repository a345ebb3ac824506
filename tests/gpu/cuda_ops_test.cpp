// Every CUDA op against the CPU reference on random data (never zeros), with the
// output poisoned before the op runs so an unwritten element cannot pass.
//
// Inputs are rounded to bf16 first, so both backends see identical values; the
// CUDA result is rounded to bf16 once at its output (ops accumulate in fp32), so
// the tolerance is two bf16 half-ulps of the largest reference value:
//   |cuda - cpu| <= 2 * 2^-8 * max|cpu|.
// GPU tests run with --smem-cap (KILN_SMEM_CAP, default 101376).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>
#include <cstdlib>
#include <random>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_backend_impl.h"
#include "backends/cuda/selftest.h"
#include "gpu/gpu_test_util.h"

namespace kiln {
namespace {

using gpu_testing::bf16_round;
using gpu_testing::kBf16Tol;

class CudaOps : public gpu_testing::GpuTest {
 protected:
  void expect_close(const std::vector<float>& got, const Tensor& ref, double tol, const char* what) {
    ASSERT_EQ(int64_t(got.size()), ref.numel()) << what;
    double max_ref = 0.0, max_err = 0.0;
    for (int64_t i = 0; i < ref.numel(); ++i) max_ref = std::max(max_ref, double(std::abs(ref.as<float>()[i])));
    for (int64_t i = 0; i < ref.numel(); ++i) {
      ASSERT_FALSE(std::isnan(got[size_t(i)])) << what << ": element " << i << " not written (or NaN)";
      max_err = std::max(max_err, std::abs(double(got[size_t(i)]) - ref.as<float>()[i]));
    }
    EXPECT_LE(max_err, tol * max_ref) << what << ": max error " << max_err << " vs max |ref| " << max_ref;
    RecordProperty(std::string(what) + "_rel_err", std::to_string(max_err / max_ref));
  }

};

TEST_F(CudaOps, LinearMatchesCpuAtModelShapes) {
  // (tokens, n_out, n_in): odd token counts, gpt-oss / Qwen3 / GLM projection shapes; at
  // 1-8 tokens the bf16 GEMV, also over a last 128-input block of 8 inputs and a last
  // unit of 12 rows (8 x 300 x 1032); the Gated DeltaNet fixtures' small shapes (one
  // partial block of 48 / 64 / 96 inputs; 1-8 rows out). At 1-4 tokens the row GEMV
  // (row_gemv.cu) and, with it off, the bf16 GEMV: odd outputs (a CTA's second row past
  // the end), K slices of unequal length and empty ones (48 inputs: 6 chunks over 4 warps).
  const int rule = cuda::bf16_row_gemv_rows();
  for (const int row_rows : {cuda::kRowGemvMaxRows, 0}) {
    cuda::set_bf16_row_gemv_rows(row_rows);
    for (auto [t, n, k] : {std::tuple{1, 2880, 2880}, {3, 512, 2880}, {8, 300, 1032}, {17, 4096, 2048},
                           {200, 640, 5120}, {7, 64, 96}, {3, 64, 96}, {7, 192, 64}, {7, 8, 64}, {7, 1, 64},
                           {7, 320, 64}, {5, 64, 48}, {2, 128, 64}, {1, 301, 1032}, {2, 7, 2056}, {4, 1, 48},
                           {3, 513, 4096}, {1, 5120, 2048}, {4, 2048, 4096}}) {
      if (row_rows == 0 && t > cuda::kRowGemvMaxRows) continue;  // (the same path either way)
      SCOPED_TRACE(::testing::Message() << t << "x" << n << "x" << k << ", row GEMV to " << row_rows << " rows");
      Tensor x = random({t, k}), w = random({n, k}, 0.05f), b = random({n}, 0.1f);
      ops::Weight wc{.data = as_bf16(w), .bias = as_bf16(b)};
      Tensor ref = host_tensor(DType::kF32, {t, n});
      cpu_->linear({.x = x, .w = &wc, .out = ref});
      ops::Weight wg{.data = gpu_->upload(wc.data), .bias = gpu_->upload(wc.bias)};
      Tensor out = poisoned({t, n});
      gpu_->linear({.x = to_gpu(x), .w = &wg, .out = out});
      expect_close(from_gpu(out), ref, kBf16Tol, "linear");
    }
  }
  cuda::set_bf16_row_gemv_rows(rule);
}

// Linears of one input (a layer's q, k and v; an MLP's gate and up): at 1-8 tokens one
// bf16 GEMV launch for all of them, beyond that one cuBLASLt GEMM each; gpt-oss's q / k / v
// with biases, and odd parts (a last unit of 12 rows, then one of 4 rows).
TEST_F(CudaOps, LinearsOfOneInputMatchCpu) {
  for (const auto& [t, n_outs, k] : {std::tuple{1, std::vector<int64_t>{4096, 512, 512}, 2880},
                                     {5, std::vector<int64_t>{300, 20}, 1032},
                                     {2, std::vector<int64_t>{301, 20, 7}, 1032},  // the row GEMV, odd parts
                                     {8, std::vector<int64_t>{4096, 512, 512}, 2880},
                                     {17, std::vector<int64_t>{640, 128}, 1032},
                                     {7, std::vector<int64_t>{192, 8}, 64},
                                     {7, std::vector<int64_t>{96, 96}, 64}}) {
    SCOPED_TRACE(::testing::Message() << t << " tokens, " << n_outs.size() << " linears of " << k);
    const Tensor x = random({t, k});
    std::vector<ops::Weight> wc(n_outs.size()), wg(n_outs.size());
    ops::LinearsArgs a{.x = to_gpu(x)};
    for (size_t i = 0; i < n_outs.size(); ++i) {
      wc[i] = ops::Weight{.data = as_bf16(random({n_outs[i], k}, 0.05f)), .bias = as_bf16(random({n_outs[i]}, 0.1f))};
      wg[i] = ops::Weight{.data = gpu_->upload(wc[i].data), .bias = gpu_->upload(wc[i].bias)};
      a.w[i] = &wg[i];
      a.out[i] = poisoned({t, n_outs[i]});
    }
    gpu_->linears(a);
    for (size_t i = 0; i < n_outs.size(); ++i) {
      Tensor ref = host_tensor(DType::kF32, {t, n_outs[i]});
      cpu_->linear({.x = x, .w = &wc[i], .out = ref});
      expect_close(from_gpu(a.out[i]), ref, kBf16Tol, "linears");
    }
  }
}

// The same linears loaded as row views of one matrix (WeightLoader::adjacent_linears): beyond
// the GEMV's rows and up to 512 one GEMM over them all and one kernel handing out the
// columns (biases added in fp32); at 1-8 rows the GEMV as before, past 512 a GEMM each.
// With biases (gpt-oss) and without (Qwen3: a bf16 product), and views in another order
// (not adjacent) left apart.
TEST_F(CudaOps, AdjacentLinearsMatchCpu) {
  for (const bool bias : {false, true})
    for (const auto& [t, n_outs, k] : {std::tuple{64, std::vector<int64_t>{2048, 256, 256}, 2048},
                                       {17, std::vector<int64_t>{4096, 512, 512}, 2880},
                                       {9, std::vector<int64_t>{640, 128}, 1032},
                                       {200, std::vector<int64_t>{96, 32, 32}, 64},
                                       {33, std::vector<int64_t>{100, 20}, 64},      // not 8s: apart
                                       {4, std::vector<int64_t>{640, 128, 128}, 1032},   // the GEMV
                                       {600, std::vector<int64_t>{96, 32, 32}, 64}}) {  // past 512: apart
      for (const bool reversed : {false, true}) {
        SCOPED_TRACE(::testing::Message() << t << " tokens, " << n_outs.size() << " linears of " << k
                                          << (bias ? " with biases" : "") << (reversed ? ", not adjacent" : ""));
        const Tensor x = random({t, k});
        int64_t n_all = 0;
        for (int64_t n : n_outs) n_all += n;
        const Tensor all = as_bf16(random({n_all, k}, 0.05f));
        const Tensor all_gpu = gpu_->upload(all);
        std::vector<ops::Weight> wc(n_outs.size()), wg(n_outs.size());
        ops::LinearsArgs a{.x = to_gpu(x)};
        int64_t row = 0;
        for (size_t i = 0; i < n_outs.size(); ++i) {
          wc[i] = ops::Weight{.data = all.slice0(row, row + n_outs[i])};
          wg[i] = ops::Weight{.data = all_gpu.slice0(row, row + n_outs[i])};
          if (bias) {
            wc[i].bias = as_bf16(random({n_outs[i]}, 0.1f));
            wg[i].bias = gpu_->upload(wc[i].bias);
          }
          row += n_outs[i];
        }
        for (size_t j = 0; j < n_outs.size(); ++j) {
          const size_t i = reversed ? n_outs.size() - 1 - j : j;
          a.w[j] = &wg[i];
          a.out[j] = poisoned({t, n_outs[i]});
        }
        auto* cuda = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
        ASSERT_NE(cuda, nullptr);
        const int64_t before = cuda->adjacent_gemms();
        gpu_->linears(a);
        // One GEMM exactly where the views are in order, past the GEMV (8 rows), up to 512
        // rows, every part a multiple of 8 columns.
        const bool eights = std::all_of(n_outs.begin(), n_outs.end(), [](int64_t n) { return n % 8 == 0; });
        EXPECT_EQ(cuda->adjacent_gemms() - before, !reversed && t > 8 && t <= 512 && eights ? 1 : 0);
        for (size_t j = 0; j < n_outs.size(); ++j) {
          const size_t i = reversed ? n_outs.size() - 1 - j : j;
          Tensor ref = host_tensor(DType::kF32, {t, n_outs[i]});
          cpu_->linear({.x = x, .w = &wc[i], .out = ref});
          expect_close(from_gpu(a.out[j]), ref, kBf16Tol, "adjacent linears");
        }
      }
    }
}

TEST_F(CudaOps, RmsNormMatchesCpu) {
  // 2880: 16-byte loads, a block per row; 1030: one element per load; 64 / 128 / 512 /
  // 1024: 8, 8, 16 and 32 threads per row (a lane group), rows not a multiple of the
  // block's; 100: one element per load, 32 threads per row.
  for (auto [rows, dim] : {std::pair{1, 2880}, {17, 2880}, {200, 2880}, {3, 1030}, {65, 64}, {129, 128},
                           {33, 512}, {7, 1024}, {1, 128}, {9, 100}}) {
    for (bool with_residual : {true, false}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows of " << dim << (with_residual ? " + residual" : ""));
      Tensor x = random({rows, dim}), r = random({rows, dim}), w = random({dim});
      Tensor r_cpu = host_tensor(DType::kF32, {rows, dim});
      std::memcpy(r_cpu.data, r.data, r.nbytes());
      Tensor ref = host_tensor(DType::kF32, {rows, dim});
      cpu_->rms_norm({.x = x, .weight = w, .residual = with_residual ? r_cpu : Tensor{}, .out = ref, .eps = 1e-5f});
      Tensor rg = to_gpu(r), out = poisoned({rows, dim});
      gpu_->rms_norm({.x = to_gpu(x), .weight = gpu_->upload(w), .residual = with_residual ? rg : Tensor{}, .out = out,
                      .eps = 1e-5f});
      expect_close(from_gpu(out), ref, 3 * kBf16Tol, "rms_norm");  // + the bf16 residual sum
      if (with_residual) expect_close(from_gpu(rg), r_cpu, kBf16Tol, "residual");
    }
  }
}

using cuda::scattered_batch;

struct AttnCase {
  int n_heads, n_kv_heads, d_head, window;
  bool sinks;
};

TEST_F(CudaOps, PagedAttentionMatchesCpuForPrefillDecodeWindowsAndSinks) {
  // Real head sizes: gpt-oss (64, sinks, window), Qwen3 / GLM (128); fewer heads.
  for (const AttnCase c : {AttnCase{8, 1, 64, 20, true}, {16, 2, 128, 0, false}, {12, 1, 128, 0, false}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.n_heads << "/" << c.n_kv_heads << " d " << c.d_head);
    const int bs = 16, max_blocks = 4, n_blocks = 2 * max_blocks;
    // Step 1 caches every token; step 2 queries: a 37-token prefill, a 1-token
    // decode at position 49, and a 3-token chunk at 20..22.
    const std::vector<std::pair<int, int>> fill3 = {{37, 37}, {50, 50}, {23, 23}}, query3 = {{37, 37}, {1, 50}, {3, 23}};
    const ops::BatchMeta b1 = scattered_batch(fill3, bs, max_blocks), b2 = scattered_batch(query3, bs, max_blocks);
    Tensor k = random({b1.n_tokens(), c.n_kv_heads, c.d_head}), v = random({b1.n_tokens(), c.n_kv_heads, c.d_head});
    Tensor kc = host_tensor(DType::kF32, {3 * n_blocks, bs, c.n_kv_heads, c.d_head});
    Tensor vc = host_tensor(DType::kF32, {3 * n_blocks, bs, c.n_kv_heads, c.d_head});
    cpu_->kv_store({.k = k, .v = v, .k_cache = kc, .v_cache = vc, .batch = &b1});
    Tensor kcg = gpu_->alloc(DType::kBF16, kc.shape), vcg = gpu_->alloc(DType::kBF16, vc.shape);
    gpu_->begin_step(b1);
    gpu_->kv_store({.k = to_gpu(k), .v = to_gpu(v), .k_cache = kcg, .v_cache = vcg, .batch = &b1});
    Tensor q = random({b2.n_tokens(), c.n_heads, c.d_head});
    Tensor sinks = c.sinks ? random({c.n_heads}, 2.0f) : Tensor{};
    const float scale = 1.0f / std::sqrt(float(c.d_head));
    Tensor ref = host_tensor(DType::kF32, {b2.n_tokens(), c.n_heads, c.d_head});
    cpu_->attention({.q = q, .k_cache = kc, .v_cache = vc, .out = ref, .sinks = sinks, .batch = &b2, .scale = scale,
                     .sliding_window = c.window});
    gpu_->begin_step(b2);
    Tensor out = poisoned(ref.shape);
    gpu_->attention({.q = to_gpu(q), .k_cache = kcg, .v_cache = vcg, .out = out,
                     .sinks = c.sinks ? gpu_->upload(sinks) : Tensor{}, .batch = &b2, .scale = scale,
                     .sliding_window = c.window});
    expect_close(from_gpu(out), ref, kBf16Tol, "attention");
  }
}

// Both MLA attend paths, over a bf16 and an e4m3 latent cache (mla_store on both
// backends must write the same codes and scales). 20 heads: a partial 16-head tile on
// the mma path; contexts 300 and 700 over 64-block tables: several KV splits, a partial
// last key tile; sequence 0 has 5 query tokens (causal within the step).
TEST_F(CudaOps, MlaMatchesCpuAtDeepSeekHeadSizes) {
  const int n_heads = 20, d_nope = 128, d_rope = 64, d_v = 128, d_latent = 512, bs = 16, max_blocks = 64;
  const ops::BatchMeta b1 = scattered_batch({{300, 300}, {700, 700}}, bs, max_blocks);
  const ops::BatchMeta b2 = scattered_batch({{5, 300}, {1, 700}}, bs, max_blocks);
  Tensor kv_b = random({n_heads * (d_nope + d_v), d_latent}, 0.05f);
  ops::Weight wc{.data = as_bf16(kv_b)};
  ops::Weight wg{.data = gpu_->upload(wc.data)};
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  ASSERT_NE(cuda, nullptr);
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "e4m3 cache" : "bf16 cache");
    Tensor lat = random({b1.n_tokens(), d_latent}), rope = random({b1.n_tokens(), d_rope});
    const Shape shape{2 * max_blocks, bs, d_latent + d_rope}, scales{2 * max_blocks, bs, 2};
    Tensor cache = host_tensor(fp8 ? DType::kF8E4M3 : DType::kF32, shape);
    Tensor cache_scale = fp8 ? host_tensor(DType::kF32, scales) : Tensor{};
    cpu_->mla_store({.kv_latent = lat, .k_rope = rope, .latent_cache = cache, .latent_scale = cache_scale,
                     .batch = &b1});
    Tensor cache_g = gpu_->alloc(fp8 ? DType::kF8E4M3 : DType::kBF16, shape);
    Tensor scale_g = fp8 ? gpu_->alloc(DType::kF32, scales) : Tensor{};
    gpu_->begin_step(b1);
    gpu_->mla_store({.kv_latent = to_gpu(lat), .k_rope = to_gpu(rope), .latent_cache = cache_g,
                     .latent_scale = scale_g, .batch = &b1});
    if (fp8) {  // the stored bytes of every slot the step wrote, codes and scales
      gpu_->synchronize();
      const int64_t row = d_latent + d_rope;
      std::vector<uint8_t> codes(size_t(cache.nbytes()));
      std::vector<float> sc(size_t(cache_scale.numel()));
      ASSERT_EQ(cudaMemcpy(codes.data(), cache_g.data, codes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(sc.data(), scale_g.data, sc.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int32_t slot : b1.slot_mapping) {
        ASSERT_EQ(std::memcmp(codes.data() + slot * row, cache.as<uint8_t>() + slot * row, size_t(row)), 0) << slot;
        ASSERT_EQ(sc[size_t(slot) * 2], cache_scale.as<float>()[slot * 2]) << slot;
        ASSERT_EQ(sc[size_t(slot) * 2 + 1], cache_scale.as<float>()[slot * 2 + 1]) << slot;
      }
    }
    Tensor qn = random({b2.n_tokens(), n_heads, d_nope}), qr = random({b2.n_tokens(), n_heads, d_rope});
    const float scale = 1.0f / std::sqrt(float(d_nope + d_rope));
    Tensor ref = host_tensor(DType::kF32, {b2.n_tokens(), n_heads, d_v});
    cpu_->mla_attention({.q_nope = qn, .q_rope = qr, .latent_cache = cache, .latent_scale = cache_scale,
                         .kv_b = &wc, .out = ref, .batch = &b2, .scale = scale});
    // The mma path rounds q_lat and the probabilities to bf16 (one half-ulp each).
    for (auto [path, tol] :
         {std::pair{cuda::MlaPath::kWarp, kBf16Tol}, std::pair{cuda::MlaPath::kMma, 2 * kBf16Tol}}) {
      SCOPED_TRACE(cuda::mla_path_name(path));
      cuda->force_mla_path(path);
      gpu_->begin_step(b2);
      Tensor out = poisoned(ref.shape);
      gpu_->mla_attention({.q_nope = to_gpu(qn), .q_rope = to_gpu(qr), .latent_cache = cache_g,
                           .latent_scale = scale_g, .kv_b = &wg, .out = out, .batch = &b2, .scale = scale});
      expect_close(from_gpu(out), ref, tol, "mla");
    }
  }
  cuda->force_mla_path(cuda::MlaPath::kAuto);
}

TEST_F(CudaOps, RopeMatchesCpuForEveryStyle) {
  const ops::BatchMeta b = scattered_batch({{5, 900}, {3, 3}}, 16, 64);
  for (auto style : {ops::RopeStyle::kHalf, ops::RopeStyle::kInterleaved}) {
    ops::RopeTable tab{.d_rot = 64, .attention_factor = 1.3f, .style = style};
    for (int i = 0; i < 32; ++i) tab.inv_freq.push_back(std::pow(10000.0f, -float(2 * i) / 64.0f));
    Tensor x = random({b.n_tokens(), 4, 128});
    Tensor xg = to_gpu(x);
    cpu_->rope({.x = x, .batch = &b, .table = &tab});
    gpu_->begin_step(b);
    gpu_->rope({.x = xg, .batch = &b, .table = &tab});
    expect_close(from_gpu(xg), x, 2 * kBf16Tol, "rope");
  }
}

// The fused per-head norm + rope of q and k against the CPU reference's rms_norm + rope:
// Qwen3 heads (32 / 4 of 128, both norms, full half-style rotary), gpt-oss-like ones (64 /
// 8 of 64, no norms), a partial interleaved rotary with only q normed, heads of 256 (the
// kernel's largest), and heads of 320 (past it: the backend runs the two ops instead).
TEST_F(CudaOps, QkNormRopeMatchesCpu) {
  struct Case {
    int n_q, n_k, d_head, d_rot;
    bool q_norm, k_norm;
    ops::RopeStyle style;
  };
  const Case cases[] = {{32, 4, 128, 128, true, true, ops::RopeStyle::kHalf},
                        {64, 8, 64, 64, false, false, ops::RopeStyle::kHalf},
                        {6, 2, 96, 32, true, false, ops::RopeStyle::kInterleaved},
                        {4, 1, 256, 128, true, true, ops::RopeStyle::kHalf},
                        {2, 1, 320, 64, true, true, ops::RopeStyle::kHalf}};
  for (const ops::BatchMeta& b : {scattered_batch({{1, 40}}, 16, 64), scattered_batch({{5, 900}, {3, 3}}, 16, 64),
                                  scattered_batch({{300, 300}}, 16, 64)}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << b.n_tokens() << " tokens, heads " << c.n_q << " / " << c.n_k << " of "
                                        << c.d_head << ", rotary " << c.d_rot);
      ops::RopeTable tab{.d_rot = c.d_rot, .attention_factor = 1.2f, .style = c.style};
      for (int i = 0; i < c.d_rot / 2; ++i) tab.inv_freq.push_back(std::pow(10000.0f, -float(2 * i) / float(c.d_rot)));
      Tensor q = random({b.n_tokens(), c.n_q, c.d_head}), k = random({b.n_tokens(), c.n_k, c.d_head});
      Tensor qn = c.q_norm ? random({c.d_head}) : Tensor{}, kn = c.k_norm ? random({c.d_head}) : Tensor{};
      Tensor qg = to_gpu(q), kg = to_gpu(k);
      cpu_->qk_norm_rope({.q = q, .k = k, .q_norm = qn, .k_norm = kn, .eps = 1e-6f, .batch = &b, .table = &tab});
      gpu_->begin_step(b);
      gpu_->qk_norm_rope({.q = qg, .k = kg, .q_norm = c.q_norm ? gpu_->upload(qn) : Tensor{},
                          .k_norm = c.k_norm ? gpu_->upload(kn) : Tensor{}, .eps = 1e-6f, .batch = &b, .table = &tab});
      // The normed values are rounded to bf16 before the rotation (as rms_norm stores them).
      expect_close(from_gpu(qg), q, 4 * kBf16Tol, "q");
      expect_close(from_gpu(kg), k, 4 * kBf16Tol, "k");
    }
  }
}

// qk_norm_rope with a store writes the caches as kv_store after it does, bit for bit
// against the two ops on the GPU (a bf16 cache: in the same launch; an e4m3 one: kv_store
// after it; heads of 320: the ops one after the other), q and k too; the bf16 keys within
// a bf16 rounding of the CPU's. A padding row (kPadSlot) stores nothing.
TEST_F(CudaOps, QkNormRopeWithAStoreWritesTheCacheLikeKvStore) {
  struct Case {
    int n_q, n_k, d_head, d_rot;
    bool norms;
  };
  const int bs = 16, max_blocks = 64;
  ops::BatchMeta b = scattered_batch({{5, 900}, {1, 41}, {3, 3}}, bs, max_blocks);
  b.slot_mapping[2] = ops::kPadSlot;
  const int64_t n_blocks = 3 * max_blocks;
  for (const Case c : {Case{16, 2, 128, 128, true}, {6, 2, 96, 32, false}, {2, 1, 320, 64, true}}) {
    for (bool fp8 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "heads " << c.n_q << " / " << c.n_k << " of " << c.d_head << ", rotary "
                                        << c.d_rot << (fp8 ? ", e4m3 cache" : ", bf16 cache"));
      ops::RopeTable tab{.d_rot = c.d_rot, .attention_factor = 1.0f, .style = ops::RopeStyle::kHalf};
      for (int i = 0; i < c.d_rot / 2; ++i) tab.inv_freq.push_back(std::pow(10000.0f, -float(2 * i) / float(c.d_rot)));
      Tensor q = random({b.n_tokens(), c.n_q, c.d_head}), k = random({b.n_tokens(), c.n_k, c.d_head});
      Tensor v = random({b.n_tokens(), c.n_k, c.d_head});
      Tensor qn = c.norms ? random({c.d_head}) : Tensor{}, kn = c.norms ? random({c.d_head}) : Tensor{};
      const Shape shape{n_blocks, bs, c.n_k, c.d_head}, scales{n_blocks, bs, c.n_k};
      struct Run {
        Tensor q, k, v, k_cache, v_cache, k_scale, v_scale;
      };
      Run runs[2];
      for (Run& r : runs) {
        r = {.q = to_gpu(q), .k = to_gpu(k), .v = to_gpu(v),
             .k_cache = gpu_->alloc(fp8 ? DType::kF8E4M3 : DType::kBF16, shape),
             .v_cache = gpu_->alloc(fp8 ? DType::kF8E4M3 : DType::kBF16, shape),
             .k_scale = fp8 ? gpu_->alloc(DType::kF32, scales) : Tensor{},
             .v_scale = fp8 ? gpu_->alloc(DType::kF32, scales) : Tensor{}};
        for (const Tensor* t : {&r.k_cache, &r.v_cache, &r.k_scale, &r.v_scale}) {
          if (t->defined()) {
            ASSERT_EQ(cudaMemset(t->data, 0x5a, size_t(t->nbytes())), cudaSuccess);
          }
        }
      }
      const Tensor qng = c.norms ? gpu_->upload(qn) : Tensor{}, kng = c.norms ? gpu_->upload(kn) : Tensor{};
      gpu_->begin_step(b);
      for (int i = 0; i < 2; ++i) {
        Run& r = runs[i];
        const ops::KvStoreArgs store{.k = r.k, .v = r.v, .k_cache = r.k_cache, .v_cache = r.v_cache,
                                     .k_scale = r.k_scale, .v_scale = r.v_scale, .batch = &b};
        gpu_->qk_norm_rope({.q = r.q, .k = r.k, .q_norm = qng, .k_norm = kng, .eps = 1e-6f, .batch = &b, .table = &tab,
                            .store = i == 0 ? &store : nullptr});
        if (i == 1) gpu_->kv_store(store);
      }
      gpu_->synchronize();
      EXPECT_EQ(from_gpu(runs[0].q), from_gpu(runs[1].q));
      EXPECT_EQ(from_gpu(runs[0].k), from_gpu(runs[1].k));
      for (auto member : {&Run::k_cache, &Run::v_cache, &Run::k_scale, &Run::v_scale}) {
        const Tensor &a = runs[0].*member, &z = runs[1].*member;
        if (!a.defined()) continue;
        std::vector<uint8_t> ha(size_t(a.nbytes())), hz(size_t(z.nbytes()));
        ASSERT_EQ(cudaMemcpy(ha.data(), a.data, ha.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(hz.data(), z.data, hz.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_TRUE(ha == hz) << "a cache written by the store differs from kv_store's";
      }
      if (fp8) continue;
      // Against the CPU (Backend's default: the ops one after the other): the slots
      // written, and the padding row's slot left as it was.
      Tensor kc = host_tensor(DType::kF32, shape), vc = host_tensor(DType::kF32, shape);
      cpu_->qk_norm_rope({.q = q, .k = k, .q_norm = qn, .k_norm = kn, .eps = 1e-6f, .batch = &b, .table = &tab,
                          .store = nullptr});
      cpu_->kv_store({.k = k, .v = v, .k_cache = kc, .v_cache = vc, .batch = &b});
      const std::vector<float> kg = from_gpu(runs[0].k_cache), vg = from_gpu(runs[0].v_cache);
      const int64_t row = int64_t(c.n_k) * c.d_head;
      std::vector<float> k_slots, v_slots, k_ref, v_ref;
      for (int32_t slot : b.slot_mapping) {
        if (slot < 0) continue;
        k_slots.insert(k_slots.end(), kg.begin() + slot * row, kg.begin() + (slot + 1) * row);
        v_slots.insert(v_slots.end(), vg.begin() + slot * row, vg.begin() + (slot + 1) * row);
        k_ref.insert(k_ref.end(), kc.as<float>() + slot * row, kc.as<float>() + (slot + 1) * row);
        v_ref.insert(v_ref.end(), vc.as<float>() + slot * row, vc.as<float>() + (slot + 1) * row);
      }
      const auto host = [](const std::vector<float>& x) {
        Tensor t = host_tensor(DType::kF32, {int64_t(x.size())});
        std::memcpy(t.data, x.data(), x.size() * 4);
        return t;
      };
      expect_close(k_slots, host(k_ref), 4 * kBf16Tol, "stored k");
      EXPECT_EQ(v_slots, v_ref) << "stored v";
      const int32_t pad_slot = int32_t(b.slot(0, 897));  // the padding row's position: not written
      std::vector<uint8_t> raw(size_t(row) * 2);
      ASSERT_EQ(cudaMemcpy(raw.data(), static_cast<const char*>(runs[0].k_cache.data) + size_t(pad_slot) * raw.size(),
                           raw.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_TRUE(std::all_of(raw.begin(), raw.end(), [](uint8_t x) { return x == 0x5a; })) << "the padding row";
    }
  }
}

struct MoeCase {
  ops::RouterKind kind;
  int n_experts, top_k, n_group, topk_group, d_model, d_ff;
  bool fused, interleaved, transposed, biases;
  ops::GluKind glu;
};

TEST_F(CudaOps, MoeMatchesCpuForEveryRouterAndLayout) {
  const MoeCase cases[] = {
      // gpt-oss: top-k-softmax, fused interleaved input-major experts with biases, clamped SwiGLU
      {ops::RouterKind::kTopKSoftmax, 8, 4, 1, 1, 2880, 2880, true, true, true, true, ops::GluKind::kGptOssClamp},
      // Qwen3-30B-A3B shape: softmax top-8 over separate gate/up
      {ops::RouterKind::kSoftmaxTopK, 32, 8, 1, 1, 2048, 768, false, false, false, false, ops::GluKind::kSilu},
      // DeepSeek / Kimi / GLM: sigmoid grouped top-k with correction bias and scaling
      {ops::RouterKind::kSigmoidGroupedTopK, 64, 8, 8, 4, 1024, 512, false, false, false, false, ops::GluKind::kSilu},
      // fused [gate; up] rows (concatenated, row-major), odd width: column tails in every tile
      {ops::RouterKind::kSoftmaxTopK, 16, 2, 1, 1, 520, 200, true, false, false, false, ops::GluKind::kSilu},
      // the deepseek_v3 test fixture's experts on one rank, and sharded over 2 and 4 ranks
      {ops::RouterKind::kSigmoidGroupedTopK, 16, 4, 4, 2, 64, 32, false, false, false, false, ops::GluKind::kSilu},
      {ops::RouterKind::kSigmoidGroupedTopK, 16, 4, 4, 2, 64, 16, false, false, false, false, ops::GluKind::kSilu},
      {ops::RouterKind::kSigmoidGroupedTopK, 16, 4, 4, 2, 64, 8, false, false, false, false, ops::GluKind::kSilu},
      // the Gated DeltaNet fixtures' experts (Qwen3-Next / Qwen3.5: softmax top-2 of 8)
      {ops::RouterKind::kSoftmaxTopK, 8, 2, 1, 1, 64, 32, false, false, false, false, ops::GluKind::kSilu},
      // row-major interleaved gate / up with biases and the clamped SwiGLU (every path)
      {ops::RouterKind::kTopKSoftmax, 8, 4, 1, 1, 512, 264, true, true, false, true, ops::GluKind::kGptOssClamp},
      // input-major fused but not interleaved: only the GEMV path takes it
      {ops::RouterKind::kSoftmaxTopK, 8, 2, 1, 1, 256, 128, true, false, true, true, ops::GluKind::kSilu},
  };
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  ASSERT_NE(cuda, nullptr);
  for (const MoeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "router " << int(c.kind) << " d " << c.d_model << " ff " << c.d_ff);
    ops::MoeExperts ec, eg;
    ec.d_ff = eg.d_ff = c.d_ff;
    ec.gate_up_interleaved = eg.gate_up_interleaved = c.interleaved;
    auto weight = [&](int64_t n_out, int64_t n_in, bool bias, ops::Weight& wc, ops::Weight& wg) {
      Tensor w = c.transposed ? random({n_in, n_out}, 0.03f) : random({n_out, n_in}, 0.03f);
      wc = {.data = as_bf16(w), .transposed = c.transposed};
      if (bias) wc.bias = as_bf16(random({n_out}, 0.1f));
      wg = {.data = gpu_->upload(wc.data), .transposed = c.transposed};
      if (bias) wg.bias = gpu_->upload(wc.bias);
    };
    for (int e = 0; e < c.n_experts; ++e) {
      ops::Weight a, b;
      if (c.fused) {
        weight(2 * c.d_ff, c.d_model, c.biases, a, b);
        ec.gate_up.push_back(a), eg.gate_up.push_back(b);
      } else {
        weight(c.d_ff, c.d_model, false, a, b);
        ec.gate.push_back(a), eg.gate.push_back(b);
        weight(c.d_ff, c.d_model, false, a, b);
        ec.up.push_back(a), eg.up.push_back(b);
      }
      weight(c.d_model, c.d_ff, c.biases, a, b);
      ec.down.push_back(a), eg.down.push_back(b);
    }
    Tensor router = random({c.n_experts, c.d_model}, 0.05f);
    ops::Weight rc{.data = as_bf16(router)}, rg{.data = gpu_->upload(rc.data)};
    if (c.biases) rc.bias = as_bf16(random({c.n_experts}, 0.1f)), rg.bias = gpu_->upload(rc.bias);
    const bool grouped_router = c.kind == ops::RouterKind::kSigmoidGroupedTopK;
    const Tensor corr_even = grouped_router ? random({c.n_experts}, 0.05f) : Tensor{};
    // Skewed routing (grouped routers): a correction bias that sends every token to the
    // same top_k experts of the first groups, so those experts take every token (several
    // GEMV tiles each) and the rest none, as a trained router's favourites can.
    Tensor corr_skew;
    if (grouped_router) {
      corr_skew = host_tensor(DType::kF32, {c.n_experts});
      const int per_group = c.n_experts / c.n_group;
      for (int e = 0; e < c.n_experts; ++e) {
        const int rank = (e / per_group) * 2 + e % per_group;  // two favourites in each group in turn
        const bool favourite = e % per_group < 2 && rank < c.top_k;
        corr_skew.as<float>()[e] = corr_even.as<float>()[e] + (favourite ? 1.0f - 0.1f * float(rank) : 0.0f);
      }
    }
    const ops::RouterParams rp{.kind = c.kind, .n_experts = c.n_experts, .top_k = c.top_k, .n_group = c.n_group,
                               .topk_group = c.topk_group, .norm_topk_prob = true, .routed_scaling_factor = 2.5f};
    const cuda::MoeShape shape{.d_model = c.d_model, .d_ff = c.d_ff, .interleaved = c.interleaved,
                               .transposed = c.transposed};
    // 1-17 tokens: decode tiles (16 rows); 200 / 600: 64-row prefill tiles where
    // there are at least 32 rows per expert; with 64 experts and 1-3 tokens most
    // experts receive none; 7 / 28 / 200 tokens again with the skewed routing.
    for (const auto& [tokens, skew] : {std::pair{1, false}, {3, false}, {7, false}, {17, false}, {28, false},
                                       {200, false}, {600, false}, {7, true}, {28, true}, {200, true}}) {
      if (skew && !grouped_router) continue;
      const Tensor& corr = skew ? corr_skew : corr_even;
      SCOPED_TRACE(::testing::Message() << tokens << " tokens" << (skew ? ", skewed routing" : ""));
      Tensor x = random({tokens, c.d_model});
      Tensor ref = host_tensor(DType::kF32, {tokens, c.d_model});
      cpu_->moe({.x = x, .router = &rc, .correction_bias = corr, .experts = &ec, .routing = rp,
                 .glu = {.kind = c.glu}, .out = ref});
      for (cuda::MoePath path : {cuda::MoePath::kGemv, cuda::MoePath::kGrouped, cuda::MoePath::kStreamGemv}) {
        if (path != cuda::MoePath::kGemv && !cuda::moe_grouped_supported(shape, c.fused, c.n_experts)) continue;
        if (path == cuda::MoePath::kStreamGemv && c.transposed) continue;  // row-major experts only
        SCOPED_TRACE(cuda::moe_path_name(path));
        cuda->force_moe_path(path);
        // The streaming GEMV with the row GEMV (row_gemv.cu: tiles of 1-4 rows), without
        // it, and with three units a warp in its down product (kMoeDownUnits, which the
        // rule takes only for large layers of short d_ff).
        const int rule = cuda::bf16_row_gemv_rows();
        const std::vector<std::pair<int, int>> variants =
            path == cuda::MoePath::kStreamGemv
                ? std::vector<std::pair<int, int>>{{0, cuda::kRowGemvMaxRows}, {0, 0}, {3, 0}}
                : std::vector<std::pair<int, int>>{{0, rule}};
        for (const auto& [upw, row_rows] : variants) {
          SCOPED_TRACE(::testing::Message() << "units a warp " << upw << ", row GEMV to " << row_rows << " rows");
          cuda::set_quant_gemv_units_per_warp(upw);
          cuda::set_bf16_row_gemv_rows(row_rows);
          Tensor out = poisoned(ref.shape);
          gpu_->moe({.x = to_gpu(x), .router = &rg, .correction_bias = corr.defined() ? gpu_->upload(corr) : Tensor{},
                     .experts = &eg, .routing = rp, .glu = {.kind = c.glu}, .out = out});
          cuda::set_quant_gemv_units_per_warp(0);
          cuda::set_bf16_row_gemv_rows(rule);
          // Routing compares bf16-rounded router logits computed in a different
          // order; a near-tie can legitimately pick another expert. Inputs are
          // random, so a mismatch beyond tolerance here would be a real bug unless
          // a tie occurs; the check stays strict and reports the error.
          expect_close(from_gpu(out), ref, 2 * kBf16Tol, "moe");
        }
      }
      cuda->force_moe_path(cuda::MoePath::kAuto);
    }
  }
}

// A one-token step's routing (route_one_kernel: a thread per expert, ranks) against the
// general route + align (a warp per token, k rounds of argmax; the count-and-scan align)
// that every other token count takes: the same experts, weights, perm and tiles, bit
// for bit, for each rule, expert count (1-16 experts a lane), group layout and
// expert-parallel slice, and with tied scores (ties go to the lower expert id).
TEST_F(CudaOps, OneTokenRoutingIsRouteAndAlignBitForBit) {
  struct Case { int kind, n_experts, top_k, n_group, topk_group, first_local, n_local; bool ties; };
  const Case cases[] = {
      {0, 128, 8, 1, 1, 0, 0, false},    // Qwen3-30B-A3B
      {0, 128, 8, 1, 1, 0, 0, true},
      {1, 32, 4, 1, 1, 0, 0, false},     // gpt-oss-20b
      {1, 128, 4, 1, 1, 64, 64, true},   // gpt-oss-120b, the second of 2 expert-parallel ranks
      {2, 256, 8, 8, 4, 0, 0, false},    // DeepSeek-V3
      {2, 256, 8, 8, 4, 96, 32, true},
      {2, 160, 8, 1, 1, 0, 0, false},    // GLM-4.5 (one group)
      {2, 384, 8, 1, 1, 128, 128, false},  // Kimi K2 (16 a lane)
      {0, 60, 4, 1, 1, 0, 0, true},      // a count that is not a multiple of 32
      {2, 16, 4, 4, 2, 0, 0, false},     // the deepseek_v3 fixture
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rule " << c.kind << ", " << c.n_experts << " experts top " << c.top_k
                                      << ", groups " << c.n_group << "/" << c.topk_group << ", local ["
                                      << c.first_local << ", +" << c.n_local << ")" << (c.ties ? ", ties" : ""));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> logits(size_t(c.n_experts)), corr(size_t(c.n_experts));
    for (float& v : logits) v = normal(rng);
    for (float& v : corr) v = 0.05f * normal(rng);
    if (c.ties) {  // pairs of equal values (their corrections too), the largest again on the last expert
      for (int e = 1; e < c.n_experts; e += 7) logits[size_t(e)] = logits[size_t(e - 1)];
      for (int e = 1; e < c.n_experts; e += 7) corr[size_t(e)] = corr[size_t(e - 1)];
      const int top = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
      logits.back() = logits[size_t(top)], corr.back() = corr[size_t(top)];
    }
    const cuda::MoeRouting r{.kind = c.kind, .n_experts = c.n_experts, .top_k = c.top_k, .n_group = c.n_group,
                             .topk_group = c.topk_group, .norm_topk_prob = true, .routed_scaling_factor = 2.5f,
                             .first_local = c.first_local, .n_local = c.n_local};
    const int n_local = c.n_local > 0 ? c.n_local : c.n_experts, slots = cuda::moe_tile_slots(c.top_k, n_local, 1);
    const auto device = [](size_t bytes) {
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
      EXPECT_EQ(cudaMemset(p, 0x5a, bytes), cudaSuccess);
      return p;
    };
    auto* d_logits = static_cast<float*>(device(logits.size() * 4));
    auto* d_corr = static_cast<float*>(device(corr.size() * 4));
    ASSERT_EQ(cudaMemcpy(d_logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_corr, corr.data(), corr.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    const float* correction = c.kind == 2 ? d_corr : nullptr;
    struct Out { std::vector<int32_t> experts, perm; std::vector<float> weights; std::vector<int4> tiles; };
    Out got[2];
    for (int way = 0; way < 2; ++way) {
      auto* experts = static_cast<int32_t*>(device(size_t(c.top_k) * 4));
      auto* weights = static_cast<float*>(device(size_t(c.top_k) * 4));
      auto* perm = static_cast<int32_t*>(device(size_t(c.top_k) * 4));
      auto* tiles = static_cast<int4*>(device(size_t(slots) * sizeof(int4)));
      if (way == 0) {
        cuda::launch_route_align(d_logits, correction, r, 1, experts, weights, n_local, 1, perm, tiles, slots, nullptr);
      } else {
        cuda::launch_route(d_logits, correction, r, 1, experts, weights, nullptr);
        cuda::launch_moe_align(experts, c.top_k, n_local, 1, perm, tiles, slots, nullptr);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      Out& o = got[way];
      o.experts.resize(size_t(c.top_k)), o.perm.resize(size_t(c.top_k)), o.weights.resize(size_t(c.top_k));
      o.tiles.resize(size_t(slots));
      ASSERT_EQ(cudaMemcpy(o.experts.data(), experts, o.experts.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(o.weights.data(), weights, o.weights.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(o.perm.data(), perm, o.perm.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(o.tiles.data(), tiles, o.tiles.size() * sizeof(int4), cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (void* p : {static_cast<void*>(experts), static_cast<void*>(weights), static_cast<void*>(perm),
                      static_cast<void*>(tiles)})
        cudaFree(p);
    }
    cudaFree(d_logits);
    cudaFree(d_corr);
    EXPECT_EQ(got[0].experts, got[1].experts);
    EXPECT_EQ(0, std::memcmp(got[0].weights.data(), got[1].weights.data(), got[0].weights.size() * 4)) << "weights";
    int n_tiles = 0;
    for (int k = 0; k < c.top_k; ++k) n_tiles += got[1].experts[size_t(k)] >= 0;
    for (int k = 0; k < n_tiles; ++k) EXPECT_EQ(got[0].perm[size_t(k)], got[1].perm[size_t(k)]) << "perm " << k;
    for (int x = 0; x < slots; ++x) {
      const int4 a = got[0].tiles[size_t(x)], b = got[1].tiles[size_t(x)];
      EXPECT_TRUE(a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w)
          << "tile " << x << ": (" << a.x << ", " << a.y << ", " << a.z << ", " << a.w << ") against (" << b.x
          << ", " << b.y << ", " << b.z << ", " << b.w << ")";
    }
  }
}

// fill_random (--load-format dummy) gives the CPU's values: f32 to fp32 rounding (nvcc may
// fuse the multiply-adds), bf16 within one bf16 ulp of them.
TEST_F(CudaOps, FillRandomMatchesTheCpuFormula) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor g = gpu_->alloc(dt, {3, 70001});
    Tensor c = cpu_->alloc(dt, {3, 70001});
    gpu_->fill_random({.out = g, .seed = 99, .mean = 0.25f, .stddev = 0.02f});
    cpu_->fill_random({.out = c, .seed = 99, .mean = 0.25f, .stddev = 0.02f});
    std::vector<float> got(size_t(g.numel())), want(size_t(c.numel()));
    gpu_->to_host_f32(g, got.data());
    to_f32(c, want.data());
    int64_t off = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double tol = dt == DType::kF32 ? 1e-6 * std::abs(want[i]) : std::abs(want[i]) * 0x1p-7;
      off += std::abs(double(got[i]) - double(want[i])) > tol;
    }
    EXPECT_EQ(off, 0) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace kiln
