// What each rank of a layout would hold on its device, found without a GPU, without the
// memory and without reading a weight: every rank's part of the model is bound by a
// sizing loader (model::WeightLoader::sizing), so the shapes, splits and formats are the
// ones the real load makes, shard by shard. `kiln inspect --tensor-parallel-size N` prints
// it; `kiln serve` refuses a layout whose weights cannot fit before it loads anything.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "formats/hf_config.h"
#include "formats/quant.h"
#include "formats/quant_config.h"
#include "ops/backend.h"
#include "runtime/kv_cache.h"
#include "runtime/model_runner.h"

namespace kiln::runtime {

struct RankSizing {
  int rank = 0;
  int64_t weight_bytes = 0;        // as the device holds them (see SizingOptions::held_bytes)
  int64_t kv_bytes_per_token = 0;  // this rank's layers and heads
  // Recurrent (Gated DeltaNet) layers: one sequence's state (kiln serve keeps max_num_seqs
  // such rows, a scratch row and as many prefix-cache checkpoints); 0 without.
  int64_t state_bytes_per_sequence = 0;
  // An estimate of the largest step's buffers (max_num_batched_tokens tokens, max_num_seqs
  // logit rows); kiln serve measures the real peak once loaded.
  int64_t activation_bytes = 0;
  // Whether the rank's layers can run a step as two micro-batches
  // (model::CausalLM::splits_into_micro_batches): NCCL's channels are chosen for them
  // before the weights load.
  bool micro_batches = false;
};

struct SizingOptions {
  ParallelConfig parallel;
  KvCacheDtype kv_dtype = KvCacheDtype::kBf16;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 256;
  bool mtp = false;  // --speculative-method mtp: the first MTP layer too (model::Shard::mtp)
  // Bytes a device holds for a quantized weight in the checkpoint layout (a backend's
  // packed layout, e.g. cuda::packed_layout); null: the checkpoint layout's own bytes.
  std::function<Result<int64_t>(const formats::QuantizedTensor&)> held_bytes;
};

// One entry per world rank. `host` names where the (unbacked) tensors would be; it never
// allocates them.
Result<std::vector<RankSizing>> size_layout(const formats::ModelConfig& config, const formats::QuantConfig& quant,
                                            ops::Backend& host, const SizingOptions& options);

}  // namespace kiln::runtime
