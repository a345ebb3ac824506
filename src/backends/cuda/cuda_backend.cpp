// CudaBackend: device setup, memory and the upload rule, per-step metadata,
// cuBLASLt GEMMs. The ops themselves are in cuda_ops.cpp.
#include "backends/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/kernels/smem.cuh"
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
  bool graphs = options.graphs;
  if (const char* g = std::getenv("KILN_CUDA_GRAPHS"); g && std::string(g) == "0") graphs = false;
  auto backend = std::make_unique<CudaBackend>(info, cap, graphs);
  // KILN_CUDA_VERIFY_GRAPHS=0: speculative verify steps always eager (run_step).
  if (const char* v = std::getenv("KILN_CUDA_VERIFY_GRAPHS"); v && std::string(v) == "0") backend->set_verify_graphs(false);
  // Debugging knob: KILN_ATTENTION_PATH=warp|fa2|split_kv forces one attention path
  // (warp: the fp32 reference kernels, for MLA too).
  if (const char* p = std::getenv("KILN_ATTENTION_PATH"); p && *p) {
    const std::string v = p;
    if (v == "warp") backend->force_attention_path(AttentionPath::kWarp), backend->force_mla_path(MlaPath::kWarp);
    else if (v == "fa2") backend->force_attention_path(AttentionPath::kFa2);
    else if (v == "split_kv") backend->force_attention_path(AttentionPath::kSplitKv);
    else return invalid_argument("KILN_ATTENTION_PATH=" + v + " (expected warp, fa2 or split_kv)");
    KILN_LOG(kWarn, "cuda: attention path forced to " << v << " (KILN_ATTENTION_PATH)");
  }
  if (const char* w = std::getenv("KILN_FP8_W8A8"); w && std::string(w) == "0") {
    backend->set_w8a8(false);
    KILN_LOG(kWarn, "cuda: FP8 weights multiply bf16 activations at every shape (KILN_FP8_W8A8=0)");
  }
  if (const char* g = std::getenv("KILN_BF16_GEMV"); g && std::string(g) == "0") {
    backend->set_bf16_gemv(false);
    KILN_LOG(kWarn, "cuda: bf16 linears take cuBLASLt at every batch size (KILN_BF16_GEMV=0)");
  } else if (g && std::string(g) == "experts") {
    backend->set_bf16_gemv_dense(false);
    KILN_LOG(kWarn, "cuda: dense bf16 linears take cuBLASLt at every batch size (KILN_BF16_GEMV=experts)");
  }
  if (const char* f = std::getenv("KILN_FUSE_LINEARS"); f && std::string(f) == "0") {
    backend->set_fuse_linears(false);
    KILN_LOG(kWarn, "cuda: q, k and v are loaded apart and multiplied in a GEMM each (KILN_FUSE_LINEARS=0)");
  }
  if (const char* g = std::getenv("KILN_GDN_CHUNKED"); g && std::string(g) == "0") {
    backend->set_gdn_chunk_min_tokens(INT32_MAX);
    KILN_LOG(kWarn, "cuda: Gated DeltaNet prompts take the token-serial recurrence (KILN_GDN_CHUNKED=0)");
  }
  // Measurement knob: KILN_SM_SMEM_CAP=102400 gives kernels the 100 KB of shared memory an
  // SM120 SM has (--smem-cap bounds a block, not an SM; kernels/smem.cuh).
  if (const char* c = std::getenv("KILN_SM_SMEM_CAP"); c && *c) {
    sm_smem_limit() = std::atoi(c);
    KILN_LOG(kWarn, "cuda: kernels prefer at most " << sm_smem_limit() << " bytes of shared memory per SM of "
                                                    << info.smem_per_sm << " (KILN_SM_SMEM_CAP)");
  }
  if (const char* t = std::getenv("KILN_QUANT_GEMV_MOE_TOKENS"); t && *t) {
    backend->set_quant_gemv_moe_tokens(std::atoll(t));
    KILN_LOG(kWarn, "cuda: quantized MoE layers take the GEMV up to " << t << " tokens (KILN_QUANT_GEMV_MOE_TOKENS)");
  }
  if (const char* r = std::getenv("KILN_QUANT_GEMV_ROWS"); r && *r) {
    backend->set_quant_gemv_rows(std::atoll(r));
    KILN_LOG(kWarn, "cuda: quantized dense linears take the GEMV in passes up to " << r << " rows (KILN_QUANT_GEMV_ROWS)");
  }
  return std::unique_ptr<ops::Backend>(std::move(backend));
}

