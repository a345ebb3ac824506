// CudaBackend: device setup, memory and the upload rule, per-step metadata,
// cuBLASLt GEMMs. The ops themselves are in cuda_ops.cpp.
#include "backends/cuda/cuda_backend_impl.h"

#include <cstdlib>
#include <cstring>

#include "core/log.h"

namespace kiln::cuda {

Result<std::unique_ptr<ops::Backend>> make_cuda_backend(const CudaOptions& options) {
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, query_device(options.device));
  int cap = options.smem_cap > 0 ? options.smem_cap : info.smem_per_block_optin;
  if (cap > info.smem_per_block_optin) {
    return invalid_argument("--smem-cap " + std::to_string(cap) + " exceeds the device's limit of " +
                            std::to_string(info.smem_per_block_optin) + " bytes per block");
  }
  KILN_LOG(kInfo, "cuda: " << info.name << " (sm_" << info.cc() << ", " << info.sm_count << " SMs), smem cap " << cap
                           << " bytes per block");
  auto backend = std::make_unique<CudaBackend>(info, cap);
  // Debugging knob: KILN_ATTENTION_PATH=warp|fa2|split_kv forces one attention path.
  if (const char* p = std::getenv("KILN_ATTENTION_PATH"); p && *p) {
    const std::string v = p;
    if (v == "warp") backend->force_attention_path(AttentionPath::kWarp);
    else if (v == "fa2") backend->force_attention_path(AttentionPath::kFa2);
    else if (v == "split_kv") backend->force_attention_path(AttentionPath::kSplitKv);
    else return invalid_argument("KILN_ATTENTION_PATH=" + v + " (expected warp, fa2 or split_kv)");
    KILN_LOG(kWarn, "cuda: attention path forced to " << v << " (KILN_ATTENTION_PATH)");
  }
  return std::unique_ptr<ops::Backend>(std::move(backend));
}

CudaBackend::CudaBackend(const DeviceInfo& info, int smem_cap) : info_(info), smem_cap_(smem_cap) {
  KILN_CUDA_CHECK(cudaSetDevice(info.index));
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KILN_CUBLAS_CHECK(cublasLtCreate(&lt_));
  allocator_ = CachingAllocator::create(info.index);
  workspace_ = allocator_->allocate(workspace_bytes_);
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  op_scratch_.clear();
  batch_buffer_.reset();
  rope_tables_.clear();
  expert_tables_.clear();
  workspace_.reset();
  release_gemm_plans();
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) cudaStreamDestroy(stream_);
}

Tensor CudaBackend::alloc(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.device = Device::kCuda;
  t.device_index = info_.index;
  t.owner = allocator_->allocate(t.nbytes());
  t.data = t.owner.get();
  return t;
}

Tensor CudaBackend::upload(const Tensor& host) {
  KILN_CHECK(host.device == Device::kHost) << "upload of a device tensor";
  const bool is_float = host.dtype == DType::kF32 || host.dtype == DType::kBF16 || host.dtype == DType::kF16;
  if (!is_float) {
    Tensor t = alloc(host.dtype, host.shape);
    KILN_CUDA_CHECK(cudaMemcpyAsync(t.data, host.data, host.nbytes(), cudaMemcpyHostToDevice, stream_));
    return t;
  }
  // Matrices become bf16, vectors fp32 (see cuda_backend.h).
  const DType target = host.rank() >= 2 ? DType::kBF16 : DType::kF32;
  std::vector<float> f(size_t(host.numel()));
  to_f32(host, f.data());
  Tensor t = alloc(target, host.shape);
  if (target == DType::kF32) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(t.data, f.data(), f.size() * 4, cudaMemcpyHostToDevice, stream_));
  } else {
    std::vector<uint16_t> b(f.size());
    for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
    KILN_CUDA_CHECK(cudaMemcpyAsync(t.data, b.data(), b.size() * 2, cudaMemcpyHostToDevice, stream_));
  }
  // The host staging buffers die here: wait for the copies (loading is not the hot path).
  synchronize();
  return t;
}

