// Engine: a loaded model on a backend, with a paged KV cache. This first
// version runs one sequence at a time (the continuous-batching scheduler plugs
// in on the same BatchMeta / block-table structures).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/hf_config.h"
#include "model/blocks.h"
#include "ops/backend.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"

namespace kiln::runtime {

struct EngineOptions {
  int32_t block_size = 16;      // tokens per KV block
  int64_t max_model_len = 0;    // 0: config max_position_embeddings (capped at 8192 on CPU)
  int32_t prefill_chunk = 0;    // 0: whole prompt in one step; N: N tokens per step
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (the final eos included if one stopped it)
  bool stopped_by_eos = false;
  // One per token when SamplingParams::logprobs >= 0 (token, its logprob, the top
  // alternatives), else empty.
  std::vector<SampledToken> logprobs;
};

// Rows of a decode step holding n sequences: 1, 2, 4, 8, then multiples of 8 (each
// distinct size is one recorded CUDA graph per context width).
int32_t decode_bucket(int32_t n);

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> load(const std::string& model_dir,
                                              std::unique_ptr<ops::Backend> backend,
                                              const EngineOptions& options);

  // fp32 logits of every prompt position, [n_prompt][vocab].
  Result<std::vector<std::vector<float>>> logits(const std::vector<int32_t>& prompt);
  // Up to max_new_tokens sampled tokens; stops early at an eos id unless ignore_eos.
  // Sampling runs on the backend: only token ids (and logprobs) come back to the host.
  Result<GenerateResult> generate(const std::vector<int32_t>& prompt, int32_t max_new_tokens,
                                  const SamplingParams& sampling, bool ignore_eos = false);
  // Several prompts generated together: each is prefilled on its own, then every
  // unfinished sequence advances one token per decode step in one batch. Each
  // sequence samples with its own generator seeded by sampling.seed, so on a
  // backend whose rows are independent (the CPU reference) the result equals
  // separate generate calls.
  Result<std::vector<GenerateResult>> generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                     int32_t max_new_tokens, const SamplingParams& sampling,
                                                     bool ignore_eos = false);

  const formats::ModelConfig& config() const { return config_; }
  int64_t max_model_len() const { return max_model_len_; }
  ops::Backend& backend() { return *backend_; }

 private:
  Engine() = default;
  Status check_prompt(const std::vector<int32_t>& prompt, int64_t extra_tokens) const;
  // Runs tokens [begin, end) of `seq` (earlier ones are already cached) and returns
  // the logits of the rows in `rows` (relative to begin): [rows, vocab] backend tensor.
  Tensor step(const std::vector<int32_t>& seq, int32_t begin, int32_t end, const std::vector<int32_t>& block_table,
              const std::vector<int32_t>& rows);

  formats::ModelConfig config_;
  std::unique_ptr<ops::Backend> backend_;
  model::CausalLM model_;
  KvCache kv_;
  BlockAllocator blocks_{0};
  EngineOptions options_;
  int64_t max_model_len_ = 0;
  ops::BatchMeta step_batch_;  // the current step's batch (backends read it until the step ends)
};

}  // namespace kiln::runtime
