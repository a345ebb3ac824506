// CPU reference backend: routing (each RouterKind, hand-checked) and the whole
// MoE layer against a naive double-precision reference written here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_internal.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

// ---- helpers ----------------------------------------------------------------

// y = W x (+ bias) in double.
std::vector<double> matvec_ref(const TestWeight& tw, const std::vector<double>& x) {
  const int64_t n_in = int64_t(x.size()), n_out = int64_t(tw.logical.size()) / n_in;
  std::vector<double> y(n_out);
  for (int64_t o = 0; o < n_out; ++o) {
    y[o] = tw.bias.empty() ? 0.0 : tw.bias[o];
    for (int64_t i = 0; i < n_in; ++i) y[o] += double(tw.logical[o * n_in + i]) * x[i];
  }
  return y;
}

struct Routed {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

Routed run_route(const std::vector<float>& logits, const std::vector<float>& bias,
                 const ops::RouterParams& p) {
  Routed r{std::vector<int32_t>(p.top_k), std::vector<float>(p.top_k)};
  route(logits.data(), bias.empty() ? nullptr : bias.data(), p, r.experts.data(), r.weights.data());
  return r;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
float logit_of(double s) { return float(std::log(s / (1.0 - s))); }

// ---- routing, hand-checked --------------------------------------------------

TEST(CpuRoute, SoftmaxTopKBreaksTiesTowardTheLowerExpert) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 0.0f};
  ops::RouterParams p{.kind = ops::RouterKind::kSoftmaxTopK, .n_experts = 5, .top_k = 2};
  Routed r = run_route(logits, {}, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 3}));
  const double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0) + 1.0;
  EXPECT_NEAR(r.weights[0], std::exp(3.0) / z, 1e-7);
  EXPECT_NEAR(r.weights[1], std::exp(3.0) / z, 1e-7);

  p.norm_topk_prob = true;
  r = run_route(logits, {}, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.weights[0], 0.5, 1e-7);
  EXPECT_NEAR(r.weights[1], 0.5, 1e-7);
}

TEST(CpuRoute, SoftmaxTopKRenormalisesTheChosenProbabilities) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.5f};
  ops::RouterParams p{.kind = ops::RouterKind::kSoftmaxTopK, .n_experts = 4, .top_k = 2,
                      .norm_topk_prob = true};
  Routed r = run_route(logits, {}, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(r.weights[0], sigmoid(0.5), 1e-7);  // e^2 / (e^2 + e^1.5)
  EXPECT_NEAR(r.weights[1], sigmoid(-0.5), 1e-7);
}

TEST(CpuRoute, TopKSoftmaxTakesTheSoftmaxOfTheChosenLogits) {
  const std::vector<float> logits = {0.1f, 2.0f, -0.5f, 1.0f};
  ops::RouterParams p{.kind = ops::RouterKind::kTopKSoftmax, .n_experts = 4, .top_k = 2};
  Routed r = run_route(logits, {}, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.weights[0], sigmoid(1.0), 1e-7);  // e^2 / (e^2 + e^1)
  EXPECT_NEAR(r.weights[1], sigmoid(-1.0), 1e-7);
}

// 8 experts in 4 groups of 2. Sigmoid scores (no bias):
//   group 0: 0.95 0.05 (top-2 sum 1.00)   group 1: 0.60 0.60 (1.20)
//   group 2: 0.70 0.65 (1.35)             group 3: 0.10 0.20 (0.30)
// Expert 0 is the best single expert but group 0 is dropped (topk_group 2).
std::vector<float> grouped_logits() {
  std::vector<float> l;
  for (double s : {0.95, 0.05, 0.6, 0.6, 0.7, 0.65, 0.1, 0.2}) l.push_back(logit_of(s));
  return l;
}

TEST(CpuRoute, GroupedTopKDropsTheBestExpertWhenItsGroupLoses) {
  const std::vector<float> logits = grouped_logits();
  ops::RouterParams p{.kind = ops::RouterKind::kSigmoidGroupedTopK, .n_experts = 8, .top_k = 3,
                      .n_group = 4, .topk_group = 2, .norm_topk_prob = true,
                      .routed_scaling_factor = 2.5f};
  Routed r = run_route(logits, {}, p);
  // Groups 2 and 1 kept; top-3 of {0.6, 0.6, 0.7, 0.65}: 4, 5, then 2 (tie with 3).
  EXPECT_EQ(r.experts, (std::vector<int32_t>{4, 5, 2}));
  const double s4 = sigmoid(logits[4]), s5 = sigmoid(logits[5]), s2 = sigmoid(logits[2]);
  const double sum = s4 + s5 + s2;
  EXPECT_NEAR(r.weights[0], 2.5 * s4 / sum, 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * s5 / sum, 1e-6);
  EXPECT_NEAR(r.weights[2], 2.5 * s2 / sum, 1e-6);
}