void CudaBackend::to_host_f32(const Tensor& t, float* out) {
  KILN_CHECK(t.device == Device::kCuda);
  if (t.dtype == DType::kF32) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(out, t.data, t.nbytes(), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return;
  }
  KILN_CHECK(t.dtype == DType::kBF16) << "to_host_f32 of " << dtype_name(t.dtype);
  std::vector<uint16_t> b(size_t(t.numel()));
  KILN_CUDA_CHECK(cudaMemcpyAsync(b.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost, stream_));
  synchronize();
  for (size_t i = 0; i < b.size(); ++i) out[i] = bf16_to_f32(b[i]);
}

void CudaBackend::from_host_f32(const float* src, Tensor& t) {
  KILN_CHECK(t.device == Device::kCuda && t.dtype == DType::kBF16) << "from_host_f32 into " << dtype_name(t.dtype);
  std::vector<uint16_t> b(size_t(t.numel()));
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(src[i]);
  KILN_CUDA_CHECK(cudaMemcpyAsync(t.data, b.data(), b.size() * 2, cudaMemcpyHostToDevice, stream_));
  synchronize();
}

void CudaBackend::begin_step(const ops::BatchMeta& b) {
  op_scratch_.clear();  // the previous step's scratch: reusable in stream order
  std::vector<int32_t> seq_of(b.positions.size());
  for (int32_t s = 0; s < b.n_seqs(); ++s)
    for (int32_t t = b.q_start[size_t(s)]; t < b.q_start[size_t(s) + 1]; ++t) seq_of[size_t(t)] = s;
  // One buffer: positions | slot_mapping | seq_of_token | block_table.
  std::vector<int32_t> packed;
  packed.insert(packed.end(), b.positions.begin(), b.positions.end());
  packed.insert(packed.end(), b.slot_mapping.begin(), b.slot_mapping.end());
  packed.insert(packed.end(), seq_of.begin(), seq_of.end());
  packed.insert(packed.end(), b.block_table.begin(), b.block_table.end());
  batch_buffer_ = allocator_->allocate(packed.size() * sizeof(int32_t));
  auto* d = static_cast<int32_t*>(batch_buffer_.get());
  KILN_CUDA_CHECK(cudaMemcpyAsync(d, packed.data(), packed.size() * 4, cudaMemcpyHostToDevice, stream_));
  synchronize();  // `packed` is a host temporary
  const size_t n = b.positions.size();
  batch_ = {.positions = d, .slot_mapping = d + n, .seq_of_token = d + 2 * n, .block_table = d + 3 * n,
            .n_tokens = b.n_tokens(), .n_seqs = b.n_seqs(), .max_blocks = b.max_blocks_per_seq,
            .block_size = b.block_size};
  host_batch_ = &b;
}

const DeviceBatch& CudaBackend::batch_for(const ops::BatchMeta* b) const {
  KILN_CHECK(b != nullptr && b == host_batch_) << "cuda: an op's batch was not passed to begin_step";
  return batch_;
}

Status CudaBackend::supports(const ops::Weight& w) const {
  if (w.quantized()) {
    return unsupported("no CUDA kernel for " + std::string(formats::quant_kind_name(w.quant.kind)) +
                       " weights yet (the CPU backend runs them)");
  }
  if (w.data.device != Device::kCuda || w.data.dtype != DType::kBF16) {
    return unsupported("weight of dtype " + std::string(dtype_name(w.data.dtype)) + " not uploaded as bf16");
  }
  return Status::Ok();
}

const int32_t* CudaBackend::device_ids(const Tensor& ids, std::vector<std::shared_ptr<void>>& keep) {
  KILN_CHECK(ids.dtype == DType::kI32) << "ids must be i32";
  if (ids.device == Device::kCuda) return ids.as<int32_t>();
  int32_t* d = scratch<int32_t>(ids.numel(), keep);
  KILN_CUDA_CHECK(cudaMemcpyAsync(d, ids.data, ids.nbytes(), cudaMemcpyHostToDevice, stream_));
  synchronize();  // the host ids may be a temporary
  return d;
}

