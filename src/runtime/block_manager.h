// BlockManager: the paged KV cache's bookkeeping, with prefix caching. It hands out
// fixed-size blocks of token slots to sequences and knows nothing of tensors (the KV
// tensors, runtime/kv_cache.h, know nothing of sequences).
//
// Prefix caching: once a block is full and its KV computed, it is identified by a hash
// chained over every token from the sequence's start to the block's end (so equal hashes
// mean equal prefixes; the block also keeps its tokens, and a lookup compares them, so a
// hash collision can never share wrong KV). A later sequence whose tokens start the same
// way takes those blocks instead of computing them again; blocks are reference-counted
// while shared. A block nobody holds goes to the back of the free list but keeps its
// contents and hash until it is handed out again, so the least recently freed cached
// blocks are evicted first. Sequences free their blocks last-first, so a prefix's tail is
// evicted before its head.
//
// Query, then commit (nano-vllm's shape): the scheduler asks match_prefix and
// blocks_needed, checks can_allocate, then calls allocate.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace kiln::runtime {

// A sequence's blocks: blocks[i] holds its tokens [i * block_size, (i + 1) * block_size).
struct BlockTable {
  std::vector<int32_t> blocks;
  int32_t n_full_hashed = 0;  // leading blocks whose chained hash is known (full, computed)
  uint64_t last_hash = 0;     // chained hash of blocks[n_full_hashed - 1]
};

struct PrefixMatch {
  std::vector<int32_t> blocks;  // cached blocks holding the prefix, in order
  std::vector<uint64_t> hashes; // their chained hashes
  int32_t n_tokens = 0;         // tokens they hold: blocks.size() * block_size
  int32_t n_free = 0;           // how many of them nobody holds now (taking them uses free blocks)
};

class BlockManager {
 public:
  BlockManager(int32_t n_blocks, int32_t block_size, bool prefix_caching);

  int32_t block_size() const { return block_size_; }
  // The hash of a full block whose tokens follow a prefix of hash `prev` (0 for the first
  // block): a block's cache key. (Data-parallel routing names prompts' prefixes by it too:
  // server/replica_router.h.)
  static uint64_t chain_hash(uint64_t prev, std::span<const int32_t> tokens);
  int32_t n_blocks() const { return int32_t(blocks_.size()); }
  // Blocks nobody holds (cached or empty): what allocate can hand out.
  int32_t n_free() const { return n_free_; }
  int32_t n_used() const { return n_blocks() - n_free_; }
  bool prefix_caching() const { return prefix_caching_; }

  // The longest run of cached full blocks that starts `tokens`, holding at most
  // max_tokens tokens. Empty when prefix caching is off.
  PrefixMatch match_prefix(std::span<const int32_t> tokens, int32_t max_tokens) const;
  // The first n_blocks blocks of a match (a model that can resume only at some of them).
  PrefixMatch truncate(const PrefixMatch& m, int32_t n_blocks) const;
  // New blocks `table` needs to hold n_tokens tokens.
  int32_t blocks_needed(const BlockTable& table, int32_t n_tokens) const;
  bool can_allocate(int32_t n_new_blocks) const { return n_new_blocks <= n_free_; }
  // Takes the matched blocks (an empty table only), then appends new blocks until the
  // table holds n_tokens tokens. KILN_CHECKs that enough blocks are free.
  void allocate(BlockTable& table, const PrefixMatch& match, int32_t n_tokens);
  // Registers the table's blocks that are full within tokens[0, n_computed) in the prefix
  // cache (their KV is written). Call after each step that computed tokens.
  void commit(BlockTable& table, std::span<const int32_t> tokens, int32_t n_computed);
  // Releases every block of the table (last first) and empties it.
  void free(BlockTable& table);
  // Releases the table's trailing blocks beyond those holding n_tokens tokens (a
  // sequence's rejected speculative tokens). They must be beyond its hashed blocks; being
  // empty of anything cacheable, they are handed out before cached free blocks.
  void shrink(BlockTable& table, int32_t n_tokens);

  // Prefix-cache counters, in tokens: looked up by match_prefix callers that count them,
  // and found cached.
  void count_lookup(int32_t queried_tokens, int32_t hit_tokens) {
    queried_tokens_ += queried_tokens;
    hit_tokens_ += hit_tokens;
  }
  int64_t prefix_queried_tokens() const { return queried_tokens_; }
  int64_t prefix_hit_tokens() const { return hit_tokens_; }
  // Cached blocks dropped to make room for new ones.
  int64_t evictions() const { return evictions_; }

 private:
  struct Block {
    int32_t ref_count = 0;
    bool hashed = false;
    uint64_t hash = 0;
    std::vector<int32_t> tokens;  // the block's tokens when hashed (compared on lookup)
    int32_t prev = -1, next = -1; // free list links while ref_count == 0
  };
  int32_t lookup(uint64_t hash, std::span<const int32_t> tokens) const;
  void push_free_back(int32_t b);
  void push_free_front(int32_t b);
  void unlink_free(int32_t b);
  int32_t pop_free_front();

  int32_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  int32_t free_head_ = -1, free_tail_ = -1, n_free_ = 0;
  std::unordered_map<uint64_t, int32_t> cached_;  // chained hash -> block
  int64_t queried_tokens_ = 0, hit_tokens_ = 0, evictions_ = 0;
};

}  // namespace kiln::runtime
