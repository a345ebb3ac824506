// ModelRunner: the ranks that run the model (one, or many with tensor, expert and
// pipeline parallelism), each with its backend, its part of the model and its KV cache,
// and the step that runs them together.
//
// One process, one thread per rank: rank 0 is the caller's thread (the engine thread,
// which also samples on rank 0's backend); ranks 1..n-1 are threads of this runner that
// wait for a job. The scheduler exists once, on rank 0: every rank runs the same step
// batch (in-process, so "broadcasting" it is handing over a pointer). World rank
// r = stage * tp + tp_rank; stage s holds layers [s * L / pp, (s + 1) * L / pp).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/progress.h"
#include "core/status.h"
#include "model/blocks.h"
#include "model/loader.h"
#include "ops/backend.h"
#include "runtime/kv_cache.h"

namespace kiln::runtime {

struct ParallelConfig {
  int tensor_parallel = 1;    // --tensor-parallel-size
  int pipeline_parallel = 1;  // --pipeline-parallel-size
  bool expert_parallel = false;  // --enable-expert-parallel: experts split whole over the tensor-parallel group
  // --watchdog-timeout: a step in which no rank moves (enters or leaves a collective, or
  // finishes) for this long is aborted with an error naming the rank that holds the
  // others up (0: no watchdog). Applies with several ranks.
  double watchdog_seconds = 60.0;
  // A pipeline splits a step into micro-batches (its sequences in up to
  // pipeline_parallel parts, so the stages overlap) only where the step has at least this
  // many tokens: below it a step is bound by reading the weights, which each micro-batch
  // reads again (two micro-batches cost a stage ~1.5x a step's weight reads in the
  // pipeline's fill and drain), so decode steps run whole, one stage after the other.
  // 0: every step of several sequences is split (tests).
  int32_t pipeline_micro_min_tokens = 512;
  // A tensor-parallel step of at least this many rows runs as two micro-batches whose sums
  // overlap the other's work (model::CausalLM::micro_batch_rows); 0: never. -1 (the
  // default): KILN_MICRO_BATCH_ROWS where set (0 turns it off), else 1024 where the group's
  // communicator says it pays (Communicator::overlap_pays: sums through host memory),
  // else never. A step the backend may record (CUDA graphs) stays whole.
  int64_t micro_batch_rows = -1;
  int world() const { return tensor_parallel * pipeline_parallel; }
};

// The communicators of a world of ranks: rank r's world communicator (pipeline hand-offs,
// logits to rank 0) and its tensor-parallel group's (ranks of its stage), and a way to
// fail all of them (a rank that dies).
// ParallelConfig::micro_batch_rows resolved (KILN_MICRO_BATCH_ROWS where the config
// leaves it to the default) for a tensor-parallel group whose communicator does or does
// not say overlap pays (Communicator::overlap_pays).
int64_t resolve_micro_batch_rows(const ParallelConfig& p, bool overlap_pays);

struct CommWorld {
  std::vector<comm::Communicator*> world, tp;
  std::shared_ptr<void> owner;
  std::function<void(const std::string& reason)> abort;
};
// Makes the communicators for the ranks' backends (NCCL for GPUs: the CLI supplies it).
using CommFactory = std::function<Result<CommWorld>(const std::vector<ops::Backend*>& backends,
                                                    const ParallelConfig& parallel)>;
// In-process groups over host memory (comm/local_group.h): the CPU backend's.
Result<CommWorld> local_comm_world(const std::vector<ops::Backend*>& backends, const ParallelConfig& parallel);

class ModelRunner {
 public:
  // backends[r] is world rank r's; their number is parallel.world(). `comms` may be
  // empty for one rank (or for host backends: local_comm_world).
  static Result<std::unique_ptr<ModelRunner>> create(std::vector<std::unique_ptr<ops::Backend>> backends,
                                                     const ParallelConfig& parallel, const CommFactory& comms);
  ~ModelRunner();

  int world() const { return int(ranks_.size()); }
  const ParallelConfig& parallel() const { return parallel_; }
  ops::Backend& backend(int rank = 0) { return *ranks_[size_t(rank)].backend; }
  const model::CausalLM& model(int rank = 0) const { return ranks_[size_t(rank)].model; }
  // Rank r's part of the model: its tensor-parallel slice and pipeline stage's layers of n_layers.
  model::Shard shard(int rank, int64_t n_layers) const;

  // Builds every rank's part at once, each on its rank's thread: build(rank, shard).
  Status build(int64_t n_layers, const std::function<Result<model::CausalLM>(int rank, const model::Shard&)>& build);

  // KV caches of n_blocks blocks, one per rank (each with its layers and heads).
  // n_state_slots: recurrent layers' per-sequence states (ignored by a model without).
  std::vector<KvCache> make_kv(int32_t n_blocks, int32_t block_size, KvCacheDtype dtype, int32_t n_state_slots = 0);
  bool recurrent() const;
  // Bytes of one recurrent-state row on the rank that needs the most (0 without).
  int64_t state_bytes_per_row() const;
  // The most bytes one token slot takes on any rank.
  int64_t kv_bytes_per_token(KvCacheDtype dtype) const;

