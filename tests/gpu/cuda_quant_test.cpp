// The quantized GEMMs (kernels/quant_gemm.cu) against the CPU reference, for every
// format the CUDA backend packs (tests/backends/cuda/quant_random.h): dense linears at
// real models' shapes and odd ones, on both tile shapes (decode: < 32 rows; prefill),
// and whole MoE layers over quantized experts. Outputs are poisoned before each call.
//
// Tolerance, per output element: the CPU computes x . W in fp32 with W exactly as
// dequantized; the GPU rounds each dequantized weight to bf16 (exact for MXFP4 and
// NVFP4, 2^-9 relative for INT4 and FP8 scales), accumulates in fp32 and rounds the
// output to bf16. So |gpu - cpu| <= 2^-8 |ref| + 2^-9 sum_k |x_k W_ok| (+ fp32 noise).
// Where the GPU runs W8A8 (FP8 weights with a scale per 128 inputs at >= 32 rows or
// 64-row MoE tiles: activations quantized to e4m3 per 128 inputs) the reference is the
// CPU backend with fp8_activations (and bf16 activations: the act between a MoE layer's
// GEMMs is quantized from bf16 on both), which quantizes the same blocks by the same
// rule; the bounds are unchanged (W8A8 rounds no weight, so they are looser than needed).
#include <cmath>
#include <functional>
#include <tuple>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend_impl.h"
#include "backends/cuda/quant_random.h"
#include "gpu/gpu_test_util.h"

namespace kiln {
namespace {

using gpu_testing::kBf16Tol;
using cuda::QuantCase;

class CudaQuant : public gpu_testing::GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    // bf16 activations: the act between a MoE layer's GEMMs is quantized from bf16, as on the GPU.
    cpu_fp8_ = cpu::make_cpu_backend({.bf16_activations = true, .fp8_activations = true});
  }
  // Whether the GPU multiplies weight wg by e4m3 activations at this many rows per weight.
  bool w8a8(const ops::Weight& wg, int64_t rows_per_weight) const {
    const auto* be = dynamic_cast<const cuda::CudaBackend*>(gpu_.get());
    return be->use_w8a8(cuda::quant_format(wg.quant)) &&
           !cuda::quant_gemm_decode_rows(rows_per_weight);
  }
  // The host weight as the CPU reference reads it, and its packed GPU twin; edit, if
  // given, changes the host weight before it is packed.
  void make_weight(const QuantCase& c, int64_t n_out, int64_t n_in, bool bias, ops::Weight& wc, ops::Weight& wg,
                   const std::function<void(formats::QuantizedTensor&)>& edit = nullptr) {
    wc = ops::Weight{};
    wc.quant = cuda::random_quantized(c, n_out, n_in, rng_);
    if (edit) edit(wc.quant);
    if (bias) wc.bias = random({n_out}, 0.1f);
    auto packed = gpu_->upload_quantized(wc.quant);
    ASSERT_TRUE(packed.ok()) << packed.status().to_string();
    wg = ops::Weight{};
    wg.quant = std::move(packed).value();
    if (bias) wg.bias = gpu_->upload(wc.bias);
  }

