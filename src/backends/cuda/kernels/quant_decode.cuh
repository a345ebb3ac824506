// Device decoding of the packed quantized layout (backends/cuda/quant_pack.h) shared by
// the quantized GEMM (quant_gemm.cu) and GEMV (quant_gemv.cu) kernels.
#pragma once

#include <cstdint>

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

// A scale of QuantFormat::scale_kind (0 e8m0, 1 e4m3, 2 bf16, 3 f16, 4 f32) at p.
__device__ __forceinline__ float scale_value(int kind, const unsigned char* p) {
  switch (kind) {
    case 0: {  // 2^(v - 127); 0 is 2^-127 (a subnormal), 255 NaN
      const uint32_t v = p[0];
      return v == 0u ? __uint_as_float(0x00400000u) : v == 255u ? __uint_as_float(0x7fc00000u) : __uint_as_float(v << 23);
    }
    case 1: return e4m3_value(p[0]);
    case 2: return __uint_as_float(uint32_t(*reinterpret_cast<const uint16_t*>(p)) << 16);
    case 3: return __half2float(*reinterpret_cast<const __half*>(p));
    default: return *reinterpret_cast<const float*>(p);
  }
}

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
