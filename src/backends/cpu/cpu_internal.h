// Private to the CPU backend (and its tests): the backend class, shared by
// cpu_backend.cpp, cpu_attention.cpp, cpu_moe.cpp and cpu_sampling.cpp, and the
// helpers they use to read weights in their stored dtype.
#pragma once

#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "backends/cpu/cpu_backend.h"
#include "ops/backend.h"

namespace kiln::cpu {

// ---- reading stored dtypes -------------------------------------------------

// Fails a check unless `t` holds a dtype the reference reads (f32, bf16, f16).
// Quantized formats come in a later issue.
void check_float_dtype(const Tensor& t, const char* what);

// Element i of a host tensor in f32 / bf16 / f16, as fp32 (exact conversion).
inline float load_f32(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: break;
  }
  KILN_CHECK(false) << "cpu backend: cannot read dtype " << dtype_name(dtype);
  return 0.0f;
}
inline float load_f32(const Tensor& t, int64_t i) { return load_f32(t.data, t.dtype, i); }

// Checks that `w` is a readable 2-D weight with a [n_out] bias if any.
void check_weight(const ops::Weight& w, const char* what);

// Logical row o of a weight (W[o, 0..n_in)) as fp32, dense or quantized (the
// scalar dequant reference of formats/quant.h). bf16_tiles: a quantized row as a
// bf16 GPU pipeline holds it (the bf16-activation mode): value * scale rounded to
// bf16 (exact for MXFP4 and NVFP4, whose global scale a kernel applies in fp32 to
// its result; one rounding for INT4 and FP8).
void weight_row(const ops::Weight& w, int64_t o, float* out, bool bf16_tiles = false);

// y[o] = sum_i x[i] W[o, i] (+ bias[o]) for o in [o_begin, o_end); y is indexed
// by o (y[o_begin] is the first written). Each y[o] is an fp32 sum in ascending
// i, so the result is the same for every storage order and every o range.
// How matvec reads its operands. bf16_tiles: quantized rows as weight_row gives them.
// fp8_act: a weight that formats::fp8_w8a8_eligible takes multiplies x quantized to e4m3
// per 128 inputs (formats::fake_quantize_fp8_act), as the CUDA W8A8 GEMMs do, and is
// read exactly (no bf16 tiles: those GEMMs scale exact code products).
struct MatvecMode {
  bool bf16_tiles = false;
  bool fp8_act = false;
};
void matvec(const ops::Weight& w, const float* x, float* y, int64_t o_begin, int64_t o_end, MatvecMode mode = {});

// Activation tensors of the reference are fp32 on the host.
void check_activation(const Tensor& t, const char* what, int rank);

// ---- routing ----------------------------------------------------------------

// One token's routing decision: experts[k] and weights[k] for k < top_k, in the
// order they were chosen (best first; ties go to the lower expert index).
// logits: [n_experts] fp32; correction_bias: [n_experts] fp32 or nullptr (used
// only by kSigmoidGroupedTopK, where nullptr means zero).
void route(const float* logits, const float* correction_bias, const ops::RouterParams& p,
           int32_t* experts, float* weights);

// ---- the backend ------------------------------------------------------------

class CpuBackend final : public ops::Backend {
 public:
  explicit CpuBackend(const CpuOptions& o)
      : pool_(o.n_threads), bf16_activations_(o.bf16_activations),
        weights_{.bf16_tiles = o.bf16_activations, .fp8_act = o.fp8_activations} {}

  std::string name() const override {
    return std::string("cpu") + (bf16_activations_ ? " (bf16 activations)" : "") +
           (weights_.fp8_act ? " (fp8 activations)" : "");
  }
  DType activation_dtype() const override { return DType::kF32; }

  Tensor alloc(DType dtype, Shape shape) override;
  Tensor upload(const Tensor& host) override;
  void to_host_f32(const Tensor& t, float* out) override;
  void from_host_f32(const float* src, Tensor& t) override;
  // f32 (the activations as they are) or e4m3 with per-row scales (ops/kv_quant.h).
  Status supports_kv_cache(DType dtype) const override {
    return dtype == DType::kF8E4M3 ? Status::Ok() : ops::Backend::supports_kv_cache(dtype);
  }

  void embedding(const ops::EmbeddingArgs& a) override;
  void rms_norm(const ops::RmsNormArgs& a) override;
  void linear(const ops::LinearArgs& a) override;
  void rope(const ops::RopeArgs& a) override;
  void kv_store(const ops::KvStoreArgs& a) override;          // cpu_attention.cpp
  void attention(const ops::AttentionArgs& a) override;       // cpu_attention.cpp
  void mla_store(const ops::MlaStoreArgs& a) override;        // cpu_attention.cpp
  void mla_attention(const ops::MlaArgs& a) override;         // cpu_attention.cpp
  void glu(const ops::GluArgs& a) override;
  void add(const ops::AddArgs& a) override;
  void slice_columns(const ops::SliceColumnsArgs& a) override;
  void moe(const ops::MoeArgs& a) override;                   // cpu_moe.cpp
  void sample(const ops::SampleArgs& a) override;             // cpu_sampling.cpp
  void fill_random(const ops::FillRandomArgs& a) override;
  Status supports_op(ops::OptionalOp) const override { return Status::Ok(); }
  void layer_norm(const ops::LayerNormArgs& a) override;
  void dsa_index_store(const ops::DsaIndexStoreArgs& a) override;  // cpu_attention.cpp
  void dsa_select(const ops::DsaSelectArgs& a) override;           // cpu_attention.cpp
  void sigmoid_mul(const ops::SigmoidMulArgs& a) override;          // cpu_gdn.cpp
  void gated_delta_net(const ops::GatedDeltaNetArgs& a) override;   // cpu_gdn.cpp
  void copy_rows(const ops::CopyRowsArgs& a) override;              // cpu_gdn.cpp
  void after_collective(Tensor& t) override {
    if (t.dtype == DType::kF32) round_output(t);
  }

 private:
  // In bf16-activation mode, rounds the values an op wrote to bf16 (CpuOptions).
  void round_output(const Tensor& t) const {
    if (!bf16_activations_) return;
    float* p = t.as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
  }

  ThreadPool pool_;
  bool bf16_activations_ = false;
  MatvecMode weights_;  // how linear and moe read their weights (CpuOptions)
};

// act = glu(gate, up) for one element (shared by glu and moe).
float glu_one(float gate, float up, const ops::GluParams& p);

}  // namespace kiln::cpu
