// The FP8 KV cache on the device (ops/kv_quant.h is the contract): quantizing a row at
// store time, and turning e4m3 codes back into numbers in the attention kernels.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace kiln::cuda {

// The cache element types the attention kernels are templated on.
using e4m3 = __nv_fp8_e4m3;
template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, e4m3>;

constexpr float kE4m3Max = 448.0f;  // ops::kE4m3Max

// ops::kv_row_scale and ops::kv_quantize, bit for bit: IEEE division rounded to nearest
// (__fdiv_rn: never an approximate reciprocal), then e4m3 rounded to nearest even with
// saturation (cvt.rn.satfinite on sm_89+, the same rounding emulated below).
__device__ __forceinline__ float kv_row_scale(float absmax) { return __fdiv_rn(absmax, kE4m3Max); }
__device__ __forceinline__ uint8_t kv_quantize(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  return uint8_t(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
}

// One e4m3 code as a float (exact).
__device__ __forceinline__ float e4m3_to_float(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code), __NV_E4M3)));
}

// Two e4m3 codes, in the low bytes of the two 16-bit halves of `spread` (a byte
// permutation of what was loaded), as a bf16x2, exactly. The code's 7 magnitude bits
// shifted left by 4 land in bf16's exponent and mantissa fields with e4m3's bias (7)
// instead of bf16's (127): that bf16 is the value times 2^-120, subnormal codes
// included (as bf16 subnormals, which bf16 arithmetic keeps), and one bf16x2 multiply
// by 2^120 restores it (FlashInfer's fast_dequant_f8f16x4 does the same).
__device__ __forceinline__ uint32_t e4m3_spread_to_bf16x2(uint32_t spread) {
  const uint32_t bits = ((spread & 0x00800080u) << 8) | ((spread & 0x007f007fu) << 4);
  const __nv_bfloat162 two_pow_120 = __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80));
  const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits), two_pow_120);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// From four codes loaded as one 32-bit word (byte i = code i): codes (0, 1) or (2, 3)
// as bf16x2, and codes (0, 2) or (1, 3) (the pairs of an ldmatrix.trans of byte pairs).
__device__ __forceinline__ uint32_t e4m3x4_lo(uint32_t w) { return e4m3_spread_to_bf16x2(__byte_perm(w, 0, 0x4140)); }
__device__ __forceinline__ uint32_t e4m3x4_hi(uint32_t w) { return e4m3_spread_to_bf16x2(__byte_perm(w, 0, 0x4342)); }
__device__ __forceinline__ uint32_t e4m3x4_even(uint32_t w) { return e4m3_spread_to_bf16x2(__byte_perm(w, 0, 0x4240)); }
__device__ __forceinline__ uint32_t e4m3x4_odd(uint32_t w) { return e4m3_spread_to_bf16x2(__byte_perm(w, 0, 0x4341)); }

}  // namespace kiln::cuda