TEST(CpuRoute, GroupedTopKChoosesByBiasedScoresButWeighsByRawSigmoid) {
  const std::vector<float> logits = grouped_logits();
  // +0.3 on expert 3: group 1 becomes 0.6 + 0.9 = 1.5, the best; expert 3 the
  // best choice (0.9), but its weight is its sigmoid 0.6, not 0.9.
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 0.3f, 0.0f, 0.0f, 0.0f, 0.0f};
  ops::RouterParams p{.kind = ops::RouterKind::kSigmoidGroupedTopK, .n_experts = 8, .top_k = 3,
                      .n_group = 4, .topk_group = 2, .norm_topk_prob = false,
                      .routed_scaling_factor = 2.5f};
  Routed r = run_route(logits, bias, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_NEAR(r.weights[0], 2.5 * 0.6, 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * 0.7, 1e-6);
  EXPECT_NEAR(r.weights[2], 2.5 * 0.65, 1e-6);

  // One group kept: only group 1 (experts 2, 3) can be chosen.
  p.topk_group = 1;
  p.top_k = 2;
  r = run_route(logits, bias, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{3, 2}));
}

TEST(CpuRoute, GroupScoreIsTheSumOfTheTopTwoNotTheMax) {
  // Groups of 3: group 0 = {0.9, 0.1, 0.1} (max 0.9, top-2 sum 1.0),
  // group 1 = {0.55, 0.55, 0.5} (max 0.55, top-2 sum 1.1): group 1 wins.
  std::vector<float> logits;
  for (double s : {0.9, 0.1, 0.1, 0.55, 0.55, 0.5}) logits.push_back(logit_of(s));
  ops::RouterParams p{.kind = ops::RouterKind::kSigmoidGroupedTopK, .n_experts = 6, .top_k = 1,
                      .n_group = 2, .topk_group = 1};
  Routed r = run_route(logits, {}, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{3}));
  EXPECT_NEAR(r.weights[0], 0.55, 1e-6);
}

// ---- whole layer against a naive reference ----------------------------------

// Independent routing in double (same rules as the contract, ties to the lower index).
std::vector<std::pair<int32_t, double>> reference_route(const std::vector<double>& logits,
                                                        const std::vector<float>& corr,
                                                        const ops::RouterParams& p) {
  const int32_t n = p.n_experts;
  auto best_first = [](const std::vector<double>& v, std::vector<int32_t> idx) {
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
    return idx;
  };
  std::vector<int32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::pair<int32_t, double>> chosen;
  if (p.kind == ops::RouterKind::kSoftmaxTopK) {
    double z = 0.0;
    for (double l : logits) z += std::exp(l);
    const std::vector<int32_t> order = best_first(logits, all);
    double sum = 0.0;
    for (int32_t i = 0; i < p.top_k; ++i) {
      chosen.push_back({order[i], std::exp(logits[order[i]]) / z});
      sum += chosen.back().second;
    }
    if (p.norm_topk_prob)
      for (auto& c : chosen) c.second /= sum;
  } else if (p.kind == ops::RouterKind::kTopKSoftmax) {
    const std::vector<int32_t> order = best_first(logits, all);
    double z = 0.0;
    for (int32_t i = 0; i < p.top_k; ++i) z += std::exp(logits[order[i]]);
    for (int32_t i = 0; i < p.top_k; ++i) chosen.push_back({order[i], std::exp(logits[order[i]]) / z});
  } else {
    const int32_t size = n / p.n_group;
    std::vector<double> s(n), c(n), group(p.n_group);
    for (int32_t e = 0; e < n; ++e) {
      s[e] = sigmoid(logits[e]);
      c[e] = s[e] + (corr.empty() ? 0.0 : corr[e]);
    }
    for (int32_t g = 0; g < p.n_group; ++g) {
      std::vector<double> members(c.begin() + g * size, c.begin() + (g + 1) * size);
      std::sort(members.rbegin(), members.rend());
      group[g] = members[0] + members[1];
    }
    std::vector<int32_t> groups(p.n_group);
    std::iota(groups.begin(), groups.end(), 0);
    groups = best_first(group, groups);
    std::vector<int32_t> candidates;
    for (int32_t e = 0; e < n; ++e)
      if (std::find(groups.begin(), groups.begin() + p.topk_group, e / size) != groups.begin() + p.topk_group)
        candidates.push_back(e);
    const std::vector<int32_t> order = best_first(c, candidates);
    double sum = 0.0;
    for (int32_t i = 0; i < p.top_k; ++i) {
      chosen.push_back({order[i], s[order[i]]});
      sum += s[order[i]];
    }
    for (auto& ch : chosen) ch.second = (p.norm_topk_prob ? ch.second / sum : ch.second) * p.routed_scaling_factor;
  }
  return chosen;
}