  // The bound of the header, element by element: `got` (x wc^T on the GPU) against the
  // CPU's `ref`.
  static void expect_within_bound(const ops::Weight& wc, const Tensor& x, const std::vector<float>& got,
                                  const Tensor& ref, double abs_floor = 1e-6) {
    const int64_t rows = x.dim(0), n_in = x.dim(1), n_out = ref.dim(1);
    std::vector<float> w(static_cast<size_t>(n_in));
    std::vector<double> abs_dot(size_t(rows * n_out), 0.0);
    for (int64_t o = 0; o < n_out; ++o) {
      formats::dequantize_row(wc.quant, o, w.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < n_in; ++k) abs_dot[size_t(r * n_out + o)] += std::abs(x.as<float>()[r * n_in + k] * w[size_t(k)]);
    }
    double worst = 0.0;
    int64_t bad = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      ASSERT_FALSE(std::isnan(got[size_t(i)])) << "element " << i << " not written (or NaN)";
      const double want = ref.as<float>()[i], err = std::abs(got[size_t(i)] - want);
      const double tol = std::ldexp(std::abs(want), -8) + std::ldexp(abs_dot[size_t(i)], -9) + abs_floor;
      worst = std::max(worst, err / tol);
      if (err > tol && bad++ < 3) ADD_FAILURE() << "element " << i << ": " << got[size_t(i)] << " vs " << want;
    }
    EXPECT_EQ(bad, 0) << "worst error / bound " << worst;
  }

  static bool fp8(const QuantCase& c) {
    return c.kind == formats::QuantKind::kFp8Block || c.kind == formats::QuantKind::kFp8Channel ||
           c.kind == formats::QuantKind::kFp8Tensor;
  }

  // A MoE layer over experts of format c (gpt-oss's layout for MXFP4: interleaved gate /
  // up with biases, 8 experts top-4; else 16 experts top-4) at each token count, against
  // the CPU's.
  void moe_matches_cpu(const QuantCase& c, int64_t d_model, int64_t d_ff, const std::vector<int>& token_counts) {
    const bool gpt_oss = c.kind == formats::QuantKind::kMxfp4;
    const int n_experts = gpt_oss ? 8 : 16, top_k = 4;
    SCOPED_TRACE(::testing::Message() << c.name() << ", d_model " << d_model << ", d_ff " << d_ff);
    ops::MoeExperts ec, eg;
    ec.d_ff = eg.d_ff = d_ff;
    ec.gate_up_interleaved = eg.gate_up_interleaved = gpt_oss;
    for (int e = 0; e < n_experts; ++e) {
      ops::Weight a, b;
      if (gpt_oss) {
        make_weight(c, 2 * d_ff, d_model, true, a, b);
        ec.gate_up.push_back(a), eg.gate_up.push_back(b);
      } else {
        make_weight(c, d_ff, d_model, false, a, b);
        ec.gate.push_back(a), eg.gate.push_back(b);
        make_weight(c, d_ff, d_model, false, a, b);
        ec.up.push_back(a), eg.up.push_back(b);
      }
      make_weight(c, d_model, d_ff, gpt_oss, a, b);
      ec.down.push_back(a), eg.down.push_back(b);
    }
    Tensor router = random({n_experts, d_model}, 0.05f);
    ops::Weight rc{.data = as_bf16(router)}, rg{.data = gpu_->upload(rc.data)};
    const ops::RouterParams rp{.kind = gpt_oss ? ops::RouterKind::kTopKSoftmax : ops::RouterKind::kSoftmaxTopK,
                               .n_experts = n_experts, .top_k = top_k, .norm_topk_prob = true};
    const ops::GluParams glu{.kind = gpt_oss ? ops::GluKind::kGptOssClamp : ops::GluKind::kSilu};
    for (int tokens : token_counts) {
      SCOPED_TRACE(::testing::Message() << tokens << " tokens");
      Tensor x = random({tokens, d_model});
      Tensor ref = host_tensor(DType::kF32, {tokens, d_model});
      const bool fp8_act = tokens >= 160 && w8a8(eg.down[0], tokens * top_k / n_experts);
      (fp8_act ? cpu_fp8_ : cpu_)->moe({.x = x, .router = &rc, .experts = &ec, .routing = rp, .glu = glu, .out = ref});
      Tensor out = poisoned(ref.shape);
      gpu_->moe({.x = to_gpu(x), .router = &rg, .experts = &eg, .routing = rp, .glu = glu, .out = out});
      // The act between the GEMMs is bf16 on the GPU (as on the bf16 path), plus the
      // weights' bf16 rounding for INT4 / FP8: three bf16 roundings of the scale.
      std::vector<float> got = from_gpu(out);
      double max_ref = 0.0, max_err = 0.0;
      for (int64_t i = 0; i < ref.numel(); ++i) {
        ASSERT_FALSE(std::isnan(got[size_t(i)])) << "element " << i << " not written (or NaN)";
        max_ref = std::max(max_ref, double(std::abs(ref.as<float>()[i])));
        max_err = std::max(max_err, std::abs(double(got[size_t(i)]) - ref.as<float>()[i]));
      }
      EXPECT_LE(max_err, 3 * kBf16Tol * max_ref) << "max error " << max_err << " vs max |ref| " << max_ref;
      std::printf("%s moe d_ff %lld, %d tokens%s: max error / max|ref| %.3g\n", c.name().c_str(), (long long)d_ff,
                  tokens, fp8_act ? " (W8A8)" : "", max_err / max_ref);
    }
  }

  std::unique_ptr<ops::Backend> cpu_fp8_;  // the reference of the W8A8 GEMMs
};

