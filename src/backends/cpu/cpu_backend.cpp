// The CPU reference backend: memory ops and the dense ops (embedding, rms_norm,
// linear, rope, glu, add). Attention lives in cpu_attention.cpp, MoE in cpu_moe.cpp.
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_internal.h"
#include "ops/random.h"

namespace kiln::cpu {

// ---- helpers shared by the backend's files ----------------------------------

void check_float_dtype(const Tensor& t, const char* what) {
  KILN_CHECK(t.device == Device::kHost) << "cpu backend: " << what << " is not in host memory";
  KILN_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16)
      << "cpu backend: " << what << " has dtype " << dtype_name(t.dtype)
      << "; the reference reads f32, bf16 and f16 only (quantized formats come later)";
}

void check_weight(const ops::Weight& w, const char* what) {
  KILN_CHECK(w.defined()) << "cpu backend: weight " << what << " is undefined";
  if (!w.quantized()) {
    KILN_CHECK_EQ(w.data.rank(), 2) << "cpu backend: weight " << what << " " << w.data.shape;
    check_float_dtype(w.data, what);
  }
  if (w.bias.defined()) {
    check_float_dtype(w.bias, what);
    KILN_CHECK_EQ(w.bias.numel(), w.n_out()) << "cpu backend: bias of weight " << what;
  }
}

void check_activation(const Tensor& t, const char* what, int rank) {
  KILN_CHECK(t.defined()) << "cpu backend: " << what << " is undefined";
  KILN_CHECK(t.device == Device::kHost) << "cpu backend: " << what << " is not in host memory";
  KILN_CHECK(t.dtype == DType::kF32) << "cpu backend: " << what << " has dtype "
                                     << dtype_name(t.dtype) << ", activations are f32";
  KILN_CHECK_EQ(t.rank(), rank) << "cpu backend: rank of " << what << " " << t.shape;
}

namespace {

// Element i of a weight stored as T, as fp32 (the same exact conversions as load_f32).
inline float load_as(const float* p, int64_t i) { return p[i]; }
inline float load_as(const bf16* p, int64_t i) { return bf16_to_f32(p[i].bits); }
inline float load_as(const f16* p, int64_t i) { return f16_to_f32(p[i].bits); }

// matvec for one storage type: the dtype dispatch happens once per call, not
// per element; the arithmetic and its order are those documented on matvec().
template <typename T>
void matvec_typed(const ops::Weight& w, const float* x, float* y, int64_t o_begin, int64_t o_end) {
  const T* data = static_cast<const T*>(w.data.data);
  const int64_t n_in = w.n_in();
  if (!w.transposed) {
    // W[o, :] is row o: one dot product per output.
    for (int64_t o = o_begin; o < o_end; ++o) {
      const T* row = data + o * n_in;
      float acc = 0.0f;
      for (int64_t i = 0; i < n_in; ++i) acc += x[i] * load_as(row, i);
      y[o - o_begin] = acc;
    }
  } else {
    // Stored [n_in, n_out]: sweep rows of the storage so reads are contiguous.
    // Every y[o] still accumulates x[i] W[o, i] in ascending i, as above.
    const int64_t n_out = w.n_out();
    for (int64_t o = o_begin; o < o_end; ++o) y[o - o_begin] = 0.0f;
    for (int64_t i = 0; i < n_in; ++i) {
      const T* row = data + i * n_out;
      for (int64_t o = o_begin; o < o_end; ++o) y[o - o_begin] += x[i] * load_as(row, o);
    }
  }
}

}  // namespace

namespace {

void dequantize_row_as(const formats::QuantizedTensor& q, int64_t o, float* out, bool bf16_tiles) {
  formats::dequantize_row(q, o, out);
  if (!bf16_tiles || q.kind == formats::QuantKind::kMxfp4 || q.kind == formats::QuantKind::kNvfp4) return;
  for (int64_t i = 0; i < q.n_in; ++i) out[i] = bf16_to_f32(f32_to_bf16(out[i]));
}

}  // namespace

