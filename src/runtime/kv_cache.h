// Paged KV cache: fixed-size blocks of token slots per layer, handed out by a
// BlockAllocator (query-then-commit: can_allocate, then allocate).
#pragma once

#include <cstdint>
#include <vector>

#include "model/blocks.h"
#include "ops/backend.h"

namespace kiln::runtime {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t n_blocks);
  bool can_allocate(int32_t n) const { return n <= int32_t(free_.size()); }
  // Takes n free blocks; KILN_CHECKs can_allocate(n).
  std::vector<int32_t> allocate(int32_t n);
  void release(const std::vector<int32_t>& blocks);
  int32_t n_free() const { return int32_t(free_.size()); }
  int32_t n_blocks() const { return n_blocks_; }

 private:
  int32_t n_blocks_;
  std::vector<int32_t> free_;  // a stack: lowest ids are handed out first
};

struct KvCache {
  int32_t block_size = 16;  // tokens per block
  int32_t n_blocks = 0;
  std::vector<model::LayerKv> layers;

  // Allocates n_blocks blocks for every layer in the backend's activation dtype.
  static KvCache create(ops::Backend& be, const std::vector<model::KvLayout>& layouts,
                        int32_t n_blocks, int32_t block_size);
  // Bytes one token slot takes over all layers.
  static int64_t bytes_per_token(const std::vector<model::KvLayout>& layouts, DType dtype);
};

}  // namespace kiln::runtime
