// Engine: a loaded model on a backend, its paged KV cache, and the continuous-batching
// loop's single step. One thread drives an Engine (the AsyncEngine's loop when serving;
// the caller for logits / generate / generate_batch).
//
//   add_request -> scheduler (waiting) -> step(): schedule -> batch -> model forward
//     -> sample (each sequence with its own seeded generator) -> StepOutputs
//     -> finished sequences free their blocks
#pragma once

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "formats/hf_config.h"
#include "model/blocks.h"
#include "ops/backend.h"
#include "runtime/batch_builder.h"
#include "runtime/adaptive_depth.h"
#include "runtime/block_manager.h"
#include "runtime/kv_cache.h"
#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/state_cache.h"
#include "runtime/sequence.h"
#include "runtime/sizing.h"
#include "runtime/speculative.h"

namespace kiln::runtime {

enum class LoadFormat {
  kAuto,   // the checkpoint's safetensors
  kDummy,  // random weights made on the backend from config.json alone (benchmarks)
};

struct EngineOptions {
  int32_t block_size = 16;          // tokens per KV block
  int64_t max_model_len = 0;        // 0: config max_position_embeddings, within the KV cache
  int32_t prefill_chunk = 0;        // tokens of one sequence per step at most (0: the step budget)
  int32_t max_num_seqs = 256;       // running sequences at most
  int32_t max_num_batched_tokens = 0;  // tokens per step at most (0: max(2048, max_num_seqs))
  bool enable_prefix_caching = true;
  // KV cache size. 0: on a GPU, gpu_memory_utilization of what is free after the weights,
  // a measured activation peak and kDeviceReserveBytes; on the CPU, enough for max_num_seqs full-length
  // sequences, at most kDefaultCpuKvBytes. A default max_model_len longer than the cache
  // holds is lowered to it; an explicit one is an error.
  int64_t kv_cache_bytes = 0;
  float gpu_memory_utilization = 0.9f;
  // How the cache stores K / V: unquantized, or e4m3 with per-row scales (about twice
  // the tokens in the same bytes; ops/kv_quant.h).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kBf16;
  // Weight loading progress: checkpoint bytes bound so far, of the total.
  std::function<void(uint64_t done, uint64_t total)> on_load_progress;
  LoadFormat load_format = LoadFormat::kAuto;
  int64_t num_layers = 0;           // > 0: only the first N decoder layers (quick runs)
  // Recurrent (Gated DeltaNet) models with prefix caching: state checkpoints kept for
  // cached prefixes (runtime/state_cache.h); -1: max_num_seqs.
  int32_t state_checkpoints = -1;
  // Speculative decoding (runtime/speculative.h): n-gram or MTP drafts of up to
  // num_speculative_tokens tokens per decoding sequence, verified in one step.
  SpeculativeMethod speculative_method = SpeculativeMethod::kOff;
  int32_t num_speculative_tokens = 0;  // >= 1 when speculative_method is not kOff
  // Each step's draft depth k in [0, num_speculative_tokens] from the measured acceptance
  // and step cost (runtime/adaptive_depth.h); false: always num_speculative_tokens.
  bool speculative_adaptive = true;
  int32_t speculative_probe_interval = 32;  // the policy's steps between probes (AdaptiveDepthConfig)
  int32_t speculative_governor_window = 32;  // its governor's window in steps (0: no governor)
  std::function<int32_t(int64_t step)> speculative_depth_schedule;  // tests: AdaptiveDepthConfig::schedule
  // Tests: with ngram, the drafts (at most k) of a request's sequence given its tokens,
  // instead of the n-gram drafter's (drafts that stand as often as a test needs).
  std::function<std::vector<int32_t>(uint64_t request_id, std::span<const int32_t> tokens, int32_t k)>
      speculative_test_drafter;
  // MTP: the buffer of hidden rows decode steps planned without drafts keep for one later
  // MTP pass holds this many steps of max_num_seqs rows (more steps of a smaller batch;
  // runtime/mtp_drafts.cpp); 0: the MTP layer runs after every step.
  int32_t mtp_deferred_steps = 16;
  // MTP with one rank: a chained pass reads its tokens where the previous pass's argmax
  // left them, and the next verify step its drafts, so neither waits for them (mtp_fetch
  // reads them back later). false (tests): each pass's drafts come to the host and go out
  // with the next batch, as with several ranks.
  bool mtp_chain_on_device = true;
  // Several ranks (model_runner.h): one backend each, given to load() in rank order;
  // `comms` makes their communicators (empty: in-process groups, host backends only).
  ParallelConfig parallel;
  CommFactory comms;
};
constexpr int64_t kDefaultCpuKvBytes = int64_t(256) << 20;
// Device memory the KV cache leaves to the runtime (at least; 1/64 of the device if more).
constexpr int64_t kDeviceReserveBytes = int64_t(512) << 20;
// What a device keeps back from the KV cache: that reserve (the driver's local memory,
// cuBLASLt, graph executables) plus the memory recorded steps may hold
// (ops::graph_memory_budget).
inline int64_t device_reserve_bytes(int64_t device_total) {
  return std::max<int64_t>(kDeviceReserveBytes, device_total / 64) + ops::graph_memory_budget(device_total);
}

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (the final eos included if one stopped it)
  bool stopped_by_eos = false;
  // One per token when SamplingParams::logprobs >= 0 (token, its logprob, the top
  // alternatives), else empty.
  std::vector<SampledToken> logprobs;
};

