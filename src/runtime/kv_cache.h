// The paged KV cache's tensors: fixed-size blocks of token slots per layer. Which
// sequence owns which block is the BlockManager's business (block_manager.h).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/blocks.h"
#include "ops/backend.h"

namespace kiln::runtime {

// How the cache stores K / V (and MLA latents): --kv-cache-dtype.
enum class KvCacheDtype {
  kBf16,  // the backend's activation dtype, unquantized (bf16 on CUDA; fp32 on the CPU reference)
  kFp8,   // e4m3 codes, 1 byte per element, plus one fp32 scale per row (ops/kv_quant.h)
};
// "bf16" (also "auto") or "fp8" (also "fp8_e4m3"); anything else is an error naming the choices.
Result<KvCacheDtype> parse_kv_cache_dtype(std::string_view name);
// The option's name ("bf16", "fp8").
const char* kv_cache_dtype_name(KvCacheDtype d);

struct KvCache {
  int32_t block_size = 16;  // tokens per block
  int32_t n_blocks = 0;
  KvCacheDtype dtype = KvCacheDtype::kBf16;
  DType storage = DType::kBF16;  // the K / V tensors' dtype: the activation dtype or kF8E4M3
  int32_t n_state_slots = 0;  // recurrent layers' per-sequence states (0: the model has none)
  std::vector<model::LayerKv> layers;

  // Allocates n_blocks blocks for every layer: in the backend's activation dtype, or
  // e4m3 codes with their scale tensors; recurrent layers get n_state_slots states.
  static KvCache create(ops::Backend& be, const std::vector<model::KvLayout>& layouts, int32_t n_blocks,
                        int32_t block_size, KvCacheDtype dtype = KvCacheDtype::kBf16, int32_t n_state_slots = 0);
  // Bytes one token slot takes over all layers (codes and scales), for a cache whose
  // unquantized values are of activation_dtype.
  static int64_t bytes_per_token(const std::vector<model::KvLayout>& layouts, DType activation_dtype,
                                 KvCacheDtype dtype = KvCacheDtype::kBf16);
  // Bytes one sequence's state takes over all recurrent layers (0 for a model without).
  static int64_t bytes_per_state_slot(const std::vector<model::KvLayout>& layouts, DType activation_dtype);
  static bool has_recurrent(const std::vector<model::KvLayout>& layouts);
  int64_t capacity_tokens() const { return int64_t(n_blocks) * block_size; }
};

}  // namespace kiln::runtime