double reference_glu(double g, double u, const ops::GluParams& p) {
  if (p.kind == ops::GluKind::kSilu) return g * sigmoid(g) * u;
  g = std::min(g, double(p.limit));
  u = std::clamp(u, -double(p.limit), double(p.limit));
  return (u + 1.0) * g * sigmoid(p.alpha * g);
}

enum class GateUp { kSeparate, kFusedConcat, kFusedInterleaved };

struct MoeFixture {
  int64_t n_tokens, d_model = 16, d_ff = 12;
  ops::RouterParams routing;
  ops::GluParams glu;
  GateUp layout;
  TestWeight router;
  std::vector<TestWeight> gate, up, gate_up, down;
  ops::MoeExperts experts;
  std::vector<float> x, corr;
  Tensor x_t, corr_t;

  MoeFixture(std::mt19937& rng, int64_t n_tok, ops::RouterParams rp, ops::GluParams gp, GateUp gu,
             DType dt, bool transposed, bool biases)
      : n_tokens(n_tok), routing(rp), glu(gp), layout(gu) {
    const int32_t n_experts = rp.n_experts;
    router = make_weight(rng, DType::kF32, n_experts, d_model, false, biases);
    experts.d_ff = d_ff;
    experts.gate_up_interleaved = gu == GateUp::kFusedInterleaved;
    for (int32_t e = 0; e < n_experts; ++e) {
      if (gu == GateUp::kSeparate) {
        gate.push_back(make_weight(rng, dt, d_ff, d_model, transposed, biases, dt, WeightDrawOrder::kStored));
        up.push_back(make_weight(rng, dt, d_ff, d_model, transposed, biases, dt, WeightDrawOrder::kStored));
        experts.gate.push_back(gate.back().w);
        experts.up.push_back(up.back().w);
      } else {
        gate_up.push_back(
            make_weight(rng, dt, 2 * d_ff, d_model, transposed, biases, dt, WeightDrawOrder::kStored));
        experts.gate_up.push_back(gate_up.back().w);
      }
      down.push_back(make_weight(rng, dt, d_model, d_ff, transposed, biases, dt, WeightDrawOrder::kStored));
      experts.down.push_back(down.back().w);
    }
    if (rp.kind == ops::RouterKind::kSigmoidGroupedTopK) {
      corr = random_values(rng, n_experts, 0.3f);
      corr_t = make_tensor(DType::kF32, {n_experts}, corr);
    }
    x = random_values(rng, n_tokens * d_model);
    x_t = make_tensor(DType::kF32, {n_tokens, d_model}, x);
  }

  Tensor run(ops::Backend& be) {
    Tensor out = be.alloc(DType::kF32, {n_tokens, d_model});
    be.moe({.x = x_t, .router = &router.w, .correction_bias = corr_t, .experts = &experts,
            .routing = routing, .glu = glu, .out = out});
    return out;
  }

  // Per token: its experts and their weights, from a double-precision router.
  std::vector<std::pair<int32_t, double>> reference_routes(int64_t t) const {
    const std::vector<double> xt(x.begin() + t * d_model, x.begin() + (t + 1) * d_model);
    return reference_route(matvec_ref(router, xt), corr, routing);
  }

  std::vector<double> reference() const {
    std::vector<double> y(n_tokens * d_model, 0.0);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const std::vector<double> xt(x.begin() + t * d_model, x.begin() + (t + 1) * d_model);
      for (const auto& [e, w] : reference_routes(t)) {
        std::vector<double> g, u;
        if (layout == GateUp::kSeparate) {
          g = matvec_ref(gate[e], xt);
          u = matvec_ref(up[e], xt);
        } else {
          const std::vector<double> gu = matvec_ref(gate_up[e], xt);
          for (int64_t i = 0; i < d_ff; ++i) {
            g.push_back(layout == GateUp::kFusedInterleaved ? gu[2 * i] : gu[i]);
            u.push_back(layout == GateUp::kFusedInterleaved ? gu[2 * i + 1] : gu[d_ff + i]);
          }
        }
        std::vector<double> act(d_ff);
        for (int64_t i = 0; i < d_ff; ++i) act[i] = reference_glu(g[i], u[i], glu);
        const std::vector<double> d = matvec_ref(down[e], act);
        for (int64_t i = 0; i < d_model; ++i) y[t * d_model + i] += w * d[i];
      }
    }
    return y;
  }
};