TEST_F(CudaQuant, LinearMatchesCpuForEveryFormatAndShape) {
  // (n_out, n_in): gpt-oss-120b attention / expert shapes, Kimi K2 / DeepSeek q_a and an
  // expert down, Qwen3-30B-A3B, and odd shapes (an output tail, inputs off the 128 tile).
  // 17 rows take the decode tiles, split over k where few CTAs would stream the whole K
  // (quant_linear_k_splits; on a 132-SM H200 {1536, 7168} in 6 splits, {77, 1056} in 2 of 9
  // stages each).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {5120, 2880}, {2880, 4096}, {1536, 7168}, {7168, 2048}, {768, 2048}, {131, 160}, {77, 1056}};
  int split_cases = 0;
  for (const QuantCase& c : cuda::quant_cases()) {
    for (auto [n_out, n_in] : shapes) {
      if (n_in % cuda::quant_k_unit(c) != 0) continue;
      for (int rows : {1, 3, 8, 17, 100, 130}) {  // GEMV (<= 8), decode, prefill, wide tiles (4-bit)
        if (rows >= 100 && n_out * n_in > 4'000'000) continue;  // keep the CPU reference quick
        SCOPED_TRACE(::testing::Message() << c.name() << " " << n_out << "x" << n_in << " rows " << rows);
        ops::Weight wc, wg;
        make_weight(c, n_out, n_in, rows % 2 == 1, wc, wg);
        const Tensor x = random({rows, n_in});
        const bool fp8_act = w8a8(wg, rows);
        if (fp8_act) std::printf("%s %lldx%lld rows %d: W8A8\n", c.name().c_str(), (long long)n_out, (long long)n_in, rows);
        if (rows > 8 && !fp8_act && cuda::quant_linear_k_splits(rows, n_out, n_in, cuda::quant_format(wg.quant)) > 1)
          ++split_cases;
        const auto [ref, got] = linear_on_both(wc, wg, x, (fp8_act ? cpu_fp8_ : cpu_).get());
        expect_within_bound(wc, x, got, ref);
      }
    }
  }
  EXPECT_GT(split_cases, 0) << "no case took the decode tiles split over k";
}

// The GEMV in passes (set_quant_gemv_rows, KILN_QUANT_GEMV_ROWS): rows past one pass's
// quant_gemv_max_rows(n_in) in several GEMV launches, each pass's rows and outputs offset,
// against the CPU for every format; 12,288 inputs take 3 rows a pass (GLM-4.5-Air's o),
// 1,056 take 8, so 31 rows are 11 and 4 passes, the last one short.
TEST_F(CudaQuant, LinearInGemvPassesMatchesCpuForEveryFormat) {
  auto* be = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  be->set_quant_gemv_rows(31);
  for (const QuantCase& c : cuda::quant_cases()) {
    for (auto [n_out, n_in] : std::vector<std::pair<int64_t, int64_t>>{{96, 12288}, {77, 1056}}) {
      if (n_in % cuda::quant_k_unit(c) != 0) continue;
      for (int rows : {9, 17, 31}) {
        SCOPED_TRACE(::testing::Message() << c.name() << " " << n_out << "x" << n_in << " rows " << rows);
        ASSERT_LT(cuda::quant_gemv_max_rows(n_in), rows) << "the case must take several passes";
        ops::Weight wc, wg;
        make_weight(c, n_out, n_in, rows % 3 == 0, wc, wg);
        const Tensor x = random({rows, n_in});
        const auto [ref, got] = linear_on_both(wc, wg, x);
        expect_within_bound(wc, x, got, ref);
      }
    }
  }
  be->set_quant_gemv_rows(0);
}

// MXFP4 scales far from a trained model's, at both ends (the GEMV applies 2^(e - 127) as
// the bf16 2^(e - 27) before its mma and 2^26 after it, pack_quantized refuses e > 154):
// rows whose every scale is 2^-67..2^-55 (the mma's products stay normal fp32) and rows
// whose every scale is 2^13..2^27, against the CPU with no absolute floor in the bound,
// through the GEMV (1 and 8 rows) and the tiles (17 and 100).
TEST_F(CudaQuant, Mxfp4ScalesAtTheEdgesOfTheGemvRangeMatchCpu) {
  const int64_t n_out = 96, n_in = 640;
  std::uniform_int_distribution<int> low(60, 72), high(140, cuda::kQuantMaxE8m0);
  ops::Weight wc, wg;
  make_weight({formats::QuantKind::kMxfp4}, n_out, n_in, false, wc, wg, [&](formats::QuantizedTensor& q) {
    for (int64_t o = 0; o < n_out; ++o)
      for (int64_t j = 0; j < n_in / 32; ++j)
        q.scale.as<uint8_t>()[o * (n_in / 32) + j] = uint8_t((o / 16) % 2 ? high(rng_) : low(rng_));
  });
  for (int rows : {1, 8, 17, 100}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows);
    const Tensor x = random({rows, n_in});
    const auto [ref, got] = linear_on_both(wc, wg, x);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got[i])) << "element " << i << ": " << got[i];
    expect_within_bound(wc, x, got, ref, 0.0);
  }
}

