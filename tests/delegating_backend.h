// Test helper: a Backend that hands every call to another one (the CPU reference by
// default), for tests that watch or break one op (override it, call inner_ for the rest).
#pragma once

#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "ops/backend.h"

namespace kiln::testing {

class DelegatingBackend : public ops::Backend {
 public:
  explicit DelegatingBackend(std::unique_ptr<ops::Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "delegating-" + inner_->name(); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  Tensor alloc(DType d, Shape s) override { return inner_->alloc(d, s); }
  Tensor upload(const Tensor& t) override { return inner_->upload(t); }
  void to_host_f32(const Tensor& t, float* out) override { inner_->to_host_f32(t, out); }
  void from_host_f32(const float* src, Tensor& t) override { inner_->from_host_f32(src, t); }
  Result<formats::QuantizedTensor> upload_quantized(const formats::QuantizedTensor& q) override {
    return inner_->upload_quantized(q);
  }
  Result<int64_t> quantized_bytes(const formats::QuantizedTensor& q) const override {
    return inner_->quantized_bytes(q);
  }
  void after_collective(Tensor& t) override { inner_->after_collective(t); }
  void release_step_memory() override { inner_->release_step_memory(); }
  Status supports_kv_cache(DType d) const override { return inner_->supports_kv_cache(d); }
  void embedding(const ops::EmbeddingArgs& a) override { inner_->embedding(a); }
  void rms_norm(const ops::RmsNormArgs& a) override { inner_->rms_norm(a); }
  void linear(const ops::LinearArgs& a) override { inner_->linear(a); }
  void rope(const ops::RopeArgs& a) override { inner_->rope(a); }
  void kv_store(const ops::KvStoreArgs& a) override { inner_->kv_store(a); }
  void attention(const ops::AttentionArgs& a) override { inner_->attention(a); }
  void mla_store(const ops::MlaStoreArgs& a) override { inner_->mla_store(a); }
  void mla_attention(const ops::MlaArgs& a) override { inner_->mla_attention(a); }
  void glu(const ops::GluArgs& a) override { inner_->glu(a); }
  void add(const ops::AddArgs& a) override { inner_->add(a); }
  void slice_columns(const ops::SliceColumnsArgs& a) override { inner_->slice_columns(a); }
  void moe(const ops::MoeArgs& a) override { inner_->moe(a); }
  void sample(const ops::SampleArgs& a) override { inner_->sample(a); }
  void fill_random(const ops::FillRandomArgs& a) override { inner_->fill_random(a); }
  Status supports_op(ops::OptionalOp op) const override { return inner_->supports_op(op); }
  void layer_norm(const ops::LayerNormArgs& a) override { inner_->layer_norm(a); }
  void dsa_index_store(const ops::DsaIndexStoreArgs& a) override { inner_->dsa_index_store(a); }
  void dsa_select(const ops::DsaSelectArgs& a) override { inner_->dsa_select(a); }
  void sigmoid_mul(const ops::SigmoidMulArgs& a) override { inner_->sigmoid_mul(a); }
  void gated_delta_net(const ops::GatedDeltaNetArgs& a) override { inner_->gated_delta_net(a); }
  void copy_rows(const ops::CopyRowsArgs& a) override { inner_->copy_rows(a); }

 protected:
  std::unique_ptr<ops::Backend> inner_;
};

}  // namespace kiln::testing