void weight_row(const ops::Weight& w, int64_t o, float* out, bool bf16_tiles) {
  if (w.quantized()) {
    dequantize_row_as(w.quant, o, out, bf16_tiles);
    return;
  }
  const int64_t n_in = w.n_in(), n_out = w.n_out();
  for (int64_t i = 0; i < n_in; ++i) out[i] = load_f32(w.data, w.transposed ? i * n_out + o : o * n_in + i);
}

void matvec(const ops::Weight& w, const float* x, float* y, int64_t o_begin, int64_t o_end, MatvecMode mode) {
  if (w.quantized()) {
    // Dequantize one row at a time (block by block of the format), then the same
    // ascending-i fp32 dot product as the dense path.
    std::vector<float> row(size_t(w.n_in())), xq;
    if (mode.fp8_act && formats::fp8_w8a8_eligible(w.quant)) {
      // W8A8 multiplies e4m3 codes by codes and scales the sums: the weight exactly.
      xq.resize(size_t(w.n_in()));
      formats::fake_quantize_fp8_act(x, w.n_in(), xq.data());
      x = xq.data();
      mode.bf16_tiles = false;
    }
    for (int64_t o = o_begin; o < o_end; ++o) {
      dequantize_row_as(w.quant, o, row.data(), mode.bf16_tiles);
      float acc = 0.0f;
      for (int64_t i = 0; i < w.n_in(); ++i) acc += x[i] * row[size_t(i)];
      y[o - o_begin] = acc;
    }
  } else {
    switch (w.data.dtype) {
      case DType::kF32: matvec_typed<float>(w, x, y, o_begin, o_end); break;
      case DType::kBF16: matvec_typed<bf16>(w, x, y, o_begin, o_end); break;
      case DType::kF16: matvec_typed<f16>(w, x, y, o_begin, o_end); break;
      default: KILN_CHECK(false) << "matvec: cannot read weight dtype " << dtype_name(w.data.dtype);
    }
  }
  if (w.bias.defined()) {
    for (int64_t o = o_begin; o < o_end; ++o) y[o - o_begin] += load_f32(w.bias, o);
  }
}

float glu_one(float gate, float up, const ops::GluParams& p) {
  switch (p.kind) {
    case ops::GluKind::kSilu: return gate / (1.0f + std::exp(-gate)) * up;
    case ops::GluKind::kGptOssClamp: {
      const float g = std::min(gate, p.limit);
      const float u = std::clamp(up, -p.limit, p.limit);
      const float sig = 1.0f / (1.0f + std::exp(-p.alpha * g));
      return (u + 1.0f) * (g * sig);
    }
  }
  KILN_CHECK(false) << "glu: unknown GluKind " << int(p.kind);
  return 0.0f;
}

// ---- memory -------------------------------------------------------------------

Tensor CpuBackend::alloc(DType dtype, Shape shape) { return host_tensor(dtype, shape); }

Tensor CpuBackend::upload(const Tensor& host) {
  KILN_CHECK(host.device == Device::kHost) << "upload: source is not in host memory";
  return host;
}

void CpuBackend::to_host_f32(const Tensor& t, float* out) { to_f32(t, out); }

void CpuBackend::from_host_f32(const float* src, Tensor& t) {
  check_activation(t, "from_host_f32 destination", t.rank());
  std::memcpy(t.data, src, size_t(t.numel()) * sizeof(float));
}

// ---- embedding ----------------------------------------------------------------

