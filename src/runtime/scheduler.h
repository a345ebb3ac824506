// Scheduler: which sequences run in the next step, and how many of their tokens.
//
// Continuous batching with chunked prefill, first come first served:
//   1. running sequences, oldest first, each asks for its uncomputed tokens (1 when
//      decoding, plus its speculative drafts where the budget and free blocks allow after
//      one token for every decoding sequence; drafts are dropped before anything is
//      preempted; a chunk of a prompt still being prefilled), within the step's token
//      budget. When the KV cache has no room, the newest running sequence is preempted:
//      its blocks are freed and it goes back to the front of the waiting queue, to be
//      recomputed later (prefix caching usually makes that cheap). No request fails for
//      blocks that will come free.
//   2. if nothing was preempted, waiting sequences join, oldest first, while there are
//      free sequence slots, token budget and blocks (their cached prefix is taken first).
// The scheduler is a plain function of (waiting, running, free blocks); it owns no
// sequence, and it never runs the model.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "runtime/block_manager.h"
#include "runtime/sequence.h"

namespace kiln::runtime {

struct SchedulerConfig {
  int32_t max_num_seqs = 256;             // running sequences at most
  int32_t max_num_batched_tokens = 2048;  // tokens per step at most
  int32_t max_prefill_chunk = 0;          // tokens of one sequence per step at most (0: no cap)
  // Recurrent models with prefix caching (runtime/state_cache.h): a prefill chunk that does
  // not finish a sequence's tokens ends on a block boundary, and one that would pass the
  // last full block before the sequence's last token stops there, so that the state after
  // each computed block boundary can be checkpointed.
  bool align_prefill_to_blocks = false;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  // Computes tokens [seq->n_computed, seq->n_computed + n_new): its last known token and,
  // when n_draft > 0, the first n_draft tokens of seq->draft after it.
  int32_t n_new = 0;
  int32_t n_draft = 0;
};

struct Schedule {
  std::vector<ScheduledSeq> seqs;   // running order
  std::vector<Sequence*> preempted; // sent back to waiting by this step
  int32_t n_tokens = 0;
  bool empty() const { return seqs.empty(); }
  // Every sequence computes one token: the step can run as a recorded decode step.
  bool decode_only() const { return !seqs.empty() && n_tokens == int32_t(seqs.size()); }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config) : config_(config) {}

  void add(Sequence* seq);  // to the back of the waiting queue
  // How many leading blocks of a prefix match a new sequence may take (recurrent models:
  // those up to the last one whose state is checkpointed). Unset: all of them.
  void set_usable_prefix(std::function<int32_t(const PrefixMatch&)> f) { usable_prefix_ = std::move(f); }
  // The next step. Blocks for every scheduled token are allocated on return.
  Schedule schedule(BlockManager& blocks);
  // Drops a sequence from whichever queue holds it (finished or cancelled); the caller
  // frees its blocks.
  void remove(Sequence* seq);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  int64_t preemptions() const { return preemptions_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  void preempt(Sequence* seq, BlockManager& blocks, Schedule& out);

  std::function<int32_t(const PrefixMatch&)> usable_prefix_;
  SchedulerConfig config_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order: oldest first
  int64_t preemptions_ = 0;
};

}  // namespace kiln::runtime