namespace {
CudaBackend& cuda_backend(ops::Backend& backend) {
  auto* b = dynamic_cast<CudaBackend*>(&backend);
  KILN_CHECK(b != nullptr) << "a CUDA backend was expected, got \"" << backend.name() << "\"";
  return *b;
}
}  // namespace

cudaStream_t stream_of(ops::Backend& backend) { return cuda_backend(backend).stream(); }
int device_of(ops::Backend& backend) { return cuda_backend(backend).info().index; }

CudaBackend::CudaBackend(const DeviceInfo& info, int smem_cap, bool graphs)
    : info_(info), smem_cap_(smem_cap), graphs_enabled_(graphs) {
  KILN_CUDA_CHECK(cudaSetDevice(info.index));
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&batch_copied_, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&parts_copied_, cudaEventDisableTiming));
  KILN_CUBLAS_CHECK(cublasLtCreate(&lt_));
  allocator_ = CachingAllocator::create(info.index);
  size_t free_bytes = 0, total_bytes = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  graph_budget_ = size_t(ops::graph_memory_budget(int64_t(total_bytes)));
  workspace_ = allocator_->allocate(workspace_bytes_);
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  release_graphs();
  op_scratch_.clear();
  batch_buffer_.reset();
  if (batch_staging_) cudaFreeHost(batch_staging_);
  if (batch_copied_) cudaEventDestroy(batch_copied_);
  if (parts_staging_) cudaFreeHost(parts_staging_);
  if (parts_copied_) cudaEventDestroy(parts_copied_);
  rope_tables_.clear();
  expert_tables_.clear();
  dequantized_.clear();
  workspace_.reset();
  release_gemm_plans();
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) cudaStreamDestroy(stream_);
}

Tensor CudaBackend::alloc(DType dtype, Shape shape) { return alloc_tensor(dtype, shape, false); }

Tensor CudaBackend::alloc_tensor(DType dtype, Shape shape, bool weight) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.device = Device::kCuda;
  t.device_index = info_.index;
  t.owner = allocator_->allocate(t.nbytes(), weight);
  t.data = t.owner.get();
  return t;
}

std::optional<ops::MemoryInfo> CudaBackend::memory_info() {
  synchronize();
  size_t free_bytes = 0, total_bytes = 0;
  KILN_CUDA_CHECK(cudaSetDevice(info_.index));
  KILN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return ops::MemoryInfo{.device_total = int64_t(total_bytes),
                         .available = int64_t(free_bytes + allocator_->bytes_cached()),
                         .in_use = int64_t(allocator_->bytes_in_use()),
                         .peak_in_use = int64_t(allocator_->peak_bytes_in_use())};
}