const float* CudaBackend::rope_table(const ops::RopeTable& t) {
  // Keyed by address, checked by content: a new table at a reused address is re-uploaded.
  auto it = rope_tables_.find(&t);
  if (it != rope_tables_.end() && it->second.first != t.inv_freq) {
    rope_tables_.erase(it);
    it = rope_tables_.end();
  }
  if (it == rope_tables_.end()) {
    auto buf = allocator_->allocate(t.inv_freq.size() * sizeof(float));
    KILN_CUDA_CHECK(cudaMemcpyAsync(buf.get(), t.inv_freq.data(), t.inv_freq.size() * 4, cudaMemcpyHostToDevice,
                                    stream_));
    synchronize();
    it = rope_tables_.emplace(&t, std::make_pair(t.inv_freq, buf)).first;
  }
  return static_cast<const float*>(it->second.second.get());
}

void CudaBackend::release_gemm_plans() {
  for (auto& [key, p] : gemm_plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  gemm_plans_.clear();
}

const CudaBackend::GemmPlan& CudaBackend::gemm_plan(int64_t rows, int64_t n_out, int64_t n_in, bool transposed,
                                                    bool bias) {
  const GemmKey key{rows, n_out, n_in, transposed, bias};
  if (auto it = gemm_plans_.find(key); it != gemm_plans_.end()) return it->second;
  if (gemm_plans_.size() >= 1024) release_gemm_plans();  // prefill lengths vary: keep the cache bounded
  // Column-major view: Y^T [n_out, rows] = W [n_out, n_in] * X^T [n_in, rows].
  // Row-major W [n_out, n_in] is column-major [n_in, n_out]: transpose it (op T);
  // input-major storage [n_in, n_out] is column-major [n_out, n_in]: op N.
  GemmPlan p;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = transposed ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (transposed) KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, n_out, n_in, n_out));
  else KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, n_in, n_out, n_in));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, n_in, rows, n_in));
  // With a bias the GEMM writes fp32 and one kernel adds the bias and rounds once.
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, bias ? CUDA_R_32F : CUDA_R_16BF, n_out, rows, n_out));
  cublasLtMatmulPreference_t pref;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes_, sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  KILN_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &heur, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  KILN_CHECK_GT(found, 0) << "cuBLASLt has no algorithm for a bf16 GEMM " << n_out << " x " << rows << " x " << n_in;
  p.algo = heur.algo;
  return gemm_plans_.emplace(key, p).first->second;
}

void CudaBackend::gemm(const Tensor& x, const ops::Weight& w, Tensor& y) {
  const int64_t rows = x.dim(0), n_in = w.n_in(), n_out = w.n_out();
  KILN_CHECK_EQ(x.dim(1), n_in) << "linear: x.dim(1) vs w.n_in()";
  KILN_CHECK_EQ(y.dim(1), n_out) << "linear: out.dim(1) vs w.n_out()";
  KILN_CHECK(w.data.dtype == DType::kBF16 && x.dtype == DType::kBF16 && y.dtype == DType::kBF16);
  if (rows == 0) return;
  const bool bias = w.bias.defined();
  const GemmPlan& plan = gemm_plan(rows, n_out, n_in, w.transposed, bias);
  const float alpha = 1.0f, beta = 0.0f;
  std::shared_ptr<void> y32 = bias ? allocator_->allocate(size_t(rows * n_out) * sizeof(float)) : nullptr;
  void* d = bias ? y32.get() : y.data;
  KILN_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.op, &alpha, w.data.data, plan.a, x.data, plan.b, &beta, d, plan.c, d,
                                   plan.c, &plan.algo, workspace_.get(), workspace_bytes_, stream_));
  if (bias) {
    KILN_CHECK(w.bias.dtype == DType::kF32) << "linear: bias must be fp32 on the device";
    launch_bias_round(static_cast<const float*>(d), w.bias.as<float>(), y.as<bf16>(), rows, n_out, stream_);
  }
}

}  // namespace kiln::cuda
