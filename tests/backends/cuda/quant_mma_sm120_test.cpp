// The native SM120 MoE GEMMs' layout (kernels/quant_mma_sm120.h), on the CPU: the block-
// scaled mma.sync cannot run on the test GPU (sm_90) nor here, so this test emulates
// the instruction from its PTX ISA description and feeds it exactly what the sm_120a
// kernel (kernels/quant_gemm_sm120.cu) would hold in registers: activations quantized
// by the header's rules, a CTA tile's pipeline stages laid out in "shared memory" by
// the header's placement, ldmatrix (emulated) at the header's lane addresses, the B
// widening and scale words the header selects. The emulated accumulators, mapped back to
// rows and columns by the header's epilogue mapping, must equal the dequantize-then-
// fp32 product of the quantized activations and the packed weights.
//
// The PTX facts the emulator encodes (PTX ISA 9.0, "mma.sync ... block scaling" and the
// m16n8k32 / m16n8k64 fragment figures; shared/research/kernels-sm120.md 2.3-2.4), with
// g = lane / 4, t = lane % 4:
//   A (16 x K, row): register a_i holds row g + 8 (i % 2); 8-bit types k = 4t + 16 (i / 2)
//     + byte, e2m1 under kind::mxf4nvf4 k = 8t + 32 (i / 2) + nibble (low nibble first).
//   B (K x 8, col): b_i holds column g; 8-bit k = 4t + 16 i + byte, e2m1 k = 8t + 32 i +
//     nibble. Under kind::mxf8f6f4 an e2m1 sits in bits 5:2 of its byte.
//   D (16 x 8): d_i holds row g + 8 (i / 2), column 2t + i % 2.
//   Scales: row m's from lane 4 (m % 8) + 2 thread-id-a + m / 8, column n's from lane
//     4 n + thread-id-b; scale_vec::1X uses byte byte-id for all k of the mma,
//     scale_vec::4X byte j for k in [16 j, 16 j + 16) (byte-id 0).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "backends/cuda/kernels/quant_mma_sm120.h"
#include "backends/cuda/quant_pack.h"
#include "backends/cuda/quant_random.h"

namespace kiln {
namespace {

namespace sm = cuda::sm120;
using sm::ActFormat;

// ---- the instruction, emulated from its PTX description

struct WarpRegs {  // one mma's operands, per lane
  uint32_t a[32][4], b[32][2], sfa[32], sfb[32];
};

double scale_value(ActFormat f, uint8_t byte) {
  return f == ActFormat::kE4m3 ? double(e8m0_to_f32(byte)) : double(fp8_e4m3_to_f32(byte));
}

// d[lane][i] += the mma's D fragment: mxf8f6f4 m16n8k32 (e4m3 x e2m1, ue8m0, 1X) or
// mxf4nvf4 m16n8k64 (e2m1 x e2m1, ue4m3, 4X), thread-ids 0.
void emulate_mma(ActFormat f, const WarpRegs& r, int byte_id, double (&d)[32][4]) {
  const bool e4m3 = f == ActFormat::kE4m3;
  const int kk = e4m3 ? 32 : 64;
  double A[16][64] = {}, B[64][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < (e4m3 ? 4 : 8); ++j) {
        const int m = g + 8 * (i % 2);
        if (e4m3) {
          A[m][4 * t + 16 * (i / 2) + j] = fp8_e4m3_to_f32(uint8_t(r.a[lane][i] >> (8 * j)));
        } else {
          A[m][8 * t + 32 * (i / 2) + j] = fp4_e2m1_to_f32(uint8_t(r.a[lane][i] >> (4 * j)) & 0xf);
        }
      }
    }
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < (e4m3 ? 4 : 8); ++j) {
        if (e4m3) {
          const uint8_t byte = uint8_t(r.b[lane][i] >> (8 * j));
          EXPECT_EQ(byte & 0xc3, 0) << "an e2m1 in an 8-bit container has zero padding bits";
          B[4 * t + 16 * i + j][g] = fp4_e2m1_to_f32((byte >> 2) & 0xf);
        } else {
          B[8 * t + 32 * i + j][g] = fp4_e2m1_to_f32(uint8_t(r.b[lane][i] >> (4 * j)) & 0xf);
        }
      }
    }
  }
  auto sa = [&](int m, int k) {
    const uint32_t word = r.sfa[4 * (m % 8) + 2 * sm::kScaleThreadId + m / 8];
    return scale_value(f, uint8_t(word >> (8 * (e4m3 ? byte_id : k / 16))));
  };
  auto sb = [&](int n, int k) {
    const uint32_t word = r.sfb[4 * n + sm::kScaleThreadId];
    return scale_value(f, uint8_t(word >> (8 * (e4m3 ? byte_id : k / 16))));
  };
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const int m = lane / 4 + 8 * (i / 2), n = 2 * (lane % 4) + i % 2;
      for (int k = 0; k < kk; ++k) d[lane][i] += A[m][k] * sa(m, k) * B[k][n] * sb(n, k);
    }
  }
}