// out[t, :] = table[ids[t] - id_begin, :] (zero for ids outside the table's slice)
void CpuBackend::embedding(const ops::EmbeddingArgs& a) {
  KILN_CHECK_EQ(a.table.rank(), 2) << "embedding: table " << a.table.shape;
  check_float_dtype(a.table, "embedding table");
  std::span<const int32_t> id_span = ops::embedding_ids(a);
  std::vector<int32_t> patched;  // token ids still in device_tokens (speculative drafts)
  if (a.from_batch == ops::BatchIds::kTokens && !a.batch->device_token_rows.empty()) {
    patched = ops::batch_token_ids(*a.batch);
    id_span = patched;
  }
  check_activation(a.out, "embedding out", 2);
  const int64_t n_tokens = int64_t(id_span.size()), rows = a.table.dim(0), d_model = a.table.dim(1);
  const int64_t vocab = a.vocab_size > 0 ? a.vocab_size : rows;
  KILN_CHECK(a.id_begin >= 0 && a.id_begin + rows <= vocab)
      << "embedding: table rows [" << a.id_begin << ", " << a.id_begin + rows << ") of vocab " << vocab;
  KILN_CHECK_EQ(a.out.dim(0), n_tokens) << "embedding: out.dim(0) vs the number of ids";
  KILN_CHECK_EQ(a.out.dim(1), d_model) << "embedding: out.dim(1) vs table.dim(1)";
  const int32_t* ids = id_span.data();
  float* out = a.out.as<float>();
  for (int64_t t = 0; t < n_tokens; ++t) {
    KILN_CHECK(ids[t] >= 0 && ids[t] < vocab)
        << "embedding: token id " << ids[t] << " at row " << t << " outside vocab " << vocab;
    const int64_t row = int64_t(ids[t]) - a.id_begin;
    for (int64_t i = 0; i < d_model; ++i)
      out[t * d_model + i] = row >= 0 && row < rows ? load_f32(a.table, row * d_model + i) : 0.0f;
  }
  round_output(a.out);
}

// ---- rms_norm -----------------------------------------------------------------

// out = v / sqrt(mean(v^2) + eps) * weight, v = x or (residual += x).
void CpuBackend::rms_norm(const ops::RmsNormArgs& a) {
  check_activation(a.x, "rms_norm x", 2);
  check_activation(a.out, "rms_norm out", 2);
  check_float_dtype(a.weight, "rms_norm weight");
  KILN_CHECK_EQ(a.weight.rank(), 1) << "rms_norm: weight " << a.weight.shape;
  const int64_t rows = a.x.dim(0), dim = a.x.dim(1);
  KILN_CHECK_EQ(a.weight.dim(0), dim) << "rms_norm: weight.dim(0) vs x.dim(1)";
  KILN_CHECK_EQ(a.out.shape, a.x.shape) << "rms_norm: out.shape vs x.shape";
  const bool has_residual = a.residual.defined();
  if (has_residual) {
    check_activation(a.residual, "rms_norm residual", 2);
    KILN_CHECK_EQ(a.residual.shape, a.x.shape) << "rms_norm: residual.shape vs x.shape";
  }
  const float* x = a.x.as<float>();
  float* res = has_residual ? a.residual.as<float>() : nullptr;
  float* out = a.out.as<float>();
  pool_.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      // The whole row of x is read (into the residual) before out is written,
      // so out may alias x.
      const float* v = x + r * dim;
      if (has_residual) {
        for (int64_t i = 0; i < dim; ++i) {
          res[r * dim + i] += v[i];
          if (bf16_activations_) res[r * dim + i] = bf16_to_f32(f32_to_bf16(res[r * dim + i]));
        }
        v = res + r * dim;
      }
      float sum_sq = 0.0f;
      for (int64_t i = 0; i < dim; ++i) sum_sq += v[i] * v[i];
      const float inv_rms = 1.0f / std::sqrt(sum_sq / float(dim) + a.eps);
      for (int64_t i = 0; i < dim; ++i)
        out[r * dim + i] = v[i] * inv_rms * load_f32(a.weight, i);
    }
  }, 16);
  round_output(a.out);
}

