// The CPU reference of a routed-MoE layer: router logits, routing (three router
// kinds, mirroring transformers), and the per-token sum over chosen experts.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_internal.h"

namespace kiln::cpu {
namespace {

// Indices of the k largest v[i] among allowed i, largest first; ties go to the
// lower index (torch.topk promises no tie order, so kiln fixes one).
std::vector<int32_t> top_k_indices(const std::vector<float>& v, int32_t k,
                                   const std::vector<char>& allowed) {
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < int32_t(v.size()); ++i)
    if (allowed[i]) idx.push_back(i);
  KILN_CHECK_LE(int64_t(k), int64_t(idx.size())) << "route: top_k vs candidate experts";
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  idx.resize(k);
  return idx;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

// ---- routing --------------------------------------------------------------------

void route(const float* logits, const float* correction_bias, const ops::RouterParams& p,
           int32_t* experts, float* weights) {
  const int32_t n = p.n_experts, k = p.top_k;
  KILN_CHECK(k > 0 && k <= n) << "route: top_k " << k << " with n_experts " << n;
  const std::vector<char> all(size_t(n), 1);
  std::vector<int32_t> chosen;

  switch (p.kind) {
    case ops::RouterKind::kSoftmaxTopK: {
      // p = softmax(logits); top-k of p; optionally w /= sum(w).
      std::vector<float> prob(logits, logits + n);
      const float m = *std::max_element(prob.begin(), prob.end());
      float sum = 0.0f;
      for (float& x : prob) {
        x = std::exp(x - m);
        sum += x;
      }
      for (float& x : prob) x /= sum;
      chosen = top_k_indices(prob, k, all);
      for (int32_t i = 0; i < k; ++i) weights[i] = prob[chosen[i]];
      if (p.norm_topk_prob) {
        float w_sum = 0.0f;
        for (int32_t i = 0; i < k; ++i) w_sum += weights[i];
        for (int32_t i = 0; i < k; ++i) weights[i] /= w_sum;
      }
      break;
    }
    case ops::RouterKind::kTopKSoftmax: {
      // top-k of logits; w = softmax over the k chosen logits.
      const std::vector<float> v(logits, logits + n);
      chosen = top_k_indices(v, k, all);
      const float m = v[chosen[0]];  // the largest
      float sum = 0.0f;
      for (int32_t i = 0; i < k; ++i) {
        weights[i] = std::exp(v[chosen[i]] - m);
        sum += weights[i];
      }
      for (int32_t i = 0; i < k; ++i) weights[i] /= sum;
      break;
    }
    case ops::RouterKind::kSigmoidGroupedTopK: {
      // s = sigmoid(logits); c = s + correction_bias; group score = sum of the
      // group's top-2 c; keep the topk_group best groups; top-k of c in them;
      // w = s of the chosen, optionally / (sum + 1e-20), times routed_scaling_factor.
      const int32_t n_group = p.n_group, group_size = n / std::max(1, n_group);
      KILN_CHECK(n_group > 0 && n % n_group == 0)
          << "route: n_experts " << n << " not divisible by n_group " << n_group;
      KILN_CHECK_GE(group_size, 2) << "route: experts per group (top-2 group score)";
      KILN_CHECK(p.topk_group > 0 && p.topk_group <= n_group)
          << "route: topk_group " << p.topk_group << " with n_group " << n_group;
      std::vector<float> s(n), c(n);
      for (int32_t e = 0; e < n; ++e) {
        s[e] = sigmoid(logits[e]);
        c[e] = s[e] + (correction_bias ? correction_bias[e] : 0.0f);
      }
      std::vector<float> group_score(n_group);
      for (int32_t g = 0; g < n_group; ++g) {
        std::vector<float> members(c.begin() + g * group_size, c.begin() + (g + 1) * group_size);
        const std::vector<int32_t> top2 =
            top_k_indices(members, 2, std::vector<char>(size_t(group_size), 1));
        group_score[g] = members[top2[0]] + members[top2[1]];
      }
      const std::vector<int32_t> kept =
          top_k_indices(group_score, p.topk_group, std::vector<char>(size_t(n_group), 1));
      std::vector<char> allowed(size_t(n), 0);
      for (int32_t g : kept)
        for (int32_t e = g * group_size; e < (g + 1) * group_size; ++e) allowed[e] = 1;
      chosen = top_k_indices(c, k, allowed);
      for (int32_t i = 0; i < k; ++i) weights[i] = s[chosen[i]];
      if (p.norm_topk_prob) {
        float w_sum = 0.0f;
        for (int32_t i = 0; i < k; ++i) w_sum += weights[i];
        for (int32_t i = 0; i < k; ++i) weights[i] /= (w_sum + 1e-20f);
      }
      for (int32_t i = 0; i < k; ++i) weights[i] *= p.routed_scaling_factor;
      break;
    }
  }
  for (int32_t i = 0; i < k; ++i) experts[i] = chosen[i];
}

// ---- moe ------------------------------------------------------------------------

// y[t] = sum_{e in topk(router(x[t])), ascending e} w[t,e] * down_e(glu(gate_e x[t], up_e x[t]))
// x: [n_tokens, d_model] fp32; threaded over tokens.
void CpuBackend::moe(const ops::MoeArgs& a) {
  check_activation(a.x, "moe x", 2);
  check_activation(a.out, "moe out", 2);
  KILN_CHECK(a.router != nullptr && a.experts != nullptr) << "moe: router or experts is null";
  const int64_t n_tokens = a.x.dim(0), d_model = a.x.dim(1);
  const ops::MoeExperts& ex = *a.experts;
  const int32_t n_experts = a.routing.n_experts, top_k = a.routing.top_k;
  const int64_t d_ff = ex.d_ff;
  KILN_CHECK_EQ(a.out.shape, a.x.shape) << "moe: out.shape vs x.shape";
  check_weight(*a.router, "moe router");
  KILN_CHECK_EQ(a.router->n_in(), d_model) << "moe: router.n_in() vs x.dim(1) (d_model)";
  KILN_CHECK_EQ(a.router->n_out(), int64_t(n_experts)) << "moe: router.n_out() vs routing.n_experts";
  KILN_CHECK(top_k > 0 && top_k <= n_experts) << "moe: routing.top_k " << top_k;
  KILN_CHECK_GT(d_ff, 0) << "moe: experts.d_ff";

  const bool fused = !ex.gate_up.empty();
  const int32_t n_local = ex.n_local();
  KILN_CHECK(ex.first_expert >= 0 && n_local > 0 && ex.first_expert + n_local <= n_experts)
      << "moe: experts [" << ex.first_expert << ", " << ex.first_expert + n_local << ") of " << n_experts;
  if (fused) {
    KILN_CHECK_EQ(ex.gate_up.size(), size_t(n_local)) << "moe: experts.gate_up.size() vs experts.down.size()";
    KILN_CHECK(ex.gate.empty() && ex.up.empty()) << "moe: both fused gate_up and gate/up given";
  } else {
    KILN_CHECK_EQ(ex.gate.size(), size_t(n_local)) << "moe: experts.gate.size() vs experts.down.size()";
    KILN_CHECK_EQ(ex.up.size(), size_t(n_local)) << "moe: experts.up.size() vs experts.down.size()";
  }
  for (int32_t e = 0; e < n_local; ++e) {
    const auto check_in_out = [&](const ops::Weight& w, const char* what, int64_t n_out,
                                  int64_t n_in) {
      check_weight(w, what);
      KILN_CHECK_EQ(w.n_out(), n_out) << "moe: " << what << ".n_out() of local expert " << e;
      KILN_CHECK_EQ(w.n_in(), n_in) << "moe: " << what << ".n_in() of local expert " << e;
    };
    if (fused) {
      check_in_out(ex.gate_up[e], "gate_up", 2 * d_ff, d_model);
    } else {
      check_in_out(ex.gate[e], "gate", d_ff, d_model);
      check_in_out(ex.up[e], "up", d_ff, d_model);
    }
    check_in_out(ex.down[e], "down", d_model, d_ff);
  }
  std::vector<float> correction;  // [n_experts] fp32, empty when undefined
  if (a.correction_bias.defined()) {
    check_float_dtype(a.correction_bias, "moe correction_bias");
    KILN_CHECK_EQ(a.correction_bias.numel(), int64_t(n_experts))
        << "moe: correction_bias.numel() vs n_experts";
    for (int32_t e = 0; e < n_experts; ++e) correction.push_back(load_f32(a.correction_bias, e));
  }

  const float* x_all = a.x.as<float>();
  float* out_all = a.out.as<float>();
  pool_.parallel_for(n_tokens, [&](int64_t t0, int64_t t1) {
    std::vector<float> logits(n_experts), w(top_k);
    std::vector<int32_t> chosen(top_k);
    std::vector<float> gate(d_ff), up(d_ff), gate_up(2 * d_ff);
    std::vector<float> act(d_ff), y(d_model), acc(d_model);
    for (int64_t t = t0; t < t1; ++t) {
      const float* x = x_all + t * d_model;
      matvec(*a.router, x, logits.data(), 0, n_experts);
      route(logits.data(), correction.empty() ? nullptr : correction.data(), a.routing,
            chosen.data(), w.data());
      // Sum in ascending expert index, whatever order routing chose them in.
      std::vector<std::pair<int32_t, float>> picks;
      for (int32_t i = 0; i < top_k; ++i) picks.emplace_back(chosen[i], w[i]);
      std::sort(picks.begin(), picks.end());

      std::fill(acc.begin(), acc.end(), 0.0f);
      for (const auto& [global_e, weight] : picks) {
        const int32_t e = ex.local(global_e);
        if (e < 0) continue;  // held by another rank
        if (fused) {
          matvec(ex.gate_up[e], x, gate_up.data(), 0, 2 * d_ff, weights_);
          for (int64_t i = 0; i < d_ff; ++i) {
            // interleaved (gpt-oss): gate = even columns, up = odd ones;
            // else gate = first d_ff columns, up = last d_ff.
            gate[i] = ex.gate_up_interleaved ? gate_up[2 * i] : gate_up[i];
            up[i] =
                ex.gate_up_interleaved ? gate_up[2 * i + 1] : gate_up[d_ff + i];
          }
        } else {
          matvec(ex.gate[e], x, gate.data(), 0, d_ff, weights_);
          matvec(ex.up[e], x, up.data(), 0, d_ff, weights_);
        }
        for (int64_t i = 0; i < d_ff; ++i) act[i] = glu_one(gate[i], up[i], a.glu);
        // A bf16 pipeline feeds the activation to the down projection as bf16.
        if (bf16_activations_)
          for (float& v : act) v = bf16_to_f32(f32_to_bf16(v));
        matvec(ex.down[e], act.data(), y.data(), 0, d_model, weights_);
        for (int64_t d = 0; d < d_model; ++d) acc[d] += weight * y[d];
      }
      std::copy(acc.begin(), acc.end(), out_all + t * d_model);
    }
  });
  round_output(a.out);
}

}  // namespace kiln::cpu