// ldmatrix.sync.aligned.m8n8.x4.b16: lane l receives, for matrix i, 32-bit word l % 4 of
// the 16-byte row whose address lane 8 i + l / 4 supplied.
void emulate_ldmatrix_x4(const std::vector<uint8_t>& smem, const uint32_t (&addr)[32], uint32_t (&out)[32][4]) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const uint32_t a = addr[8 * i + lane / 4] + 4 * (lane % 4);
      EXPECT_LE(a + 4, smem.size());
      std::memcpy(&out[lane][i], &smem[a], 4);
    }
  }
}

// The 8 row addresses of each matrix of one ldmatrix hit 8 different 16-byte bank groups.
void expect_conflict_free(const uint32_t (&addr)[32]) {
  for (int i = 0; i < 4; ++i) {
    std::set<uint32_t> groups;
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(addr[8 * i + j] % 16, 0u);
      groups.insert(addr[8 * i + j] / 16 % 8);
    }
    EXPECT_EQ(groups.size(), 8u) << "ldmatrix matrix " << i << " has a bank conflict";
  }
}

uint32_t read32(const std::vector<uint8_t>& smem, uint32_t off) {
  uint32_t v;
  EXPECT_LE(off + 4, smem.size());
  std::memcpy(&v, &smem[off], 4);
  return v;
}

// Activations with the spread real ones have: blocks from 1e-2 to 1e2, outliers, zero
// blocks, bf16-representable values.
std::vector<float> random_activations(int64_t rows, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> e(-2.0f, 2.0f);
  std::vector<float> x(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < k; b += 16) {
      const float amp = rng() % 11 == 0 ? 0.0f : std::pow(10.0f, e(rng));
      for (int64_t i = b; i < std::min(k, b + 16); ++i) {
        float v = n(rng) * amp;
        if (rng() % 97 == 0) v *= 40.0f;
        x[size_t(r * k + i)] = bf16_to_f32(f32_to_bf16(v));
      }
    }
  }
  return x;
}

struct QuantActs {
  std::vector<uint8_t> codes, scales;
  std::vector<float> row_scale;
};
QuantActs quantize(ActFormat f, const std::vector<float>& x, int64_t rows, int64_t k) {
  QuantActs q{std::vector<uint8_t>(size_t(rows * sm::act_code_row_bytes(f, k)), 0xcd),
              std::vector<uint8_t>(size_t(rows * sm::act_scale_row_bytes(f, k)), 0xcd),
              std::vector<float>(size_t(rows), -1.0f)};
  sm::quantize_act_rows(f, x.data(), rows, k, q.codes.data(), q.scales.data(), q.row_scale.data());
  return q;
}

// ---- the quantization rules

