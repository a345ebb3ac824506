// Device decoding of the packed quantized layout (backends/cuda/quant_pack.h) shared by
// the quantized GEMM (quant_gemm.cu) and GEMV (quant_gemv.cu) kernels.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda {

// One e2m1 code (4 bits) as a float: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives.
__device__ __forceinline__ float e2m1_value(uint32_t c) {
  const uint32_t mag = c & 7u;
  const float v = mag >= 2u ? __uint_as_float((((mag >> 1) + 126u) << 23) | ((mag & 1u) << 22)) : 0.5f * float(mag);
  return (c & 8u) ? -v : v;
}

// One e4m3 (OCP fn) byte as a float.
__device__ __forceinline__ float e4m3_value(uint32_t c) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E4M3)));
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ __nv_bfloat162 as_bf16x2(uint32_t v) { return *reinterpret_cast<__nv_bfloat162*>(&v); }

// Pair j (0..3) of an 8-code word of 4-bit codes c0..c7 (c0 in the low nibble), in
// order: the bf16x2 (c_2j, c_2j+1), byte j of the word. e2m1 (kValue 0): each nibble
// moved to the top of its half (sign at bit 15 / 31), its 3-bit magnitude shifted under
// the bf16 exponent: the value times 2^-126 (a bias of 127 rather than 1). INT4 (1):
// (code | 0x4300) as bf16 is 128 + code, minus 136: exactly code - 8.
template <int kValue>
__device__ __forceinline__ uint32_t decode_pair_natural(uint32_t w, int j) {
  if constexpr (kValue == 0) {
    const uint32_t u = __byte_perm(w << 4, w, (j << 4) | ((4 + j) << 12));  // c_2j at bits 12-15, c_2j+1 at 28-31
    return (u & 0x80008000u) | ((u & 0x70007000u) >> 6);
  } else {
    const uint32_t u = (__byte_perm(w, w >> 4, j | ((4 + j) << 8)) & 0x000f000fu) | 0x43004300u;
    return bf16x2_bits(__hsub2(as_bf16x2(u), __floats2bfloat162_rn(136.0f, 136.0f)));
  }
}

// The bits of a scale of QuantFormat::scale_kind (0 e8m0, 1 e4m3, 2 bf16, 3 f16, 4 f32)
// at p, and their value: separate so that a kernel can issue the load early and
// decode when it arrives.
__device__ __forceinline__ uint32_t scale_bits(int kind, const unsigned char* p) {
  switch (kind) {
    case 0:
    case 1: return p[0];
    case 2:
    case 3: return *reinterpret_cast<const uint16_t*>(p);
    default: return *reinterpret_cast<const uint32_t*>(p);
  }
}
__device__ __forceinline__ float scale_of(int kind, uint32_t v) {
  switch (kind) {
    case 0: return v == 0u ? __uint_as_float(0x00400000u) : v == 255u ? __uint_as_float(0x7fc00000u) : __uint_as_float(v << 23);  // 2^(v - 127)
    case 1: return e4m3_value(v);
    case 2: return __uint_as_float(v << 16);
    case 3: return __half2float(__ushort_as_half(uint16_t(v)));
    default: return __uint_as_float(v);
  }
}
__device__ __forceinline__ float scale_value(int kind, const unsigned char* p) { return scale_of(kind, scale_bits(kind, p)); }

// Where column f of a quantized GEMM reads its weight row: a dense weight's row f, an
// expert's down row f, or (up) fused column f = 2i + h of a gate/up pair: gate (h 0) or
// up (h 1) row i, from separate matrices or one fused [gate; up] / interleaved matrix.
// By value: taking the address of a kernel parameter (the dense weight) would copy the
// whole parameter block to local memory.
struct QuantRowRef {
  QuantMat m;
  int row;
};
__device__ __forceinline__ QuantRowRef quant_row(const QuantMat& dense, const QuantExpert* ew, bool up,
                                                 bool interleaved, int d_ff, int f) {
  if (ew == nullptr) return {dense, f};
  if (!up) return {ew->down, f};
  const int i = f >> 1, h = f & 1;
  if (ew->gate_up.codes == nullptr) return {h ? ew->up : ew->gate, i};
  return {ew->gate_up, interleaved ? f : h * d_ff + i};
}

}  // namespace kiln::cuda
