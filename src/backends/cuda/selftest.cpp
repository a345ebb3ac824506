#include "backends/cuda/selftest.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend_impl.h"
#include "backends/cuda/kernels/quant_mma_sm120.h"
#include "backends/cuda/quant_pack.h"
#include "backends/cuda/quant_random.h"
#include "core/log.h"

namespace kiln::cuda {
namespace {

// Both backends see identical bf16-representable inputs and store activations
// in bf16; outputs then differ by fp32 summation order, which can move a bf16
// rounding by one ulp: two half-ulps of the largest value bound it.
constexpr double kTolerance = 2.0 / 256.0;

class Harness {
 public:
  explicit Harness(ops::Backend& gpu)
      : gpu_(gpu), cpu_(cpu::make_cpu_backend({.bf16_activations = true})),
        cpu_fp8_(cpu::make_cpu_backend({.bf16_activations = true, .fp8_activations = true})) {}

  Tensor random(Shape s, float scale = 1.0f) {
    Tensor t = host_tensor(DType::kF32, s);
    std::uniform_real_distribution<float> d(-scale, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = bf16_to_f32(f32_to_bf16(d(rng_)));
    return t;
  }
  Tensor bf16(const Tensor& f) {
    Tensor t = host_tensor(DType::kBF16, f.shape);
    for (int64_t i = 0; i < f.numel(); ++i) t.as<uint16_t>()[i] = f32_to_bf16(f.as<float>()[i]);
    return t;
  }
  Tensor gpu(const Tensor& host) {
    Tensor t = gpu_.alloc(DType::kBF16, host.shape);
    gpu_.from_host_f32(host.as<float>(), t);
    return t;
  }
  Tensor poisoned(Shape s) {
    std::vector<float> nan(size_t(s.numel()), std::nanf(""));
    Tensor t = gpu_.alloc(DType::kBF16, s);
    gpu_.from_host_f32(nan.data(), t);
    return t;
  }
  Tensor cpu_out(Shape s) { return host_tensor(DType::kF32, s); }
  ops::Backend& cpu() { return *cpu_; }
  ops::Backend& cpu_fp8() { return *cpu_fp8_; }  // the W8A8 GEMMs' reference
  ops::Backend& gpu_backend() { return gpu_; }

  PathResult compare(const std::string& path, const Tensor& got_gpu, const Tensor& ref) {
    PathResult r{.path = path, .tolerance = kTolerance};
    std::vector<float> got(size_t(got_gpu.numel()));
    gpu_.to_host_f32(got_gpu, got.data());
    double max_ref = 0.0, max_err = 0.0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      const float g = got[size_t(i)], c = ref.as<float>()[i];
      if (std::isnan(g)) {
        r.detail = "element " + std::to_string(i) + " not written (NaN)";
        return r;
      }
      max_ref = std::max(max_ref, double(std::abs(c)));
      max_err = std::max(max_err, std::abs(double(g) - double(c)));
    }
    r.rel_err = max_ref > 0 ? max_err / max_ref : max_err;
    r.passed = r.rel_err <= kTolerance;
    if (!r.passed) r.detail = "max relative error " + std::to_string(r.rel_err) + " > " + std::to_string(kTolerance);
    return r;
  }