TEST(QuantMmaSm120, NumberFormatsRoundToNearestEvenAndSaturate) {
  // e4m3: every code decodes as the core's OCP e4m3fn, encodes back, and midpoints go to
  // the even neighbour; beyond 448 saturates.
  for (uint32_t c = 0; c <= 0x7e; ++c) {
    ASSERT_EQ(sm::e4m3_value(c), fp8_e4m3_to_f32(uint8_t(c))) << c;
    ASSERT_EQ(sm::e4m3_code(sm::e4m3_value(c)), c) << c;
    if (c < 0x7e) {
      const float mid = 0.5f * (sm::e4m3_value(c) + sm::e4m3_value(c + 1));
      EXPECT_EQ(sm::e4m3_code(mid), c % 2 == 0 ? c : c + 1) << "midpoint above code " << c;
    }
  }
  EXPECT_EQ(sm::e4m3_code(460.0f), 0x7eu);
  EXPECT_EQ(sm::e4m3_code(1e30f), 0x7eu);
  // e2m1 likewise, saturating at 6.
  for (uint32_t c = 0; c < 8; ++c) {
    ASSERT_EQ(sm::e2m1_value(c), fp4_e2m1_to_f32(uint8_t(c))) << c;
    ASSERT_EQ(sm::e2m1_code(sm::e2m1_value(c)), c) << c;
    if (c < 7) {
      const float mid = 0.5f * (sm::e2m1_value(c) + sm::e2m1_value(c + 1));
      EXPECT_EQ(sm::e2m1_code(mid), c % 2 == 0 ? c : c + 1) << "midpoint above code " << c;
    }
  }
  EXPECT_EQ(sm::e2m1_code(7.5f), 7u);
  // Random values: the code is a nearest one.
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::pow(2.0f, 20.0f * u(rng) - 11.0f);
    const float q = sm::e4m3_value(sm::e4m3_code(v));
    for (uint32_t c = 0; c <= 0x7e; ++c) ASSERT_LE(std::abs(q - v), std::abs(sm::e4m3_value(c) - v)) << v;
    const float w = 7.0f * u(rng), p = sm::e2m1_value(sm::e2m1_code(w));
    for (uint32_t c = 0; c < 8; ++c) ASSERT_LE(std::abs(p - w), std::abs(sm::e2m1_value(c) - w)) << w;
  }
}

TEST(QuantMmaSm120, ActivationBlocksFollowTheirScaleRules) {
  std::mt19937 rng(2);
  const int64_t rows = 9, k = 200;  // a partial 32-block and 128-tile of padding
  const std::vector<float> x = random_activations(rows, k, rng);
  for (ActFormat f : {ActFormat::kE4m3, ActFormat::kE2m1}) {
    SCOPED_TRACE(f == ActFormat::kE4m3 ? "e4m3" : "e2m1");
    const QuantActs q = quantize(f, x, rows, k);
    const int group = sm::act_group(f);
    const int64_t scale_row = sm::act_scale_row_bytes(f, k);
    for (int64_t r = 0; r < rows; ++r) {
      float row_amax = 0.0f;
      for (int64_t i = 0; i < k; ++i) row_amax = std::max(row_amax, std::abs(x[size_t(r * k + i)]));
      if (f == ActFormat::kE2m1) {
        EXPECT_EQ(q.row_scale[size_t(r)], row_amax > 0 ? row_amax / 2688.0f : 1.0f);
      }
      for (int64_t b = 0; b < scale_row; ++b) {
        float amax = 0.0f;
        for (int64_t i = b * group; i < std::min(k, (b + 1) * group); ++i)
          amax = std::max(amax, std::abs(x[size_t(r * k + i)]));
        const uint8_t s = q.scales[size_t(r * scale_row + b)];
        if (f == ActFormat::kE4m3) {
          // The smallest power of two that brings amax within e4m3's 448.
          const double p = std::ldexp(1.0, int(s) - 127);
          if (amax > 0) {
            EXPECT_LE(amax / p, 448.0) << r << " " << b;
            EXPECT_GT(amax / p, 224.0) << r << " " << b;
          }
        } else {
          const float g = q.row_scale[size_t(r)];
          EXPECT_EQ(s, sm::e4m3_code(amax / (6.0f * g))) << r << " " << b;
        }
        // Every value is the nearest representable one (saturating), so within half a
        // step of its input: e4m3 2^-4 relative above its subnormals, e2m1 within the
        // block's largest step (2 s g) or a saturated 6 s g.
        for (int64_t i = b * group; i < (b + 1) * group; ++i) {
          const float want = i < k ? x[size_t(r * k + i)] : 0.0f;
          const float got = sm::act_value(f, q.codes.data(), q.scales.data(), q.row_scale.data(), k, r, i);
          if (f == ActFormat::kE4m3) {
            const double p = std::ldexp(1.0, int(s) - 127);
            EXPECT_LE(std::abs(got - want), std::max(std::abs(want) / 16.0, p * 0x1p-10)) << r << " " << i;
          } else if (s == 0) {  // a block far below its row's maximum: flushed to zero
            EXPECT_EQ(got, 0.0f);
            EXPECT_LT(amax, q.row_scale[size_t(r)] * 6.0f * 0x1p-10f) << r << " " << b;
          } else {
            const double sg = double(fp8_e4m3_to_f32(s)) * q.row_scale[size_t(r)];
            const double v = std::abs(want) / sg;  // in units of the block's scale
            EXPECT_LE(std::abs(got - want), std::max(1.0, v - 6.0) * sg * (1 + 1e-6)) << r << " " << i;
          }
        }
      }
    }
  }
}

