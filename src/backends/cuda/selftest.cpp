#include "backends/cuda/selftest.h"

#include <cmath>
#include <functional>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend_impl.h"
#include "core/log.h"

namespace kiln::cuda {
namespace {

// Both backends see identical bf16-representable inputs and store activations
// in bf16; outputs then differ by fp32 summation order, which can move a bf16
// rounding by one ulp: two half-ulps of the largest value bound it.
constexpr double kTolerance = 2.0 / 256.0;

class Harness {
 public:
  explicit Harness(ops::Backend& gpu) : gpu_(gpu), cpu_(cpu::make_cpu_backend({.bf16_activations = true})) {}

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
  std::unique_ptr<ops::Backend> cpu_;
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

PathResult test_linear(Harness& h) {
  Tensor x = h.random({5, 256}), w = h.random({384, 256}, 0.05f), b = h.random({384}, 0.1f);
  ops::Weight wc{.data = h.bf16(w), .bias = h.bf16(b)};
  ops::Weight wg{.data = h.gpu_backend().upload(wc.data), .bias = h.gpu_backend().upload(wc.bias)};
  Tensor ref = h.cpu_out({5, 384}), out = h.poisoned({5, 384});
  h.cpu().linear({.x = x, .w = &wc, .out = ref});
  h.gpu_backend().linear({.x = h.gpu(x), .w = &wg, .out = out});
  return h.compare("linear (cuBLASLt bf16, bias)", out, ref);
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

PathResult test_glu(Harness& h, ops::GluKind kind) {
  Tensor g = h.random({3, 300}, 8.0f), u = h.random({3, 300}, 8.0f);
  Tensor ref = h.cpu_out({3, 300}), out = h.poisoned({3, 300});
  h.cpu().glu({.gate = g, .up = u, .out = ref, .params = {.kind = kind}});
  h.gpu_backend().glu({.gate = h.gpu(g), .up = h.gpu(u), .out = out, .params = {.kind = kind}});
  return h.compare(kind == ops::GluKind::kSilu ? "glu (silu)" : "glu (gpt-oss clamp)", out, ref);
}

PathResult test_attention(Harness& h, int n_heads, int n_kv, int d, int window, bool sinks) {
  const ops::BatchMeta b1 = scattered_batch({{20, 20}, {40, 40}}, 16, 3), b2 = scattered_batch({{20, 20}, {1, 40}}, 16, 3);
  Tensor k = h.random({b1.n_tokens(), n_kv, d}), v = h.random({b1.n_tokens(), n_kv, d});
  Tensor kc = h.cpu_out({6, 16, n_kv, d}), vc = h.cpu_out({6, 16, n_kv, d});
  Tensor kg = h.gpu_backend().alloc(DType::kBF16, kc.shape), vg = h.gpu_backend().alloc(DType::kBF16, vc.shape);
  h.cpu().kv_store({.k = k, .v = v, .k_cache = kc, .v_cache = vc, .batch = &b1});
  h.gpu_backend().begin_step(b1);
  h.gpu_backend().kv_store({.k = h.gpu(k), .v = h.gpu(v), .k_cache = kg, .v_cache = vg, .batch = &b1});
  Tensor q = h.random({b2.n_tokens(), n_heads, d});
  Tensor s = sinks ? h.random({n_heads}, 2.0f) : Tensor{};
  const float scale = 1.0f / std::sqrt(float(d));
  Tensor ref = h.cpu_out({b2.n_tokens(), n_heads, d}), out = h.poisoned(ref.shape);
  h.cpu().attention({.q = q, .k_cache = kc, .v_cache = vc, .out = ref, .sinks = s, .batch = &b2, .scale = scale,
                     .sliding_window = window});
  h.gpu_backend().begin_step(b2);
  h.gpu_backend().attention({.q = h.gpu(q), .k_cache = kg, .v_cache = vg, .out = out,
                             .sinks = sinks ? h.gpu_backend().upload(s) : Tensor{}, .batch = &b2, .scale = scale,
                             .sliding_window = window});
  return h.compare("attention (d " + std::to_string(d) + ", GQA " + std::to_string(n_heads / n_kv) +
                       (window ? ", window" : "") + (sinks ? ", sinks" : "") + ")",
                   out, ref);
}

PathResult test_mla(Harness& h) {
  const int n_heads = 2, d_nope = 128, d_rope = 64, d_v = 128, d_latent = 512;
  const ops::BatchMeta b1 = scattered_batch({{18, 18}}, 16, 2), b2 = scattered_batch({{1, 18}}, 16, 2);
  Tensor lat = h.random({18, d_latent}), rope = h.random({18, d_rope});
  Tensor cache = h.cpu_out({2, 16, d_latent + d_rope});
  Tensor cg = h.gpu_backend().alloc(DType::kBF16, cache.shape);
  h.cpu().mla_store({.kv_latent = lat, .k_rope = rope, .latent_cache = cache, .batch = &b1});
  h.gpu_backend().begin_step(b1);
  h.gpu_backend().mla_store({.kv_latent = h.gpu(lat), .k_rope = h.gpu(rope), .latent_cache = cg, .batch = &b1});
  Tensor kv_b = h.random({n_heads * (d_nope + d_v), d_latent}, 0.05f);
  ops::Weight wc{.data = h.bf16(kv_b)}, wg{.data = h.gpu_backend().upload(wc.data)};
  Tensor qn = h.random({1, n_heads, d_nope}), qr = h.random({1, n_heads, d_rope});
  Tensor ref = h.cpu_out({1, n_heads, d_v}), out = h.poisoned(ref.shape);
  h.cpu().mla_attention({.q_nope = qn, .q_rope = qr, .latent_cache = cache, .kv_b = &wc, .out = ref, .batch = &b2,
                         .scale = 0.07f});
  h.gpu_backend().begin_step(b2);
  h.gpu_backend().mla_attention({.q_nope = h.gpu(qn), .q_rope = h.gpu(qr), .latent_cache = cg, .kv_b = &wg,
                                 .out = out, .batch = &b2, .scale = 0.07f});
  return h.compare("mla (absorbed, latent 512 + rope 64)", out, ref);
}

PathResult test_moe(Harness& h, ops::RouterKind kind) {
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
  Tensor x = h.random({5, d});
  Tensor ref = h.cpu_out({5, d}), out = h.poisoned({5, d});
  h.cpu().moe({.x = x, .router = &rc, .correction_bias = corr, .experts = &ec, .routing = rp, .glu = glu, .out = ref});
  h.gpu_backend().moe({.x = h.gpu(x), .router = &rg,
                       .correction_bias = corr.defined() ? h.gpu_backend().upload(corr) : Tensor{}, .experts = &eg,
                       .routing = rp, .glu = glu, .out = out});
  static const char* names[] = {"moe (softmax top-k)", "moe (top-k softmax, gpt-oss experts)",
                                "moe (sigmoid grouped top-k)"};
  return h.compare(names[int(kind)], out, ref);
}

}  // namespace

std::vector<PathResult> run_self_test(ops::Backend& gpu) {
  Harness h(gpu);
  std::vector<PathResult> r;
  r.push_back(test_linear(h));
  r.push_back(test_rms_norm(h));
  r.push_back(test_rope(h, ops::RopeStyle::kHalf));
  r.push_back(test_rope(h, ops::RopeStyle::kInterleaved));
  r.push_back(test_glu(h, ops::GluKind::kSilu));
  r.push_back(test_glu(h, ops::GluKind::kGptOssClamp));
  // Attention: every path on its own (the fast paths fall back to the warp kernel).
  auto* cuda = dynamic_cast<CudaBackend*>(&gpu);
  const std::pair<AttentionPath, const char*> paths[] = {
      {AttentionPath::kWarp, "warp"}, {AttentionPath::kFa2, "FA2 mma.sync"}, {AttentionPath::kSplitKv, "split-KV"}};
  for (const auto& [path, name] : paths) {
    if (cuda) cuda->force_attention_path(path);
    for (PathResult t : {test_attention(h, 8, 2, 64, 16, true), test_attention(h, 4, 1, 128, 0, false)}) {
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
  r.push_back(test_mla(h));
  r.push_back(test_moe(h, ops::RouterKind::kSoftmaxTopK));
  r.push_back(test_moe(h, ops::RouterKind::kTopKSoftmax));
  r.push_back(test_moe(h, ops::RouterKind::kSigmoidGroupedTopK));
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
