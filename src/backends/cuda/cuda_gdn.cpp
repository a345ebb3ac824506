// CudaBackend's Gated DeltaNet ops (OptionalOp::kGatedDeltaNet): gated_delta_net,
// sigmoid_mul and copy_rows; argument checks as the CPU reference makes them, then the
// kernels of kernels/gated_delta_net.cu.
#include "backends/cuda/cuda_backend_impl.h"

namespace kiln::cuda {
namespace {

void check_bf16(const Tensor& t, const char* what, int rank) {
  KILN_CHECK(t.defined() && t.device == Device::kCuda && t.dtype == DType::kBF16 && t.rank() == rank)
      << "cuda: " << what << " must be a rank-" << rank << " bf16 device tensor (dtype " << dtype_name(t.dtype)
      << ", shape " << t.shape << ")";
}

const float* f32_vector(const Tensor& t, int64_t n, const char* what) {
  KILN_CHECK(t.defined() && t.device == Device::kCuda && t.dtype == DType::kF32 && t.numel() == n)
      << "cuda: gated_delta_net " << what << " must be an fp32 device vector of " << n << " (dtype "
      << dtype_name(t.dtype) << ", shape " << t.shape << ")";
  return t.as<float>();
}

}  // namespace

void CudaBackend::sigmoid_mul(const ops::SigmoidMulArgs& a) {
  check_bf16(a.x, "sigmoid_mul x", 2);
  check_bf16(a.gate, "sigmoid_mul gate", 2);
  check_bf16(a.out, "sigmoid_mul out", 2);
  ops::check_sigmoid_mul_args(a);
  const int64_t rows = a.x.dim(0), n = a.x.dim(1), gn = a.gate.dim(1);
  launch_sigmoid_mul(a.x.as<bf16>(), a.gate.as<bf16>(), a.out.as<bf16>(), rows, n, gn, stream_);
}

void CudaBackend::copy_rows(const ops::CopyRowsArgs& a) {
  KILN_CHECK(a.src.device == Device::kCuda && a.dst.device == Device::kCuda) << "copy_rows: host tensors on cuda";
  const int64_t bytes = ops::check_copy_rows_args(a);
  const char* src = static_cast<const char*>(a.src.data) + a.src_row * bytes;
  char* dst = static_cast<char*>(a.dst.data) + a.dst_row * bytes;
  if (src == dst || bytes == 0) return;  // distinct rows never overlap
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::gated_delta_net(const ops::GatedDeltaNetArgs& a) {
  KILN_CHECK(a.batch != nullptr) << "gated_delta_net: no batch";
  const ops::BatchMeta& batch = *a.batch;
  const DeviceBatch& db = batch_for(a.batch);
  const int64_t nk = a.n_k_heads, nv = a.n_v_heads, dk = a.d_k, dv = a.d_v;
  KILN_CHECK(nk > 0 && dk > 0 && dv > 0 && nv % nk == 0)
      << "gated_delta_net: " << nv << " value heads for " << nk << " key heads, dk " << dk << ", dv " << dv;
  KILN_CHECK(dk <= kGdnMaxDk) << "cuda: gated_delta_net: key head size " << dk << " above " << kGdnMaxDk;
  const int64_t key_dim = nk * dk, value_dim = nv * dv, channels = 2 * key_dim + value_dim;
  const int64_t n_tokens = batch.n_tokens(), n_seqs = batch.n_seqs();
  check_bf16(a.qkv, "gated_delta_net qkv", 2);
  check_bf16(a.b, "gated_delta_net b", 2);
  check_bf16(a.out, "gated_delta_net out", 2);
  KILN_CHECK(a.qkv.dim(0) == n_tokens && a.b.dim(0) == n_tokens && a.out.dim(0) == n_tokens)
      << "gated_delta_net: rows of qkv / b / out vs the batch's " << n_tokens << " tokens";
  KILN_CHECK_EQ(a.qkv.dim(1), a.grouped ? channels + value_dim : channels) << "gated_delta_net: qkv width";
  KILN_CHECK_EQ(a.b.dim(1), a.grouped ? 2 * nv : nv) << "gated_delta_net: b width";
  if (!a.grouped) {
    check_bf16(a.z, "gated_delta_net z", 2);
    check_bf16(a.a, "gated_delta_net a", 2);
    KILN_CHECK(a.z.dim(0) == n_tokens && a.a.dim(0) == n_tokens && a.z.dim(1) == value_dim && a.a.dim(1) == nv)
        << "gated_delta_net: z / a shape";
  }
  check_bf16(a.conv_weight, "gated_delta_net conv weight", 2);
  const int64_t kernel = a.conv_weight.dim(1);
  KILN_CHECK(a.conv_weight.dim(0) == channels && kernel >= 1 && kernel <= kGdnMaxConvKernel)
      << "cuda: gated_delta_net: conv weight " << a.conv_weight.shape << " (at most " << kGdnMaxConvKernel << " taps)";
  KILN_CHECK_EQ(a.out.dim(1), value_dim) << "gated_delta_net: out width";
  KILN_CHECK(a.conv_state.defined() && a.conv_state.device == Device::kCuda &&
             (a.conv_state.dtype == DType::kBF16 || a.conv_state.dtype == DType::kF32) && a.conv_state.rank() == 3 &&
             a.conv_state.dim(1) == channels && a.conv_state.dim(2) == kernel - 1)
      << "cuda: gated_delta_net: conv state " << a.conv_state.shape << " " << dtype_name(a.conv_state.dtype);
  KILN_CHECK(a.recurrent_state.defined() && a.recurrent_state.device == Device::kCuda &&
             a.recurrent_state.dtype == DType::kF32 && a.recurrent_state.rank() == 4 &&
             a.recurrent_state.dim(1) == nv && a.recurrent_state.dim(2) == dk && a.recurrent_state.dim(3) == dv)
      << "cuda: gated_delta_net: recurrent state " << a.recurrent_state.shape << " "
      << dtype_name(a.recurrent_state.dtype);
  KILN_CHECK(int64_t(batch.state_slots.size()) == n_seqs && db.state_slots != nullptr)
      << "gated_delta_net: " << batch.state_slots.size() << " state slots for " << n_seqs << " sequences";
  for (int32_t slot : batch.state_slots)
    KILN_CHECK(slot >= 0 && slot < a.conv_state.dim(0) && slot < a.recurrent_state.dim(0))
        << "gated_delta_net: state slot " << slot;
  // Speculative verification: the state after row t also into row state_snapshots[t] (-1: not).
  KILN_CHECK(batch.state_snapshots.empty() ||
             (int64_t(batch.state_snapshots.size()) == n_tokens && db.state_snapshots != nullptr))
      << "gated_delta_net: state snapshots for " << batch.state_snapshots.size() << " of " << n_tokens << " rows";
  for (int32_t row : batch.state_snapshots)
    KILN_CHECK(row < a.conv_state.dim(0) && row < a.recurrent_state.dim(0)) << "gated_delta_net: snapshot row " << row;
  if (n_tokens == 0) return;

  GdnParams p;
  p.qkv = a.qkv.as<bf16>();
  p.qkv_cols = a.qkv.dim(1);
  p.z = a.grouped ? nullptr : a.z.as<bf16>();
  p.b = a.b.as<bf16>();
  p.a = a.grouped ? nullptr : a.a.as<bf16>();
  p.grouped = a.grouped;
  p.conv_weight = a.conv_weight.as<bf16>();
  p.a_log = f32_vector(a.a_log, nv, "a_log");
  p.dt_bias = f32_vector(a.dt_bias, nv, "dt_bias");
  p.norm_weight = f32_vector(a.norm_weight, dv, "norm weight");
  p.norm_eps = a.norm_eps;
  p.conv_state = a.conv_state.data;
  p.conv_state_bf16 = a.conv_state.dtype == DType::kBF16;
  p.recurrent_state = a.recurrent_state.as<float>();
  p.out = a.out.as<bf16>();
  p.positions = db.positions;
  p.seq_of_token = db.seq_of_token;
  p.q_start = db.q_start;
  p.state_slots = db.state_slots;
  p.snapshots = batch.state_snapshots.empty() ? nullptr : db.state_snapshots;
  p.n_tokens = int32_t(n_tokens);
  p.n_seqs = int32_t(n_seqs);
  p.nk = int32_t(nk);
  p.nv = int32_t(nv);
  p.dk = int32_t(dk);
  p.dv = int32_t(dv);
  p.conv_kernel = int32_t(kernel);
  // The fp32 scratch goes back to the cache when the op returns, not at the next step:
  // only work queued after these kernels can reuse it (allocator.h), and a prefill's
  // [T, channels] per layer held for the whole step would be GiBs (Qwen3-Next-80B: 96 MiB
  // per layer at 2,048 tokens, 36 layers). A recorded graph keeps it (record_into).
  std::vector<std::shared_ptr<void>> keep;
  p.x = scratch<float>(n_tokens * channels, keep);
  p.gb = scratch<float>(n_tokens * 2 * nv, keep);
  p.o = scratch<float>(n_tokens * value_dim, keep);
  // Prompts take the chunked form where it applies: not in verify steps (it writes no
  // snapshots), heads of at most kGdnChunkMaxHead in multiples of 4 (its rows move as
  // float4), its shared memory within the cap.
  if (batch.state_snapshots.empty() && dk <= kGdnChunkMaxHead && dv <= kGdnChunkMaxHead && dk % 4 == 0 &&
      dv % 4 == 0 && gdn_chunk_smem_bytes(int(dk)) <= smem_cap_) {
    p.chunk_min_tokens = gdn_chunk_min_tokens_;
    p.n_chunks = gdn_chunk_count(batch.q_start.data(), int32_t(n_seqs), p.chunk_min_tokens);
  }
  if (p.n_chunks > 0) {
    p.w = scratch<float>(n_tokens * nv * dk, keep);
    p.u = scratch<float>(n_tokens * nv * dv, keep);
    p.pmat = scratch<float>(n_tokens * nv * kGdnChunk, keep);
    p.gcum = scratch<float>(n_tokens * nv, keep);
  } else {
    p.chunk_min_tokens = INT32_MAX;
  }
  launch_gated_delta_net(p, stream_);
}

}  // namespace kiln::cuda
