// DeepSeek sparse attention's CUDA ops (OptionalOp::kDsa) against the CPU reference on
// random non-zero inputs, outputs poisoned before each op runs:
// - layer_norm: within kBf16Tol (one bf16 rounding at the output), in place;
// - dsa_index_store: the stored bf16 rows, or e4m3 codes and scales, bit for bit;
// - dsa_select: the selections EQUAL to the CPU's. Inputs are bf16-representable, so
//   both backends hold the same numbers, and the GPU scores with the CPU's operations
//   in its order without FMA contraction (kernels/dsa.cu): the scores are bit-identical,
//   ties included (4 index heads make many exact-zero scores: ties to the lower
//   position). A mismatch prints the row, both lists and the scores around the k-th.
// - mla_attention over selected positions, both attend paths, bf16 and e4m3 latent
//   caches, with -1 entries inside a row too: within the tolerances of the dense MLA test
//   (cuda_ops_test.cpp).
// Batches: a 40-token prefill, a decode at position 999, a chunk continuing at position
// 20 and a 3-token chunk at 297, over 16-slot blocks scattered in the cache; top_k 8 and
// 64 (below and above most contexts: dense and sparse rows).
// Long contexts (LongContextDecodeSelectionsEqualTheCpu): DeepSeek-V3.2's indexer and
// top-2048 on 8 decode tokens up to 12,345 positions and on one at 20,001 with heavily
// tied scores, each token's top-k split over many CTAs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_backend_impl.h"
#include "backends/cuda/selftest.h"
#include "gpu/gpu_test_util.h"
#include "ops/kv_quant.h"