Tensor CudaBackend::upload(const Tensor& host) {
  KILN_CHECK(host.device == Device::kHost) << "upload of a device tensor";
  const bool is_float = host.dtype == DType::kF32 || host.dtype == DType::kBF16 || host.dtype == DType::kF16;
  if (!is_float) {
    Tensor t = alloc_tensor(host.dtype, host.shape, true);
    KILN_CUDA_CHECK(cudaMemcpyAsync(t.data, host.data, host.nbytes(), cudaMemcpyHostToDevice, stream_));
    return t;
  }
  // Matrices become bf16, vectors fp32 (see cuda_backend.h).
  const DType target = host.rank() >= 2 ? DType::kBF16 : DType::kF32;
  std::vector<float> f(size_t(host.numel()));
  to_f32(host, f.data());
  Tensor t = alloc_tensor(target, host.shape, true);
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

void CudaBackend::to_host_i32(const Tensor& t, int32_t* out) {
  KILN_CHECK(t.device == Device::kCuda && t.dtype == DType::kI32) << "cuda: to_host_i32 of " << dtype_name(t.dtype);
  KILN_CUDA_CHECK(cudaMemcpyAsync(out, t.data, t.nbytes(), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaBackend::from_host_f32(const float* src, Tensor& t) {
  KILN_CHECK(t.device == Device::kCuda && t.dtype == DType::kBF16) << "from_host_f32 into " << dtype_name(t.dtype);
  std::vector<uint16_t> b(size_t(t.numel()));
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(src[i]);
  KILN_CUDA_CHECK(cudaMemcpyAsync(t.data, b.data(), b.size() * 2, cudaMemcpyHostToDevice, stream_));
  synchronize();
}

namespace {

// The words pack_batch writes for b: positions | slot_mapping | seq_of_token | token_ids
// | block_table | logit_rows | q_start | state_slots | state_snapshots | input_rows |
// device_token_rows.
size_t batch_words(const ops::BatchMeta& b) {
  const size_t n = b.positions.size();
  return 4 * n + b.block_table.size() + b.logit_rows.size() + b.q_start.size() + b.state_slots.size() +
         b.state_snapshots.size() + b.input_rows.size() + b.device_token_rows.size();
}

// b's metadata into h (batch_words(b) words), and the DeviceBatch that reads it once it
// is copied to d.
DeviceBatch pack_batch(const ops::BatchMeta& b, int32_t* h, int32_t* d) {
  const size_t n = b.positions.size(), n_table = b.block_table.size(), n_rows = b.logit_rows.size();
  const size_t n_seqs = b.context_len.size(), n_slots = b.state_slots.size();
  const size_t n_snaps = b.state_snapshots.size(), n_inputs = b.input_rows.size();
  std::copy(b.positions.begin(), b.positions.end(), h);
  std::copy(b.slot_mapping.begin(), b.slot_mapping.end(), h + n);
  for (int32_t s = 0; s < b.n_seqs(); ++s)
    for (int32_t t = b.q_start[size_t(s)]; t < b.q_start[size_t(s) + 1]; ++t) h[2 * n + size_t(t)] = s;
  std::fill(h + 3 * n, h + 4 * n, 0);
  std::copy(b.token_ids.begin(), b.token_ids.end(), h + 3 * n);
  std::copy(b.block_table.begin(), b.block_table.end(), h + 4 * n);
  std::copy(b.logit_rows.begin(), b.logit_rows.end(), h + 4 * n + n_table);
  const size_t at_q = 4 * n + n_table + n_rows, at_slots = at_q + n_seqs + 1;
  std::copy(b.q_start.begin(), b.q_start.end(), h + at_q);
  std::copy(b.state_slots.begin(), b.state_slots.end(), h + at_slots);
  std::copy(b.state_snapshots.begin(), b.state_snapshots.end(), h + at_slots + n_slots);
  std::copy(b.input_rows.begin(), b.input_rows.end(), h + at_slots + n_slots + n_snaps);
  std::copy(b.device_token_rows.begin(), b.device_token_rows.end(), h + at_slots + n_slots + n_snaps + n_inputs);
  return {.positions = d, .slot_mapping = d + n, .seq_of_token = d + 2 * n, .block_table = d + 4 * n,
          .token_ids = d + 3 * n, .logit_rows = d + 4 * n + n_table, .n_tokens = b.n_tokens(),
          .n_seqs = b.n_seqs(), .max_blocks = b.max_blocks_per_seq, .block_size = b.block_size,
          .n_logit_rows = int32_t(n_rows), .q_start = d + at_q, .state_slots = n_slots ? d + at_slots : nullptr,
          .state_snapshots = n_snaps ? d + at_slots + n_slots : nullptr,
          .input_rows = n_inputs ? d + at_slots + n_slots + n_snaps : nullptr};
}

}  // namespace

void CudaBackend::begin_step(const ops::BatchMeta& b) {
  op_scratch_.clear();  // the previous step's scratch: reusable in stream order
  step_parts_.clear();
  parts_used_ = 0;
  const size_t n = b.positions.size();
  KILN_CHECK(b.slot_mapping.size() == n && b.q_start.size() == b.context_len.size() + 1)
      << "begin_step: inconsistent batch (" << n << " positions, " << b.slot_mapping.size() << " slots)";
  KILN_CHECK(b.token_ids.empty() || b.token_ids.size() == n) << "begin_step: token_ids vs positions";
  const size_t n_seqs = b.context_len.size(), n_slots = b.state_slots.size();
  KILN_CHECK(n_slots == 0 || n_slots == n_seqs) << "begin_step: " << n_slots << " state slots for " << n_seqs
                                                << " sequences";
  const size_t n_snaps = b.state_snapshots.size(), n_inputs = b.input_rows.size(), n_patch = b.device_token_rows.size();
  KILN_CHECK(n_patch == 0 || (n_patch == n && b.device_tokens.device == Device::kCuda && b.device_tokens.dtype == DType::kI32))
      << "begin_step: " << n_patch << " device token rows for " << n << " rows";
  KILN_CHECK(n_snaps == 0 || n_snaps == n) << "begin_step: " << n_snaps << " state snapshots for " << n << " rows";
  KILN_CHECK(n_inputs == 0 || n_inputs == n) << "begin_step: " << n_inputs << " input rows for " << n << " rows";
  const size_t total = batch_words(b);
  KILN_CUDA_CHECK(cudaEventSynchronize(batch_copied_));  // the previous step's copy left the staging
  if (total > batch_capacity_) {
    release_graphs();  // they read the old buffer
    synchronize();
    if (batch_staging_) KILN_CUDA_CHECK(cudaFreeHost(batch_staging_));
    batch_capacity_ = std::max<size_t>(total, 2 * batch_capacity_);
    KILN_CUDA_CHECK(cudaMallocHost(&batch_staging_, batch_capacity_ * sizeof(int32_t)));
    batch_buffer_ = allocator_->allocate(batch_capacity_ * sizeof(int32_t));
  }
  auto* d = static_cast<int32_t*>(batch_buffer_.get());
  batch_ = pack_batch(b, batch_staging_, d);
  KILN_CUDA_CHECK(cudaMemcpyAsync(d, batch_staging_, total * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  KILN_CUDA_CHECK(cudaEventRecord(batch_copied_, stream_));
  // Token ids still on the device (speculative drafts) into place, before any op reads them.
  if (n_patch > 0) {
    launch_patch_ids(d + 3 * n, d + (total - n_patch), b.device_tokens.as<int32_t>(), int64_t(n), stream_);
  }
  host_batch_ = &b;
}

// A micro-batch's metadata: packed after the step's others in their own pinned staging
// and copied to a block of its own, held until the next step.
void CudaBackend::add_step_batch(const ops::BatchMeta& part) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
  KILN_CHECK(capturing == cudaStreamCaptureStatusNone) << "cuda: a micro-batch inside a recorded step";
  KILN_CHECK(part.device_token_rows.empty()) << "cuda: a micro-batch with device token ids";
  if (parts_used_ == 0) KILN_CUDA_CHECK(cudaEventSynchronize(parts_copied_));  // the last step's copies left
  const size_t words = batch_words(part);
  if (parts_used_ + words > parts_capacity_) {
    synchronize();  // this step's earlier parts were copied from the old staging
    if (parts_staging_) KILN_CUDA_CHECK(cudaFreeHost(parts_staging_));
    parts_capacity_ = std::max(parts_used_ + words, 2 * parts_capacity_);
    KILN_CUDA_CHECK(cudaMallocHost(&parts_staging_, parts_capacity_ * sizeof(int32_t)));
  }
  int32_t* h = parts_staging_ + parts_used_;
  parts_used_ += words;
  std::shared_ptr<void> mem = allocator_->allocate(std::max<size_t>(words, 1) * sizeof(int32_t));
  auto* d = static_cast<int32_t*>(mem.get());
  const DeviceBatch db = pack_batch(part, h, d);
  KILN_CUDA_CHECK(cudaMemcpyAsync(d, h, words * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  KILN_CUDA_CHECK(cudaEventRecord(parts_copied_, stream_));
  step_parts_.push_back({.host = &part, .device = db, .memory = std::move(mem)});
}

void CudaBackend::release_graphs() {
  for (auto& [key, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  graph_bytes_ = 0;
}

// Decode-shaped steps (one new token per sequence, up to kMaxGraphTokens rows) are
// recorded once per key and batch shape and replayed: the launches of a whole
// forward pass become one cudaGraphLaunch. So are speculative verify steps of a uniform
// shape (every sequence q = 2..8 rows, each a logit row: the same q_start for a given
// key), since every op reads the batch from the device buffer and sizes its launch from
// the shape alone (a step some op cannot record runs eagerly, as below); and MTP passes
// (input_rows set: model::CausalLM::mtp_forward) of a uniform shape whatever their logit
// rows. Everything a replay reads that changes
// between steps lives in the batch buffer begin_step refills in place; every
// block the recorded kernels touch is held by the graph, so no later allocation
// can alias it.
bool CudaBackend::may_record(const ops::BatchMeta& b) const {
  const int32_t n = b.n_tokens(), n_seqs = b.n_seqs();
  if (!graphs_enabled_ || n > kMaxGraphTokens) return false;
  bool shaped = n == n_seqs;
  if (!shaped && verify_graphs_ && n_seqs > 0 && n % n_seqs == 0 && n / n_seqs <= 8 &&
      (int32_t(b.logit_rows.size()) == n || !b.input_rows.empty())) {
    shaped = true;
    for (int32_t s = 0; shaped && s <= n_seqs; ++s) shaped = b.q_start[size_t(s)] == s * (n / n_seqs);
  }
  return shaped;
}

Tensor CudaBackend::run_step(const ops::BatchMeta& b, uint64_t key, const std::function<Tensor()>& ops) {
  // kMaxGraphTokens 512: a verify step of 128 sequences and 3 drafts (4 rows each) and its
  // MTP passes replay too (at 256 they ran eagerly: 0.48-0.65 ms of launches a step on the
  // MTP demo model, docs/perf/speculative.md); past the recording budget a shape runs eagerly.
  begin_step(b);
  const int32_t n = b.n_tokens(), n_seqs = b.n_seqs();
  if (!may_record(b)) return ops();
  // (Whether the step takes state snapshots is part of its shape: a recording reads them
  // from the buffer or not at all.)
  StepGraph& g = graphs_[GraphKey{key, b.n_tokens(), b.n_seqs(), b.max_blocks_per_seq, b.block_size,
                                  int32_t(b.logit_rows.size()), !b.state_snapshots.empty()}];
  if (g.exec != nullptr) {
    KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
    ++graph_replays_;
    return g.out;
  }
  if (!g.failed) ++one_time_steps_;  // the first, eager run or the recording
  if (g.failed || g.eager_runs++ == 0) return ops();
  std::vector<std::shared_ptr<void>> keep;
  allocator_->record_into(&keep);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  Tensor out = ops();
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  allocator_->record_into(nullptr);
  const Clock::time_point t1 = Clock::now();
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ie = e == cudaSuccess ? cudaGraphInstantiate(&exec, graph, 0) : e;
  if (graph) cudaGraphDestroy(graph);
  const Clock::time_point t2 = Clock::now();
  const auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  if (ie != cudaSuccess) {  // some op is not capturable: run this shape eagerly from now on
    cudaGetLastError();
    g.failed = true;
    KILN_LOG(kWarn, "cuda: recording a step of " << n << " rows over " << n_seqs << " sequences failed ("
                               << cudaGetErrorString(ie) << "); running that shape eagerly");
    begin_step(b);
    return ops();
  }
  // The recording holds the blocks its step used (one reused within it once the step's
  // work let go of it: about the step's peak): past the budget the KV cache left for
  // recordings, this shape runs eagerly instead.
  const size_t bytes = allocator_->recorded_bytes();
  if (graph_bytes_ + bytes > graph_budget_) {
    cudaGraphExecDestroy(exec);
    g.failed = true;
    if (!graph_budget_logged_) {
      graph_budget_logged_ = true;
      KILN_LOG(kInfo, "cuda: recorded decode steps hold " << (graph_bytes_ >> 20) << " MiB; a step of " << b.n_seqs()
                                                          << " sequences would add " << (bytes >> 20)
                                                          << " MiB, past the " << (graph_budget_ >> 20)
                                                          << " MiB budget: such shapes run eagerly");
    }
    keep.clear();
    begin_step(b);
    return ops();
  }
  graph_bytes_ += bytes;
  KILN_LOG(kDebug, "cuda: recorded a step of " << n << " rows over " << n_seqs << " sequences (width "
                                                << b.max_blocks_per_seq << ") in " << ms(t1 - t0)
                                                << " ms of capture and " << ms(t2 - t1)
                                                << " ms of instantiation, holding " << (bytes >> 10) << " KiB of the "
                                                << (allocator_->recorded_handouts() >> 10)
                                                << " KiB its work allocated (" << (graph_bytes_ >> 20)
                                                << " MiB in all recordings)");
  g.exec = exec;
  g.out = out;
  g.keep = std::move(keep);
  KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
  return g.out;
}

// Their device copies stay to the next step (ops queued on them may not have run yet).
void CudaBackend::end_step_batches() {
  for (StepPart& p : step_parts_) p.host = nullptr;
}

const DeviceBatch& CudaBackend::batch_for(const ops::BatchMeta* b) const {
  KILN_CHECK(b != nullptr) << "cuda: an op without its batch";
  if (b == host_batch_) return batch_;
  for (const StepPart& p : step_parts_)
    if (p.host == b) return p.device;
  KILN_CHECK(false) << "cuda: an op's batch was not passed to begin_step or add_step_batch";
  return batch_;
}

Status CudaBackend::supports(const ops::Weight& w) const {
  if (w.quantized()) {
    if (w.quant.packed_group > 0 && w.quant.data.device == Device::kCuda) return Status::Ok();
    return unsupported(std::string(formats::quant_kind_name(w.quant.kind)) +
                       " weight not packed for the CUDA kernels (upload_quantized)");
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
                                                    bool f32_out) {
  const GemmKey key{rows, n_out, n_in, transposed, f32_out};
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
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, f32_out ? CUDA_R_32F : CUDA_R_16BF, n_out, rows, n_out));
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

void CudaBackend::gemm_f32(const bf16* x, const bf16* w, int64_t rows, int64_t n_out, int64_t n_in, float* y) {
  if (rows == 0) return;
  const GemmPlan& plan = gemm_plan(rows, n_out, n_in, /*transposed=*/false, /*f32_out=*/true);
  const float alpha = 1.0f, beta = 0.0f;
  KILN_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.op, &alpha, w, plan.a, x, plan.b, &beta, y, plan.c, y, plan.c, &plan.algo,
                                   workspace_.get(), workspace_bytes_, stream_));
}

}  // namespace kiln::cuda
