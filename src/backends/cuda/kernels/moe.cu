// MoE: router logits, the three routing rules (mirroring the CPU reference
// exactly, ties to the lower expert id), the GEMV expert path (one block per
// (token, chosen expert) computes the whole gated MLP as matrix-vector products:
// the reference path, for every layout) and the weighted combine. The fast path,
// grouped mma.sync GEMMs over expert-sorted tokens, is moe_gemm.cu.
#include <cfloat>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK = 16;
constexpr int kExpertThreads = 256;

__global__ void router_logits_kernel(const bf16* x, const bf16* w, const float* bias, int64_t n_tokens,
                                     int64_t n_experts, int64_t d, float* logits) {
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= n_tokens * n_experts) return;
  const int64_t t = warp / n_experts, e = warp % n_experts;
  float acc = 0.0f;
  for (int64_t i = lane; i < d; i += 32) acc += to_f(x[t * d + i]) * to_f(w[e * d + i]);
  acc = warp_sum(acc);
  if (lane == 0) logits[warp] = acc + (bias ? bias[e] : 0.0f);
}

// Index of the largest v[i] with allowed[i] (ties: lowest i), or -1.
__device__ int argmax_allowed(const float* v, const bool* allowed, int n) {
  int best = -1;
  for (int i = 0; i < n; ++i)
    if (allowed[i] && (best < 0 || v[i] > v[best])) best = i;
  return best;
}

// One thread per token.
__global__ void route_kernel(const float* logits, const float* correction, MoeRouting r, int64_t n_tokens,
                             int32_t* experts, float* weights) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_tokens) return;
  const float* lg = logits + t * r.n_experts;
  float score[kMaxExperts], choice[kMaxExperts];
  bool allowed[kMaxExperts];
  int chosen[kMaxTopK];
  float w[kMaxTopK];
  const int E = r.n_experts, K = r.top_k;
  if (r.kind == 0) {  // softmax over all, top-k of the probabilities
    float mx = -FLT_MAX, sum = 0.0f;
    for (int e = 0; e < E; ++e) mx = fmaxf(mx, lg[e]);
    for (int e = 0; e < E; ++e) sum += (score[e] = __expf(lg[e] - mx));
    for (int e = 0; e < E; ++e) score[e] /= sum, allowed[e] = true;
    for (int k = 0; k < K; ++k) {
      chosen[k] = argmax_allowed(score, allowed, E);
      allowed[chosen[k]] = false;
      w[k] = score[chosen[k]];
    }
    if (r.norm_topk_prob) {
      float s = 0.0f;
      for (int k = 0; k < K; ++k) s += w[k];
      for (int k = 0; k < K; ++k) w[k] /= s;
    }
  } else if (r.kind == 1) {  // top-k of the logits, softmax over the chosen
    for (int e = 0; e < E; ++e) allowed[e] = true;
    for (int k = 0; k < K; ++k) {
      chosen[k] = argmax_allowed(lg, allowed, E);
      allowed[chosen[k]] = false;
    }
    float mx = lg[chosen[0]], s = 0.0f;
    for (int k = 0; k < K; ++k) s += (w[k] = __expf(lg[chosen[k]] - mx));
    for (int k = 0; k < K; ++k) w[k] /= s;
  } else {  // sigmoid, correction bias, grouped top-k (DeepSeek-V3)
    for (int e = 0; e < E; ++e) {
      score[e] = 1.0f / (1.0f + __expf(-lg[e]));
      choice[e] = score[e] + (correction ? correction[e] : 0.0f);
    }
    const int per_group = E / r.n_group;
    float group_score[kMaxExperts];
    bool group_ok[kMaxExperts];
    for (int g = 0; g < r.n_group; ++g) {  // sum of the group's top-2 choice scores
      float a = -FLT_MAX, b = -FLT_MAX;
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
        if (choice[e] > a) b = a, a = choice[e];
        else if (choice[e] > b) b = choice[e];
      }
      group_score[g] = a + b;
      group_ok[g] = true;
    }
    for (int e = 0; e < E; ++e) allowed[e] = false;
    for (int k = 0; k < r.topk_group; ++k) {
      const int g = argmax_allowed(group_score, group_ok, r.n_group);
      group_ok[g] = false;
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) allowed[e] = true;
    }
    for (int k = 0; k < K; ++k) {
      chosen[k] = argmax_allowed(choice, allowed, E);
      allowed[chosen[k]] = false;
      w[k] = score[chosen[k]];
    }
    if (r.norm_topk_prob) {
      float s = 0.0f;
      for (int k = 0; k < K; ++k) s += w[k];
      for (int k = 0; k < K; ++k) w[k] /= s + 1e-20f;
    }
    for (int k = 0; k < K; ++k) w[k] *= r.routed_scaling_factor;
  }
  for (int k = 0; k < K; ++k) {
    experts[t * K + k] = chosen[k];
    weights[t * K + k] = w[k];
  }
}

// Row r of a logical [n_out, n_in] matrix dotted with v (fp32, in shared memory),
// by one warp; `transposed`: stored [n_in, n_out].
__device__ float row_dot(const bf16* w, bool transposed, int64_t n_out, int64_t n_in, int64_t r, const float* v) {
  float acc = 0.0f;
  const int lane = threadIdx.x % 32;
  if (!transposed) {
    const bf16* row = w + r * n_in;
    for (int64_t i = lane; i < n_in; i += 32) acc += to_f(row[i]) * v[i];
  } else {
    for (int64_t i = lane; i < n_in; i += 32) acc += to_f(w[i * n_out + r]) * v[i];
  }
  return warp_sum(acc);
}