namespace kiln {
namespace {

using cuda::scattered_batch;
using gpu_testing::bf16_round;
using gpu_testing::kBf16Tol;

class CudaDsaTest : public gpu_testing::GpuTest {
 protected:
  // max |got - ref| / max |ref|; fails if an element was not written (NaN).
  double rel_err(const std::vector<float>& got, const Tensor& ref, const char* what) {
    EXPECT_EQ(int64_t(got.size()), ref.numel()) << what;
    double max_ref = 0.0, max_err = 0.0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      max_ref = std::max(max_ref, double(std::abs(ref.as<float>()[i])));
      if (std::isnan(got[size_t(i)])) {
        ADD_FAILURE() << what << ": element " << i << " not written (or NaN)";
        return INFINITY;
      }
      max_err = std::max(max_err, std::abs(double(got[size_t(i)]) - ref.as<float>()[i]));
    }
    std::printf("%s: max |cuda - cpu| %.4g, max |cpu| %.4g, relative %.4g\n", what, max_err, max_ref,
                max_err / max_ref);
    return max_err / max_ref;
  }
  // A device i32 tensor of 0x5a5a5a5a (neither a position nor -1).
  Tensor poisoned_i32(Shape s) {
    Tensor t = gpu_->alloc(DType::kI32, s);
    gpu_->synchronize();
    EXPECT_EQ(cudaMemset(t.data, 0x5a, size_t(t.nbytes())), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return t;
  }
  // The indexer keys k of batch b's slots stored on both backends: the CPU's cache (f32, or
  // e4m3 codes + scales) and the GPU's (bf16, or e4m3 codes + scales).
  struct IndexCaches {
    Tensor cpu, cpu_scale, gpu, gpu_scale;
  };
  IndexCaches store_index(const Tensor& k, const ops::BatchMeta& b, int64_t n_blocks, int bs, bool fp8) {
    const int64_t d = k.dim(1);
    const Shape cshape{n_blocks, bs, d}, sshape{n_blocks, bs};
    IndexCaches c;
    c.cpu = host_tensor(fp8 ? DType::kF8E4M3 : DType::kF32, cshape);
    c.cpu_scale = fp8 ? host_tensor(DType::kF32, sshape) : Tensor{};
    cpu_->dsa_index_store({.k = k, .index_cache = c.cpu, .index_scale = c.cpu_scale, .batch = &b});
    c.gpu = gpu_->alloc(fp8 ? DType::kF8E4M3 : DType::kBF16, cshape);
    c.gpu_scale = fp8 ? gpu_->alloc(DType::kF32, sshape) : Tensor{};
    gpu_->begin_step(b);
    gpu_->dsa_index_store({.k = to_gpu(k), .index_cache = c.gpu, .index_scale = c.gpu_scale, .batch = &b});
    return c;
  }
  template <typename T>
  std::vector<T> read(const Tensor& t) {
    gpu_->synchronize();
    std::vector<T> v(size_t(t.nbytes()) / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), t.data, v.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

class CudaDsa : public CudaDsaTest {};
class CudaDsaCache : public CudaDsaTest, public ::testing::WithParamInterface<bool> {};

TEST_F(CudaDsa, SupportsTheOptionalOps) {
  EXPECT_TRUE(gpu_->supports_op(ops::OptionalOp::kDsa).ok());
}

// The start-up self-test's DSA paths (bf16 and e4m3 caches) pass, so DSA stays enabled.
TEST_F(CudaDsa, SelfTestPassesTheDsaPaths) {
  int n = 0;
  for (const cuda::PathResult& r : cuda::run_self_test(*gpu_)) {
    if (r.path.rfind("dsa (", 0) != 0) continue;
    ++n;
    std::printf("self-test %s: %s, max rel err %.4g %s\n", r.path.c_str(), r.passed ? "pass" : "FAIL", r.rel_err,
                r.detail.c_str());
    EXPECT_TRUE(r.passed) << r.path << ": " << r.detail;
  }
  EXPECT_EQ(n, 2);
  EXPECT_TRUE(gpu_->supports_op(ops::OptionalOp::kDsa).ok()) << gpu_->supports_op(ops::OptionalOp::kDsa).to_string();
}

TEST_F(CudaDsa, LayerNormMatchesCpuInPlace) {
  const int64_t rows = 37;
  for (int64_t dim : {128, 1000}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << (with_bias ? " with bias" : " without bias"));
      Tensor x = random({rows, dim}, 2.0f);
      for (int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = bf16_round(x.as<float>()[i] + 0.75f);  // mean != 0
      Tensor w = random({dim}), bias = random({dim}, 0.5f);
      Tensor ref = host_tensor(DType::kF32, {rows, dim});
      cpu_->layer_norm({.x = x, .weight = w, .bias = with_bias ? bias : Tensor{}, .out = ref, .eps = 1e-6f});
      Tensor xg = to_gpu(x);  // out aliases x
      gpu_->layer_norm({.x = xg, .weight = gpu_->upload(w), .bias = with_bias ? gpu_->upload(bias) : Tensor{},
                        .out = xg, .eps = 1e-6f});
      EXPECT_LE(rel_err(from_gpu(xg), ref, "layer_norm"), kBf16Tol);
    }
  }
}

// The scores of row t on the host (double; the index cache as the CPU holds it), for
// diagnostics only.
std::vector<double> host_scores(const Tensor& q, const Tensor& w, const Tensor& cache, const Tensor& cache_s,
                                const ops::BatchMeta& b, int t, int s, float scale, float weight_scale) {
  const int64_t n_heads = q.dim(1), d = q.dim(2);
  const int p = b.positions[size_t(t)];
  std::vector<double> out(size_t(p) + 1);
  for (int j = 0; j <= p; ++j) {
    const int64_t slot = b.slot(s, j);
    double score = 0.0;
    for (int64_t h = 0; h < n_heads; ++h) {
      double dot = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        const double k = cache.dtype == DType::kF8E4M3
                             ? double(ops::kv_dequantize(cache.as<uint8_t>()[slot * d + c], cache_s.as<float>()[slot]))
                             : double(cache.as<float>()[slot * d + c]);
        dot += double(q.as<float>()[(t * n_heads + h) * d + c]) * k;
      }
      score += double(w.as<float>()[t * n_heads + h]) * weight_scale * std::max(double(scale) * dot, 0.0);
    }
    out[size_t(j)] = score;
  }
  return out;
}

std::string list_str(const int32_t* v, int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

TEST_P(CudaDsaCache, IndexStoreAndSelectEqualTheCpu) {
  const bool fp8 = GetParam();
  const int bs = 16, max_blocks = 64;
  // Step 1 caches every token; step 2 queries a 40-token prefill, a decode at 999, a chunk
  // continuing at position 20 and one at 297.
  const std::vector<std::pair<int, int>> fill = {{40, 40}, {1000, 1000}, {32, 32}, {300, 300}};
  const std::vector<std::pair<int, int>> query = {{40, 40}, {1, 1000}, {12, 32}, {3, 300}};
  const ops::BatchMeta b1 = scattered_batch(fill, bs, max_blocks), b2 = scattered_batch(query, bs, max_blocks);
  const int64_t n_blocks = int64_t(fill.size()) * max_blocks, n = b2.n_tokens();
  std::vector<int> seq_of(static_cast<size_t>(n));
  for (int s = 0; s < b2.n_seqs(); ++s)
    for (int t = b2.q_start[size_t(s)]; t < b2.q_start[size_t(s) + 1]; ++t) seq_of[size_t(t)] = s;
  // DeepSeek-V3.2's indexer (64 heads of 128), GLM-5-like 16 heads, 4 small heads (many
  // exact-zero scores: ties), and 6 heads of 30 (the scores kernel's scalar loads, heads
  // and dims zero-padded to multiples of 4).
  for (auto [n_heads, d] : {std::pair{64, 128}, std::pair{16, 128}, std::pair{4, 32}, std::pair{6, 30}}) {
    SCOPED_TRACE(::testing::Message() << (fp8 ? "e4m3" : "bf16") << " index cache, " << n_heads << " heads of " << d);
    Tensor k = random({b1.n_tokens(), d});
    const auto [cache, cache_s, cache_g, scale_g] = store_index(k, b1, n_blocks, bs, fp8);
    // The stored rows of every slot the step wrote, bit for bit.
    int64_t bad_rows = 0;
    if (fp8) {
      const std::vector<uint8_t> codes = read<uint8_t>(cache_g);
      const std::vector<float> sc = read<float>(scale_g);
      for (int32_t slot : b1.slot_mapping) {
        if (std::memcmp(codes.data() + int64_t(slot) * d, cache.as<uint8_t>() + int64_t(slot) * d, size_t(d)) != 0 ||
            sc[size_t(slot)] != cache_s.as<float>()[slot])
          ++bad_rows;
      }
    } else {
      const std::vector<float> got = from_gpu(cache_g);
      for (int32_t slot : b1.slot_mapping)
        for (int64_t c = 0; c < d; ++c)
          if (got[size_t(int64_t(slot) * d + c)] != cache.as<float>()[int64_t(slot) * d + c]) {
            ++bad_rows;
            break;
          }
    }
    EXPECT_EQ(bad_rows, 0) << "dsa_index_store: rows unlike the CPU's of " << b1.n_tokens();

    Tensor q = random({n, n_heads, d}), w = random({n, n_heads});
    const float scale = 1.0f / std::sqrt(float(d)), weight_scale = 1.0f / std::sqrt(float(n_heads));
    Tensor qg = to_gpu(q), wg = to_gpu(w);
    for (int top_k : {8, 64}) {
      SCOPED_TRACE(::testing::Message() << "top_k " << top_k);
      Tensor ref = host_tensor(DType::kI32, {n, top_k});
      cpu_->dsa_select({.q = q, .weights = w, .index_cache = cache, .index_scale = cache_s, .selected = ref,
                        .batch = &b2, .scale = scale, .weight_scale = weight_scale});
      gpu_->begin_step(b2);
      Tensor sel = poisoned_i32({n, top_k});
      gpu_->dsa_select({.q = qg, .weights = wg, .index_cache = cache_g, .index_scale = scale_g, .selected = sel,
                        .batch = &b2, .scale = scale, .weight_scale = weight_scale});
      const std::vector<int32_t> got = read<int32_t>(sel);
      int mismatched = 0, dense = 0, zero_ties = 0;
      for (int t = 0; t < n; ++t) {
        const int p = b2.positions[size_t(t)];
        if (p + 1 <= top_k) ++dense;
        const int32_t* g = got.data() + int64_t(t) * top_k;
        const int32_t* r = ref.as<int32_t>() + int64_t(t) * top_k;
        const bool equal = std::equal(g, g + top_k, r);
        if (equal && n_heads > 4) continue;  // the host scores are for diagnostics and tie counts only
        const std::vector<double> sc =
            host_scores(q, w, cache, cache_s, b2, t, seq_of[size_t(t)], scale, weight_scale);
        if (p + 1 > top_k && std::count(sc.begin(), sc.end(), 0.0) > 1) ++zero_ties;
        if (equal || ++mismatched > 3) continue;
        std::vector<double> sorted = sc;
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        const size_t kth = size_t(std::min<int64_t>(top_k, int64_t(sorted.size())) - 1);
        std::printf("MISMATCH row %d (position %d): scores (host, double) k-th %.9g, next %.9g\n  cuda: %s\n  cpu:  %s\n",
                    t, p, sorted[kth], kth + 1 < sorted.size() ? sorted[kth + 1] : NAN, list_str(g, top_k).c_str(),
                    list_str(r, top_k).c_str());
      }
      std::printf("dsa_select %s cache, %d heads of %d, top_k %d: %lld rows (%d dense, %d with tied zero scores), %d "
                  "unlike the CPU's\n",
                  fp8 ? "e4m3" : "bf16", n_heads, d, top_k, static_cast<long long>(n), dense, zero_ties, mismatched);
      EXPECT_EQ(mismatched, 0);
    }
  }
}

// Decode at long contexts on DeepSeek-V3.2's indexer (64 heads of 128, top-2048), each
// token's top-k split over many CTAs (dsa_select_plan: about 1,024 keys each): 8 decode
// tokens at contexts 2,048 (dense), 2,049 (one key left out), 3,000 ... 12,345 (not
// multiples of the 64-key tile or of the slices); and one token at 20,001 whose keys
// repeat 64 vectors (j % 64), so 64 distinct scores each tied over ~312 positions spread
// across every slice: the 2,048th falls inside a tie, taken at its lowest positions.
TEST_P(CudaDsaCache, LongContextDecodeSelectionsEqualTheCpu) {
  const bool fp8 = GetParam();
  const int n_heads = 64, d = 128, top_k = 2048, bs = 64;
  struct Case {
    const char* what;
    std::vector<int> contexts;
    int distinct_keys;  // 0: every key random
  };
  for (const Case& c : {Case{"8 decode tokens", {2048, 2049, 3000, 4097, 8191, 8192, 8193, 12345}, 0},
                        Case{"one decode token, 64 distinct keys", {20001}, 64}}) {
    SCOPED_TRACE(::testing::Message() << (fp8 ? "e4m3" : "bf16") << " index cache, " << c.what);
    std::vector<std::pair<int, int>> fill, query;
    int max_ctx = 0;
    for (int ctx : c.contexts) {
      fill.push_back({ctx, ctx});
      query.push_back({1, ctx});
      max_ctx = std::max(max_ctx, ctx);
    }
    const int max_blocks = (max_ctx + bs - 1) / bs + 3;
    const ops::BatchMeta b1 = scattered_batch(fill, bs, max_blocks), b2 = scattered_batch(query, bs, max_blocks);
    const int64_t n_blocks = int64_t(fill.size()) * max_blocks, n = b2.n_tokens();
    Tensor k = random({b1.n_tokens(), d});
    if (c.distinct_keys > 0)  // one sequence: row r is position r
      for (int64_t r = c.distinct_keys; r < k.dim(0); ++r)
        std::memcpy(k.as<float>() + r * d, k.as<float>() + (r % c.distinct_keys) * d, size_t(d) * sizeof(float));
    const auto [cache, cache_s, cache_g, scale_g] = store_index(k, b1, n_blocks, bs, fp8);

    Tensor q = random({n, n_heads, d}), w = random({n, n_heads});
    const float scale = 1.0f / std::sqrt(float(d)), weight_scale = 1.0f / std::sqrt(float(n_heads));
    Tensor ref = host_tensor(DType::kI32, {n, top_k});
    cpu_->dsa_select({.q = q, .weights = w, .index_cache = cache, .index_scale = cache_s, .selected = ref,
                      .batch = &b2, .scale = scale, .weight_scale = weight_scale});
    gpu_->begin_step(b2);
    Tensor sel = poisoned_i32({n, top_k});
    gpu_->dsa_select({.q = to_gpu(q), .weights = to_gpu(w), .index_cache = cache_g, .index_scale = scale_g,
                      .selected = sel, .batch = &b2, .scale = scale, .weight_scale = weight_scale});
    const std::vector<int32_t> got = read<int32_t>(sel);
    int mismatched = 0;
    for (int64_t t = 0; t < n; ++t) {
      const int32_t* g = got.data() + t * top_k;
      const int32_t* r = ref.as<int32_t>() + t * top_k;
      const int64_t first = std::mismatch(g, g + top_k, r).first - g;
      if (first == top_k) continue;
      if (++mismatched <= 3)
        std::printf("MISMATCH row %lld (position %d) from entry %lld:\n  cuda: %s\n  cpu:  %s\n",
                    static_cast<long long>(t), b2.positions[size_t(t)], static_cast<long long>(first),
                    list_str(g + first, std::min<int64_t>(16, top_k - first)).c_str(),
                    list_str(r + first, std::min<int64_t>(16, top_k - first)).c_str());
    }
    std::printf("dsa_select %s cache, %s, top_k %d: %lld rows, %d unlike the CPU's\n", fp8 ? "e4m3" : "bf16",
                c.what, top_k, static_cast<long long>(n), mismatched);
    EXPECT_EQ(mismatched, 0);
  }
}

// A selection as dsa_select makes one (ascending, -1 padded, dense while p + 1 <= top_k)
// but of random positions, with every third entry of the decode row's list set to -1
// (unused entries inside a row).
Tensor random_selection(const ops::BatchMeta& b, int top_k, int holes_row, std::mt19937& rng) {
  const int64_t n = b.n_tokens();
  Tensor sel = host_tensor(DType::kI32, {n, top_k});
  for (int64_t t = 0; t < n; ++t) {
    const int p = b.positions[size_t(t)];
    std::vector<int32_t> all(size_t(p) + 1);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(size_t(std::min(top_k, p + 1)));
    std::sort(all.begin(), all.end());
    int32_t* row = sel.as<int32_t>() + t * top_k;
    for (int i = 0; i < top_k; ++i) row[i] = i < int(all.size()) ? all[size_t(i)] : -1;
    if (t == holes_row)
      for (int i = 1; i < top_k; i += 3) row[i] = -1;
  }
  return sel;
}

TEST_P(CudaDsaCache, MlaOverSelectedPositionsMatchesCpu) {
  const bool fp8 = GetParam();
  const int n_heads = 20, d_nope = 128, d_rope = 64, d_v = 128, d_latent = 512, bs = 16, max_blocks = 64;
  const ops::BatchMeta b1 = scattered_batch({{300, 300}, {700, 700}, {40, 40}}, bs, max_blocks);
  const ops::BatchMeta b2 = scattered_batch({{5, 300}, {1, 700}, {40, 40}}, bs, max_blocks);
  const int decode_row = 5;  // the 700-context decode token
  Tensor kv_b = random({n_heads * (d_nope + d_v), d_latent}, 0.05f);
  ops::Weight wc{.data = as_bf16(kv_b)};
  ops::Weight wg{.data = gpu_->upload(wc.data)};
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  ASSERT_NE(cuda, nullptr);
  Tensor lat = random({b1.n_tokens(), d_latent}), rope = random({b1.n_tokens(), d_rope});
  const Shape shape{3 * max_blocks, bs, d_latent + d_rope}, scales{3 * max_blocks, bs, 2};
  Tensor cache = host_tensor(fp8 ? DType::kF8E4M3 : DType::kF32, shape);
  Tensor cache_scale = fp8 ? host_tensor(DType::kF32, scales) : Tensor{};
  cpu_->mla_store({.kv_latent = lat, .k_rope = rope, .latent_cache = cache, .latent_scale = cache_scale, .batch = &b1});
  Tensor cache_g = gpu_->alloc(fp8 ? DType::kF8E4M3 : DType::kBF16, shape);
  Tensor scale_g = fp8 ? gpu_->alloc(DType::kF32, scales) : Tensor{};
  gpu_->begin_step(b1);
  gpu_->mla_store({.kv_latent = to_gpu(lat), .k_rope = to_gpu(rope), .latent_cache = cache_g, .latent_scale = scale_g,
                   .batch = &b1});
  Tensor qn = random({b2.n_tokens(), n_heads, d_nope}), qr = random({b2.n_tokens(), n_heads, d_rope});
  const float scale = 1.0f / std::sqrt(float(d_nope + d_rope));
  for (int top_k : {8, 64}) {
    SCOPED_TRACE(::testing::Message() << (fp8 ? "e4m3" : "bf16") << " latent cache, top_k " << top_k);
    Tensor sel = random_selection(b2, top_k, decode_row, rng_);
    Tensor ref = host_tensor(DType::kF32, {b2.n_tokens(), n_heads, d_v});
    cpu_->mla_attention({.q_nope = qn, .q_rope = qr, .latent_cache = cache, .latent_scale = cache_scale, .kv_b = &wc,
                         .out = ref, .batch = &b2, .scale = scale, .selected = sel});
    // The dense result differs (the selection is not ignored).
    Tensor dense = host_tensor(DType::kF32, ref.shape);
    cpu_->mla_attention({.q_nope = qn, .q_rope = qr, .latent_cache = cache, .latent_scale = cache_scale, .kv_b = &wc,
                         .out = dense, .batch = &b2, .scale = scale});
    const std::vector<float> dense_v(dense.as<float>(), dense.as<float>() + dense.numel());
    EXPECT_GT(rel_err(dense_v, ref, "cpu: dense vs sparse (must differ)"), 0.05);
    Tensor sel_g = gpu_->upload(sel);
    // The mma path rounds q_lat and the probabilities to bf16 (one half-ulp each).
    for (auto [path, tol] :
         {std::pair{cuda::MlaPath::kWarp, kBf16Tol}, std::pair{cuda::MlaPath::kMma, 2 * kBf16Tol}}) {
      SCOPED_TRACE(cuda::mla_path_name(path));
      cuda->force_mla_path(path);
      gpu_->begin_step(b2);
      Tensor out = poisoned(ref.shape);
      gpu_->mla_attention({.q_nope = to_gpu(qn), .q_rope = to_gpu(qr), .latent_cache = cache_g,
                           .latent_scale = scale_g, .kv_b = &wg, .out = out, .batch = &b2, .scale = scale,
                           .selected = sel_g});
      const std::string what = std::string("mla over selected positions, ") + (fp8 ? "e4m3" : "bf16") + " cache, " +
                               cuda::mla_path_name(path) + ", top_k " + std::to_string(top_k);
      EXPECT_LE(rel_err(from_gpu(out), ref, what.c_str()), tol);
    }
  }
  cuda->force_mla_path(cuda::MlaPath::kAuto);
}

INSTANTIATE_TEST_SUITE_P(Cache, CudaDsaCache, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "e4m3" : "bf16"; });

}  // namespace
}  // namespace kiln
