// CudaBackend's DeepSeek sparse attention ops (OptionalOp::kDsa): layer_norm,
// dsa_index_store and dsa_select (kernels/dsa.cu); mla_attention's `selected` is in
// cuda_ops.cpp. Argument checks at entry, then the kernels; no host synchronization
// (the ops run inside recorded decode graphs).
#include "backends/cuda/cuda_backend_impl.h"

namespace kiln::cuda {
namespace {

void check_bf16(const Tensor& t, int rank, const char* what) {
  KILN_CHECK(t.defined() && t.device == Device::kCuda && t.dtype == DType::kBF16 && t.rank() == rank)
      << "cuda: " << what << " must be a rank-" << rank << " bf16 device tensor (dtype " << dtype_name(t.dtype)
      << ", shape " << t.shape << ")";
}

// The index cache [n_blocks, block_size, d_index]: bf16 without scales, or e4m3 with
// fp32 scales [n_blocks, block_size].
DsaIndexCacheView check_index_cache(const Tensor& cache, const Tensor& scale, const char* op) {
  KILN_CHECK(cache.defined() && cache.device == Device::kCuda && cache.rank() == 3 &&
             (cache.dtype == DType::kBF16 || cache.dtype == DType::kF8E4M3))
      << op << ": index_cache must be a bf16 or e4m3 device tensor [n_blocks, block_size, d_index] (dtype "
      << dtype_name(cache.dtype) << ", shape " << cache.shape << ")";
  const bool fp8 = cache.dtype == DType::kF8E4M3;
  if (!fp8) {
    KILN_CHECK(!scale.defined()) << op << ": a bf16 index cache with scales (only an e4m3 cache has them)";
    return {.data = cache.data, .scale = nullptr, .fp8 = false};
  }
  KILN_CHECK(scale.defined() && scale.device == Device::kCuda && scale.dtype == DType::kF32 && scale.rank() == 2 &&
             scale.dim(0) == cache.dim(0) && scale.dim(1) == cache.dim(1))
      << op << ": an e4m3 index cache " << cache.shape << " needs f32 scales [" << cache.dim(0) << ", "
      << cache.dim(1) << "] (got " << scale.shape << ")";
  return {.data = cache.data, .scale = scale.as<float>(), .fp8 = true};
}

}  // namespace

// The optional ops it has (Gated DeltaNet and its state snapshots: cuda_gdn.cpp).
Status CudaBackend::supports_op(ops::OptionalOp op) const {
  if (op == ops::OptionalOp::kGatedDeltaNet || op == ops::OptionalOp::kStateSnapshots) return Status::Ok();
  if (op == ops::OptionalOp::kDsa) {
    if (dsa_disabled_.empty()) return Status::Ok();
    return unsupported("the cuda backend's DeepSeek sparse attention kernels failed the start-up self-test (" +
                       dsa_disabled_ + ")");
  }
  return ops::Backend::supports_op(op);
}

void CudaBackend::layer_norm(const ops::LayerNormArgs& a) {
  check_bf16(a.x, 2, "layer_norm x");
  check_bf16(a.out, 2, "layer_norm out");
  KILN_CHECK_EQ(a.out.shape, a.x.shape) << "layer_norm: out.shape vs x.shape";
  const int64_t rows = a.x.dim(0), dim = a.x.dim(1);
  KILN_CHECK(a.weight.defined() && a.weight.device == Device::kCuda && a.weight.dtype == DType::kF32 &&
             a.weight.numel() == dim)
      << "layer_norm: weight must be an fp32 device vector of " << dim << " (got " << dtype_name(a.weight.dtype)
      << " " << a.weight.shape << ")";
  const float* bias = nullptr;
  if (a.bias.defined()) {
    KILN_CHECK(a.bias.device == Device::kCuda && a.bias.dtype == DType::kF32 && a.bias.numel() == dim)
        << "layer_norm: bias must be an fp32 device vector of " << dim << " (got " << dtype_name(a.bias.dtype) << " "
        << a.bias.shape << ")";
    bias = a.bias.as<float>();
  }
  launch_layer_norm(a.x.as<bf16>(), a.weight.as<float>(), bias, a.out.as<bf16>(), rows, dim, a.eps, stream_);
}

void CudaBackend::dsa_index_store(const ops::DsaIndexStoreArgs& a) {
  const DeviceBatch& b = batch_for(a.batch);
  check_bf16(a.k, 2, "dsa_index_store k");
  const DsaIndexCacheView cache = check_index_cache(a.index_cache, a.index_scale, "dsa_index_store");
  const int64_t n_tokens = a.k.dim(0), d_index = a.k.dim(1);
  KILN_CHECK_EQ(a.index_cache.dim(2), d_index) << "dsa_index_store: index_cache.dim(2) vs k.dim(1) (d_index)";
  KILN_CHECK_EQ(n_tokens, int64_t(b.n_tokens)) << "dsa_index_store: k.dim(0) vs the batch's tokens";
  KILN_CHECK_EQ(a.index_cache.dim(1), int64_t(b.block_size)) << "dsa_index_store: index_cache.dim(1) vs block_size";
  if (cache.fp8) {  // one row per token, its own scale (ops/kv_quant.h)
    launch_store_rows_e4m3(a.k.as<bf16>(), a.index_cache.as<uint8_t>(), a.index_scale.as<float>(), b.slot_mapping,
                           n_tokens, 1, d_index, d_index, 0, 1, 0, stream_);
    return;
  }
  const StoreRowSet set{.x = a.k.as<bf16>(), .cache = a.index_cache.as<bf16>(), .row_elems = d_index};
  launch_store_rows(&set, 1, b.slot_mapping, n_tokens, d_index, stream_);
}

void CudaBackend::dsa_select(const ops::DsaSelectArgs& a) {
  const ScratchScope scratch_scope(op_scratch_);
  const DeviceBatch& b = batch_for(a.batch);
  check_bf16(a.q, 3, "dsa_select q");
  check_bf16(a.weights, 2, "dsa_select weights");
  const DsaIndexCacheView cache = check_index_cache(a.index_cache, a.index_scale, "dsa_select");
  const int64_t n_tokens = a.q.dim(0), n_heads = a.q.dim(1), d_index = a.q.dim(2);
  KILN_CHECK_EQ(a.index_cache.dim(2), d_index) << "dsa_select: index_cache.dim(2) vs q.dim(2) (d_index)";
  KILN_CHECK(a.weights.dim(0) == n_tokens && a.weights.dim(1) == n_heads)
      << "dsa_select: weights " << a.weights.shape << " vs q " << a.q.shape;
  KILN_CHECK_EQ(n_tokens, int64_t(b.n_tokens)) << "dsa_select: q.dim(0) vs the batch's tokens";
  KILN_CHECK_EQ(a.index_cache.dim(1), int64_t(b.block_size)) << "dsa_select: index_cache.dim(1) vs block_size";
  KILN_CHECK(a.selected.defined() && a.selected.device == Device::kCuda && a.selected.dtype == DType::kI32 &&
             a.selected.rank() == 2 && a.selected.dim(0) == n_tokens && a.selected.dim(1) > 0)
      << "dsa_select: selected must be a device i32 [n_tokens, top_k], got " << dtype_name(a.selected.dtype) << " "
      << a.selected.shape;
  if (n_tokens == 0) return;
  uint32_t* keys = scratch<uint32_t>(int64_t(dsa_select_plan(b).scratch_words), op_scratch_);
  launch_dsa_select(a.q.as<bf16>(), a.weights.as<bf16>(), cache, a.selected.as<int32_t>(), keys, b, int(n_heads),
                    int(d_index), int(a.selected.dim(1)), a.scale, a.weight_scale, smem_cap_, stream_);
}

}  // namespace kiln::cuda
