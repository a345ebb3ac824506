#include "server/replica_router.h"

#include <algorithm>

#include "core/check.h"

namespace kiln::server {
namespace {

// splitmix64's finalizer: every input bit reaches every output bit.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The chained hash at the end of each full block of `prompt`: block i's covers tokens
// [0, 16 (i + 1)), so equal hashes mean (up to a 64-bit collision) equal prefixes.
std::vector<uint64_t> block_hashes(std::span<const int32_t> prompt) {
  std::vector<uint64_t> out;
  uint64_t h = 0x6b696c6e;  // "kiln"
  for (size_t i = 0; i < prompt.size(); ++i) {
    h = mix(h ^ (uint64_t(uint32_t(prompt[i])) + 0x9e3779b97f4a7c15ull));
    if ((i + 1) % ReplicaRouter::kBlockTokens == 0) out.push_back(h);
  }
  return out;
}

}  // namespace

ReplicaRouter::ReplicaRouter(int n, int slack, size_t max_blocks) : n_(n), slack_(slack), max_blocks_(max_blocks) {
  KILN_CHECK(n >= 1 && max_blocks >= 1) << "ReplicaRouter(" << n << ", " << slack << ", " << max_blocks << ")";
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
  const std::vector<uint64_t> hashes = block_hashes(prompt);
  std::lock_guard<std::mutex> lock(mu_);
  int chosen = -1;
  // The longest remembered prefix, if it is at least half the prompt.
  for (size_t b = hashes.size(); b > 0 && 2 * b * kBlockTokens >= prompt.size(); --b) {
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