 private:
  ops::Backend& gpu_;
  std::unique_ptr<ops::Backend> cpu_, cpu_fp8_;
  std::mt19937 rng_{20261122};
};

}  // namespace

ops::BatchMeta scattered_batch(const std::vector<std::pair<int, int>>& seqs, int block_size, int max_blocks) {
  ops::BatchMeta b;
  b.block_size = block_size;
  b.max_blocks_per_seq = max_blocks;
  const int n = int(seqs.size());
  b.q_start.push_back(0);
  for (int s = 0; s < n; ++s) {
    for (int i = 0; i < max_blocks; ++i) b.block_table.push_back(s + i * n);  // scattered blocks
    b.context_len.push_back(seqs[size_t(s)].second);
  }
  for (int s = 0; s < n; ++s) {
    for (int p = seqs[size_t(s)].second - seqs[size_t(s)].first; p < seqs[size_t(s)].second; ++p) {
      b.positions.push_back(p);
      b.slot_mapping.push_back(int32_t(b.slot(s, p)));
    }
    b.q_start.push_back(int32_t(b.positions.size()));
  }
  return b;
}

namespace {

// A bf16 linear at `rows` rows: 1 takes the row GEMV (row_gemv.cu), 5 the bf16 GEMV (unless
// either is off), 40 cuBLASLt.
PathResult test_linear(Harness& h, int rows) {
  Tensor x = h.random({rows, 264}), w = h.random({392, 264}, 0.05f), b = h.random({392}, 0.1f);
  ops::Weight wc{.data = h.bf16(w), .bias = h.bf16(b)};
  ops::Weight wg{.data = h.gpu_backend().upload(wc.data), .bias = h.gpu_backend().upload(wc.bias)};
  Tensor ref = h.cpu_out({rows, 392}), out = h.poisoned({rows, 392});
  h.cpu().linear({.x = x, .w = &wc, .out = ref});
  h.gpu_backend().linear({.x = h.gpu(x), .w = &wg, .out = out});
  const auto* cuda = dynamic_cast<const CudaBackend*>(&h.gpu_backend());
  const bool gemv = rows <= 8 && cuda != nullptr && cuda->bf16_gemv_dense();
  const bool row_gemv = gemv && rows <= bf16_row_gemv_rows();
  return h.compare(row_gemv ? "linear (bf16 row GEMV, bias)"
                   : gemv   ? "linear (bf16 GEMV, bias)"
                            : "linear (cuBLASLt bf16, bias)",
                   out, ref);
}

PathResult test_rms_norm(Harness& h) {
  Tensor x = h.random({7, 512}), r = h.random({7, 512}), w = h.random({512});
  Tensor rg = h.gpu(r), ref = h.cpu_out({7, 512}), out = h.poisoned({7, 512});
  h.cpu().rms_norm({.x = x, .weight = w, .residual = r, .out = ref, .eps = 1e-5f});
  h.gpu_backend().rms_norm({.x = h.gpu(x), .weight = h.gpu_backend().upload(w), .residual = rg, .out = out,
                            .eps = 1e-5f});
  return h.compare("rms_norm (+ residual)", out, ref);
}

PathResult test_rope(Harness& h, ops::RopeStyle style) {
  const ops::BatchMeta b = scattered_batch({{3, 700}, {2, 2}}, 16, 48);
  ops::RopeTable tab{.d_rot = 32, .attention_factor = 1.2f, .style = style};
  for (int i = 0; i < 16; ++i) tab.inv_freq.push_back(std::pow(10000.0f, -float(2 * i) / 32.0f));
  Tensor x = h.random({b.n_tokens(), 2, 64});
  Tensor xg = h.gpu(x);
  h.cpu().rope({.x = x, .batch = &b, .table = &tab});
  h.gpu_backend().begin_step(b);
  h.gpu_backend().rope({.x = xg, .batch = &b, .table = &tab});
  return h.compare(style == ops::RopeStyle::kHalf ? "rope (half pairs, partial)" : "rope (interleaved pairs)", xg, x);
}

// The fused per-head norm + rope of q and k: norms on both and a partial half-style rope,
// or no norms and a full interleaved one.
PathResult test_qk_norm_rope(Harness& h, bool norms) {
  const ops::BatchMeta b = scattered_batch({{3, 700}, {2, 2}}, 16, 48);
  const int d_head = norms ? 128 : 64, d_rot = 64;
  ops::RopeTable tab{.d_rot = d_rot, .attention_factor = 1.1f,
                     .style = norms ? ops::RopeStyle::kHalf : ops::RopeStyle::kInterleaved};
  for (int i = 0; i < d_rot / 2; ++i) tab.inv_freq.push_back(std::pow(10000.0f, -float(2 * i) / float(d_rot)));
  Tensor q = h.random({b.n_tokens(), 4, d_head}), k = h.random({b.n_tokens(), 2, d_head});
  Tensor qn = norms ? h.random({d_head}) : Tensor{}, kn = norms ? h.random({d_head}) : Tensor{};
  Tensor qg = h.gpu(q), kg = h.gpu(k);
  h.cpu().qk_norm_rope({.q = q, .k = k, .q_norm = qn, .k_norm = kn, .eps = 1e-6f, .batch = &b, .table = &tab});
  h.gpu_backend().begin_step(b);
  h.gpu_backend().qk_norm_rope({.q = qg, .k = kg, .q_norm = norms ? h.gpu_backend().upload(qn) : Tensor{},
                                .k_norm = norms ? h.gpu_backend().upload(kn) : Tensor{}, .eps = 1e-6f, .batch = &b,
                                .table = &tab});
  const char* name = norms ? "qk_norm_rope (norms, half pairs, partial)" : "qk_norm_rope (interleaved pairs)";
  PathResult r = h.compare(name, qg, q);
  return r.passed ? h.compare(name, kg, k) : r;
}

PathResult test_glu(Harness& h, ops::GluKind kind) {
  Tensor g = h.random({3, 300}, 8.0f), u = h.random({3, 300}, 8.0f);
  Tensor ref = h.cpu_out({3, 300}), out = h.poisoned({3, 300});
  h.cpu().glu({.gate = g, .up = u, .out = ref, .params = {.kind = kind}});
  h.gpu_backend().glu({.gate = h.gpu(g), .up = h.gpu(u), .out = out, .params = {.kind = kind}});
  return h.compare(kind == ops::GluKind::kSilu ? "glu (silu)" : "glu (gpt-oss clamp)", out, ref);
}

// A KV cache on both backends: the CPU's f32 (or e4m3 + scales), the GPU's bf16 (or
// e4m3 + scales). n_scales: scales per slot (e4m3 only).
struct SelfTestCache {
  Tensor cpu, gpu, cpu_scale, gpu_scale;
};
SelfTestCache make_cache(Harness& h, Shape s, int64_t n_scales, bool fp8) {
  SelfTestCache c;
  if (!fp8) {
    c.cpu = h.cpu_out(s);
    c.gpu = h.gpu_backend().alloc(DType::kBF16, s);
    return c;
  }
  c.cpu = host_tensor(DType::kF8E4M3, s);
  c.gpu = h.gpu_backend().alloc(DType::kF8E4M3, s);
  c.cpu_scale = host_tensor(DType::kF32, {s.dims[0], s.dims[1], n_scales});
  c.gpu_scale = h.gpu_backend().alloc(DType::kF32, c.cpu_scale.shape);
  return c;
}

PathResult test_attention(Harness& h, int n_heads, int n_kv, int d, int window, bool sinks, bool fp8) {
  const ops::BatchMeta b1 = scattered_batch({{20, 20}, {40, 40}}, 16, 3), b2 = scattered_batch({{20, 20}, {1, 40}}, 16, 3);
  Tensor k = h.random({b1.n_tokens(), n_kv, d}), v = h.random({b1.n_tokens(), n_kv, d});
  const SelfTestCache kc = make_cache(h, {6, 16, n_kv, d}, n_kv, fp8), vc = make_cache(h, {6, 16, n_kv, d}, n_kv, fp8);
  h.cpu().kv_store({.k = k, .v = v, .k_cache = kc.cpu, .v_cache = vc.cpu, .k_scale = kc.cpu_scale,
                    .v_scale = vc.cpu_scale, .batch = &b1});
  h.gpu_backend().begin_step(b1);
  h.gpu_backend().kv_store({.k = h.gpu(k), .v = h.gpu(v), .k_cache = kc.gpu, .v_cache = vc.gpu,
                            .k_scale = kc.gpu_scale, .v_scale = vc.gpu_scale, .batch = &b1});
  Tensor q = h.random({b2.n_tokens(), n_heads, d});
  Tensor s = sinks ? h.random({n_heads}, 2.0f) : Tensor{};
  const float scale = 1.0f / std::sqrt(float(d));
  Tensor ref = h.cpu_out({b2.n_tokens(), n_heads, d}), out = h.poisoned(ref.shape);
  h.cpu().attention({.q = q, .k_cache = kc.cpu, .v_cache = vc.cpu, .k_scale = kc.cpu_scale, .v_scale = vc.cpu_scale,
                     .out = ref, .sinks = s, .batch = &b2, .scale = scale, .sliding_window = window});
  h.gpu_backend().begin_step(b2);
  h.gpu_backend().attention({.q = h.gpu(q), .k_cache = kc.gpu, .v_cache = vc.gpu, .k_scale = kc.gpu_scale,
                             .v_scale = vc.gpu_scale, .out = out,
                             .sinks = sinks ? h.gpu_backend().upload(s) : Tensor{}, .batch = &b2, .scale = scale,
                             .sliding_window = window});
  return h.compare(std::string("attention (") + (fp8 ? "fp8 cache, " : "") + "d " + std::to_string(d) + ", GQA " +
                       std::to_string(n_heads / n_kv) + (window ? ", window" : "") + (sinks ? ", sinks" : "") + ")",
                   out, ref);
}

PathResult test_mla(Harness& h, bool fp8) {
  const int n_heads = 2, d_nope = 128, d_rope = 64, d_v = 128, d_latent = 512;
  const ops::BatchMeta b1 = scattered_batch({{18, 18}}, 16, 2), b2 = scattered_batch({{1, 18}}, 16, 2);
  Tensor lat = h.random({18, d_latent}), rope = h.random({18, d_rope});
  const SelfTestCache cache = make_cache(h, {2, 16, d_latent + d_rope}, 2, fp8);
  h.cpu().mla_store({.kv_latent = lat, .k_rope = rope, .latent_cache = cache.cpu, .latent_scale = cache.cpu_scale,
                     .batch = &b1});
  h.gpu_backend().begin_step(b1);
  h.gpu_backend().mla_store({.kv_latent = h.gpu(lat), .k_rope = h.gpu(rope), .latent_cache = cache.gpu,
                             .latent_scale = cache.gpu_scale, .batch = &b1});
  Tensor kv_b = h.random({n_heads * (d_nope + d_v), d_latent}, 0.05f);
  ops::Weight wc{.data = h.bf16(kv_b)}, wg{.data = h.gpu_backend().upload(wc.data)};
  Tensor qn = h.random({1, n_heads, d_nope}), qr = h.random({1, n_heads, d_rope});
  Tensor ref = h.cpu_out({1, n_heads, d_v}), out = h.poisoned(ref.shape);
  h.cpu().mla_attention({.q_nope = qn, .q_rope = qr, .latent_cache = cache.cpu, .latent_scale = cache.cpu_scale,
                         .kv_b = &wc, .out = ref, .batch = &b2, .scale = 0.07f});
  h.gpu_backend().begin_step(b2);
  h.gpu_backend().mla_attention({.q_nope = h.gpu(qn), .q_rope = h.gpu(qr), .latent_cache = cache.gpu,
                                 .latent_scale = cache.gpu_scale, .kv_b = &wg, .out = out, .batch = &b2,
                                 .scale = 0.07f});
  return h.compare(std::string("mla (") + (fp8 ? "fp8 cache, " : "") + "absorbed, latent 512 + rope 64)", out, ref);
}

// DeepSeek sparse attention (OptionalOp::kDsa): the indexer key's LayerNorm (in place),
// its cache store, the top-k selection (equal to the CPU's: the GPU scores with the CPU's
// own operations, kernels/dsa.cu) and MLA over that selection on the MLA path the
// self-test left chosen. Not required: a failure refuses DSA models at load instead.
PathResult test_dsa(Harness& h, bool fp8) {
  PathResult res{.path = std::string("dsa (") + (fp8 ? "fp8 cache, " : "") +
                         "layer_norm, index store, top-k 8 of 40, MLA over the selection)",
                 .tolerance = kTolerance, .required = false};
  ops::Backend& gpu = h.gpu_backend();
  const int n_heads = 4, d = 32, top_k = 8, n_q = 3;
  const ops::BatchMeta b1 = scattered_batch({{40, 40}}, 16, 4), b2 = scattered_batch({{n_q, 40}}, 16, 4);
  Tensor k = h.random({40, d}), w = h.random({d}), bias = h.random({d}, 0.5f);
  Tensor kn = h.cpu_out({40, d}), kg = h.gpu(k);
  h.cpu().layer_norm({.x = k, .weight = w, .bias = bias, .out = kn, .eps = 1e-6f});
  gpu.layer_norm({.x = kg, .weight = gpu.upload(w), .bias = gpu.upload(bias), .out = kg, .eps = 1e-6f});
  if (PathResult ln = h.compare(res.path, kg, kn); !ln.passed) {
    res.detail = "layer_norm: " + ln.detail;
    return res;
  }
  // Both caches from the CPU's normalised keys (bf16-representable: its bf16 mode).
  const SelfTestCache ic = make_cache(h, {4, 16, d}, 1, fp8);
  const Tensor cs = fp8 ? ic.cpu_scale.reshape({4, 16}) : Tensor{}, gs = fp8 ? ic.gpu_scale.reshape({4, 16}) : Tensor{};
  h.cpu().dsa_index_store({.k = kn, .index_cache = ic.cpu, .index_scale = cs, .batch = &b1});
  gpu.begin_step(b1);
  gpu.dsa_index_store({.k = h.gpu(kn), .index_cache = ic.gpu, .index_scale = gs, .batch = &b1});
  Tensor q = h.random({n_q, n_heads, d}), wts = h.random({n_q, n_heads});
  Tensor sel_c = host_tensor(DType::kI32, {n_q, top_k});
  h.cpu().dsa_select({.q = q, .weights = wts, .index_cache = ic.cpu, .index_scale = cs, .selected = sel_c,
                      .batch = &b2, .scale = 0.18f, .weight_scale = 0.5f});
  Tensor sel_g = gpu.alloc(DType::kI32, {n_q, top_k});
  gpu.synchronize();
  KILN_CUDA_CHECK(cudaMemset(sel_g.data, 0x5a, size_t(sel_g.nbytes())));  // neither a position nor -1
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  gpu.begin_step(b2);
  gpu.dsa_select({.q = h.gpu(q), .weights = h.gpu(wts), .index_cache = ic.gpu, .index_scale = gs, .selected = sel_g,
                  .batch = &b2, .scale = 0.18f, .weight_scale = 0.5f});
  std::vector<int32_t> got(size_t(n_q) * top_k);
  gpu.synchronize();
  KILN_CUDA_CHECK(cudaMemcpy(got.data(), sel_g.data, got.size() * 4, cudaMemcpyDeviceToHost));
  if (!std::equal(got.begin(), got.end(), sel_c.as<int32_t>())) {
    res.detail = "dsa_select: a selection unlike the CPU's";
    return res;
  }
  const int mh = 2, d_nope = 128, d_rope = 64, d_v = 128, d_latent = 512;
  Tensor lat = h.random({40, d_latent}), rope = h.random({40, d_rope});
  const SelfTestCache lc = make_cache(h, {4, 16, d_latent + d_rope}, 2, fp8);
  h.cpu().mla_store({.kv_latent = lat, .k_rope = rope, .latent_cache = lc.cpu, .latent_scale = lc.cpu_scale,
                     .batch = &b1});
  gpu.begin_step(b1);
  gpu.mla_store({.kv_latent = h.gpu(lat), .k_rope = h.gpu(rope), .latent_cache = lc.gpu, .latent_scale = lc.gpu_scale,
                 .batch = &b1});
  Tensor kv_b = h.random({mh * (d_nope + d_v), d_latent}, 0.05f);
  ops::Weight wc{.data = h.bf16(kv_b)}, wg{.data = gpu.upload(wc.data)};
  Tensor qn = h.random({n_q, mh, d_nope}), qr = h.random({n_q, mh, d_rope});
  Tensor ref = h.cpu_out({n_q, mh, d_v}), out = h.poisoned(ref.shape);
  h.cpu().mla_attention({.q_nope = qn, .q_rope = qr, .latent_cache = lc.cpu, .latent_scale = lc.cpu_scale,
                         .kv_b = &wc, .out = ref, .batch = &b2, .scale = 0.07f, .selected = sel_c});
  gpu.begin_step(b2);
  gpu.mla_attention({.q_nope = h.gpu(qn), .q_rope = h.gpu(qr), .latent_cache = lc.gpu, .latent_scale = lc.gpu_scale,
                     .kv_b = &wg, .out = out, .batch = &b2, .scale = 0.07f, .selected = sel_g});
  res = h.compare(res.path, out, ref);
  res.required = false;
  if (!res.passed) res.detail = "MLA over the selection: " + res.detail;
  return res;
}

PathResult test_moe(Harness& h, ops::RouterKind kind, int n_tokens) {
  const int n_experts = 8, top_k = 2, d = 128, d_ff = 64;
  const bool gpt_oss = kind == ops::RouterKind::kTopKSoftmax;
  ops::MoeExperts ec, eg;
  ec.d_ff = eg.d_ff = d_ff;
  ec.gate_up_interleaved = eg.gate_up_interleaved = gpt_oss;
  auto weight = [&](int64_t n_out, int64_t n_in, std::vector<ops::Weight>& lc, std::vector<ops::Weight>& lg) {
    Tensor w = gpt_oss ? h.random({n_in, n_out}, 0.1f) : h.random({n_out, n_in}, 0.1f);
    ops::Weight c{.data = h.bf16(w), .transposed = gpt_oss};
    if (gpt_oss) c.bias = h.bf16(h.random({n_out}, 0.1f));
    ops::Weight g{.data = h.gpu_backend().upload(c.data), .transposed = gpt_oss};
    if (gpt_oss) g.bias = h.gpu_backend().upload(c.bias);
    lc.push_back(c), lg.push_back(g);
  };
  for (int e = 0; e < n_experts; ++e) {
    if (gpt_oss) {
      weight(2 * d_ff, d, ec.gate_up, eg.gate_up);
    } else {
      weight(d_ff, d, ec.gate, eg.gate);
      weight(d_ff, d, ec.up, eg.up);
    }
    weight(d, d_ff, ec.down, eg.down);
  }
  Tensor router = h.random({n_experts, d}, 0.1f);
  ops::Weight rc{.data = h.bf16(router)}, rg{.data = h.gpu_backend().upload(rc.data)};
  Tensor corr = kind == ops::RouterKind::kSigmoidGroupedTopK ? h.random({n_experts}, 0.05f) : Tensor{};
  const ops::RouterParams rp{.kind = kind, .n_experts = n_experts, .top_k = top_k, .n_group = 4,
                             .topk_group = 2, .norm_topk_prob = true, .routed_scaling_factor = 2.0f};
  const ops::GluParams glu{.kind = gpt_oss ? ops::GluKind::kGptOssClamp : ops::GluKind::kSilu};
  Tensor x = h.random({n_tokens, d});
  Tensor ref = h.cpu_out({n_tokens, d}), out = h.poisoned({n_tokens, d});
  h.cpu().moe({.x = x, .router = &rc, .correction_bias = corr, .experts = &ec, .routing = rp, .glu = glu, .out = ref});
  h.gpu_backend().moe({.x = h.gpu(x), .router = &rg,
                       .correction_bias = corr.defined() ? h.gpu_backend().upload(corr) : Tensor{}, .experts = &eg,
                       .routing = rp, .glu = glu, .out = out});
  static const char* names[] = {"moe (softmax top-k)", "moe (top-k softmax, gpt-oss experts)",
                                "moe (sigmoid grouped top-k)"};
  return h.compare(std::string(names[int(kind)]) + ", " + std::to_string(n_tokens) + " tokens", out, ref);
}


// Sampling against the CPU reference on the same bf16 logits (ties are common in bf16).
// The kernel's masses are within kSampleTol relative of the reference's (each an fp32 exp,
// 2 ulp, of an fp32 argument of magnitude <= 30, rounded to 2^-40 and summed exactly), so
// its token may differ only where moving the draw and the filters by that much moves the
// reference's. A token's position in the candidate order is monotone in the uniform and
// top_p and antitone in min_p, so two reference calls at the extremes bound it.
constexpr double kSampleTol = 0x1p-16;

PathResult test_sampling(Harness& h) {
  const int rows = 6, vocab = 4099, n_top = 5;  // odd vocab: rows are not 16-byte aligned
  Tensor x = h.random({rows, vocab}, 6.0f);
  const std::vector<ops::SamplingParams> params = {
      {},
      {.temperature = 0.7f, .top_k = 50},
      {.temperature = 1.0f, .top_p = 0.9f},
      {.temperature = 1.3f, .min_p = 0.05f},
      {.temperature = 0.9f, .top_k = 40, .top_p = 0.8f, .min_p = 0.02f},
      {.temperature = 1.0f}};
  const std::vector<float> uniform = {0.5f, 0.25f, 0.9f, 0.1f, 0.7f, 0.999f};
  struct Out {
    std::vector<int32_t> tokens, top_ids;
    std::vector<float> logprobs, top_logprobs;
  };
  auto run = [&](ops::Backend& be, const Tensor& logits, const std::vector<ops::SamplingParams>& p,
                 const std::vector<float>& u) {
    Out o{std::vector<int32_t>(rows), std::vector<int32_t>(rows * n_top), std::vector<float>(rows),
          std::vector<float>(rows * n_top)};
    be.sample({.logits = logits, .params = p, .uniform = u, .n_top = n_top, .tokens = o.tokens,
               .logprobs = o.logprobs, .top_ids = o.top_ids, .top_logprobs = o.top_logprobs});
    return o;
  };
  const Out got = run(h.gpu_backend(), h.gpu(x), params, uniform), ref = run(h.cpu(), x, params, uniform);
  std::vector<ops::SamplingParams> p_lo = params, p_hi = params;
  std::vector<float> u_lo = uniform, u_hi = uniform;
  for (int r = 0; r < rows; ++r) {
    const ops::SamplingParams& p = params[size_t(r)];
    if (p.top_p < 1.0f) {
      p_lo[size_t(r)].top_p = float(p.top_p * (1.0 - kSampleTol));
      p_hi[size_t(r)].top_p = float(std::min(1.0, p.top_p * (1.0 + kSampleTol)));
    }
    if (p.min_p > 0.0f) {
      p_lo[size_t(r)].min_p = float(std::min(1.0, p.min_p * (1.0 + kSampleTol)));
      p_hi[size_t(r)].min_p = float(p.min_p * (1.0 - kSampleTol));
    }
    u_lo[size_t(r)] = float(std::max(0.0, uniform[size_t(r)] - kSampleTol));
    u_hi[size_t(r)] = float(std::min(1.0 - 0x1p-24, uniform[size_t(r)] + kSampleTol));
  }
  const Out lo = run(h.cpu(), x, p_lo, u_lo), hi = run(h.cpu(), x, p_hi, u_hi);

  PathResult res{.path = "sampling (radix select: greedy, top-k, top-p, min-p, logprobs)", .tolerance = kSampleTol};
  for (int r = 0; r < rows; ++r) {
    const float* row = x.as<float>() + int64_t(r) * vocab;
    auto position = [&](int32_t id) {  // in the candidate order: logit descending, ids ascending
      int n = 0;
      for (int j = 0; j < vocab; ++j) n += row[j] > row[id] || (row[j] == row[id] && j < id);
      return n;
    };
    const std::string at = "row " + std::to_string(r) + ": ";
    const size_t ru = size_t(r);
    const int g = position(got.tokens[ru]), a = position(lo.tokens[ru]), b = position(hi.tokens[ru]);
    if (g < a || g > b) {
      res.detail = at + "token " + std::to_string(got.tokens[size_t(r)]) + " at position " + std::to_string(g) +
                   ", the reference's is in [" + std::to_string(a) + ", " + std::to_string(b) + "]";
      return res;
    }
    auto check_logprob = [&](float gv, float rv, const std::string& what) {
      const double err = std::abs(double(gv) - double(rv));
      res.rel_err = std::max(res.rel_err, err);
      if (!(err <= kSampleTol + std::abs(rv) * 0x1p-23))
        res.detail = at + what + " logprob " + std::to_string(gv) + " vs " + std::to_string(rv);
    };
    if (got.tokens[size_t(r)] == ref.tokens[size_t(r)])
      check_logprob(got.logprobs[size_t(r)], ref.logprobs[size_t(r)], "token");
    for (int j = 0; j < n_top; ++j) {
      const size_t i = size_t(r * n_top + j);
      if (got.top_ids[i] != ref.top_ids[i]) {
        res.detail = at + "top " + std::to_string(j) + " is " + std::to_string(got.top_ids[i]) + ", expected " +
                     std::to_string(ref.top_ids[i]);
      }
      check_logprob(got.top_logprobs[i], ref.top_logprobs[i], "top " + std::to_string(j));
    }
    if (!res.detail.empty()) return res;
  }
  res.passed = true;
  return res;
}

}  // namespace

// A quantized linear of each value kind, on the GEMV (2 rows) and on the mma.sync
// decode (20) and prefill (40) tiles. The reference reads the weights as the GPU's bf16
// tiles hold them (the CPU's bf16 mode); where the GPU runs the W8A8 GEMMs (FP8 at 40
// rows) it also quantizes the activations as they do (fp8_activations).
PathResult test_quant_linear(Harness& h, const QuantCase& c, int rows) {
  static std::mt19937 rng(20261123);
  const int64_t n_out = 192, n_in = 384;
  ops::Weight wc{.quant = random_quantized(c, n_out, n_in, rng)};
  auto packed = h.gpu_backend().upload_quantized(wc.quant);
  const auto* cuda = dynamic_cast<const CudaBackend*>(&h.gpu_backend());
  const bool w8a8 = cuda && !quant_gemm_decode_rows(rows) && packed.ok() && cuda->use_w8a8(quant_format(*packed));
  const std::string path = "quantized linear (" + c.name() + ", " + std::to_string(rows) + " rows, " +
                           (rows <= kGemvRows ? "GEMV" : w8a8 ? "W8A8 e4m3 mma.sync" : "mma.sync") + ")";
  if (!packed.ok()) return PathResult{.path = path, .detail = packed.status().to_string()};
  ops::Weight wg{.quant = std::move(packed).value()};
  Tensor x = h.random({rows, n_in});
  Tensor ref = h.cpu_out({rows, n_out}), out = h.poisoned({rows, n_out});
  (w8a8 ? h.cpu_fp8() : h.cpu()).linear({.x = x, .w = &wc, .out = ref});
  h.gpu_backend().linear({.x = h.gpu(x), .w = &wg, .out = out});
  return h.compare(path, out, ref);
}

namespace {

// The native SM120 MoE GEMMs (kernels/quant_gemm_sm120.cu) quantize activations on the
// fly, so the bf16 CPU backend is not their reference. The reference here computes their
// math on the host from each GEMM's own input: x and the device's act quantized by
// quant_mma_sm120.h's rules, the packed weights' values (quant_pack.h), sums in double,
// the CPU backend's GLU. The device and host quantized x must agree byte for byte; act
// and y then differ by fp32 summation order (and act by its bf16 rounding): kTolerance.
// SM 12.x only (elsewhere "not applicable"); a pass enables the path.
PathResult test_moe_native(Harness& h, formats::QuantKind kind) {
  const bool mx = kind == formats::QuantKind::kMxfp4;
  PathResult res{.path = std::string("moe native sm_120a (") +
                         (mx ? "MXFP4 x e4m3, mxf8f6f4)" : "NVFP4 x e2m1, mxf4nvf4)"),
                 .tolerance = kTolerance,
                 .required = false};
  auto* cuda = dynamic_cast<CudaBackend*>(&h.gpu_backend());
  if (cuda == nullptr || cuda->info().cc_major != 12) {
    res.applicable = false;
    res.detail = cuda ? "not applicable on sm_" + std::to_string(cuda->info().cc()) : "not a CUDA backend";
    return res;
  }
  if (!quant_sm120_native_available()) {
    res.detail = "this build has no sm_120a / sm_121a code for sm_" + std::to_string(cuda->info().cc()) +
                 " (KILN_CUDA_ARCHS " KILN_CUDA_ARCHS_BUILT ")";
    return res;
  }
  // 4 experts, top-2, 96 tokens: 48 rows per expert, the 64-row prefill tiles; inputs off
  // the 128-input tile. MXFP4 as gpt-oss has it (interleaved gate/up, biases, clamped
  // SwiGLU), NVFP4 as ModelOpt's (separate gate and up, SiLU).
  const int n_experts = 4, top_k = 2, n_tokens = 96, d = 320, d_ff = 192, n_pairs = n_tokens * top_k;
  const auto fmt = sm120::ActFormat(mx ? 0 : 1);
  static std::mt19937 rng(20261124);
  struct HostExpert {
    std::vector<PackedQuant> up;  // fused [2 d_ff, d] interleaved, or gate, up
    PackedQuant down;
    std::vector<float> up_bias, down_bias;
  };
  std::vector<HostExpert> hosts(n_experts);
  std::vector<QuantExpert> table(n_experts);
  std::vector<formats::QuantizedTensor> keep;  // device weights, alive until the end
  std::vector<Tensor> keep_bias;
  auto matrix = [&](int64_t n_out, int64_t n_in, std::vector<PackedQuant>& host) -> Result<QuantMat> {
    const formats::QuantizedTensor q = random_quantized({kind}, n_out, n_in, rng);
    KILN_ASSIGN_OR_RETURN(PackedQuant p, pack_quantized(q));
    host.push_back(std::move(p));
    KILN_ASSIGN_OR_RETURN(formats::QuantizedTensor g, cuda->upload_quantized(q));
    keep.push_back(g);
    return quant_mat(keep.back());
  };
  auto bias = [&](int64_t n, std::vector<float>& host) {
    Tensor b = h.random({n}, 0.1f);
    host.assign(b.as<float>(), b.as<float>() + n);
    keep_bias.push_back(cuda->upload(b));
    return keep_bias.back().as<float>();
  };
  const Status built = [&]() -> Status {
    for (int e = 0; e < n_experts; ++e) {
      HostExpert& he = hosts[size_t(e)];
      QuantExpert& t = table[size_t(e)];
      if (mx) {
        KILN_ASSIGN_OR_RETURN(t.gate_up, matrix(2 * d_ff, d, he.up));
        t.gate_up_bias = bias(2 * d_ff, he.up_bias);
        t.down_bias = bias(d, he.down_bias);
      } else {
        KILN_ASSIGN_OR_RETURN(t.gate, matrix(d_ff, d, he.up));
        KILN_ASSIGN_OR_RETURN(t.up, matrix(d_ff, d, he.up));
      }
      std::vector<PackedQuant> down;
      KILN_ASSIGN_OR_RETURN(t.down, matrix(d, d_ff, down));
      he.down = std::move(down[0]);
    }
    return Status::Ok();
  }();
  if (!built.ok()) {
    res.detail = built.to_string();
    return res;
  }
  const QuantFormat f = quant_format(keep.back());
  std::vector<int32_t> experts(static_cast<size_t>(n_pairs));
  for (int tkn = 0; tkn < n_tokens; ++tkn) {  // two distinct experts, unevenly loaded
    const int e0 = int(rng() % 3), e1 = (e0 + 1 + int(rng() % 3)) % n_experts;
    experts[size_t(2 * tkn)] = e0, experts[size_t(2 * tkn + 1)] = e1;
  }
  Tensor x = h.random({n_tokens, d}, 2.0f), xg = h.gpu(x);

  // Device buffers (outputs poisoned), then the launch on this thread's default stream.
  auto bytes = [&](size_t n) { return cuda->alloc(DType::kU8, {int64_t(n)}); };
  const int slots = moe_tile_slots(n_pairs, n_experts, sm120::kBM);
  const size_t act_q_bytes =
      moe_native_quant_scratch_bytes(int(fmt), MoeShape{.d_model = d, .d_ff = d_ff}, n_pairs, top_k);
  Tensor t_table = bytes(table.size() * sizeof(QuantExpert)), t_experts = bytes(experts.size() * 4);
  Tensor t_perm = bytes(size_t(n_pairs) * 4), t_tiles = bytes(size_t(slots) * sizeof(int4)), t_q = bytes(act_q_bytes);
  Tensor t_act = h.poisoned({n_pairs, d_ff});
  Tensor t_y = bytes(size_t(n_pairs) * d * 4);
  std::vector<float> nan(size_t(n_pairs) * d, std::nanf(""));
  cuda->synchronize();  // uploads and x are on the backend's stream
  KILN_CUDA_CHECK(cudaMemcpy(t_table.data, table.data(), t_table.nbytes(), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(t_experts.data, experts.data(), t_experts.nbytes(), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(t_y.data, nan.data(), t_y.nbytes(), cudaMemcpyHostToDevice));
  const MoeShape s{.d_model = d, .d_ff = d_ff, .interleaved = mx, .glu_kind = mx ? 1 : 0};
  MoeGroupedScratch sc{.perm = t_perm.as<int32_t>(), .tiles = static_cast<int4*>(t_tiles.data),
                       .act = t_act.as<bf16>(), .y = t_y.as<float>()};
  launch_moe_grouped_quant_sm120(xg.as<bf16>(), static_cast<const QuantExpert*>(t_table.data), f,
                                 t_experts.as<int32_t>(), s, n_pairs, n_experts, top_k, sc, t_q.data, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> perm(static_cast<size_t>(n_pairs));
  std::vector<float> act(size_t(n_pairs) * d_ff), y(size_t(n_pairs) * d);
  KILN_CUDA_CHECK(cudaMemcpy(perm.data(), t_perm.data, perm.size() * 4, cudaMemcpyDeviceToHost));
  KILN_CUDA_CHECK(cudaMemcpy(y.data(), t_y.data, y.size() * 4, cudaMemcpyDeviceToHost));
  cuda->to_host_f32(t_act, act.data());

  // x quantized: the device's bytes against quantize_act_rows'.
  const int64_t x_codes = n_tokens * sm120::act_code_row_bytes(fmt, d);
  const int64_t x_scales = n_tokens * sm120::act_scale_row_bytes(fmt, d);
  std::vector<uint8_t> xq(static_cast<size_t>(x_codes)), xs(static_cast<size_t>(x_scales)), dq(xq.size()),
      ds(xs.size());
  std::vector<float> xr(static_cast<size_t>(n_tokens)), dr(xr.size());
  sm120::quantize_act_rows(fmt, x.as<float>(), n_tokens, d, xq.data(), xs.data(), xr.data());
  const QuantActBuffers dev = quant_act_buffers(int(fmt), t_q.data, n_tokens, d);
  KILN_CUDA_CHECK(cudaMemcpy(dq.data(), dev.codes, dq.size(), cudaMemcpyDeviceToHost));
  KILN_CUDA_CHECK(cudaMemcpy(ds.data(), dev.scales, ds.size(), cudaMemcpyDeviceToHost));
  if (!mx) KILN_CUDA_CHECK(cudaMemcpy(dr.data(), dev.row_scale, dr.size() * 4, cudaMemcpyDeviceToHost));
  if (dq != xq || ds != xs || (!mx && dr != xr)) {
    res.detail = "the device's quantized activations differ from quantize_act_rows'";
    return res;
  }

  // act = glu(x W_up^T) per sorted row, then y = act W_down^T per pair, each from its own input.
  auto dequantized = [](const PackedQuant& p) {
    std::vector<float> w(size_t(p.n_out * p.n_in));
    for (int64_t o = 0; o < p.n_out; ++o)
      for (int64_t k = 0; k < p.n_in; ++k) w[size_t(o * p.n_in + k)] = packed_element(p, o, k) * p.scale2;
    return w;
  };
  auto act_rows = [&](const float* in, int64_t rows, int64_t k, std::vector<uint8_t>& codes,
                      std::vector<uint8_t>& scales, std::vector<float>& row_scale) {
    std::vector<float> out(size_t(rows * k));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i)
        out[size_t(r * k + i)] = sm120::act_value(fmt, codes.data(), scales.data(), row_scale.data(), k, r, i);
    return out;
  };
  auto dot = [](const float* a, const float* b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
    return float(s);
  };
  std::vector<std::vector<float>> w_up(size_t(n_experts) * 2), w_down(static_cast<size_t>(n_experts));
  for (int e = 0; e < n_experts; ++e) {
    for (size_t j = 0; j < hosts[size_t(e)].up.size(); ++j)
      w_up[size_t(2 * e) + j] = dequantized(hosts[size_t(e)].up[j]);
    w_down[size_t(e)] = dequantized(hosts[size_t(e)].down);
  }
  const std::vector<float> xv = act_rows(x.as<float>(), n_tokens, d, xq, xs, xr);
  Tensor gate = h.cpu_out({n_pairs, d_ff}), up = h.cpu_out({n_pairs, d_ff}), act_ref = h.cpu_out({n_pairs, d_ff});
  for (int r = 0; r < n_pairs; ++r) {
    const int pair = perm[size_t(r)], e = experts[size_t(pair)];
    const HostExpert& he = hosts[size_t(e)];
    const float* xrow = &xv[size_t(pair / top_k) * d];
    for (int i = 0; i < d_ff; ++i) {
      // Gate / up rows: interleaved (2i, 2i + 1) of the fused matrix, or row i of each.
      const float* wg = mx ? &w_up[size_t(2 * e)][size_t(2 * i) * d] : &w_up[size_t(2 * e)][size_t(i) * d];
      const float* wu = mx ? &w_up[size_t(2 * e)][size_t(2 * i + 1) * d] : &w_up[size_t(2 * e + 1)][size_t(i) * d];
      gate.as<float>()[r * d_ff + i] = dot(xrow, wg, d) + (mx ? he.up_bias[size_t(2 * i)] : 0.0f);
      up.as<float>()[r * d_ff + i] = dot(xrow, wu, d) + (mx ? he.up_bias[size_t(2 * i + 1)] : 0.0f);
    }
  }
  h.cpu().glu({.gate = gate, .up = up, .out = act_ref,
               .params = {.kind = mx ? ops::GluKind::kGptOssClamp : ops::GluKind::kSilu}});
  std::vector<uint8_t> aq(size_t(n_pairs * sm120::act_code_row_bytes(fmt, d_ff)));
  std::vector<uint8_t> as(size_t(n_pairs * sm120::act_scale_row_bytes(fmt, d_ff)));
  std::vector<float> ar(static_cast<size_t>(n_pairs));
  sm120::quantize_act_rows(fmt, act.data(), n_pairs, d_ff, aq.data(), as.data(), ar.data());
  const std::vector<float> av = act_rows(act.data(), n_pairs, d_ff, aq, as, ar);
  double max_act = 0.0, err_act = 0.0, max_y = 0.0, err_y = 0.0;
  for (int64_t i = 0; i < int64_t(act.size()); ++i) {
    if (std::isnan(act[size_t(i)])) {
      res.detail = "act element " + std::to_string(i) + " not written (NaN)";
      return res;
    }
    max_act = std::max(max_act, double(std::abs(act_ref.as<float>()[i])));
    err_act = std::max(err_act, double(std::abs(act[size_t(i)] - act_ref.as<float>()[i])));
  }
  for (int r = 0; r < n_pairs; ++r) {
    const int pair = perm[size_t(r)], e = experts[size_t(pair)];
    for (int j = 0; j < d; ++j) {
      const float want = dot(&av[size_t(r) * d_ff], &w_down[size_t(e)][size_t(j) * d_ff], d_ff) +
                         (mx ? hosts[size_t(e)].down_bias[size_t(j)] : 0.0f);
      const float got = y[size_t(pair) * d + j];
      if (std::isnan(got)) {
        res.detail = "pair " + std::to_string(pair) + " not written (NaN)";
        return res;
      }
      max_y = std::max(max_y, double(std::abs(want)));
      err_y = std::max(err_y, double(std::abs(got - want)));
    }
  }
  res.rel_err = std::max(err_act / std::max(max_act, 1e-30), err_y / std::max(max_y, 1e-30));
  res.passed = res.rel_err <= kTolerance;
  if (!res.passed)
    res.detail = "max relative error " + std::to_string(res.rel_err) + " > " + std::to_string(kTolerance);
  return res;
}

}  // namespace

std::vector<PathResult> run_self_test(ops::Backend& gpu) {
  Harness h(gpu);
  std::vector<PathResult> r;
  auto* cuda = dynamic_cast<CudaBackend*>(&gpu);
  if (PathResult t = test_linear(h, 5); !t.passed && cuda) {
    // The bf16 GEMV has a fallback: cuBLASLt at every batch size, tested next.
    t.required = false;
    r.push_back(t);
    cuda->set_bf16_gemv(false);
    KILN_LOG(kWarn, "CUDA self-test: bf16 linears stay on cuBLASLt: " << t.path << ": " << t.detail);
    r.push_back(test_linear(h, 5));
  } else {
    r.push_back(t);
  }
  if (PathResult t = test_linear(h, 1); !t.passed && cuda && bf16_row_gemv_rows() > 0) {
    // The one-row kernel's fallback: the bf16 GEMV (or cuBLASLt) above.
    t.required = false;
    r.push_back(t);
    set_bf16_row_gemv_rows(0);
    KILN_LOG(kWarn, "CUDA self-test: one-row bf16 linears leave the row GEMV: " << t.path << ": " << t.detail);
    r.push_back(test_linear(h, 1));
  } else {
    r.push_back(t);
  }
  r.push_back(test_linear(h, 40));
  r.push_back(test_rms_norm(h));
  r.push_back(test_rope(h, ops::RopeStyle::kHalf));
  r.push_back(test_rope(h, ops::RopeStyle::kInterleaved));
  r.push_back(test_qk_norm_rope(h, true));
  r.push_back(test_qk_norm_rope(h, false));
  r.push_back(test_glu(h, ops::GluKind::kSilu));
  r.push_back(test_glu(h, ops::GluKind::kGptOssClamp));
  // Attention: every path on its own (the fast paths fall back to the warp kernel).
  const std::pair<AttentionPath, const char*> paths[] = {
      {AttentionPath::kWarp, "warp"}, {AttentionPath::kFa2, "FA2 mma.sync"}, {AttentionPath::kSplitKv, "split-KV"}};
  // Each over a bf16 and an e4m3 cache (both backends quantize the same values to the
  // same codes and scales, so the comparison measures the kernels), and head size 256
  // (Qwen3-Next / Qwen3.5) over a bf16 cache (an e4m3 one of 256 takes the warp kernel).
  for (const auto& [path, name] : paths) {
    if (cuda) cuda->force_attention_path(path);
    for (PathResult t : {test_attention(h, 8, 2, 64, 16, true, false), test_attention(h, 4, 1, 128, 0, false, false),
                         test_attention(h, 8, 2, 64, 16, true, true), test_attention(h, 4, 1, 128, 0, false, true),
                         test_attention(h, 16, 2, 256, 0, false, false)}) {
      t.path = std::string(name) + " " + t.path;
      t.required = path == AttentionPath::kWarp;
      if (!t.passed && !t.required && cuda) {
        cuda->disable_attention_path(path);
        KILN_LOG(kWarn, "CUDA self-test: disabling attention path " << t.path << ": " << t.detail);
      }
      r.push_back(t);
    }
    if (cuda) cuda->force_attention_path(AttentionPath::kAuto);
  }
  for (MlaPath path : {MlaPath::kWarp, MlaPath::kMma}) {
    if (cuda) cuda->force_mla_path(path);
    for (bool fp8 : {false, true}) {
      PathResult t = test_mla(h, fp8);
      t.path = std::string(mla_path_name(path)) + " " + t.path;
      t.required = path == MlaPath::kWarp;
      if (!t.passed && !t.required && cuda) {
        cuda->disable_mla_mma();
        KILN_LOG(kWarn, "CUDA self-test: disabling the mma.sync MLA path: " << t.detail);
      }
      r.push_back(t);
    }
    if (cuda) cuda->force_mla_path(MlaPath::kAuto);
  }
  // DeepSeek sparse attention, over bf16 and e4m3 caches, on the MLA path chosen above.
  for (bool fp8 : {false, true}) {
    PathResult t = test_dsa(h, fp8);
    if (!t.passed && cuda) {
      cuda->disable_dsa(t.path + ": " + t.detail);
      KILN_LOG(kWarn, "CUDA self-test: DeepSeek sparse attention models will be refused at load: " << t.detail);
    }
    r.push_back(t);
  }
  // MoE experts: the GEMV path (required), then the grouped GEMMs in their decode
  // (5 tokens) and prefill (160 tokens: 40 rows per expert) tile shapes, and the
  // streaming GEMV over row-major bf16 experts at 1 token (the row GEMV) and 5 (not
  // gpt-oss's input-major ones; its failure turns the bf16 GEMV off, dense linears included).
  for (MoePath path : {MoePath::kGemv, MoePath::kGrouped, MoePath::kStreamGemv}) {
    if (path == MoePath::kStreamGemv && (cuda == nullptr || !cuda->bf16_gemv())) continue;
    if (cuda) cuda->force_moe_path(path);
    for (ops::RouterKind kind :
         {ops::RouterKind::kSoftmaxTopK, ops::RouterKind::kTopKSoftmax, ops::RouterKind::kSigmoidGroupedTopK}) {
      if (path == MoePath::kStreamGemv && kind == ops::RouterKind::kTopKSoftmax) continue;
      for (int n_tokens : {1, 5, 160}) {
        if ((path != MoePath::kGrouped && n_tokens > 5) || (path != MoePath::kStreamGemv && n_tokens == 1)) continue;
        PathResult t = test_moe(h, kind, n_tokens);
        t.path = std::string(moe_path_name(path)) + " " + t.path;
        t.required = path == MoePath::kGemv;
        if (!t.passed && !t.required && cuda && path == MoePath::kStreamGemv && n_tokens == 1 &&
            bf16_row_gemv_rows() > 0) {
          // One token takes the row GEMV (row_gemv.cu): off, and the streaming GEMV checked
          // again (it keeps the bf16 GEMV if it passes).
          set_bf16_row_gemv_rows(0);
          KILN_LOG(kWarn, "CUDA self-test: row GEMV off: " << t.path << ": " << t.detail);
          r.push_back(t);
          t = test_moe(h, kind, n_tokens);
          t.path = std::string(moe_path_name(path)) + " " + t.path + " (row GEMV off)";
          t.required = false;
        }
        if (!t.passed && !t.required && cuda) {
          if (path == MoePath::kStreamGemv) {
            cuda->set_bf16_gemv(false);
            KILN_LOG(kWarn, "CUDA self-test: bf16 GEMV off: " << t.path << ": " << t.detail);
          } else {
            cuda->disable_grouped_moe();
            KILN_LOG(kWarn, "CUDA self-test: disabling the grouped MoE path: " << t.path << ": " << t.detail);
          }
        }
        r.push_back(t);
      }
    }
    if (cuda) cuda->force_moe_path(MoePath::kAuto);
  }
  // Quantized weights: no fallback kernel, so a failure refuses quantized checkpoints
  // (upload_quantized says why) and leaves bf16 models served.
  for (const QuantCase& c : {QuantCase{formats::QuantKind::kMxfp4}, QuantCase{formats::QuantKind::kNvfp4},
                             QuantCase{formats::QuantKind::kInt4Group, 32, 0, DType::kBF16},
                             QuantCase{formats::QuantKind::kFp8Block, 128, 128, DType::kF32}}) {
    for (int rows : {2, 20, 40}) {
      PathResult t = test_quant_linear(h, c, rows);
      t.required = false;
      if (!t.passed && cuda && t.path.find("W8A8") != std::string::npos) {
        // W8A8 has a fallback: the W8A16 tiles, tested next in its place.
        cuda->set_w8a8(false);
        KILN_LOG(kWarn, "CUDA self-test: FP8 weights stay W8A16: " << t.path << ": " << t.detail);
        r.push_back(t);
        t = test_quant_linear(h, c, rows);
        t.required = false;
      }
      if (!t.passed && cuda) {
        cuda->disable_quantized(t.path + ": " + t.detail);
        KILN_LOG(kWarn, "CUDA self-test: quantized weights disabled: " << t.path << ": " << t.detail);
      }
      r.push_back(t);
    }
  }
  // The native SM120 quantized MoE: off by default, enabled format by format on a pass.
  for (formats::QuantKind kind : {formats::QuantKind::kMxfp4, formats::QuantKind::kNvfp4}) {
    PathResult t = test_moe_native(h, kind);
    if (t.passed && cuda) {
      cuda->enable_native_quant_moe(kind == formats::QuantKind::kMxfp4 ? 0 : 1);
    } else if (t.applicable) {
      KILN_LOG(kWarn, "CUDA self-test: " << t.path << " stays off: " << t.detail);
    }
    r.push_back(t);
  }
  r.push_back(test_sampling(h));
  gpu.synchronize();
  return r;
}

Status self_test_status(const std::vector<PathResult>& results) {
  for (const PathResult& r : results) {
    if (!r.passed && r.required) return internal_error("CUDA self-test failed: " + r.path + ": " + r.detail);
  }
  return Status::Ok();
}

}  // namespace kiln::cuda
