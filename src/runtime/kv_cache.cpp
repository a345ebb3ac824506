#include "runtime/kv_cache.h"

#include "core/check.h"

namespace kiln::runtime {

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
