// The ops layer is contracts; this file holds the few helpers they share.
#include "ops/backend.h"

#include <algorithm>

#include "core/check.h"

namespace kiln::ops {

std::span<const int32_t> embedding_ids(const EmbeddingArgs& a) {
  if (a.from_batch == BatchIds::kNone) {
    KILN_CHECK(a.ids.dtype == DType::kI32 && a.ids.device == Device::kHost && a.ids.rank() == 1)
        << "embedding: ids must be a host i32 vector, got " << dtype_name(a.ids.dtype) << " " << a.ids.shape;
    return {a.ids.as<int32_t>(), size_t(a.ids.dim(0))};
  }
  KILN_CHECK(a.batch != nullptr) << "embedding: ids from the batch, but no batch";
  switch (a.from_batch) {
    case BatchIds::kTokens: return a.batch->token_ids;
    case BatchIds::kLogitRows: return a.batch->logit_rows;
    default: break;
  }
  KILN_CHECK_EQ(a.batch->input_rows.size(), a.batch->positions.size()) << "embedding: the batch has no input rows";
  return a.batch->input_rows;
}

std::vector<int32_t> batch_token_ids(const BatchMeta& b) {
  std::vector<int32_t> ids = b.token_ids;
  if (b.device_token_rows.empty()) return ids;
  KILN_CHECK(b.device_token_rows.size() == ids.size() && b.device_tokens.dtype == DType::kI32 &&
             b.device_tokens.device == Device::kHost)
      << "batch: device token rows need " << ids.size() << " entries and host i32 tokens";
  for (size_t r = 0; r < ids.size(); ++r) {
    const int32_t at = b.device_token_rows[r];
    if (at < 0) continue;
    KILN_CHECK_LT(at, b.device_tokens.numel()) << "batch: device token index at row " << r;
    ids[r] = b.device_tokens.as<int32_t>()[at];
  }
  return ids;
}

void Backend::to_host_i32(const Tensor& t, int32_t* out) {
  KILN_CHECK(t.dtype == DType::kI32 && t.device == Device::kHost) << name() << ": to_host_i32 of a non-host or non-i32 tensor";
  std::copy_n(t.as<int32_t>(), t.numel(), out);
}

void Backend::argmax(const ArgmaxArgs& a) {
  const int64_t n = a.logits.dim(0);
  KILN_CHECK(a.out.dtype == DType::kI32 && a.out.device == Device::kHost && a.out.numel() >= n)
      << name() << ": argmax into " << dtype_name(a.out.dtype) << " " << a.out.shape;
  const std::vector<SamplingParams> params(static_cast<size_t>(n));  // temperature 0
  const std::vector<float> uniform(static_cast<size_t>(n), 0.0f);
  sample({.logits = a.logits, .params = params, .uniform = uniform,
          .tokens = std::span<int32_t>(a.out.as<int32_t>(), static_cast<size_t>(n))});
}

void Backend::linears(const LinearsArgs& a) {
  for (size_t i = 0; i < a.w.size() && a.w[i] != nullptr; ++i) linear({.x = a.x, .w = a.w[i], .out = a.out[i]});
}

void Backend::qk_norm_rope(const QkNormRopeArgs& a) {
  for (const auto& [x, weight] : {std::pair{a.q, a.q_norm}, std::pair{a.k, a.k_norm}}) {
    KILN_CHECK(x.rank() == 3) << "qk_norm_rope: q / k must be [n_tokens, heads, d_head], got " << x.shape;
    if (weight.defined()) {
      const Tensor rows = x.reshape({x.dim(0) * x.dim(1), x.dim(2)});
      rms_norm({.x = rows, .weight = weight, .out = rows, .eps = a.eps});
    }
    rope({.x = x, .batch = a.batch, .table = a.table});
  }
  if (a.store != nullptr) {
    KILN_CHECK(a.store->k.data == a.k.data && a.store->k.shape == a.k.shape)
        << "qk_norm_rope: store.k must be the k this op rotates";
    kv_store(*a.store);
  }
}

const char* optional_op_name(OptionalOp op) {
  switch (op) {
    case OptionalOp::kDsa: return "DeepSeek sparse attention (layer_norm, dsa_index_store, dsa_select, MLA over selected positions)";
    case OptionalOp::kGatedDeltaNet: return "Gated DeltaNet linear attention (gated_delta_net, sigmoid_mul, copy_rows)";
    case OptionalOp::kStateSnapshots: return "Gated DeltaNet state snapshots per row (speculative decoding of recurrent models)";
  }
  return "?";
}

Status Backend::supports_op(OptionalOp op) const {
  return unsupported("the " + name() + " backend does not implement " + optional_op_name(op));
}

void Backend::layer_norm(const LayerNormArgs&) {
  KILN_CHECK(false) << "the " << name() << " backend has no layer_norm op (" << optional_op_name(OptionalOp::kDsa) << ")";
}
void Backend::dsa_index_store(const DsaIndexStoreArgs&) {
  KILN_CHECK(false) << "the " << name() << " backend has no dsa_index_store op";
}
void Backend::dsa_select(const DsaSelectArgs&) {
  KILN_CHECK(false) << "the " << name() << " backend has no dsa_select op";

}

void Backend::sigmoid_mul(const SigmoidMulArgs&) {
  KILN_CHECK(false) << "sigmoid_mul: the " << name() << " backend does not have it (OptionalOp::kGatedDeltaNet)";
}

void Backend::copy_rows(const CopyRowsArgs&) {
  KILN_CHECK(false) << "copy_rows: the " << name() << " backend does not have it (OptionalOp::kGatedDeltaNet)";
}

void Backend::gated_delta_net(const GatedDeltaNetArgs&) {
  KILN_CHECK(false) << "gated_delta_net: the " << name() << " backend does not have it (OptionalOp::kGatedDeltaNet)";
}

}  // namespace kiln::ops