  // One step over `batch` (alive and unchanged until it returns): logits
  // [batch.logit_rows.size(), vocab] on rank 0's backend, valid until the next step.
  // A pipeline splits the batch's sequences into micro-batches, so the stages overlap,
  // where the step has ParallelConfig::pipeline_micro_min_tokens tokens or more.
  // A rank's failure fails the step on every rank: the error names the rank.
  Result<Tensor> forward(const ops::BatchMeta& batch, std::vector<KvCache>& kv);

  // Multi-token prediction (--speculative-method mtp; every rank's model has its MTP
  // layer): from now on forward() keeps the final hidden state of each of up to
  // max_tokens rows, which mtp_forward reads; pending_rows (0: none) more can be kept
  // for a later MTP pass (mtp_keep); and max_depth rows of draft ids (mtp_argmax).
  void enable_mtp(int32_t max_tokens, int32_t pending_rows, int32_t max_depth);
  bool mtp_enabled() const { return !mtp_.empty(); }
  int32_t mtp_pending_rows() const { return mtp_.empty() || !mtp_[0].pending.defined() ? 0 : int32_t(mtp_[0].pending.dim(0)); }
  // Copies the last forward step's hidden rows [0, n) to the kept rows [at, at + n).
  Status mtp_keep(int32_t n, int32_t at);
  // Where mtp_forward's rows read their hidden state: the last forward step's, the last
  // mtp_forward's outputs (row i: its logit row i), or the rows mtp_keep kept.
  enum class MtpInput { kStep, kChain, kKept };
  // The MTP layer over `batch` on every rank (model::CausalLM::mtp_forward): row r reads
  // hidden row batch.input_rows[r] of `from`, and (tokens_from_depth = j >= 0, one rank
  // only) token draft_ids(j)[r] instead of batch.token_ids[r]. Logits
  // [batch.logit_rows.size(), vocab] on rank 0's backend, valid until the next step; with
  // one rank the work may still be running (nothing here waits for it).
  Result<Tensor> mtp_forward(const ops::BatchMeta& batch, MtpInput from, std::vector<KvCache>& kv,
                             int tokens_from_depth = -1);
  // Greedy ids of `logits`'s n rows into draft row `depth` (ids [depth n, (depth + 1) n))
  // on rank 0, not waited for.
  void mtp_argmax(const Tensor& logits, int depth);
  // Draft rows [0, depths) of passes of n rows, on the host (waits for them).
  std::vector<int32_t> mtp_read_drafts(int depths, int n);
  // All draft rows (rank 0's memory): a verify step may read its tokens there.
  const Tensor& mtp_draft_ids() const { return mtp_[0].draft_ids; }

  // Runs fn(rank) on every rank's thread at once (rank 0 on this one); the first
  // failure, after every rank has stopped (the others are aborted out of collectives).
  // With watched_step, the watchdog aborts it when no rank moves for its timeout (a
  // forward step is watched; loading is not). When a rank is still in fn kStuckGrace
  // after such an abort, the error says so and every later run fails at once (the
  // process should exit: that rank's thread may still touch fn's captures).
  Status run(const std::function<void(int rank)>& fn, bool watched_step = false);
  static constexpr std::chrono::milliseconds kStuckGrace{10000};

  // World rank r's communicators as the model uses them (watched): its world and its
  // tensor-parallel group's; null with one rank.
  comm::Communicator* world_comm(int rank) const { return comms_.world.empty() ? nullptr : comms_.world[size_t(rank)]; }
  comm::Communicator* tp_comm(int rank) const { return comms_.tp.empty() ? nullptr : comms_.tp[size_t(rank)]; }

 private:
  struct Rank {
    std::unique_ptr<ops::Backend> backend;
    model::CausalLM model;
  };
  struct Threads;
  struct Watchdog;
  ModelRunner() = default;

  ParallelConfig parallel_;
  std::vector<Rank> ranks_;
  CommWorld comms_;  // its world / tp entries are the watched wrappers below
  std::shared_ptr<comm::ProgressBoard> board_;
  std::vector<std::unique_ptr<comm::WatchedCommunicator>> watched_;
  std::unique_ptr<Watchdog> watchdog_;
  std::optional<std::string> stuck_;  // set when a rank did not return after an abort
  std::unique_ptr<Threads> threads_;
  struct MtpBuffers {
    Tensor step_hidden;  // [max_tokens, d_model]: forward()'s final hidden states
    Tensor chain[2];     // mtp_forward's outputs, alternately
    int last = 0;        // chain[last] holds the latest
    Tensor pending;      // [pending_rows, d_model]: rows mtp_keep kept
    Tensor draft_ids;    // [max_depth * max_tokens] i32 (rank 0): mtp_argmax's outputs, draft row
                         // j of a pass of n rows at [j n, (j + 1) n)
  };
  std::vector<MtpBuffers> mtp_;  // per rank, once enable_mtp ran
  std::vector<ops::BatchMeta> micro_;  // the current step's micro-batches
  Tensor logits_;                      // a pipeline's gathered logits (rank 0)
};

// World rank `rank`'s part of a model of n_layers decoder layers under `parallel`: its
// tensor-parallel slice and its pipeline stage's layers.
model::Shard shard_of(const ParallelConfig& parallel, int rank, int64_t n_layers);

// The sequences [begin, end) of `b` as a batch of their own (their tokens, block
// tables and logit rows, rebased).
ops::BatchMeta batch_slice(const ops::BatchMeta& b, int32_t begin, int32_t end);

}  // namespace kiln::runtime