// A layer's q, k and v (or gate and up) of one input, in one GEMV launch (linears), each
// against the CPU: gpt-oss-120b's attention shapes, and odd ones (a part ending in a unit
// of 13 rows, then a part of 160).
TEST_F(CudaQuant, LinearsOfOneInputMatchCpuForEveryFormat) {
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> shapes = {{2880, {4096, 512, 512}}, {1056, {77, 160}}};
  for (const QuantCase& c : cuda::quant_cases()) {
    for (const auto& [n_in, n_outs] : shapes) {
      if (n_in % cuda::quant_k_unit(c) != 0) continue;
      for (int rows : {1, 5}) {
        SCOPED_TRACE(::testing::Message() << c.name() << " " << n_outs.size() << " linears of " << n_in << ", rows "
                                          << rows);
        std::vector<ops::Weight> wc(n_outs.size()), wg(n_outs.size());
        const Tensor x = random({rows, n_in});
        ops::LinearsArgs a{.x = to_gpu(x)};
        for (size_t i = 0; i < n_outs.size(); ++i) {
          make_weight(c, n_outs[i], n_in, i != 1, wc[i], wg[i]);
          a.w[i] = &wg[i];
          a.out[i] = poisoned({rows, n_outs[i]});
        }
        gpu_->linears(a);
        for (size_t i = 0; i < n_outs.size(); ++i) {
          Tensor ref = host_tensor(DType::kF32, {rows, n_outs[i]});
          cpu_->linear({.x = x, .w = &wc[i], .out = ref});
          expect_within_bound(wc[i], x, from_gpu(a.out[i]), ref);
        }
      }
    }
  }
}

// Whole MoE layers: gpt-oss's fused interleaved MXFP4 experts with biases and the
// clamped SwiGLU; separate gate / up / down for the other formats (GLM / Kimi / Qwen).
TEST_F(CudaQuant, MoeMatchesCpuForEveryFormat) {
  for (const QuantCase& c : cuda::quant_cases()) {
    const bool gpt_oss = c.kind == formats::QuantKind::kMxfp4;
    // FP8 (block scales over ceil(K / 128) blocks): 1088 = 8.5 x 128, so the W8A8 down GEMM's
    // last 128-column tile is half empty, as at gpt-oss's 2880 (4-bit groups need whole k tiles).
    const int64_t d_model = gpt_oss ? 2880 : fp8(c) ? 1088 : 1024, d_ff = gpt_oss ? 2880 : 768;
    // 1 and 8 tokens: the GEMV (kGemvRows-row tiles); 24: decode tiles; 160 tokens x 4 / 16
    // experts = 40 rows per expert: prefill tiles; 520: 130 rows per expert, the wide tiles
    // (two of the formats that have them: the CPU reference dequantizes every row it uses).
    const bool wide = c.kind == formats::QuantKind::kNvfp4 ||
                      (c.kind == formats::QuantKind::kInt4Group && c.scale_dtype == DType::kBF16);
    moe_matches_cpu(c, d_model, d_ff, wide ? std::vector<int>{1, 8, 24, 160, 520} : std::vector<int>{1, 8, 24, 160});
  }
}

// The down GEMV with several units a warp (kMoeDownUnits), forced at sizes where the rule
// would not take it: a TP rank's short d_ff (2 and 3 blocks of 128 inputs, the 4-bit
// formats' 256 and 384; 200 and 328 for FP8: partial blocks), 2, 3, 4 and 8 units a warp
// over 64 or 65 units a matrix (warps whose last units are past the matrix), d_model 1032
// for FP8 (its last unit half outside the output).
TEST_F(CudaQuant, MoeDownGemvOverSeveralUnitsAWarpMatchesCpu) {
  struct Restore {
    ~Restore() { cuda::set_quant_gemv_units_per_warp(0); }
  } restore;
  for (const QuantCase& c : cuda::quant_cases()) {
    const int64_t d_model = fp8(c) ? 1032 : 1024;
    for (int upw : {2, 3, 4, 8}) {
      cuda::set_quant_gemv_units_per_warp(upw);
      SCOPED_TRACE(::testing::Message() << upw << " units a warp");
      for (int64_t d_ff : fp8(c) ? std::vector<int64_t>{200, 328} : std::vector<int64_t>{256, 384})
        moe_matches_cpu(c, d_model, d_ff, {1, 8});
    }
  }
}

