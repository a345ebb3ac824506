// The CUDA backend's packed layout of quantized weights (backends/cuda/quant_pack.h),
// checked on the CPU: every element of the packed form, decoded the way the kernels
// decode it, equals the reference dequantization (formats::dequantize_row) exactly, the
// padding decodes to zero, the unit-major order is the one quant_layout.h states, rows
// keep the alignment the kernels' cp.async needs, and shapes the layout cannot hold
// fail with a clear error.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "backends/cuda/quant_pack.h"
#include "backends/cuda/quant_random.h"

namespace kiln {
namespace {

using cuda::pack_quantized;
using cuda::packed_element;
using formats::QuantKind;

TEST(CudaQuantPack, EveryFormatDecodesToTheReferenceValues) {
  std::mt19937 rng(7);
  for (const cuda::QuantCase& c : cuda::quant_cases()) {
    // Odd row counts (a partial FP8 row block), inputs off the 128-input tile.
    const int64_t unit = cuda::quant_k_unit(c);
    for (auto [n_out, n_in] : {std::pair<int64_t, int64_t>{3, unit}, {131, 5 * 128 + unit}, {130, 384}}) {
      if (n_in % unit != 0) continue;
      SCOPED_TRACE(c.name() + " " + std::to_string(n_out) + "x" + std::to_string(n_in));
      const formats::QuantizedTensor q = cuda::random_quantized(c, n_out, n_in, rng);
      auto p = pack_quantized(q);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      EXPECT_EQ(p->k_padded % cuda::kQuantKTile, 0);
      EXPECT_GE(p->k_padded, n_in);
      EXPECT_EQ(p->code_row_bytes() % 64, 0) << "code rows are whole 16-byte chunks per tile";
      EXPECT_EQ(p->tile_scale_bytes() % 4, 0) << "scales move in 4-byte pieces";
      EXPECT_LE(p->tile_scale_bytes(), cuda::kQuantMaxTileScaleBytes);
      EXPECT_EQ(cuda::kQuantKTile % p->group, 0);
      EXPECT_EQ(p->rows(), (n_out + 15) / 16 * 16) << "rows padded to whole 16-row units";
      EXPECT_EQ(p->codes.size(), size_t(p->rows() * p->code_row_bytes()));
      EXPECT_EQ(p->scales.size(), size_t(p->rows() * p->scale_row_bytes()));
      // What sizing counts from the shapes alone (runtime/sizing.h) is what is packed.
      auto layout = cuda::packed_layout(q);
      ASSERT_TRUE(layout.ok()) << layout.status().to_string();
      EXPECT_EQ(cuda::packed_bytes(*layout),
                int64_t(p->codes.size() + p->scales.size()) + (p->has_scale2 ? 4 : 0));
      std::vector<float> ref(static_cast<size_t>(n_in));
      int64_t mismatches = 0, nonzero = 0;
      for (int64_t o = 0; o < n_out; ++o) {
        formats::dequantize_row(q, o, ref.data());
        for (int64_t k = 0; k < p->k_padded; ++k) {
          const float got = packed_element(*p, o, k) * p->scale2;
          const float want = k < n_in ? ref[size_t(k)] : 0.0f;
          if (got != want && mismatches++ < 5) ADD_FAILURE() << "(" << o << ", " << k << "): " << got << " vs " << want;
          nonzero += want != 0.0f;
        }
      }
      for (int64_t o = n_out; o < p->rows(); ++o)  // the padding rows
        for (int64_t k = 0; k < p->k_padded; ++k)
          if (packed_element(*p, o, k) != 0.0f && mismatches++ < 5) ADD_FAILURE() << "padding (" << o << ", " << k << ")";
      EXPECT_EQ(mismatches, 0);
      EXPECT_GT(nonzero, n_out * n_in / 2) << "random weights, not zeros";
    }
  }
}

// The unit-major order itself, spelled out independently of quant_layout.h: rows in units
// of 16, a unit block by block (64 bytes of 4-bit codes and 4 of MXFP4 scales per row and
// 128 inputs), so one unit's block is one contiguous run in row order. 37 rows: a partial
// last unit, padded with rows of zero codes and zero scale bytes.
TEST(CudaQuantPack, AUnitsRowsLieBlockByBlock) {
  std::mt19937 rng(9);
  const int64_t n_out = 37, n_in = 384, row = n_in / 2, scales_row = n_in / 32;
  const formats::QuantizedTensor q = cuda::random_quantized({QuantKind::kMxfp4}, n_out, n_in, rng);
  auto p = pack_quantized(q);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->rows(), 48);
  ASSERT_EQ(p->code_row_bytes(), row);
  ASSERT_EQ(p->scale_row_bytes(), scales_row);
  const auto* codes = static_cast<const uint8_t*>(q.data.data);
  const auto* scales = static_cast<const uint8_t*>(q.scale.data);
  int64_t bad = 0;
  for (int64_t o = 0; o < p->rows(); ++o) {
    const int64_t unit = o / 16, r = o % 16;
    for (int64_t j = 0; j < row; ++j) {  // code byte j of row o: block j / 64
      const int64_t at = unit * 16 * row + (j / 64) * 16 * 64 + r * 64 + j % 64;
      const uint8_t want = o < n_out ? codes[o * row + j] : 0;
      if (p->codes[size_t(at)] != want && bad++ < 5) ADD_FAILURE() << "code byte " << j << " of row " << o;
    }
    for (int64_t j = 0; j < scales_row; ++j) {  // scale j of row o: block j / 4
      const int64_t at = unit * 16 * scales_row + (j / 4) * 16 * 4 + r * 4 + j % 4;
      const uint8_t want = o < n_out ? scales[o * scales_row + j] : 0;
      if (p->scales[size_t(at)] != want && bad++ < 5) ADD_FAILURE() << "scale " << j << " of row " << o;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(cuda::quant_block_offset(37, 2, row, 64), 32 * row + (2 * 16 + 5) * 64);
}

TEST(CudaQuantPack, ShapesTheLayoutCannotHoldFailClearly) {
  std::mt19937 rng(8);
  auto q = cuda::random_quantized({QuantKind::kInt4Group, 24, 0, DType::kBF16}, 4, 96, rng);
  auto p = pack_quantized(q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("group size 24"), std::string::npos) << p.status().message();

  q = cuda::random_quantized({QuantKind::kFp8Block, 96, 128, DType::kF32}, 4, 192, rng);
  p = pack_quantized(q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("block size 96"), std::string::npos) << p.status().message();

  q = cuda::random_quantized({QuantKind::kInt4Group, 8, 0, DType::kF32}, 4, 64, rng);
  p = pack_quantized(q);  // 16 f32 scales per 128 inputs: 64 bytes, over the kernels' 32
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("bytes of scales"), std::string::npos) << p.status().message();
}

// The GEMV applies an e8m0 scale as a bf16 2^(e - 27): exponent fields up to 154 pack
// and decode exactly; 155-254 would be infinities there and fail here; 255 (NaN) packs.
TEST(CudaQuantPack, Mxfp4ScalesBeyondTheGemvRangeFailClearly) {
  std::mt19937 rng(9);
  auto q = cuda::random_quantized({QuantKind::kMxfp4}, 16, 128, rng);
  q.scale.as<uint8_t>()[5] = uint8_t(cuda::kQuantMaxE8m0);
  q.scale.as<uint8_t>()[6] = 0;
  q.scale.as<uint8_t>()[7] = 255;
  auto p = pack_quantized(q);  // row 1's groups: k 32-63 at 2^27, 64-95 at 2^-127, 96-127 NaN
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::vector<float> ref(128);
  formats::dequantize_row(q, 1, ref.data());
  int nonzero = 0;
  for (int k = 32; k < 96; ++k) {
    EXPECT_EQ(packed_element(*p, 1, k), ref[size_t(k)]) << k;
    nonzero += ref[size_t(k)] != 0.0f;
  }
  EXPECT_GT(nonzero, 32);
  EXPECT_TRUE(std::isnan(packed_element(*p, 1, 96)));
  q.scale.as<uint8_t>()[9] = uint8_t(cuda::kQuantMaxE8m0 + 1);
  p = pack_quantized(q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("a scale of 2^28"), std::string::npos) << p.status().message();
}

// NVFP4 block scales are unsigned e4m3 (the SM120 tensor cores read them as ue4m3): a
// scale byte with the sign bit set fails the pack, naming the byte and its row.
TEST(CudaQuantPack, Nvfp4ScalesWithTheSignBitSetFailClearly) {
  std::mt19937 rng(11);
  auto q = cuda::random_quantized({QuantKind::kNvfp4}, 16, 128, rng);
  ASSERT_TRUE(pack_quantized(q).ok());
  q.scale.as<uint8_t>()[8 * 3 + 2] = 0xb8;  // -1.0 in e4m3: row 3, scale 2
  auto p = pack_quantized(q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("sign bit set (0xb8, scale 2 of row 3"), std::string::npos)
      << p.status().message();
}

}  // namespace
}  // namespace kiln
