// Random quantized weights for --load-format dummy (WeightLoader::dummy): a linear in
// its checkpoint layout (formats/quant.h), as if read from a real checkpoint, so the
// backend takes the same upload_quantized path and the same kernels.
//
// Codes: each is drawn from a table of 256 entries indexed by one random byte, the
// entries the format's codes nearest to the 256 quantiles of a normal (e4m3 up to about
// 323, e2m1 up to 6, INT4 -7..7): bell-shaped like a trained weight's codes, zero mean.
// Scales: jittered around the value that makes the dequantized weight's standard
// deviation `stddev` (E[(code * scale)^2] = stddev^2 exactly, from the tables' RMS):
//   FP8 / INT4   base * j, j = 2^((u - 1/2) / 4) normalised to E[j^2] = 1, one u per block
//   MXFP4        2^e with e = floor(t) or floor(t) + 1 (t = log2(base)), drawn so E[4^e] = base^2
//   NVFP4        block scales e4m3 in (224, 448], the fp32 global scale fitting them
// Random bytes come from splitmix64 over 8-byte words (ops/random.h), one stream per row,
// so the values depend on the seed and the element's place only, not on the threads.
#pragma once

#include <cstdint>

#include "formats/quant.h"

namespace kiln {
class ThreadPool;
}

namespace kiln::model {

struct RandomQuantArgs {
  formats::QuantKind kind = formats::QuantKind::kNone;
  int64_t n_out = 0, n_in = 0;       // the logical [n_out, n_in] matrix
  int32_t block_n = 0, block_k = 0;  // kFp8Block's block; kInt4Group: block_k = group size
  float stddev = 0.0f;               // of the dequantized weight
  uint64_t seed = 0;
  bool shapes_only = false;          // the tensors' dtypes and shapes, unbacked (no memory, no values)
};

// A tensor with a dtype and a shape and no memory, for sizing a model that is never run
// (WeightLoader::sizing): its data is a non-null address of its own that must never be read.
Tensor unbacked_tensor(DType dtype, Shape shape);

// Host tensors: FP8 e4m3 codes with fp32 scales (block [ceil(n_out/bn), ceil(n_in/bk)],
// channel [n_out, 1], tensor [1]); MXFP4 u8 [n_out, n_in/32, 16] + e8m0 u8 [n_out, n_in/32];
// NVFP4 u8 [n_out, n_in/2] + e4m3 [n_out, n_in/16] + fp32 [1]; INT4 i32 [n_out, n_in/8] +
// bf16 [n_out, n_in/group]. Rows are made in parallel on `pool` when given.
// The caller checks the shape against the format (n_in a multiple of its groups).
formats::QuantizedTensor random_quantized(const RandomQuantArgs& a, ThreadPool* pool = nullptr);

// The RMS of a format's dummy code values (the `rms` the scales are chosen from): exposed
// for tests.
double random_code_rms(formats::QuantKind kind);

}  // namespace kiln::model