// The W8A8 GEMMs at prefill shapes of DeepSeek-V3 / Kimi K2 (q_a, o, a shared expert's
// up and down), GLM-4.5-Air and MLA's kv_a, at 84 and 300 rows (whole and partial 64-row
// tiles), with the bound of the header against the emulating reference; and against the W8A16
// reference their error is what quantizing the activations costs (about 2^-5 of a
// typical output), several times the W8A8 bound: so a kernel that ignored the activation
// scales or skipped the quantization would fail one. An all-zero activation block (scale
// 1) and a weight block of scale 0 (zero codes, as a quantizer writes one) in the middle
// of K check the per-block promotion where a scale is degenerate (no NaN, no skipped block).
TEST_F(CudaQuant, W8a8LinearMatchesTheEmulatingReferenceAtPrefillShapes) {
  const QuantCase block{formats::QuantKind::kFp8Block, 128, 128, DType::kF32};
  // 576 outputs (MLA's kv_a): the last 128-column tile half empty, whose second warp column
  // skips its mmas; 64 + 20 rows: the last row tile's second warp row skips them too.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1536, 7168}, {7168, 2048}, {4096, 4096}, {1408, 2048},
                                                           {576, 7168}};
  for (auto [n_out, n_in] : shapes) {
    for (const int rows : {64 + 20, 4 * 64 + 44}) {
      SCOPED_TRACE(::testing::Message() << n_out << "x" << n_in << " rows " << rows);
      ops::Weight wc, wg;
      make_weight(block, n_out, n_in, true, wc, wg, [&](formats::QuantizedTensor& q) {
        q.scale.as<float>()[1 * q.scale.shape[1] + 2] = 0.0f;  // weight block (1, 2): scale 0, codes 0
        for (int64_t o = 128; o < 256; ++o)
          for (int64_t k = 256; k < 384; ++k) q.data.as<uint8_t>()[o * n_in + k] = 0;
      });
      if (!w8a8(wg, rows)) GTEST_SKIP() << "no W8A8 on this device";
      Tensor x = random({rows, n_in});
      for (int64_t k = 128; k < 256; ++k) x.as<float>()[5 * n_in + k] = 0.0f;  // row 5's block 1
      Tensor ref = host_tensor(DType::kF32, {rows, n_out}), ref16 = host_tensor(DType::kF32, {rows, n_out});
      cpu_fp8_->linear({.x = x, .w = &wc, .out = ref});
      cpu_->linear({.x = x, .w = &wc, .out = ref16});
      Tensor out = poisoned({rows, n_out});
      gpu_->linear({.x = to_gpu(x), .w = &wg, .out = out});
      const std::vector<float> got = from_gpu(out);
      double max_ref = 0.0, err = 0.0, err16 = 0.0;
      for (int64_t i = 0; i < ref.numel(); ++i) {
        ASSERT_FALSE(std::isnan(got[size_t(i)])) << "element " << i << " not written (or NaN)";
        max_ref = std::max(max_ref, double(std::abs(ref.as<float>()[i])));
        err = std::max(err, std::abs(double(got[size_t(i)]) - ref.as<float>()[i]));
        err16 = std::max(err16, std::abs(double(got[size_t(i)]) - ref16.as<float>()[i]));
      }
      std::printf("w8a8 %lldx%lld rows %d: max error / max|ref| %.3g vs the emulating reference, %.3g vs W8A16\n",
                  (long long)n_out, (long long)n_in, rows, err / max_ref, err16 / max_ref);
      EXPECT_LE(err, kBf16Tol * max_ref);
      EXPECT_GT(err16, 2 * err) << "the output does not show the activations' e4m3 rounding";
    }
  }
}

// A weight the packed layout cannot hold is refused at upload, naming the problem.
TEST_F(CudaQuant, UnsupportedShapesFailAtUpload) {
  auto q = cuda::random_quantized({formats::QuantKind::kInt4Group, 24, 0, DType::kBF16}, 4, 96, rng_);
  auto p = gpu_->upload_quantized(q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("group size 24"), std::string::npos) << p.status().message();
}

}  // namespace
}  // namespace kiln
