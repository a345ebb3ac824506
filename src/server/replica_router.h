// Which data-parallel replica a request goes to (`kiln serve --data-parallel-size`).
//
// Each replica has a prefix cache of its own, so a conversation's next turn, or an agent's
// next call with the same long context, computes its whole prompt again wherever it lands
// but on the replica that served the turn before. The router remembers, for the prompts
// it routed, the chained hash of every full KV block (the engines' prefix-cache keys:
// runtime::BlockManager::chain_hash) and the replica it went to; a new prompt
// goes to the replica that served its longest remembered prefix when that prefix is at
// least half of it, unless that replica has more than `slack` requests open beyond the
// least busy one. Otherwise (and for a prompt with nothing remembered) the least busy
// replica takes it, equal ones in turn. (SGLang's cache-aware router decides the same way,
// with a match rate and a load gap.) What it remembers is bounded (least recently used
// blocks forgotten first) and may be stale: a replica's cache may have evicted a block;
// that only costs the prefix computed again, never a wrong answer.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

namespace kiln::server {

class ReplicaRouter {
 public:
  // n replicas; slack: open requests the replica holding a prompt's prefix may have beyond
  // the least busy one and still take it (negative: prefixes are not followed, as where the
  // engines cache none); block_tokens: the engines' KV block size; max_blocks: block
  // hashes remembered at most.
  ReplicaRouter(int n, int slack, int block_tokens, size_t max_blocks = size_t(1) << 18);

  // The replica for `prompt` given each one's open requests (open.size() == n); the prompt's
  // blocks are then remembered as that replica's.
  int pick(std::span<const int32_t> prompt, std::span<const int32_t> open);

  size_t remembered_blocks() const;

 private:
  int least_busy(std::span<const int32_t> open);

  struct Entry {
    int replica;
    std::list<uint64_t>::iterator lru;
  };
  const int n_, slack_, block_tokens_;
  const size_t max_blocks_;
  uint32_t next_ = 0;  // where the search for the least busy starts (equals in turn)
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> blocks_;
  std::list<uint64_t> lru_;  // most recently used first
};

}  // namespace kiln::server