TEST(QuantMmaSm120, SlotOrderIsAPermutationOfEachBlock) {
  std::set<int> inputs;
  for (int s = 0; s < 32; ++s) {
    EXPECT_EQ(sm::e4m3_block_slot(sm::e4m3_block_input(s)), s);
    inputs.insert(sm::e4m3_block_input(s));
  }
  EXPECT_EQ(inputs.size(), 32u);
  EXPECT_EQ(*inputs.rbegin(), 31);
}

// ---- one CTA tile through the emulated instruction

// What input (r, k) of x stands for after quantization, from x itself and its block's
// stored scale (so a misplaced code cannot hide in both the kernel's and the reference's
// reading of the codes); act_value, which reads the codes, must agree.
double quantized_input(ActFormat f, const std::vector<float>& x, const QuantActs& a, int64_t k, int64_t r, int64_t i) {
  const float xv = x[size_t(r * k + i)];
  const uint8_t s = a.scales[size_t(r * sm::act_scale_row_bytes(f, k) + i / sm::act_group(f))];
  double q = 0.0;
  if (f == ActFormat::kE4m3) {
    const double p = std::ldexp(1.0, int(s) - 127);
    q = sm::e4m3_value(sm::e4m3_code(float(std::abs(xv) / p))) * p;
  } else if (s != 0) {
    const float sg = fp8_e4m3_to_f32(s) * a.row_scale[size_t(r)];  // the quantizer's fp32 divisor
    q = double(sm::e2m1_value(sm::e2m1_code(std::abs(xv) / sg))) * fp8_e4m3_to_f32(s) * a.row_scale[size_t(r)];
  }
  q = xv < 0 ? -q : q;
  EXPECT_EQ(float(q), sm::act_value(f, a.codes.data(), a.scales.data(), a.row_scale.data(), k, r, i)) << r << " " << i;
  return q;
}

