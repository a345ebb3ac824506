#include "runtime/state_cache.h"

#include "core/check.h"

namespace kiln::runtime {

StateCache::StateCache(int32_t n_running, int32_t n_checkpoints, int32_t n_snapshots)
    : n_running_(n_running), n_checkpoint_rows_(n_checkpoints), n_snapshots_(n_snapshots) {
  for (int32_t i = n_running - 1; i >= 0; --i) free_running_.push_back(i);
  for (int32_t i = rows(n_running, n_checkpoints) - 1; i > n_running; --i) free_checkpoints_.push_back(i);
}

int32_t StateCache::acquire() {
  KILN_CHECK(!free_running_.empty()) << "more running sequences than state rows";
  const int32_t row = free_running_.back();
  free_running_.pop_back();
  return row;
}

void StateCache::release(int32_t row) {
  KILN_CHECK(row >= 0 && row < n_running_) << "state row " << row << " is not a running row";
  free_running_.push_back(row);
}

int32_t StateCache::find(uint64_t key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->row;
}

int32_t StateCache::store(uint64_t key) {
  if (find(key) >= 0) return -1;
  int32_t row = -1;
  if (!free_checkpoints_.empty()) {
    row = free_checkpoints_.back();
    free_checkpoints_.pop_back();
  } else if (!lru_.empty()) {
    row = lru_.back().row;
    by_key_.erase(lru_.back().key);
    lru_.pop_back();
  } else {
    return -1;
  }
  lru_.push_front({key, row});
  by_key_[key] = lru_.begin();
  return row;
}

}  // namespace kiln::runtime
