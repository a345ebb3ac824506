#include "runtime/block_manager.h"

#include <algorithm>

#include "core/check.h"

namespace kiln::runtime {

BlockManager::BlockManager(int32_t n_blocks, int32_t block_size, bool prefix_caching)
    : block_size_(block_size), prefix_caching_(prefix_caching), blocks_(size_t(std::max(n_blocks, 0))) {
  KILN_CHECK(block_size > 0) << "block size " << block_size;
  for (int32_t b = 0; b < n_blocks; ++b) push_free_back(b);
}

uint64_t BlockManager::chain_hash(uint64_t prev, std::span<const int32_t> tokens) {
  // splitmix64 steps over (prev, tokens...): every input bit reaches every output bit.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(prev ^ 0x6b696c6e2d6b7668ull);
  for (int32_t t : tokens) h = mix(h ^ uint64_t(uint32_t(t)));
  return h;
}

int32_t BlockManager::lookup(uint64_t hash, std::span<const int32_t> tokens) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return -1;
  const Block& b = blocks_[size_t(it->second)];
  if (!std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin(), tokens.end())) return -1;
  return it->second;
}

PrefixMatch BlockManager::match_prefix(std::span<const int32_t> tokens, int32_t max_tokens) const {
  PrefixMatch m;
  if (!prefix_caching_) return m;
  const int32_t n_full = std::min<int32_t>(int32_t(tokens.size()), max_tokens) / block_size_;
  uint64_t h = 0;
  for (int32_t i = 0; i < n_full; ++i) {
    const auto block_tokens = tokens.subspan(size_t(i) * size_t(block_size_), size_t(block_size_));
    h = chain_hash(h, block_tokens);
    const int32_t b = lookup(h, block_tokens);
    if (b < 0) break;
    m.blocks.push_back(b);
    m.hashes.push_back(h);
    if (blocks_[size_t(b)].ref_count == 0) ++m.n_free;
  }
  m.n_tokens = int32_t(m.blocks.size()) * block_size_;
  return m;
}

PrefixMatch BlockManager::truncate(const PrefixMatch& m, int32_t n_blocks) const {
  PrefixMatch out;
  for (int32_t i = 0; i < std::min<int32_t>(n_blocks, int32_t(m.blocks.size())); ++i) {
    out.blocks.push_back(m.blocks[size_t(i)]);
    out.hashes.push_back(m.hashes[size_t(i)]);
    if (blocks_[size_t(m.blocks[size_t(i)])].ref_count == 0) ++out.n_free;
  }
  out.n_tokens = int32_t(out.blocks.size()) * block_size_;
  return out;
}

int32_t BlockManager::blocks_needed(const BlockTable& table, int32_t n_tokens) const {
  const int32_t want = (n_tokens + block_size_ - 1) / block_size_;
  return std::max(0, want - int32_t(table.blocks.size()));
}

void BlockManager::allocate(BlockTable& table, const PrefixMatch& match, int32_t n_tokens) {
  if (!match.blocks.empty()) {
    KILN_CHECK(table.blocks.empty()) << "a prefix match is taken by an empty table only";
    for (size_t i = 0; i < match.blocks.size(); ++i) {
      Block& b = blocks_[size_t(match.blocks[i])];
      KILN_CHECK(b.hashed && b.hash == match.hashes[i]) << "stale prefix match, block " << match.blocks[i];
      if (b.ref_count++ == 0) unlink_free(match.blocks[i]);
      table.blocks.push_back(match.blocks[i]);
    }
    table.n_full_hashed = int32_t(match.blocks.size());
    table.last_hash = match.hashes.back();
  }
  const int32_t need = blocks_needed(table, n_tokens);
  KILN_CHECK(can_allocate(need)) << "asked for " << need << " blocks, " << n_free_ << " free";
  for (int32_t i = 0; i < need; ++i) {
    const int32_t id = pop_free_front();
    Block& b = blocks_[size_t(id)];
    if (b.hashed) {  // evict: its contents are about to be overwritten
      cached_.erase(b.hash);
      b.hashed = false;
      b.tokens.clear();
      ++evictions_;
    }
    b.ref_count = 1;
    table.blocks.push_back(id);
  }
}

void BlockManager::commit(BlockTable& table, std::span<const int32_t> tokens, int32_t n_computed) {
  if (!prefix_caching_) return;
  const int32_t n_full = std::min<int32_t>(n_computed / block_size_, int32_t(table.blocks.size()));
  for (int32_t i = table.n_full_hashed; i < n_full; ++i) {
    const auto block_tokens = tokens.subspan(size_t(i) * size_t(block_size_), size_t(block_size_));
    table.last_hash = chain_hash(table.last_hash, block_tokens);
    table.n_full_hashed = i + 1;
    Block& b = blocks_[size_t(table.blocks[size_t(i)])];
    if (b.hashed) continue;  // a block taken from the cache
    if (cached_.count(table.last_hash) != 0) continue;  // another sequence cached this prefix first
    b.hashed = true;
    b.hash = table.last_hash;
    b.tokens.assign(block_tokens.begin(), block_tokens.end());
    cached_[b.hash] = table.blocks[size_t(i)];
  }
}

void BlockManager::free(BlockTable& table) {
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) {
    Block& b = blocks_[size_t(*it)];
    KILN_CHECK(b.ref_count > 0) << "block " << *it << " freed twice";
    if (--b.ref_count == 0) push_free_back(*it);
  }
  table = BlockTable{};
}

void BlockManager::shrink(BlockTable& table, int32_t n_tokens) {
  const size_t keep = size_t((std::max(n_tokens, 0) + block_size_ - 1) / block_size_);
  KILN_CHECK_GE(keep, size_t(table.n_full_hashed)) << "shrinking into hashed blocks";
  while (table.blocks.size() > keep) {
    const int32_t id = table.blocks.back();
    table.blocks.pop_back();
    Block& b = blocks_[size_t(id)];
    KILN_CHECK(b.ref_count > 0 && !b.hashed) << "block " << id << " shrunk while free or cached";
    if (--b.ref_count == 0) push_free_front(id);
  }
}

void BlockManager::push_free_front(int32_t id) {
  Block& b = blocks_[size_t(id)];
  b.prev = -1;
  b.next = free_head_;
  if (free_head_ >= 0) blocks_[size_t(free_head_)].prev = id;
  else free_tail_ = id;
  free_head_ = id;
  ++n_free_;
}

void BlockManager::push_free_back(int32_t id) {
  Block& b = blocks_[size_t(id)];
  b.prev = free_tail_;
  b.next = -1;
  if (free_tail_ >= 0) blocks_[size_t(free_tail_)].next = id;
  else free_head_ = id;
  free_tail_ = id;
  ++n_free_;
}

void BlockManager::unlink_free(int32_t id) {
  Block& b = blocks_[size_t(id)];
  if (b.prev >= 0) blocks_[size_t(b.prev)].next = b.next;
  else free_head_ = b.next;
  if (b.next >= 0) blocks_[size_t(b.next)].prev = b.prev;
  else free_tail_ = b.prev;
  b.prev = b.next = -1;
  --n_free_;
}

int32_t BlockManager::pop_free_front() {
  KILN_CHECK(free_head_ >= 0) << "no free block";
  const int32_t id = free_head_;
  unlink_free(id);
  return id;
}

}  // namespace kiln::runtime
