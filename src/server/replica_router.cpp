#include "server/replica_router.h"

#include <algorithm>

#include "core/check.h"
#include "runtime/block_manager.h"

namespace kiln::server {
namespace {

// The chained hash of each full block of `prompt`, as the engines' prefix caches key them
// (runtime::BlockManager::chain_hash): equal hashes mean equal prefixes (up to a 64-bit
// collision, which here costs only a worse choice).
std::vector<uint64_t> block_hashes(std::span<const int32_t> prompt, int block_tokens) {
  std::vector<uint64_t> out;
  uint64_t h = 0;
  for (size_t end = size_t(block_tokens); end <= prompt.size(); end += size_t(block_tokens)) {
    h = runtime::BlockManager::chain_hash(h, prompt.subspan(end - size_t(block_tokens), size_t(block_tokens)));
    out.push_back(h);
  }
  return out;
}

}  // namespace

ReplicaRouter::ReplicaRouter(int n, int slack, int block_tokens, size_t max_blocks)
    : n_(n), slack_(slack), block_tokens_(block_tokens), max_blocks_(max_blocks) {
  KILN_CHECK(n >= 1 && block_tokens >= 1 && max_blocks >= 1)
      << "ReplicaRouter(" << n << ", " << slack << ", " << block_tokens << ", " << max_blocks << ")";
}

int ReplicaRouter::least_busy(std::span<const int32_t> open) {
  const int start = int(next_++ % uint32_t(n_));
  int best = start;
  for (int k = 1; k < n_; ++k) {
    const int i = (start + k) % n_;
    if (open[size_t(i)] < open[size_t(best)]) best = i;
  }
  return best;
}

int ReplicaRouter::pick(std::span<const int32_t> prompt, std::span<const int32_t> open) {
  KILN_CHECK_OP(==, open.size(), size_t(n_));
  if (slack_ < 0) {
    std::lock_guard<std::mutex> lock(mu_);
    return least_busy(open);
  }
  const std::vector<uint64_t> hashes = block_hashes(prompt, block_tokens_);
  std::lock_guard<std::mutex> lock(mu_);
  int chosen = -1;
  // The longest remembered prefix, if it is at least half the prompt.
  for (size_t b = hashes.size(); b > 0 && 2 * b * size_t(block_tokens_) >= prompt.size(); --b) {
    const auto it = blocks_.find(hashes[b - 1]);
    if (it == blocks_.end()) continue;
    const int r = it->second.replica;
    const int32_t least = *std::min_element(open.begin(), open.end());
    if (open[size_t(r)] <= least + slack_) chosen = r;
    break;
  }
  if (chosen < 0) chosen = least_busy(open);
  // Its blocks are now the chosen replica's (the most recently used).
  for (uint64_t h : hashes) {
    if (auto it = blocks_.find(h); it != blocks_.end()) {
      it->second.replica = chosen;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      continue;
    }
    lru_.push_front(h);
    blocks_.emplace(h, Entry{chosen, lru_.begin()});
    if (blocks_.size() > max_blocks_) {
      blocks_.erase(lru_.back());
      lru_.pop_back();
    }
  }
  return chosen;
}

size_t ReplicaRouter::remembered_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blocks_.size();
}

}  // namespace kiln::server
