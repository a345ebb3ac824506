// Private to the CUDA backend: the backend class (shared by cuda_backend.cpp
// and cuda_ops.cpp).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <memory>
#include <vector>

#include "backends/cuda/allocator.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda {

// A packed quantized weight (upload_quantized) as the kernels take it.
QuantMat quant_mat(const formats::QuantizedTensor& q);
QuantFormat quant_format(const formats::QuantizedTensor& q);

// The most rows a recorded (replayed) step has: decode and speculative verify steps (512: a
// verify step of 128 sequences and 3 drafts, and its MTP passes; run_step).
constexpr int32_t kMaxGraphTokens = 512;

class CudaBackend final : public ops::Backend {
 public:
  CudaBackend(const DeviceInfo& info, int smem_cap, bool graphs = true);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::kBF16; }
  Tensor alloc(DType dtype, Shape shape) override;
  Tensor alloc_weight(DType dtype, Shape shape) override { return alloc_tensor(dtype, shape, true); }
  // alloc, or (weight) a block sized to the tensor, not to a size class: the weights
  // upload and upload_quantized make.
  Tensor alloc_tensor(DType dtype, Shape shape, bool weight);
  Tensor upload(const Tensor& host) override;
  void to_host_f32(const Tensor& t, float* out) override;
  void from_host_f32(const float* src, Tensor& t) override;
  void to_host_i32(const Tensor& t, int32_t* out) override;
  void synchronize() override { KILN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  Result<int64_t> quantized_bytes(const formats::QuantizedTensor& q) const override;
  void release_step_memory() override {
    int previous = 0;  // callable from any rank's thread: its device stays current
    cudaGetDevice(&previous);
    cudaSetDevice(info_.index);
    cudaStreamSynchronize(stream_);
    release_graphs();
    op_scratch_.clear();
    cudaSetDevice(previous);
  }
  std::string weight_path(const ops::Weight& w, bool expert) const override;
  void bind_thread() override { KILN_CUDA_CHECK(cudaSetDevice(info().index)); }
  std::optional<ops::MemoryInfo> memory_info() override;
  void reset_peak_memory() override { allocator_->reset_peak(); }
  void begin_step(const ops::BatchMeta& batch) override;
  void add_step_batch(const ops::BatchMeta& part) override;
  void end_step_batches() override;
  bool may_record(const ops::BatchMeta& batch) const override;
  Tensor run_step(const ops::BatchMeta& batch, uint64_t key, const std::function<Tensor()>& ops) override;
  Status supports(const ops::Weight& w) const override;
  // bf16, or e4m3 with per-row scales (ops/kv_quant.h); every attention path reads both.
  Status supports_kv_cache(DType dtype) const override;
  Result<formats::QuantizedTensor> upload_quantized(const formats::QuantizedTensor& q) override;

  void embedding(const ops::EmbeddingArgs& a) override;
  void rms_norm(const ops::RmsNormArgs& a) override;
  void linear(const ops::LinearArgs& a) override;
  void linears(const ops::LinearsArgs& a) override;
  // Adjacent dense linears (q, k and v loaded as row views of one matrix) take one GEMM
  // where the GEMV does not, up to kMaxGraphTokens rows (KILN_FUSE_LINEARS=0: loaded
  // apart, a GEMM each).
  bool fuses_adjacent_linears() const override { return fuse_linears_; }
  void set_fuse_linears(bool on) { fuse_linears_ = on; }
  void rope(const ops::RopeArgs& a) override;
  void qk_norm_rope(const ops::QkNormRopeArgs& a) override;
  void kv_store(const ops::KvStoreArgs& a) override;
  void attention(const ops::AttentionArgs& a) override;
  void mla_store(const ops::MlaStoreArgs& a) override;
  void mla_attention(const ops::MlaArgs& a) override;
  // The optional ops (cuda_dsa.cpp): DeepSeek sparse attention (unless its self-test
  // failed) and Gated DeltaNet.
  Status supports_op(ops::OptionalOp op) const override;
  // DeepSeek sparse attention (OptionalOp::kDsa; cuda_dsa.cpp).
  void layer_norm(const ops::LayerNormArgs& a) override;
  void dsa_index_store(const ops::DsaIndexStoreArgs& a) override;
  void dsa_select(const ops::DsaSelectArgs& a) override;
  void glu(const ops::GluArgs& a) override;
  void add(const ops::AddArgs& a) override;
  void slice_columns(const ops::SliceColumnsArgs& a) override;
  void moe(const ops::MoeArgs& a) override;
  void sample(const ops::SampleArgs& a) override;  // cuda_sampling.cpp
  void argmax(const ops::ArgmaxArgs& a) override;  // cuda_sampling.cpp
  void fill_random(const ops::FillRandomArgs& a) override;
  // Gated DeltaNet (OptionalOp::kGatedDeltaNet; cuda_gdn.cpp).
  void sigmoid_mul(const ops::SigmoidMulArgs& a) override;
  void gated_delta_net(const ops::GatedDeltaNetArgs& a) override;
  void copy_rows(const ops::CopyRowsArgs& a) override;

  const DeviceInfo& info() const { return info_; }
  cudaStream_t stream() const { return stream_; }
  int smem_cap() const { return smem_cap_; }

  // Attention path control (the self-test): force one path, or keep a path that
  // failed its self-test out of the automatic choice (the warp kernel remains).
  void set_verify_graphs(bool on) { verify_graphs_ = on; }
  void force_attention_path(AttentionPath p) { forced_attention_path_ = p; }
  void disable_attention_path(AttentionPath p) { disabled_attention_paths_.push_back(p); }
  // MoE expert path control, likewise (the GEMV path remains).
  void force_moe_path(MoePath p) { forced_moe_path_ = p; }
  void disable_grouped_moe() { grouped_moe_disabled_ = true; }
  // Quantized weights control (the self-test): after a failure upload_quantized
  // refuses every quantized weight with this reason.
  void disable_quantized(std::string reason) { quantized_disabled_ = std::move(reason); }
  // The native SM120 MoE GEMMs (quant_gemm_sm120.cu), per activation format: off until
  // the self-test has proved them on this device (it runs them on SM 12.x only).
  void enable_native_quant_moe(int act_format) { native_quant_moe_[act_format] = true; }
  // The W8A8 FP8 GEMMs (quant_gemm.cu) for prefill-shaped calls: on unless turned off
  // (KILN_FP8_W8A8=0, or kiln bench op's W8A16 rows): then FP8 weights stay W8A16.
  void set_w8a8(bool on) { w8a8_ = on; }
  // Gated DeltaNet's chunked form (kernels/gated_delta_net.cu) for a sequence with at least
  // this many rows in a step (INT32_MAX: never, KILN_GDN_CHUNKED=0; tests force either path).
  void set_gdn_chunk_min_tokens(int32_t n) { gdn_chunk_min_tokens_ = n; }
  // The bf16 GEMV for dense linears at batch 1-8 (launch_quant_gemv_linears with kBf16GemvFormat): on unless
  // turned off (KILN_BF16_GEMV=0: cuBLASLt at every shape).
  void set_bf16_gemv(bool on) { bf16_gemv_ = on; }
  bool bf16_gemv() const { return bf16_gemv_; }
  // Off: the dense linears take cuBLASLt at every shape, bf16 experts keep the GEMV
  // (KILN_BF16_GEMV=experts; for measuring the two apart).
  void set_bf16_gemv_dense(bool on) { bf16_gemv_dense_ = on; }
  bool bf16_gemv_dense() const { return bf16_gemv_ && bf16_gemv_dense_; }
  // The most tokens a quantized MoE layer takes the GEMV for (tiles beyond), in place
  // of the rule of moe_stream_gemv.
  void set_quant_gemv_moe_tokens(int64_t n) { quant_gemv_moe_tokens_ = n; }
  // Quantized dense linears of up to n rows take the GEMV in passes of
  // quant_gemv_max_rows(n_in) rows where one pass cannot take them all (each pass reads
  // the weight again), instead of the decode tiles; 0 (the default): off
  // (KILN_QUANT_GEMV_ROWS; kiln bench op's "linear (quantized, decode rows)" compares
  // both). The decode tiles run a CTA per 64 outputs over the whole K, so a long-K weight
  // (GLM-4.5-Air's FP8 o_proj: 12,288 inputs, 64 CTAs) is latency-bound at 6-31 rows.
  void set_quant_gemv_rows(int64_t n) { quant_gemv_rows_ = n; }
  // Whether weights of format f take the W8A8 GEMMs where a call is prefill-shaped
  // (a linear's rows or a MoE layer's pairs per expert at least 32: the 64-row tiles).
  bool use_w8a8(const QuantFormat& f) const {
    return w8a8_ && quant_w8a8_supported(f, info_.cc()) && quant_w8a8_smem_bytes() <= smem_cap_;
  }
  // Decode steps replayed from a recorded CUDA graph so far (tests, doctor).
  int64_t graph_replays() const { return graph_replays_; }
  // linears() calls that took one GEMM over adjacent weights (adjacent_gemm).
  int64_t adjacent_gemms() const { return adjacent_gemms_; }
  int64_t one_time_steps() const override { return one_time_steps_; }
  // MLA attend path control, likewise (the warp kernel remains).
  void force_mla_path(MlaPath p) { forced_mla_path_ = p; }
  void disable_mla_mma() { mla_mma_disabled_ = true; }
  // DeepSeek sparse attention control (the self-test): after a failure supports_op(kDsa)
  // refuses with this reason, so such models are refused at load.
  void disable_dsa(std::string reason) { dsa_disabled_ = std::move(reason); }

 private:
  // Device scratch of n elements of T, valid until the stream passes this op.
  template <typename T>
  T* scratch(int64_t n, std::vector<std::shared_ptr<void>>& keep) {
    keep.push_back(allocator_->allocate(size_t(n) * sizeof(T)));
    return static_cast<T*>(keep.back().get());
  }
  const int32_t* device_ids(const Tensor& ids, std::vector<std::shared_ptr<void>>& keep);
  const DeviceBatch& batch_for(const ops::BatchMeta* b) const;
  const float* rope_table(const ops::RopeTable& t);
  // The device table of an expert list: ExpertWeights (bf16) or QuantExpert (packed
  // quantized experts) per local expert, made (and its shapes checked) on first use.
  // The device table of an expert list: QuantExpert (packed experts) or ExpertWeights
  // (bf16); for bf16 experts not transposed also a QuantExpert view of them for the
  // streaming GEMV (kBf16GemvFormat), else nullptr.
  struct ExpertTables {
    const void* table = nullptr;
    const QuantExpert* bf16_gemv = nullptr;
  };
  ExpertTables expert_table(const ops::MoeExperts& ex, int64_t d_model);
  // The path heuristic for quantized weights (a tuner's place): the streaming GEMV
  // (quant_gemv.cu) while a weight meets at most quant_gemv_max_rows activation rows,
  // else the mma.sync tiles (quant_gemm.cu). A MoE layer takes the GEMV while its
  // experts average at most kQuantGemvTilesPerExpert GEMV tiles (of up to
  // quant_gemv_max_rows rows) each, and always at up to 16 tokens: each tile streams
  // its expert's weights again, but the GEMV runs near 50% of copy bandwidth where the
  // tiles, mostly empty rows at these sizes, reach 11-17% ("Quantized MoE decode" in
  // docs/PERF.md: faster at every measured size up to 256 tokens).
  // KILN_QUANT_GEMV_MOE_TOKENS replaces the rule by a token count (measurements).
  static constexpr int64_t kQuantGemvTilesPerExpert = 4;
  // MoE layers of at least this many tokens compute router logits by cuBLASLt.
  static constexpr int64_t kRouterGemmTokens = 64;
  // Dense bf16 weights up to this many elements take the GEMV at batch 1-8 (bigger ones,
  // an lm_head, stream at 85-90% of copy bandwidth through cuBLASLt already).
  static constexpr int64_t kBf16GemvMaxWeights = int64_t(64) << 20;
  // Whether a dense bf16 weight takes the bf16 GEMV at batch 1-8 (linear, weight_path).
  bool bf16_gemv_weight(const ops::Weight& w) const;
  // How linear runs a.w through the GEMV (quant_gemv.cu), or nullopt where it does not.
  struct GemvLinear {
    QuantFormat format;
    GemvPart part;
  };
  std::optional<GemvLinear> gemv_linear(const ops::LinearArgs& a) const;
  int64_t quant_gemv_moe_tokens_ = -1;  // >= 0: the token count that replaces the rule
  int64_t quant_gemv_rows_ = 0;         // set_quant_gemv_rows
  // The rows of one GEMV pass where a quantized dense linear of `rows` rows takes the
  // GEMV in several passes (set_quant_gemv_rows), else 0.
  int64_t gemv_pass_rows(const ops::Weight& w, int64_t rows) const {
    const int64_t pass = w.quantized() ? quant_gemv_max_rows(w.n_in()) : 0;
    return pass > 0 && rows > pass && rows <= quant_gemv_rows_ ? pass : 0;
  }
  // bf16 experts (row-major) stream under the same rule with one tile per expert: while
  // each is read once. From there the grouped bf16 tiles, unlike the quantized ones, are
  // as fast, and twice as fast where the GEMV would stream experts several times
  // (Qwen3-30B-A3B: level at 64 tokens, 568 vs 1141 us at 512).
  static constexpr int64_t kBf16GemvTilesPerExpert = 1;
  bool moe_stream_gemv(int64_t n_tokens, int64_t n_pairs, int n_local, int gemv_rows, int64_t tiles_per_expert) const {
    if (gemv_rows < 1) return false;
    if (quant_gemv_moe_tokens_ >= 0) return n_tokens <= quant_gemv_moe_tokens_;
    return n_tokens <= 16 || n_pairs <= tiles_per_expert * gemv_rows * n_local;
  }
  // A quantized weight as bf16 [n_out, n_in] (MLA's kv_b), made on first use.
  const bf16* dequantized(const ops::Weight& w);
  // y [rows, n_out] = x [rows, n_in] W^T through cuBLASLt (bf16 in, fp32 accumulate).
  void gemm(const Tensor& x, const ops::Weight& w, Tensor& y);
  // linears() of bf16 weights that are row views of one matrix, one after the other: one
  // GEMM over them all into scratch, its columns handed out (biases added) by one kernel;
  // false (nothing done) where they are not.
  bool adjacent_gemm(const ops::LinearsArgs& a);
  // The same into fp32 y, unrounded, W row-major [n_out, n_in] (the MoE router at prefill).
  void gemm_f32(const bf16* x, const bf16* w, int64_t rows, int64_t n_out, int64_t n_in, float* y);

  DeviceInfo info_;
  int smem_cap_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  std::shared_ptr<CachingAllocator> allocator_;
  std::shared_ptr<void> workspace_;
  size_t workspace_bytes_ = 32u << 20;

  const ops::BatchMeta* host_batch_ = nullptr;
  DeviceBatch batch_;
  // The step's metadata: packed in pinned host memory, copied to one device
  // buffer that moves only when it grows (recorded graphs read it in place).
  std::shared_ptr<void> batch_buffer_;
  std::shared_ptr<void> greedy_rows_;  // argmax: SampleRows of temperature 0
  int64_t greedy_rows_n_ = 0;
  int32_t* batch_staging_ = nullptr;  // pinned, batch_capacity_ entries
  size_t batch_capacity_ = 0;
  cudaEvent_t batch_copied_ = nullptr;  // the staging may be rewritten once this passed
  // The step's micro-batches (add_step_batch), each in a block of its own.
  struct StepPart {
    const ops::BatchMeta* host = nullptr;
    DeviceBatch device;
    std::shared_ptr<void> memory;
  };
  std::vector<StepPart> step_parts_;
  int32_t* parts_staging_ = nullptr;  // pinned, parts_capacity_ entries, parts_used_ of them this step
  size_t parts_capacity_ = 0, parts_used_ = 0;
  cudaEvent_t parts_copied_ = nullptr;

  // CUDA graphs of decode-shaped steps (run_step), per key and batch shape.
  struct StepGraph {
    int eager_runs = 0;               // the first run is eager: it creates lazy tables and plans
    bool failed = false;              // capture failed once: stay eager
    cudaGraphExec_t exec = nullptr;
    Tensor out;
    std::vector<std::shared_ptr<void>> keep;  // every block the recorded kernels use
  };
  using GraphKey = std::tuple<uint64_t, int32_t, int32_t, int32_t, int32_t, int32_t, bool>;
  std::map<GraphKey, StepGraph> graphs_;
  bool graphs_enabled_ = true;
  bool verify_graphs_ = true;  // uniform speculative verify steps recorded too (KILN_CUDA_VERIFY_GRAPHS=0: not)
  int64_t graph_replays_ = 0, one_time_steps_ = 0, adjacent_gemms_ = 0;
  // Bytes the recorded steps hold, and the most they may (ops::graph_memory_budget): a
  // shape whose recording would pass it runs eagerly.
  size_t graph_bytes_ = 0, graph_budget_ = 0;
  bool graph_budget_logged_ = false;
  void release_graphs();
  // Device copies of per-model constants, keyed by the host object and checked
  // against its content on every lookup (a freed object's address may be reused).
  std::map<const ops::RopeTable*, std::pair<std::vector<float>, std::shared_ptr<void>>> rope_tables_;
  struct ExpertTable {
    std::vector<const void*> sources;           // host-visible identity: weight and bias data pointers
    std::vector<std::shared_ptr<void>> keep;    // the table and fp32 copies of bf16 biases
    ExpertTables device;
  };
  std::map<const ops::MoeExperts*, ExpertTable> expert_tables_;
  std::map<const ops::Weight*, std::pair<const void*, Tensor>> dequantized_;  // by weight, checked by data
  // Device blocks an op's kernels use for its own intermediate values (scratch<T>): an op
  // that takes any holds a ScratchScope, which gives them back to the allocator's cache
  // when the op returns. Its kernels are queued by then, and all of this backend's work
  // runs on one stream, so a later op reusing a block runs after them; a step's peak is
  // one op's scratch, not every layer's (a CUDA graph being recorded keeps its blocks
  // anyway). begin_step clears what is left.
  std::vector<std::shared_ptr<void>> op_scratch_;
  struct ScratchScope {
    explicit ScratchScope(std::vector<std::shared_ptr<void>>& blocks) : blocks_(blocks), mark_(blocks.size()) {}
    ~ScratchScope() { blocks_.resize(mark_); }
    ScratchScope(const ScratchScope&) = delete;
    ScratchScope& operator=(const ScratchScope&) = delete;

   private:
    std::vector<std::shared_ptr<void>>& blocks_;
    size_t mark_;  // blocks before the op: a nested op releases only its own
  };
  // cuBLASLt descriptors and the chosen algorithm per GEMM shape, made once: a
  // decode step runs the same few shapes every time.
  struct GemmPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using GemmKey = std::tuple<int64_t, int64_t, int64_t, bool, bool>;  // rows, n_out, n_in, transposed, f32_out
  std::map<GemmKey, GemmPlan> gemm_plans_;
  const GemmPlan& gemm_plan(int64_t rows, int64_t n_out, int64_t n_in, bool transposed, bool f32_out);
  void release_gemm_plans();
  AttentionPath forced_attention_path_ = AttentionPath::kAuto;
  std::vector<AttentionPath> disabled_attention_paths_;
  MoePath forced_moe_path_ = MoePath::kAuto;
  bool grouped_moe_disabled_ = false;
  MlaPath forced_mla_path_ = MlaPath::kAuto;
  bool mla_mma_disabled_ = false;
  std::string dsa_disabled_;  // non-empty: the self-test failure that disabled DSA
  std::string quantized_disabled_;  // non-empty: the self-test failure that disabled them
  bool native_quant_moe_[2] = {false, false};  // by quant_native_act_format
  bool w8a8_ = true;
  bool bf16_gemv_ = true;
  bool bf16_gemv_dense_ = true;
  bool fuse_linears_ = true;
  int32_t gdn_chunk_min_tokens_ = kGdnChunkMinTokens;
};

}  // namespace kiln::cuda
