#include "model/dummy_quant.h"

#include <algorithm>
#include <atomic>
#include <array>
#include <cmath>
#include <functional>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/random.h"

namespace kiln::model {
namespace {

using formats::QuantKind;

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;  // splitmix64's increment
constexpr uint64_t kCodes = 0, kScales = 1;          // the two streams of a tensor

// Word i of the stream starting at `s`: splitmix64's own sequence.
inline uint64_t word(uint64_t s, uint64_t i) { return ops::splitmix64(s + i * kGamma); }
// The stream of row `row` of a tensor's codes or scales.
uint64_t row_stream(uint64_t seed, uint64_t tag, int64_t row) {
  return ops::splitmix64(ops::splitmix64(seed ^ (tag * kGamma)) ^ uint64_t(row));
}

// The standard normal's p-quantile, by bisection on its CDF (tables only: 256 calls).
double normal_quantile(double p) {
  double lo = -10.0, hi = 10.0;
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// A uniform byte -> a code, and the RMS of the codes' values over the 256 bytes.
struct CodeTable {
  std::array<uint8_t, 256> code{};
  double rms = 0.0;
};

template <class Encode, class Decode>
CodeTable quantile_table(double spread, Encode encode, Decode decode) {
  CodeTable t;
  double sq = 0.0;
  for (int b = 0; b < 256; ++b) {
    t.code[size_t(b)] = encode(normal_quantile((b + 0.5) / 256.0) * spread);
    const double v = decode(t.code[size_t(b)]);
    sq += v * v;
  }
  t.rms = std::sqrt(sq / 256.0);
  return t;
}

uint8_t nearest_e2m1(double x) {
  uint8_t best = 0;
  for (uint8_t n = 1; n < 16; ++n)
    if (std::abs(fp4_e2m1_to_f32(n) - x) < std::abs(fp4_e2m1_to_f32(best) - x)) best = n;
  return best;
}

// Spreads (code units per standard deviation) as absmax scaling gives them: a 128 x 128
// FP8 block's absmax is about 4 sigma and maps to 448; a 16- or 32-input FP4 block's is
// about 2 sigma and maps to 4..6; an INT4 group of 32's about 2.1 sigma maps to 7.
const CodeTable& code_table(QuantKind kind) {
  static const CodeTable e4m3 =
      quantile_table(112.0, [](double x) { return f32_to_fp8_e4m3(float(x)); }, fp8_e4m3_to_f32);
  static const CodeTable e2m1 = quantile_table(2.8, nearest_e2m1, fp4_e2m1_to_f32);
  static const CodeTable int4 = quantile_table(
      3.3, [](double x) { return uint8_t(std::clamp<long>(std::lround(x), -7, 7) + 8); },
      [](uint8_t c) { return float(int(c) - 8); });
  switch (kind) {
    case QuantKind::kMxfp4:
    case QuantKind::kNvfp4: return e2m1;
    case QuantKind::kInt4Group: return int4;
    default: return e4m3;
  }
}

// Scale jitter: 2^((u - 1/2) / 4) for a byte's u in [0, 1) (+-9%), normalised to a mean
// square of 1. Narrow so that a matrix of a few blocks keeps its spread.
const std::array<float, 256>& jitter() {
  static const std::array<float, 256> j = [] {
    std::array<double, 256> f{};
    double sq = 0.0;
    for (int b = 0; b < 256; ++b) {
      f[size_t(b)] = std::exp2(((b + 0.5) / 256.0 - 0.5) / 4.0);
      sq += f[size_t(b)] * f[size_t(b)];
    }
    std::array<float, 256> out{};
    for (int b = 0; b < 256; ++b) out[size_t(b)] = float(f[size_t(b)] / std::sqrt(sq / 256.0));
    return out;
  }();
  return j;
}

// NVFP4 block scales: e4m3 codes of 448 * 2^-u, u in [0, 1) (ModelOpt maps a block's
// absmax / 6 into e4m3's range under the tensor's global scale), and their RMS.
const CodeTable& nvfp4_block_scales() {
  static const CodeTable t = [] {
    CodeTable s;
    double sq = 0.0;
    for (int b = 0; b < 256; ++b) {
      s.code[size_t(b)] = f32_to_fp8_e4m3(float(448.0 * std::exp2(-(b + 0.5) / 256.0)));
      const double v = fp8_e4m3_to_f32(s.code[size_t(b)]);
      sq += v * v;
    }
    s.rms = std::sqrt(sq / 256.0);
    return s;
  }();
  return t;
}

// One row's n 8-bit codes.
void fill_bytes(uint8_t* out, int64_t n, uint64_t s, const CodeTable& t) {
  int64_t i = 0;
  for (uint64_t w = 0; i < n; ++w) {
    uint64_t h = word(s, w);
    for (int j = 0; j < 8 && i < n; ++j, ++i, h >>= 8) out[i] = t.code[h & 0xff];
  }
}

// Eight 4-bit codes from one word: element k in bits [4k, 4k + 4) (low nibble = even k;
// INT4's LSB-first nibbles of a word).
inline uint32_t nibbles8(uint64_t h, const CodeTable& t) {
  uint32_t v = 0;
  for (int j = 0; j < 8; ++j) v |= uint32_t(t.code[(h >> (8 * j)) & 0xff]) << (4 * j);
  return v;
}

// fn(o) for every row, in parallel on `pool` in chunks of at least 256 KiB of codes.
void for_rows(int64_t n_rows, int64_t row_bytes, ThreadPool* pool, const std::function<void(int64_t)>& fn) {
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) fn(o);
  };
  if (pool == nullptr) {
    run(0, n_rows);
    return;
  }
  pool->parallel_for(n_rows, run, std::max<int64_t>(1, (int64_t(256) << 10) / std::max<int64_t>(1, row_bytes)));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One row of n_in e2m1 codes, two per byte (MXFP4 and NVFP4 alike), from stream s.
void fill_e2m1_row(uint8_t* row, int64_t n_in, uint64_t s, const CodeTable& codes) {
  for (int64_t w = 0; w < n_in / 8; ++w) {
    const uint32_t v = nibbles8(word(s, uint64_t(w)), codes);
    for (int b = 0; b < 4; ++b) row[4 * w + b] = uint8_t(v >> (8 * b));
  }
}

}  // namespace

double random_code_rms(QuantKind kind) { return code_table(kind).rms; }

Tensor unbacked_tensor(DType dtype, Shape shape) {
  // defined(), never dereferenced, and distinct per tensor (a tied lm_head is told from an
  // untied one by its address).
  static std::atomic<uintptr_t> next{uintptr_t{1} << 44};
  Tensor t;
  t.data = reinterpret_cast<void*>(next.fetch_add(uintptr_t{1} << 12));
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

formats::QuantizedTensor random_quantized(const RandomQuantArgs& a, ThreadPool* pool) {
  formats::QuantizedTensor q;
  q.kind = a.kind;
  q.n_out = a.n_out;
  q.n_in = a.n_in;
  q.block_n = a.block_n;
  q.block_k = a.block_k;
  const int64_t n_out = a.n_out, n_in = a.n_in;
  const CodeTable& codes = code_table(a.kind);
  const double base = double(a.stddev) / codes.rms;  // the scale that gives `stddev` on average
  const auto& j = jitter();
  // shapes_only: the same tensors unbacked, no values made.
  const auto make = [&](DType dtype, Shape shape) {
    return a.shapes_only ? unbacked_tensor(dtype, shape) : host_tensor(dtype, shape);
  };
  switch (a.kind) {
    case QuantKind::kFp8Block:
    case QuantKind::kFp8Channel:
    case QuantKind::kFp8Tensor: {
      KILN_CHECK(a.kind != QuantKind::kFp8Block || (a.block_n > 0 && a.block_k > 0))
          << "fp8-block needs a block, got " << a.block_n << " x " << a.block_k;
      q.data = make(DType::kF8E4M3, {n_out, n_in});
      q.scale = a.kind == QuantKind::kFp8Tensor    ? make(DType::kF32, {1})
                : a.kind == QuantKind::kFp8Channel ? make(DType::kF32, {n_out, 1})
                                                   : make(DType::kF32, {ceil_div(n_out, a.block_n), ceil_div(n_in, a.block_k)});
      if (a.shapes_only) break;
      uint8_t* data = q.data.as<uint8_t>();
      for_rows(n_out, n_in, pool, [&](int64_t o) { fill_bytes(data + o * n_in, n_in, row_stream(a.seed, kCodes, o), codes); });
      if (a.kind == QuantKind::kFp8Tensor) {
        q.scale.as<float>()[0] = float(base);
        break;
      }
      const uint64_t s = row_stream(a.seed, kScales, 0);
      for (int64_t i = 0; i < q.scale.numel(); ++i) q.scale.as<float>()[i] = float(base) * j[word(s, uint64_t(i)) & 0xff];
      break;
    }
    case QuantKind::kMxfp4: {
      KILN_CHECK(n_in % 32 == 0) << "mxfp4 n_in " << n_in;
      q.data = make(DType::kU8, {n_out, n_in / 32, 16});
      q.scale = make(DType::kU8, {n_out, n_in / 32});  // e8m0, as the gpt-oss release ships it
      if (a.shapes_only) break;
      // Scale 2^e, e = lo or lo + 1 with P(lo + 1) = p so that E[4^e] = base^2 = 4^t.
      const double t = std::log2(base), lo = std::floor(t);
      const auto p_hi = uint32_t((std::exp2(2.0 * (t - lo)) - 1.0) / 3.0 * 65536.0);
      KILN_CHECK(lo >= -126 && lo <= 126) << "mxfp4 scale 2^" << lo;
      const auto e_lo = uint8_t(127 + int(lo));
      uint8_t* data = q.data.as<uint8_t>();
      uint8_t* scale = q.scale.as<uint8_t>();
      for_rows(n_out, n_in / 2, pool, [&](int64_t o) {
        fill_e2m1_row(data + o * (n_in / 2), n_in, row_stream(a.seed, kCodes, o), codes);
        const uint64_t ss = row_stream(a.seed, kScales, o);
        for (int64_t g = 0; g < n_in / 32; ++g)
          scale[o * (n_in / 32) + g] = uint8_t(e_lo + ((word(ss, uint64_t(g)) & 0xffff) < p_hi ? 1 : 0));
      });
      break;
    }
    case QuantKind::kNvfp4: {
      KILN_CHECK(n_in % 16 == 0) << "nvfp4 n_in " << n_in;
      const CodeTable& block = nvfp4_block_scales();
      q.data = make(DType::kU8, {n_out, n_in / 2});
      q.scale = make(DType::kF8E4M3, {n_out, n_in / 16});
      q.scale2 = make(DType::kF32, {1});
      if (a.shapes_only) break;
      q.scale2.as<float>()[0] = float(base / block.rms);
      uint8_t* data = q.data.as<uint8_t>();
      uint8_t* scale = q.scale.as<uint8_t>();
      for_rows(n_out, n_in / 2, pool, [&](int64_t o) {
        fill_e2m1_row(data + o * (n_in / 2), n_in, row_stream(a.seed, kCodes, o), codes);
        const uint64_t ss = row_stream(a.seed, kScales, o);
        for (int64_t g = 0; g < n_in / 16; ++g) scale[o * (n_in / 16) + g] = block.code[word(ss, uint64_t(g)) & 0xff];
      });
      break;
    }
    case QuantKind::kInt4Group: {
      KILN_CHECK(n_in % 8 == 0 && a.block_k > 0) << "int4 n_in " << n_in << " group " << a.block_k;
      const int64_t groups = ceil_div(n_in, a.block_k);
      q.data = make(DType::kI32, {n_out, n_in / 8});
      q.scale = make(DType::kBF16, {n_out, groups});  // compressed-tensors ships the model dtype
      if (a.shapes_only) break;
      int32_t* data = q.data.as<int32_t>();
      uint16_t* scale = q.scale.as<uint16_t>();
      for_rows(n_out, n_in / 2, pool, [&](int64_t o) {
        const uint64_t s = row_stream(a.seed, kCodes, o);
        for (int64_t w = 0; w < n_in / 8; ++w) data[o * (n_in / 8) + w] = int32_t(nibbles8(word(s, uint64_t(w)), codes));
        const uint64_t ss = row_stream(a.seed, kScales, o);
        for (int64_t g = 0; g < groups; ++g)
          scale[o * groups + g] = f32_to_bf16(float(base) * j[word(ss, uint64_t(g)) & 0xff]);
      });
      break;
    }
    case QuantKind::kNone: KILN_CHECK(false) << "random_quantized of a dense weight";
  }
  return q;
}

}  // namespace kiln::model
