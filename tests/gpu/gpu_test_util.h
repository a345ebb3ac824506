// Shared by the GPU tests: a fixture with a CUDA backend under the SM120 cap
// (KILN_SMEM_CAP, default 101376) and a CPU reference, and helpers for
// bf16-representable random inputs, poisoned outputs and host copies.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "runtime/engine.h"

namespace kiln::gpu_testing {

// One bf16 rounding at an op's output, with fp32 accumulation inside: two bf16
// half-ulps of the largest reference value.
constexpr double kBf16Tol = 2.0 / 256.0;

inline int smem_cap() {
  const char* v = std::getenv("KILN_SMEM_CAP");
  return v ? std::atoi(v) : 101376;
}

inline float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto be = cuda::make_cuda_backend({.smem_cap = smem_cap()});
    if (!be.ok()) GTEST_SKIP() << be.status().to_string();
    gpu_ = std::move(be).value();
    cpu_ = cpu::make_cpu_backend(0);
  }

  // A host fp32 tensor of bf16-representable random values in [-scale, scale].
  Tensor random(Shape s, float scale = 1.0f) {
    Tensor t = host_tensor(DType::kF32, s);
    std::uniform_real_distribution<float> d(-scale, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = bf16_round(d(rng_));
    return t;
  }
  // The same values as a bf16 host tensor (a "checkpoint" weight).
  Tensor as_bf16(const Tensor& f) {
    Tensor t = host_tensor(DType::kBF16, f.shape);
    for (int64_t i = 0; i < f.numel(); ++i) t.as<uint16_t>()[i] = f32_to_bf16(f.as<float>()[i]);
    return t;
  }
  // An activation on the GPU holding host values.
  Tensor to_gpu(const Tensor& host) {
    Tensor t = gpu_->alloc(DType::kBF16, host.shape);
    gpu_->from_host_f32(host.as<float>(), t);
    return t;
  }
  // Fill a GPU activation with NaN, so an element an op does not write is caught.
  void poison(Tensor& t) {
    std::vector<float> nan(size_t(t.numel()), std::nanf(""));
    gpu_->from_host_f32(nan.data(), t);
  }
  Tensor poisoned(Shape s) {
    Tensor t = gpu_->alloc(DType::kBF16, s);
    poison(t);
    return t;
  }
  std::vector<float> from_gpu(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    gpu_->to_host_f32(t, v.data());
    return v;
  }
  // x [rows, n_in] (host fp32) through a linear on a CPU reference (cpu_ unless given;
  // weight wc, fp32 out) and on the GPU (its upload wg, into a poisoned output):
  // {reference, GPU result}.
  std::pair<Tensor, std::vector<float>> linear_on_both(const ops::Weight& wc, const ops::Weight& wg, const Tensor& x,
                                                       ops::Backend* reference = nullptr) {
    const int64_t rows = x.dim(0), n_out = wc.n_out();
    Tensor ref = host_tensor(DType::kF32, {rows, n_out});
    (reference ? reference : cpu_.get())->linear({.x = x, .w = &wc, .out = ref});
    Tensor out = poisoned({rows, n_out});
    gpu_->linear({.x = to_gpu(x), .w = &wg, .out = out});
    return {ref, from_gpu(out)};
  }

  std::mt19937 rng_{1234};
  std::unique_ptr<ops::Backend> gpu_, cpu_;
};

// Where two greedy continuations of `prompt` part (first differing token), and the top-2
// margin of `ref`'s logits there as a fraction of their largest |logit|: a near-tie when
// small. Returns {got.size(), 0} when they do not part.
struct Divergence {
  size_t at = 0;
  double margin = 0.0;       // (top1 - top2) / max|logit|
  double top2_gap = 0.0;     // top1 - top2
};
inline Divergence first_divergence(runtime::Engine& ref, const std::vector<int32_t>& prompt,
                                   const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  Divergence d;
  while (d.at < got.size() && d.at < want.size() && got[d.at] == want[d.at]) ++d.at;
  if (got == want) return d;
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), want.begin(), want.begin() + long(d.at));
  auto l = ref.logits(seq);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return d;
  std::vector<float> last = l->back();
  double scale = 0.0;
  for (float v : last) scale = std::max(scale, double(std::abs(v)));
  std::sort(last.begin(), last.end(), std::greater<>());
  d.top2_gap = double(last[0] - last[1]);
  d.margin = d.top2_gap / scale;
  return d;
}

}  // namespace kiln::gpu_testing