// One block per (token, slot): act = glu(gate x, up x) in shared memory, then
// y = down act (+ bias), unweighted, into scratch[t, slot, :].
__global__ void expert_mlp_kernel(const bf16* x, const ExpertWeights* table, const int32_t* experts, MoeShape s,
                                  int top_k, float* scratch) {
  extern __shared__ float smem[];
  float* xs = smem;             // [d_model]
  float* act = smem + s.d_model;  // [d_ff]
  const int64_t ts = blockIdx.x, t = ts / top_k;
  const ExpertWeights ew = table[experts[ts]];
  for (int64_t i = threadIdx.x; i < s.d_model; i += blockDim.x) xs[i] = to_f(x[t * s.d_model + i]);
  __syncthreads();
  const int warp = threadIdx.x / 32, n_warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int64_t r = warp; r < s.d_ff; r += n_warps) {
    float g, u;
    int64_t gr = r, ur = r;
    if (ew.gate_up) {
      gr = s.interleaved ? 2 * r : r;
      ur = s.interleaved ? 2 * r + 1 : s.d_ff + r;
      g = row_dot(ew.gate_up, s.transposed, 2 * s.d_ff, s.d_model, gr, xs);
      u = row_dot(ew.gate_up, s.transposed, 2 * s.d_ff, s.d_model, ur, xs);
    } else {
      g = row_dot(ew.gate, s.transposed, s.d_ff, s.d_model, r, xs);
      u = row_dot(ew.up, s.transposed, s.d_ff, s.d_model, r, xs);
    }
    if (ew.gate_up_bias) g += ew.gate_up_bias[gr], u += ew.gate_up_bias[ur];
    // act goes to the down projection as bf16, like the grouped path's.
    if (lane == 0) act[r] = to_f(__float2bfloat16(glu_value(g, u, s.glu_kind, s.alpha, s.limit)));
  }
  __syncthreads();
  for (int64_t o = warp; o < s.d_model; o += n_warps) {
    float y = row_dot(ew.down, s.transposed, s.d_model, s.d_ff, o, act);
    if (lane == 0) scratch[ts * s.d_model + o] = y + (ew.down_bias ? ew.down_bias[o] : 0.0f);
  }
}

// out[t] = sum over slots in ascending expert id of w * y (fixed order).
__global__ void combine_kernel(const float* scratch, const int32_t* experts, const float* weights, int top_k,
                               int64_t d_model, bf16* out) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < d_model; i += blockDim.x) {
    float acc = 0.0f;
    int last = -1;
    for (int n = 0; n < top_k; ++n) {  // visit slots by increasing expert id
      int next = -1;
      for (int k = 0; k < top_k; ++k) {
        const int e = experts[t * top_k + k];
        if (e > last && (next < 0 || e < experts[t * top_k + next])) next = k;
      }
      last = experts[t * top_k + next];
      acc += weights[t * top_k + next] * scratch[(t * top_k + next) * d_model + i];
    }
    out[t * d_model + i] = __float2bfloat16(acc);
  }
}

}  // namespace

void launch_router_logits(const bf16* x, const bf16* router, const float* bias, int64_t n_tokens, int64_t n_experts,
                          int64_t d_model, float* logits, cudaStream_t stream) {
  const int64_t warps = n_tokens * n_experts;
  if (warps == 0) return;
  router_logits_kernel<<<ceil_div(warps * 32, 256), 256, 0, stream>>>(x, router, bias, n_tokens, n_experts, d_model,
                                                                      logits);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_route(const float* logits, const float* correction_bias, const MoeRouting& r, int64_t n_tokens,
                  int32_t* experts, float* weights, cudaStream_t stream) {
  KILN_CHECK(r.n_experts <= kMaxExperts && r.top_k <= kMaxTopK)
      << "route: " << r.n_experts << " experts, top " << r.top_k << " (supported up to " << kMaxExperts << ", "
      << kMaxTopK << ")";
  if (n_tokens == 0) return;
  route_kernel<<<ceil_div(n_tokens, 64), 64, 0, stream>>>(logits, correction_bias, r, n_tokens, experts, weights);
  KILN_CUDA_LAUNCH_CHECK();
}

const char* moe_path_name(MoePath path) {
  switch (path) {
    case MoePath::kAuto: return "auto";
    case MoePath::kGemv: return "gemv";
    case MoePath::kGrouped: return "grouped mma.sync";
  }
  return "?";
}

int moe_gemv_smem_bytes(const MoeShape& s) { return int(size_t(s.d_model + s.d_ff) * sizeof(float)); }

void launch_moe_gemv(const bf16* x, const ExpertWeights* expert_table, const int32_t* experts, const MoeShape& s,
                     int64_t n_tokens, int top_k, float* y, int smem_cap, cudaStream_t stream) {
  if (n_tokens == 0) return;
  const int smem = moe_gemv_smem_bytes(s);
  KILN_CHECK(smem <= smem_cap) << "moe gemv: d_model " << s.d_model << " + d_ff " << s.d_ff << " floats need "
                               << smem << " bytes of shared memory, cap " << smem_cap;
  if (smem > 48 * 1024) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(expert_mlp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  expert_mlp_kernel<<<unsigned(n_tokens * top_k), kExpertThreads, smem, stream>>>(x, expert_table, experts, s, top_k,
                                                                                  y);
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_moe_combine(const float* y, const int32_t* experts, const float* weights, int64_t n_tokens, int top_k,
                        int64_t d_model, bf16* out, cudaStream_t stream) {
  if (n_tokens == 0) return;
  combine_kernel<<<unsigned(n_tokens), 256, 0, stream>>>(y, experts, weights, top_k, d_model, out);
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace kiln::cuda
