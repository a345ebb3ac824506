// The grid order of tile launches over a MoE tile table (moe_gemm.cu's bf16 tiles,
// quant_gemm.cu's W4A16 and W8A8 tiles): the n tile is the grid's fast index, so a row
// tile's CTAs are dispatched together and share its activation rows in L2, and an
// expert's tiles (1-2 at 64-128 routed rows) follow one another and share its weights.
// With the row tile fast, the CTAs in flight spanned one n tile of every expert, more
// bytes than a 50 MB L2 (gpt-oss-120b's up GEMM at 2048 tokens: 47 MB of weights and 24 MB
// of activations per n tile), and each n tile read the activations from DRAM again. H100,
// MoE layers: bf16 13-17.5% faster at 2048 tokens, 0.7-7% at 512 and 8192; quantized 0-3%
// (docs/PERF.md). Past gridDim.y's 65,535 row tiles the order falls back to row-fast.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kiln::cuda {

struct TileGrid {
  dim3 grid;
  bool n_fast;  // x is the n tile, y the row tile (else the reverse)
};

inline TileGrid moe_tile_grid(int row_tiles, int64_t n_tiles) {
  if (row_tiles <= 65535) return {dim3(unsigned(n_tiles), unsigned(row_tiles)), true};
  return {dim3(unsigned(row_tiles), unsigned(n_tiles)), false};
}

__device__ __forceinline__ int grid_row_tile(bool n_fast) { return int(n_fast ? blockIdx.y : blockIdx.x); }
__device__ __forceinline__ int grid_n_tile(bool n_fast) { return int(n_fast ? blockIdx.x : blockIdx.y); }

}  // namespace kiln::cuda