// One sampled token of one sequence.
struct StepOutput {
  uint64_t request_id = 0;
  int32_t sample_index = 0;
  SampledToken token;
  FinishReason finish = FinishReason::kNone;  // set when this token ended the sequence
};

// Monotonic counters and current gauges of an engine.
struct EngineStats {
  int64_t steps = 0;
  int64_t prompt_tokens = 0;      // prompt tokens of added requests (once per request, whatever n)
  int64_t computed_tokens = 0;    // tokens run through the model (prefill + decode + recompute)
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int32_t running = 0, waiting = 0;  // sequences
  int32_t waiting_requests = 0;      // requests none of whose sequences has run yet
  int32_t kv_blocks_used = 0, kv_blocks_total = 0;
  // Steps by kind: decode (every sequence computes one token; a recorded CUDA graph where
  // the backend has them), verify (every sequence decodes, some verifying drafts) or mixed
  // (prefill chunks in the step). Seconds are the wall time of step(): scheduling, the
  // forward pass, sampling and the draft passes it queues.
  // Where a kind's wall time goes, by phase: plan (drafts proposed, scheduling, the batch
  // built), launch (the forward pass queued: a graph replay, or every op's launch), sample
  // (sampling and verification, which wait for the device: the forward pass's time where
  // the host ran ahead of it) and finish (tokens emitted, blocks committed, the MTP passes
  // queued, the depth policy). The device idles through plan and finish.
  static constexpr int kPhases = 4;
  static constexpr const char* kPhaseNames[kPhases] = {"plan", "launch", "sample", "finish"};
  struct StepKind {
    int64_t steps = 0, tokens = 0;
    double seconds = 0.0;
    double phase_seconds[kPhases] = {};
  };
  StepKind decode_steps, verify_steps, mixed_steps;
  // Steps that ran a batch shape for the first time or recorded it (a CUDA graph), on any
  // rank: their time is mostly that one-time cost (ops::Backend::one_time_steps).
  int64_t one_time_steps = 0;
  // Speculative decoding: draft tokens verified, and those the target accepted.
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0;
  int64_t spec_verified_seqs = 0;  // sequence-steps that verified drafts
  // Draft depths chosen (runtime/adaptive_depth.h): steps where some decoding sequence had
  // a draft, the sum of their depths, and the mean of the recent ones (an EMA over ~32).
  int64_t spec_depth_steps = 0, spec_depth_total = 0;
  double spec_depth_recent = 0.0;
  // MTP (runtime/mtp_drafts.cpp): hidden rows kept aside by steps planned without drafts,
  // and the MTP passes that ran over them later.
  int64_t mtp_deferred_rows = 0, mtp_flushes = 0;
  // Steps that drafted with MTP, and their chained passes (drafts 2..k; each drafting step
  // also runs a first pass over its rows).
  int64_t mtp_draft_steps = 0, mtp_chained_passes = 0;

  // Adds another engine's counters and gauges to these (data-parallel replicas as one
  // server; every field but spec_depth_recent, a mean: runtime::combined_stats). A field
  // added above is added here too.
  void add(const EngineStats& o);
};

