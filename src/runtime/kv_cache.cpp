#include "runtime/kv_cache.h"

#include <string>

#include "core/check.h"

namespace kiln::runtime {

Result<KvCacheDtype> parse_kv_cache_dtype(std::string_view name) {
  if (name == "bf16" || name == "auto") return KvCacheDtype::kBf16;
  if (name == "fp8" || name == "fp8_e4m3") return KvCacheDtype::kFp8;
  if (name == "fp8_e5m2") {
    return unsupported("KV cache dtype fp8_e5m2 is not supported: use fp8 (e4m3 with a scale per row)");
  }
  return invalid_argument("unknown KV cache dtype \"" + std::string(name) + "\" (expected bf16 or fp8)");
}

const char* kv_cache_dtype_name(KvCacheDtype d) { return d == KvCacheDtype::kFp8 ? "fp8" : "bf16"; }

KvCache KvCache::create(ops::Backend& be, const std::vector<model::KvLayout>& layouts, int32_t n_blocks,
                        int32_t block_size, KvCacheDtype dtype, int32_t n_state_slots) {
  KvCache c;
  c.block_size = block_size;
  c.n_blocks = n_blocks;
  c.n_state_slots = has_recurrent(layouts) ? n_state_slots : 0;
  c.dtype = dtype;
  const bool fp8 = dtype == KvCacheDtype::kFp8;
  const DType dt = fp8 ? DType::kF8E4M3 : be.activation_dtype();
  c.storage = dt;
  for (const model::KvLayout& l : layouts) {
    model::LayerKv kv;
    if (l.recurrent) {
      KILN_CHECK(n_state_slots > 0) << "a recurrent layer needs state slots";
      kv.conv_state = be.alloc(be.activation_dtype(), {n_state_slots, l.conv_channels, l.conv_kernel - 1});
      kv.recurrent_state = be.alloc(DType::kF32, {n_state_slots, l.state_heads, l.state_d_k, l.state_d_v});
      // Zeroed (fill_random with stddev 0): a device's fresh memory may hold anything, NaN
      // included, and the scratch row padding rows read never starts at position 0.
      for (Tensor* t : {&kv.conv_state, &kv.recurrent_state}) be.fill_random({.out = *t, .mean = 0.0f, .stddev = 0.0f});
    } else if (l.mla) {
      kv.latent = be.alloc(dt, {n_blocks, block_size, l.d_latent_rope});
      if (fp8) kv.latent_scale = be.alloc(DType::kF32, {n_blocks, block_size, 2});
      if (l.d_index > 0) {
        kv.index_k = be.alloc(dt, {n_blocks, block_size, l.d_index});
        if (fp8) kv.index_k_scale = be.alloc(DType::kF32, {n_blocks, block_size});
      }
    } else {
      kv.k = be.alloc(dt, {n_blocks, block_size, l.n_kv_heads, l.d_head});
      kv.v = be.alloc(dt, {n_blocks, block_size, l.n_kv_heads, l.d_head});
      if (fp8) {
        kv.k_scale = be.alloc(DType::kF32, {n_blocks, block_size, l.n_kv_heads});
        kv.v_scale = be.alloc(DType::kF32, {n_blocks, block_size, l.n_kv_heads});
      }
    }
    c.layers.push_back(std::move(kv));
  }
  return c;
}

int64_t KvCache::bytes_per_token(const std::vector<model::KvLayout>& layouts, DType activation_dtype,
                                 KvCacheDtype dtype) {
  const bool fp8 = dtype == KvCacheDtype::kFp8;
  int64_t elems = 0, scales = 0;
  for (const model::KvLayout& l : layouts) {
    if (l.recurrent) continue;
    elems += (l.mla ? l.d_latent_rope : 2 * l.n_kv_heads * l.d_head) + l.d_index;
    scales += (l.mla ? 2 : 2 * l.n_kv_heads) + (l.d_index > 0 ? 1 : 0);
  }
  if (!fp8) return elems * dtype_bits(activation_dtype) / 8;
  return elems + scales * int64_t(sizeof(float));
}

int64_t KvCache::bytes_per_state_slot(const std::vector<model::KvLayout>& layouts, DType activation_dtype) {
  int64_t bytes = 0;
  for (const model::KvLayout& l : layouts) {
    if (!l.recurrent) continue;
    bytes += l.conv_channels * (l.conv_kernel - 1) * dtype_bits(activation_dtype) / 8;
    bytes += l.state_heads * l.state_d_k * l.state_d_v * int64_t(sizeof(float));
  }
  return bytes;
}

bool KvCache::has_recurrent(const std::vector<model::KvLayout>& layouts) {
  for (const model::KvLayout& l : layouts)
    if (l.recurrent) return true;
  return false;
}

}  // namespace kiln::runtime
