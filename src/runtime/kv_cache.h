// The paged KV cache's tensors: fixed-size blocks of token slots per layer. Which
// sequence owns which block is the BlockManager's business (block_manager.h).
#pragma once

#include <cstdint>
#include <vector>

#include "model/blocks.h"
#include "ops/backend.h"

namespace kiln::runtime {

struct KvCache {
  int32_t block_size = 16;  // tokens per block
  int32_t n_blocks = 0;
  std::vector<model::LayerKv> layers;

  // Allocates n_blocks blocks for every layer in the backend's activation dtype.
  static KvCache create(ops::Backend& be, const std::vector<model::KvLayout>& layouts,
                        int32_t n_blocks, int32_t block_size);
  // Bytes one token slot takes over all layers.
  static int64_t bytes_per_token(const std::vector<model::KvLayout>& layouts, DType dtype);
  int64_t capacity_tokens() const { return int64_t(n_blocks) * block_size; }
};

}  // namespace kiln::runtime