// A step that failed on some rank (a dead GPU, a failed collective): the engine cannot
// go on. Thrown by step(), logits() and generate*(); the server stops on it.
struct EngineFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  // model_dir: a checkpoint directory; with LoadFormat::kDummy, a directory holding
  // config.json or the path of a config .json file.
  static Result<std::unique_ptr<Engine>> load(const std::string& model_dir,
                                              std::unique_ptr<ops::Backend> backend,
                                              const EngineOptions& options);
  // One backend per rank of options.parallel (world rank order).
  static Result<std::unique_ptr<Engine>> load(const std::string& model_dir,
                                              std::vector<std::unique_ptr<ops::Backend>> backends,
                                              const EngineOptions& options);

  // ---- one call, one answer (CLI, tests); not while requests are in flight

  // fp32 logits of every prompt position, [n_prompt][vocab].
  Result<std::vector<std::vector<float>>> logits(const std::vector<int32_t>& prompt);
  // --speculative-method mtp: fp32 logits of the MTP layer at positions 0 .. n-2 of the
  // prompt, each given the prompt's next token ([n_prompt - 1][vocab]: row t predicts
  // prompt[t + 2]); in chunks of prefill_chunk like logits() (runtime/mtp_drafts.cpp).
  Result<std::vector<std::vector<float>>> mtp_logits(const std::vector<int32_t>& prompt);
  // Up to max_new_tokens sampled tokens; stops early at an eos id unless ignore_eos.
  Result<GenerateResult> generate(const std::vector<int32_t>& prompt, int32_t max_new_tokens,
                                  const SamplingParams& sampling, bool ignore_eos = false);
  // Several prompts as requests of one continuous batch, each sampling with its own
  // generator seeded by sampling.seed: on a backend whose rows are independent (the CPU
  // reference) the result equals separate generate calls.
  Result<std::vector<GenerateResult>> generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                     int32_t max_new_tokens, const SamplingParams& sampling,
                                                     bool ignore_eos = false);

  // ---- serving: one thread calls these

  // Whether the engine can take the request (invalid_argument with the numbers if not).
  Status check_request(const Request& r) const;
  // Queues a checked request; its id must be unused. max_tokens must be >= 1.
  Status add_request(uint64_t id, std::shared_ptr<const Request> r);
  // Ends a request's sequences (or only sample `sample`) at once and frees their blocks
  // (unknown ids: no-op).
  void cancel(uint64_t id, int32_t sample = -1);
  // Runs one step of the continuous batch; the tokens it sampled (nothing when idle).
  std::vector<StepOutput> step();
  bool idle() const { return scheduler_->idle(); }
  bool has_request(uint64_t id) const { return requests_.count(id) != 0; }
  EngineStats stats() const;
  // Speculative decoding's depth policy and its estimates (nullptr without speculation).
  const AdaptiveDepth* speculation_depth() const { return depth_.get(); }

  const formats::ModelConfig& config() const { return config_; }
  int64_t max_model_len() const { return max_model_len_; }
  int64_t kv_capacity_tokens() const { return kv_[0].capacity_tokens(); }
  int64_t kv_cache_bytes() const { return kv_bytes_; }  // per rank at most
  // The weights' bytes on the devices, every rank's summed (about the model's size under
  // tensor or pipeline parallelism), and rank 0's device memory; 0 where the backend does
  // not say (the CPU's).
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t device_memory_bytes() const;
  KvCacheDtype kv_cache_dtype() const { return kv_[0].dtype; }
  DType kv_cache_storage() const { return kv_[0].storage; }  // bf16 / f32 (CPU) / f8e4m3
  const SchedulerConfig& scheduler_config() const { return scheduler_->config(); }
  bool prefix_caching() const { return blocks_->prefix_caching(); }
  int32_t block_size() const { return blocks_->block_size(); }  // tokens per KV block
  ops::Backend& backend() { return *backend_; }  // rank 0's (sampling)
  const ParallelConfig& parallel() const { return runner_->parallel(); }
  // End-of-sequence ids: config.json's, generation_config.json's and the tokenizer's.
  const std::vector<int32_t>& eos_token_ids() const { return eos_ids_; }

 private:
  Engine() = default;
  Status check_prompt(const std::vector<int32_t>& prompt, int64_t extra_tokens) const;
  // Gives a sequence's recurrent-state row back (no-op without one).
  void release_state_slot(Sequence& seq);
  // Recurrent models: rows to the scheduled sequences that have none (restored from the
  // prefix checkpoint where they start after cached blocks), before a step; checkpoints
  // of the states that end on a block boundary, after it.
  void assign_state_rows(const Schedule& schedule);
  void checkpoint_states(const Schedule& schedule);  // (sequences with drafts: after verification)
  void checkpoint_state(const Sequence& seq);
  void copy_state_row(int32_t src, int32_t dst);
  Status size_kv_cache(const EngineOptions& options);
  // config_ from the checkpoint (or a config .json for dummy weights), cut to
  // options.num_layers; returns its quantization config.
  Result<formats::QuantConfig> read_config(const std::string& model_dir, const EngineOptions& options);
  Status load_weights(const std::string& model_dir, const EngineOptions& options, const formats::QuantConfig& quant);
  // On devices that report their memory (`devices`, one a rank): each rank's weights and an
  // estimate of its activations sized from the shapes alone (runtime/sizing.h) against what
  // the device has free, so a layout that cannot fit is refused before the communicators
  // are made and minutes of loading (what they take comes out of the runtime's reserve,
  // device_reserve_bytes). Returns the sizes (none where they could not be found).
  Result<std::vector<RankSizing>> check_layout_fits(const formats::QuantConfig& quant, const EngineOptions& options,
                                                    const std::vector<ops::Backend*>& devices);
  // The activation memory of the largest step the scheduler can make (GPU sizing).
  int64_t measure_activation_peak();
  Tensor forward(ops::BatchMeta&& batch);
  // One sequence's batch (logits(), mtp_logits()): tokens at positions first_pos .. over
  // `table`, the logits of every row (all_rows) or of the last.
  ops::BatchMeta one_sequence_batch(const BlockTable& table, std::span<const int32_t> tokens, int32_t first_pos,
                                    bool all_rows) const;
  Tensor run_forward(std::vector<KvCache>& kv);  // step_batch_ over every rank; throws EngineFailure
  void finish(Sequence& seq, FinishReason reason);
  // Speculative decoding: drafts for the running decoding sequences, before a step.
  void propose_drafts();
  // --speculative-method mtp, after a step (runtime/mtp_drafts.cpp): the MTP layer over
  // the positions each running sequence committed in it (their hidden states), then
  // chained for up to num_speculative_tokens drafts of each decoding sequence.
  // While the depth policy plans no drafts, decode steps only keep their hidden rows and
  // the MTP layer runs over them later, all at once (mtp_flush: before the next MTP pass,
  // or when the kept rows are full). A kept row: its sequence (null once it ended or was
  // preempted: mtp_forget), position, next token and KV slot.
  struct MtpKept {
    Sequence* seq = nullptr;
    int32_t pos = 0, token = 0, slot = 0;
  };
  void mtp_flush();
  void mtp_forget(Sequence& seq);
  void mtp_drafts(const std::vector<StepBatch::Rows>& rows);
  // With one rank the last MTP drafts stay in the backend's memory until needed on the
  // host: the next verify step reads them there (BatchMeta::device_token_rows), and
  // mtp_fetch brings them to their sequences (after that step's forward pass is queued,
  // or earlier where a grammar needs them).
  void mtp_mark_device_drafts(ops::BatchMeta& batch, const std::vector<StepBatch::Verify>& verify) const;
  void mtp_fetch();
  // Appends one sampled token to seq and ends it where a stop condition holds; false
  // when it ended (nothing more may follow).
  bool emit(Sequence& seq, SampledToken t, std::vector<StepOutput>& outs, std::vector<uint64_t>& done);
  void force(SampledToken& t, int32_t id, const Tensor& logits, size_t row, bool logprob);

  struct RequestState {
    std::shared_ptr<const Request> request;
    std::vector<std::unique_ptr<Sequence>> seqs;
    int32_t n_unfinished = 0;
    bool started = false;  // a sequence of it has run
  };
  void drop_request(std::unordered_map<uint64_t, RequestState>::iterator it);

  formats::ModelConfig config_;
  std::unique_ptr<ModelRunner> runner_;  // the ranks: backends, model parts
  ops::Backend* backend_ = nullptr;      // rank 0's
  std::vector<KvCache> kv_;              // per rank
  int64_t kv_bytes_ = 0;
  int64_t weight_bytes_ = 0;
  std::unique_ptr<BlockManager> blocks_;
  StateCache states_;  // recurrent models: the per-sequence state rows and prefix checkpoints
  std::unique_ptr<Scheduler> scheduler_;
  EngineOptions options_;
  int64_t max_model_len_ = 0;
  std::vector<int32_t> eos_ids_;
  ops::BatchMeta step_batch_;  // the current step's batch (backends read it until the step ends)
  ops::BatchMeta mtp_batch_;   // likewise, the MTP layer's current step
  std::vector<MtpKept> mtp_kept_;  // row i: the runner's kept row i (ModelRunner::mtp_keep)
  std::vector<Sequence*> mtp_on_device_;  // slot i's sequence whose drafts are on the device (or null)
  int32_t mtp_on_device_depths_ = 0;     // draft rows of those drafts
  std::unordered_map<uint64_t, RequestState> requests_;
  EngineStats stats_;
  int32_t unstarted_requests_ = 0;
  std::unique_ptr<AdaptiveDepth> depth_;  // with speculative decoding
  // Threads that fill a step's token masks (structured output) while its forward pass
  // runs: 4 on the CPU backend, whose forward pass has the cores; on a GPU backend half
  // the host's hardware threads, 4 to 16 (64 constrained streams missing the mask cache
  // at a few ms a mask outlasted the forward pass on 4: docs/perf/structured-output.md).
  int mask_threads_ = 4;
};

}  // namespace kiln::runtime