// out = (x - mean) / sqrt(var + eps) * weight + bias per row, fp32, mean first then
// the biased variance (torch.nn.LayerNorm).
void CpuBackend::layer_norm(const ops::LayerNormArgs& a) {
  check_activation(a.x, "layer_norm x", 2);
  check_activation(a.out, "layer_norm out", 2);
  check_float_dtype(a.weight, "layer_norm weight");
  const int64_t rows = a.x.dim(0), dim = a.x.dim(1);
  KILN_CHECK(a.weight.rank() == 1 && a.weight.dim(0) == dim) << "layer_norm: weight " << a.weight.shape << " vs x " << a.x.shape;
  if (a.bias.defined()) {
    check_float_dtype(a.bias, "layer_norm bias");
    KILN_CHECK(a.bias.rank() == 1 && a.bias.dim(0) == dim) << "layer_norm: bias " << a.bias.shape << " vs x " << a.x.shape;
  }
  KILN_CHECK_EQ(a.out.shape, a.x.shape) << "layer_norm: out.shape vs x.shape";
  const float* x = a.x.as<float>();
  float* out = a.out.as<float>();
  pool_.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* v = x + r * dim;
      float mean = 0.0f, var = 0.0f;
      for (int64_t i = 0; i < dim; ++i) mean += v[i];
      mean /= float(dim);
      for (int64_t i = 0; i < dim; ++i) var += (v[i] - mean) * (v[i] - mean);
      const float inv_std = 1.0f / std::sqrt(var / float(dim) + a.eps);
      for (int64_t i = 0; i < dim; ++i) {  // reads v[i] before writing out[i]: out may alias x
        out[r * dim + i] = (v[i] - mean) * inv_std * load_f32(a.weight, i) + (a.bias.defined() ? load_f32(a.bias, i) : 0.0f);
      }
    }
  }, 16);
  round_output(a.out);
}

// ---- linear -------------------------------------------------------------------

// out[t, o] = sum_i x[t, i] W[o, i] (+ bias[o]); threaded over output columns so
// decode (one token) uses every thread too.
void CpuBackend::linear(const ops::LinearArgs& a) {
  KILN_CHECK(a.w != nullptr) << "linear: weight is null";
  check_weight(*a.w, "linear");
  check_activation(a.x, "linear x", 2);
  check_activation(a.out, "linear out", 2);
  const int64_t n_tokens = a.x.dim(0), n_in = a.w->n_in(), n_out = a.w->n_out();
  KILN_CHECK_EQ(a.x.dim(1), n_in) << "linear: x.dim(1) vs w.n_in() " << a.w->data.shape
                                  << (a.w->transposed ? " (transposed)" : "");
  KILN_CHECK_EQ(a.out.dim(0), n_tokens) << "linear: out.dim(0) vs x.dim(0)";
  KILN_CHECK_EQ(a.out.dim(1), n_out) << "linear: out.dim(1) vs w.n_out()";
  const float* x = a.x.as<float>();
  float* out = a.out.as<float>();
  pool_.parallel_for(n_out, [&](int64_t o0, int64_t o1) {
    for (int64_t t = 0; t < n_tokens; ++t) matvec(*a.w, x + t * n_in, out + t * n_out + o0, o0, o1, weights_);
  }, 16);
  round_output(a.out);
}

// ---- rope ---------------------------------------------------------------------

// Rotates pairs (x1, x2) of each head in place: x1' = x1 cos - x2 sin,
// x2' = x2 cos + x1 sin, with angle = float(pos) * inv_freq[i] in fp32 (as
// transformers computes it) and cos, sin scaled by attention_factor.
void CpuBackend::rope(const ops::RopeArgs& a) {
  KILN_CHECK(a.table != nullptr && a.batch != nullptr) << "rope: table or batch is null";
  KILN_CHECK_EQ(int64_t(a.batch->positions.size()), a.x.dim(0)) << "rope: batch.positions.size() vs x.dim(0)";
  check_activation(a.x, "rope x", 3);
  const ops::RopeTable& tab = *a.table;
  const int64_t n_tokens = a.x.dim(0), n_heads = a.x.dim(1), d_head = a.x.dim(2);
  const int64_t half = tab.d_rot / 2;
  KILN_CHECK(tab.d_rot > 0 && tab.d_rot % 2 == 0) << "rope: d_rot " << tab.d_rot;
  KILN_CHECK_LE(int64_t(tab.d_rot), d_head) << "rope: table.d_rot vs x.dim(2)";
  KILN_CHECK_EQ(int64_t(tab.inv_freq.size()), half) << "rope: inv_freq.size() vs d_rot/2";
  float* x = a.x.as<float>();
  pool_.parallel_for(n_tokens, [&](int64_t t0, int64_t t1) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t t = t0; t < t1; ++t) {
      const float pos = float(a.batch->positions[size_t(t)]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * tab.inv_freq[i];
        cos_v[i] = std::cos(angle) * tab.attention_factor;
        sin_v[i] = std::sin(angle) * tab.attention_factor;
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * d_head;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i1 = tab.style == ops::RopeStyle::kHalf ? i : 2 * i;
          const int64_t i2 = tab.style == ops::RopeStyle::kHalf ? i + half : 2 * i + 1;
          const float x1 = v[i1], x2 = v[i2];
          v[i1] = x1 * cos_v[i] - x2 * sin_v[i];
          v[i2] = x2 * cos_v[i] + x1 * sin_v[i];
        }
      }
    }
  }, 4);
  round_output(a.x);
}

