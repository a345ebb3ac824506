// StateCache: the rows of the recurrent layers' per-sequence state (Gated DeltaNet's
// model::LayerKv::conv_state / recurrent_state), beside the paged KV cache.
//
// Rows [0, n_running) belong to running sequences (one each while it runs), row
// n_running is scratch (padding rows of a step, Engine::logits), and the rows after it
// hold checkpoints for prefix caching: the state right after a full KV block, keyed by
// that block's chained hash (BlockManager). A sequence whose prompt starts with cached
// blocks resumes from the checkpoint of the last of them (the scheduler keeps only the
// matched blocks up to the last checkpointed one), exactly as if it had computed them.
// Checkpoints are written whenever a sequence's computed tokens end on a block boundary
// (the scheduler ends prefill chunks there) and evicted least recently used first.
// Speculative decoding adds snapshot rows at the end: a verify step's rows each leave the
// state after them in one, and the engine copies back the one after the last draft that
// stood (runtime/engine.cpp).
// This class keeps the books; the engine copies the rows (ops::Backend::copy_rows).
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace kiln::runtime {

class StateCache {
 public:
  StateCache() = default;
  StateCache(int32_t n_running, int32_t n_checkpoints, int32_t n_snapshots = 0);

  static int32_t rows(int32_t n_running, int32_t n_checkpoints, int32_t n_snapshots = 0) {
    return n_running + 1 + n_checkpoints + n_snapshots;
  }
  bool enabled() const { return n_running_ > 0; }
  int32_t scratch_row() const { return n_running_; }
  int32_t n_snapshots() const { return n_snapshots_; }
  int32_t snapshot_row(int32_t i) const { return n_running_ + 1 + n_checkpoint_rows_ + i; }

  // A row for a sequence that starts running; fails a check when none is free (the
  // scheduler never runs more sequences than n_running).
  int32_t acquire();
  void release(int32_t row);

  // The checkpoint row after the block whose chained hash is `key` (marked as just used),
  // or -1.
  int32_t find(uint64_t key);
  bool has(uint64_t key) const { return by_key_.count(key) != 0; }
  // The row to write the checkpoint for `key` into: a free one or the least recently used
  // (its old key forgotten); -1 when `key` is stored already (marked as just used) or
  // there are no checkpoint rows.
  int32_t store(uint64_t key);
  int32_t n_checkpoints() const { return int32_t(by_key_.size()); }

 private:
  struct Entry {
    uint64_t key;
    int32_t row;
  };
  int32_t n_running_ = 0, n_checkpoint_rows_ = 0, n_snapshots_ = 0;
  std::vector<int32_t> free_running_;
  std::vector<int32_t> free_checkpoints_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> by_key_;
};

}  // namespace kiln::runtime