// The stage image load_stage's cp.async copies write for k tile kt: A rows 0..rows-1 of
// the quantized activations (zero past them), weight rows 0..cols-1 (zero past them).
std::vector<uint8_t> stage_image(ActFormat f, const QuantActs& a, int64_t k, int rows, const cuda::PackedQuant& w,
                                 int cols, int kt) {
  std::vector<uint8_t> smem(size_t(sm::stage_bytes(f)), 0);
  const int a_row = sm::a_row_bytes(f), sc = sm::scale_row_bytes(f);
  const int64_t a_code_row = sm::act_code_row_bytes(f, k), a_scale_row = sm::act_scale_row_bytes(f, k);
  std::set<uint32_t> written;
  auto chunk = [&](uint32_t dst, const uint8_t* src) {
    EXPECT_TRUE(written.insert(dst).second) << "two chunks placed at " << dst;
    std::memcpy(&smem[dst], src, 16);
  };
  for (int r = 0; r < rows; ++r) {
    for (int ch = 0; ch < a_row / 16; ++ch)
      chunk(sm::tile_chunk(r, ch, a_row), &a.codes[size_t(r * a_code_row + kt * a_row + 16 * ch)]);
    std::memcpy(&smem[size_t(sm::a_scales_offset(f) + r * sc)], &a.scales[size_t(r * a_scale_row + kt * sc)],
                size_t(sc));
  }
  EXPECT_EQ(w.tile_scale_bytes(), sc) << "the weights' scale bytes per stage";
  // Weight rows as the kernel addresses them: the row's block 0 in the unit-major layout
  // (quant_layout.h), then kt blocks of 16 rows on.
  for (int n = 0; n < cols; ++n) {
    const int64_t b_codes = cuda::quant_block_offset(n, 0, w.code_row_bytes(), sm::kBRowBytes) +
                            int64_t(kt) * cuda::kQuantUnitRows * sm::kBRowBytes;
    const int64_t b_scales =
        cuda::quant_block_offset(n, 0, w.scale_row_bytes(), sc) + int64_t(kt) * cuda::kQuantUnitRows * sc;
    for (int ch = 0; ch < sm::kBRowBytes / 16; ++ch)
      chunk(uint32_t(sm::b_codes_offset(f)) + sm::tile_chunk(n, ch, sm::kBRowBytes), &w.codes[size_t(b_codes + 16 * ch)]);
    std::memcpy(&smem[size_t(sm::b_scales_offset(f) + n * sc)], &w.scales[size_t(b_scales)], size_t(sc));
  }
  return smem;
}