// ---- glu, add -------------------------------------------------------------------

void CpuBackend::glu(const ops::GluArgs& a) {
  check_activation(a.gate, "glu gate", 2);
  check_activation(a.up, "glu up", 2);
  check_activation(a.out, "glu out", 2);
  KILN_CHECK_EQ(a.up.shape, a.gate.shape) << "glu: up.shape vs gate.shape";
  KILN_CHECK_EQ(a.out.shape, a.gate.shape) << "glu: out.shape vs gate.shape";
  const float* g = a.gate.as<float>();
  const float* u = a.up.as<float>();
  float* out = a.out.as<float>();
  const int64_t n = a.gate.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = glu_one(g[i], u[i], a.params);
  round_output(a.out);
}

void CpuBackend::fill_random(const ops::FillRandomArgs& a) {
  KILN_CHECK(a.out.device == Device::kHost) << "fill_random: not a host tensor";
  const int64_t n = a.out.numel();
  pool_.parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float v = a.mean + a.stddev * ops::unit_normal(a.seed, uint64_t(i));
      if (a.out.dtype == DType::kF32) a.out.as<float>()[i] = v;
      else if (a.out.dtype == DType::kBF16) a.out.as<uint16_t>()[i] = f32_to_bf16(v);
      else KILN_CHECK(false) << "fill_random: dtype " << dtype_name(a.out.dtype);
    }
  });
}

void CpuBackend::add(const ops::AddArgs& a) {
  check_activation(a.a, "add a", a.a.rank());
  check_activation(a.b, "add b", a.a.rank());
  check_activation(a.out, "add out", a.a.rank());
  KILN_CHECK_EQ(a.b.shape, a.a.shape) << "add: b.shape vs a.shape";
  KILN_CHECK_EQ(a.out.shape, a.a.shape) << "add: out.shape vs a.shape";
  const float* x = a.a.as<float>();
  const float* y = a.b.as<float>();
  float* out = a.out.as<float>();
  const int64_t n = a.a.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
  round_output(a.out);
}

void CpuBackend::slice_columns(const ops::SliceColumnsArgs& a) {
  check_activation(a.src, "slice_columns src", 2);
  check_activation(a.dst, "slice_columns dst", 2);
  KILN_CHECK_EQ(a.dst.dim(0), a.src.dim(0)) << "slice_columns: dst rows vs src rows";
  const int64_t rows = a.src.dim(0), n_src = a.src.dim(1), n_dst = a.dst.dim(1), n = ops::slice_width(a);
  KILN_CHECK(a.col_begin >= 0 && n > 0 && a.col_begin + n <= n_src)
      << "slice_columns: columns [" << a.col_begin << ", " << a.col_begin + n << ") of " << n_src;
  KILN_CHECK(a.dst_col_begin >= 0 && a.dst_col_begin + n <= n_dst)
      << "slice_columns: dst columns [" << a.dst_col_begin << ", " << a.dst_col_begin + n << ") of " << n_dst;
  const float* src = a.src.as<float>();
  float* dst = a.dst.as<float>();
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * n_dst + a.dst_col_begin, src + r * n_src + a.col_begin, size_t(n) * sizeof(float));
}

std::unique_ptr<ops::Backend> make_cpu_backend(int n_threads) {
  return std::make_unique<CpuBackend>(CpuOptions{.n_threads = n_threads});
}

std::unique_ptr<ops::Backend> make_cpu_backend(const CpuOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace kiln::cpu
