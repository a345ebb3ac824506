// Small device helpers shared by the kernels.
#pragma once

#include <cuda_bf16.h>

namespace kiln::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

// The gated activations (ops::GluKind): kind 0 silu(g) * u; kind 1 the gpt-oss
// clamped form (g clamped above, u both sides, (u + 1) * g * sigmoid(alpha g)).
__device__ __forceinline__ float glu_value(float g, float u, int kind, float alpha, float limit) {
  if (kind == 0) return g / (1.0f + __expf(-g)) * u;
  g = fminf(g, limit);
  u = fminf(fmaxf(u, -limit), limit);
  return (u + 1.0f) * (g / (1.0f + __expf(-alpha * g)));
}

// Output i of an up GEMM from its gate and up sums: their biases (bias [2 d_ff]: gate i
// and up i at 2i and 2i + 1 when the fused rows interleave, else at i and d_ff + i), then
// the GLU.
__device__ __forceinline__ float glu_output(float g, float u, const float* bias, bool interleaved, int i, int64_t d_ff,
                                            int kind, float alpha, float limit) {
  if (bias != nullptr) g += bias[interleaved ? 2 * i : i], u += bias[interleaved ? 2 * i + 1 : d_ff + i];
  return glu_value(g, u, kind, alpha, limit);
}

inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

}  // namespace kiln::cuda
