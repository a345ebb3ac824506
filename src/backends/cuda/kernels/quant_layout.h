// Where a packed quantized weight's bytes lie (backends/cuda/quant_pack.h): the one
// addressing rule every reader of packed codes and scales shares, host and device.
// Plain C++ (no CUDA headers needed), so the CPU tests include it as the kernels do.
//
// Rows are stored in units of kQuantUnitRows (the GEMV's mma m; the row count is padded
// to whole units), and a unit 128-input block by block: block b of the unit's 16 rows
// is one contiguous run of 16 x blk bytes, row by row. blk is a row's bytes per block:
// 64 of 4-bit codes, 128 of FP8 codes, tile_scale_bytes of scales. A unit occupies the
// same bytes as its 16 rows would row-major (16 x row_bytes from row 16 u on): the repack
// is a permutation inside each unit, and the only growth is the padding to whole units.
// One warp of the GEMV reads its unit's block as 1 KB in one piece instead of 16 pieces
// of 64 bytes a row length apart (+14% streaming at eight tokens in bench/gemv_dissect.cu).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KILN_QUANT_HD __host__ __device__
#else
#define KILN_QUANT_HD
#endif

namespace kiln::cuda {

inline constexpr int kQuantUnitRows = 16;

// The largest e8m0 exponent field a packed MXFP4 weight may carry: the GEMV applies the
// scale 2^(e - 127) before its mma as the bf16 2^(e - 27) (quant_gemv.cu, pre_scale),
// which is finite up to e = 154, weights below 2^30. A trained model's are nowhere near;
// pack_quantized refuses larger ones rather than let them turn into infinities (255, an
// e8m0 NaN, stays NaN everywhere).
inline constexpr int kQuantMaxE8m0 = 154;

// n rows padded to whole units.
KILN_QUANT_HD constexpr int64_t quant_rows_padded(int64_t n) {
  return (n + kQuantUnitRows - 1) / kQuantUnitRows * kQuantUnitRows;
}

// Byte offset of row o (>= 0) of a packed array's 128-input block b, rows of row_bytes,
// blk bytes per row per block. Block b + 1 of the same row is kQuantUnitRows * blk further.
KILN_QUANT_HD constexpr int64_t quant_block_offset(int64_t o, int64_t b, int64_t row_bytes, int64_t blk) {
  static_assert(kQuantUnitRows == 16, "units are 16 rows: the bit operations below");
  return (o & ~int64_t(15)) * row_bytes + (b * kQuantUnitRows + (o & 15)) * blk;
}

}  // namespace kiln::cuda