void check_tile(ActFormat f, formats::QuantKind kind, int64_t k, int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> x = random_activations(sm::kBM, k, rng);
  const QuantActs a = quantize(f, x, sm::kBM, k);
  auto packed = cuda::pack_quantized(cuda::random_quantized({kind}, sm::kBN, k, rng));
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  const cuda::PackedQuant& w = *packed;
  for (int off : {sm::a_scales_offset(f), sm::b_codes_offset(f), sm::b_scales_offset(f), sm::stage_bytes(f)})
    EXPECT_EQ(off % 128, 0) << "stage regions stay 128-byte aligned";

  // acc[warp][lane][mt][nt][i], as the kernel's registers.
  std::vector<std::array<std::array<std::array<std::array<double, 4>, sm::kNT>, sm::kMT>, 32>> acc(4);
  for (auto& wacc : acc)
    for (auto& l : wacc)
      for (auto& m : l)
        for (auto& n : m) n.fill(0.0);
  const int n_k = int(sm::k_padded(k) / sm::kKTile);
  for (int kt = 0; kt < n_k; ++kt) {
    const std::vector<uint8_t> smem = stage_image(f, a, k, rows, w, cols, kt);
    for (int warp = 0; warp < 4; ++warp) {
      const int wm = warp / sm::kWarpsN, wn = warp % sm::kWarpsN;
      uint32_t bq[sm::kNT][32][4];
      for (int nt = 0; nt < sm::kNT; ++nt) {
        uint32_t addr[32];
        for (int lane = 0; lane < 32; ++lane)
          addr[lane] = uint32_t(sm::b_codes_offset(f)) + sm::b_frag_addr(lane, (wn * sm::kNT + nt) * 8);
        expect_conflict_free(addr);
        emulate_ldmatrix_x4(smem, addr, bq[nt]);
      }
      for (int ks = 0; ks < sm::k_steps(f); ++ks) {
        uint32_t af[sm::kMT][32][4], sfa[sm::kMT][32];
        for (int mt = 0; mt < sm::kMT; ++mt) {
          const int m0 = (wm * sm::kMT + mt) * 16;
          uint32_t addr[32];
          for (int lane = 0; lane < 32; ++lane) {
            addr[lane] = sm::a_frag_addr(f, lane, m0, ks);
            sfa[mt][lane] = read32(smem, sm::a_scales_offset(f) + sm::sfa_offset(f, lane, m0, ks));
          }
          expect_conflict_free(addr);
          emulate_ldmatrix_x4(smem, addr, af[mt]);
        }
        for (int nt = 0; nt < sm::kNT; ++nt) {
          WarpRegs regs{};
          for (int lane = 0; lane < 32; ++lane) {
            regs.sfb[lane] =
                read32(smem, sm::b_scales_offset(f) + sm::sfb_offset(f, lane, (wn * sm::kNT + nt) * 8, ks));
            sm::b_operand(f, bq[nt][lane], ks, regs.b[lane][0], regs.b[lane][1]);
          }
          for (int mt = 0; mt < sm::kMT; ++mt) {
            for (int lane = 0; lane < 32; ++lane) {
              std::memcpy(regs.a[lane], af[mt][lane], sizeof(regs.a[lane]));
              regs.sfa[lane] = sfa[mt][lane];
            }
            double d[32][4] = {};
            emulate_mma(f, regs, sm::scale_byte_id(f, ks), d);
            for (int lane = 0; lane < 32; ++lane)
              for (int i = 0; i < 4; ++i)
                acc[size_t(warp)][size_t(lane)][size_t(mt)][size_t(nt)][size_t(i)] += d[lane][i];
          }
        }
      }
    }
  }

  // The epilogue's mapping: every (row, column) once; each equal to the reference.
  std::set<std::pair<int, int>> seen;
  int64_t checked = 0, nonzero = 0;
  for (int warp = 0; warp < 4; ++warp) {
    const int wm = warp / sm::kWarpsN, wn = warp % sm::kWarpsN;
    for (int lane = 0; lane < 32; ++lane) {
      for (int mt = 0; mt < sm::kMT; ++mt) {
        for (int nt = 0; nt < sm::kNT; ++nt) {
          for (int i = 0; i < 4; ++i) {
            const int r = (wm * sm::kMT + mt) * 16 + sm::acc_row(lane, i);
            const int n = (wn * sm::kNT + nt) * 8 + sm::acc_col(lane, i);
            EXPECT_TRUE(seen.insert({r, n}).second) << "(" << r << ", " << n << ") twice";
            if (r >= rows || n >= cols) continue;  // the kernel writes no such element
            const double rs = f == ActFormat::kE2m1 ? a.row_scale[size_t(r)] : 1.0;
            const double got = acc[size_t(warp)][size_t(lane)][size_t(mt)][size_t(nt)][size_t(i)] * rs * w.scale2;
            double want = 0.0, mag = 0.0;
            for (int64_t kk = 0; kk < k; ++kk) {
              const double t = quantized_input(f, x, a, k, r, kk) * cuda::packed_element(w, n, kk) * w.scale2;
              want += t;
              mag += std::abs(t);
            }
            // Both sides sum the same exact products in double, in different orders.
            ASSERT_LE(std::abs(got - want), 1e-12 * mag + 1e-300) << "row " << r << ", column " << n;
            ++checked;
            nonzero += want != 0.0;
          }
        }
      }
    }
  }
  EXPECT_EQ(seen.size(), size_t(sm::kBM * sm::kBN));
  EXPECT_EQ(checked, int64_t(rows) * cols);
  EXPECT_GT(nonzero, checked * 3 / 4) << "random data, not zeros";
}

TEST(QuantMmaSm120, MxfpTileMatchesTheReference) {
  // MXFP4 weights x e4m3 activations (mxf8f6f4): 320 inputs (3 stages, the last padded),
  // a partial tile of rows and of columns.
  check_tile(ActFormat::kE4m3, formats::QuantKind::kMxfp4, 320, 50, 120, 11);
  check_tile(ActFormat::kE4m3, formats::QuantKind::kMxfp4, 128, sm::kBM, sm::kBN, 12);
}

TEST(QuantMmaSm120, NvfpTileMatchesTheReference) {
  // NVFP4 weights x e2m1 activations (mxf4nvf4).
  check_tile(ActFormat::kE2m1, formats::QuantKind::kNvfp4, 336, 37, 128, 13);
  check_tile(ActFormat::kE2m1, formats::QuantKind::kNvfp4, 256, sm::kBM, 72, 14);
}

}  // namespace
}  // namespace kiln