const ops::RouterParams kQwen3Routing{.kind = ops::RouterKind::kSoftmaxTopK, .n_experts = 6,
                                      .top_k = 2, .norm_topk_prob = true};
const ops::RouterParams kDeepSeekRouting{.kind = ops::RouterKind::kSigmoidGroupedTopK, .n_experts = 8,
                                         .top_k = 3, .n_group = 4, .topk_group = 2,
                                         .norm_topk_prob = true, .routed_scaling_factor = 2.5f};
const ops::RouterParams kGptOssRouting{.kind = ops::RouterKind::kTopKSoftmax, .n_experts = 6, .top_k = 2};
// limit 1.5 instead of gpt-oss's 7 so the clamp bites on these small random values.
const ops::GluParams kGptOssGlu{.kind = ops::GluKind::kGptOssClamp, .alpha = 1.702f, .limit = 1.5f};

TEST(CpuMoe, SeparateGateAndUpWithSoftmaxTopK) {
  std::mt19937 rng(40);
  auto be = make_cpu_backend(3);
  MoeFixture f(rng, 9, kQwen3Routing, {}, GateUp::kSeparate, DType::kF32, false, false);
  expect_close(f.run(*be).as<float>(), f.reference(), 1e-5);
}

TEST(CpuMoe, FusedConcatenatedGateUpWithGroupedTopKAndBf16Experts) {
  std::mt19937 rng(41);
  auto be = make_cpu_backend(3);
  MoeFixture f(rng, 9, kDeepSeekRouting, {}, GateUp::kFusedConcat, DType::kBF16, false, false);
  expect_close(f.run(*be).as<float>(), f.reference(), 1e-5);
}

TEST(CpuMoe, FusedInterleavedTransposedGateUpWithBiasesAndGptOssClamp) {
  std::mt19937 rng(42);
  auto be = make_cpu_backend(3);
  MoeFixture f(rng, 9, kGptOssRouting, kGptOssGlu, GateUp::kFusedInterleaved, DType::kBF16, true, true);
  // The clamp must actually bite somewhere for this test to mean anything.
  int clamped = 0;
  for (int64_t t = 0; t < f.n_tokens; ++t) {
    const std::vector<double> xt(f.x.begin() + t * f.d_model, f.x.begin() + (t + 1) * f.d_model);
    for (const auto& [e, w] : f.reference_routes(t))
      for (double v : matvec_ref(f.gate_up[e], xt)) clamped += std::abs(v) > kGptOssGlu.limit;
  }
  EXPECT_GT(clamped, 0);
  expect_close(f.run(*be).as<float>(), f.reference(), 1e-5);
}

TEST(CpuMoe, ExpertsWithNoTokensAreSkipped) {
  std::mt19937 rng(43);
  auto be = make_cpu_backend(2);
  const ops::RouterParams top1{.kind = ops::RouterKind::kSoftmaxTopK, .n_experts = 8, .top_k = 1};
  MoeFixture f(rng, 3, top1, {}, GateUp::kSeparate, DType::kBF16, false, true);
  std::vector<int> tokens_per_expert(8, 0);
  for (int64_t t = 0; t < f.n_tokens; ++t)
    for (const auto& [e, w] : f.reference_routes(t)) ++tokens_per_expert[e];
  EXPECT_GE(std::count(tokens_per_expert.begin(), tokens_per_expert.end(), 0), 5);
  expect_close(f.run(*be).as<float>(), f.reference(), 1e-5);
}

TEST(CpuMoe, OneAndFourThreadsGiveBitIdenticalResults) {
  std::mt19937 rng(44);
  auto be1 = make_cpu_backend(1);
  auto be4 = make_cpu_backend(4);
  MoeFixture f(rng, 13, kDeepSeekRouting, kGptOssGlu, GateUp::kFusedInterleaved, DType::kBF16, true, true);
  Tensor out1 = f.run(*be1), out4 = f.run(*be4);
  EXPECT_EQ(std::memcmp(out1.data, out4.data, out1.nbytes()), 0);
}

}  // namespace
}  // namespace kiln::cpu
