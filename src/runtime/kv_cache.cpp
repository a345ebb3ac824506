#include "runtime/kv_cache.h"

#include "core/check.h"

namespace kiln::runtime {

BlockAllocator::BlockAllocator(int32_t n_blocks) : n_blocks_(n_blocks) {
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::vector<int32_t> BlockAllocator::allocate(int32_t n) {
  KILN_CHECK(can_allocate(n)) << "asked for " << n << " blocks, " << free_.size() << " free";
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - size_t(n));
  return {out.rbegin(), out.rend()};
}

void BlockAllocator::release(const std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    KILN_CHECK(*it >= 0 && *it < n_blocks_) << "block " << *it;
    free_.push_back(*it);
  }
}

KvCache KvCache::create(ops::Backend& be, const std::vector<model::KvLayout>& layouts,
                        int32_t n_blocks, int32_t block_size) {
  KvCache c;
  c.block_size = block_size;
  c.n_blocks = n_blocks;
  const DType dt = be.activation_dtype();
  for (const model::KvLayout& l : layouts) {
    model::LayerKv kv;
    if (l.mla) {
      kv.latent = be.alloc(dt, {n_blocks, block_size, l.d_latent_rope});
    } else {
      kv.k = be.alloc(dt, {n_blocks, block_size, l.n_kv_heads, l.d_head});
      kv.v = be.alloc(dt, {n_blocks, block_size, l.n_kv_heads, l.d_head});
    }
    c.layers.push_back(std::move(kv));
  }
  return c;
}

int64_t KvCache::bytes_per_token(const std::vector<model::KvLayout>& layouts, DType dtype) {
  int64_t elems = 0;
  for (const model::KvLayout& l : layouts) elems += l.mla ? l.d_latent_rope : 2 * l.n_kv_heads * l.d_head;
  return elems * dtype_bits(dtype) / 8;
}

}  // namespace kiln::runtime
