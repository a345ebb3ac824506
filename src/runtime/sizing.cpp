#include "runtime/sizing.h"

#include <algorithm>

#include "model/loader.h"
#include "models/registry.h"

namespace kiln::runtime {
namespace {

// The largest step's buffers on one rank, estimated from the config and the rank's shard
// (bf16 activations). The residual stream lives through the step (residual, norm output
// and block output per token); on top of it one op's buffers at a time, the largest of:
// attention's (q / k / v and its output, MLA's fp32 scratch), a dense MLP's (gate / up /
// product), a MoE layer's (its scratch, given back when the op returns: the router's fp32
// logits, choices and weights, and per (token, expert) pair the fp32 expert output, the
// bf16 activation and the permutation; or its shared experts' MLP, which runs apart from
// it), and the fp32 logits of max_num_seqs rows (this rank's vocabulary slice, and the
// whole vocabulary gathered on rank 0). Measured on an H200 (2026-11-29, kiln serve's
// start-up line, 2,048 tokens in 64 sequences): Qwen3-30B-A3B 177 MiB, GLM-4.7 NVFP4 430,
// GLM-4.5-Air NVFP4 353, the same at every depth. (Until then every MoE layer's scratch
// was held to the step's end: 7,398 MiB for Qwen3-30B-A3B, 29,783 for GLM-4.7 at TP4.)
int64_t activation_estimate(const formats::ModelConfig& c, const model::Shard& sh, const SizingOptions& o,
                            int rank, int64_t n_moe_layers) {
  const int64_t tp = sh.tp_size, tokens = o.max_num_batched_tokens, rows = o.max_num_seqs;
  const int64_t heads = std::max<int64_t>(1, c.n_heads / tp), kv_heads = std::max<int64_t>(1, c.n_kv_heads / tp);
  const bool mla = c.d_latent > 0;
  const int64_t d_qk = mla ? c.d_nope + c.d_rope : c.d_head, d_v = mla ? c.d_v : c.d_head;
  int64_t attn = heads * d_qk + heads * d_v + (mla ? c.d_latent + c.d_rope : 2 * kv_heads * c.d_head);
  if (mla) attn += heads * c.d_latent * 4;  // the MLA kernels' fp32 scratch, 2 floats per latent value
  const int64_t stream = tokens * 2 * 3 * c.d_model;
  int64_t op = tokens * 2 * attn;
  if (c.d_ff > 0) op = std::max(op, tokens * 2 * 3 * ((c.d_ff + tp - 1) / tp));
  if (c.n_experts > 0 && n_moe_layers > 0) {
    const int64_t ff = sh.expert_parallel ? c.d_ff_expert : (c.d_ff_expert + tp - 1) / tp;
    const int64_t pairs = tokens * c.n_experts_active;
    op = std::max(op, tokens * c.n_experts * 4 + pairs * (4 + 4) + pairs * (c.d_model * 4 + ff * 2 + 4));
    op = std::max(op, tokens * 2 * 3 * ((c.d_ff_expert * c.n_shared_experts + tp - 1) / tp));
  }
  const int64_t vocab_part = (c.vocab_size + tp - 1) / tp;
  op = std::max(op, rows * vocab_part * 4 + (rank == 0 ? rows * c.vocab_size * 4 : 0));
  return stream + op;
}

int64_t moe_layers(const model::CausalLM& lm) {
  int64_t n = 0;
  for (const model::DecoderLayer& l : lm.layers) n += std::holds_alternative<model::Moe>(l.ffn) ? 1 : 0;
  return n;
}

}  // namespace

Result<std::vector<RankSizing>> size_layout(const formats::ModelConfig& config, const formats::QuantConfig& quant,
                                            ops::Backend& host, const SizingOptions& o) {
  std::vector<RankSizing> out;
  for (int rank = 0; rank < o.parallel.world(); ++rank) {
    model::Shard shard = shard_of(o.parallel, rank, config.n_layers);
    shard.mtp = o.mtp && o.parallel.pipeline_parallel == 1;  // as Engine::load_weights binds it
    model::WeightLoader loader = model::WeightLoader::sizing(host, quant, o.held_bytes);
    loader.set_shard(shard);
    Result<model::CausalLM> lm = models::build_model(config, loader);
    if (!lm.ok()) return lm.status().with_context("rank " + std::to_string(rank) + " of the layout");
    out.push_back({.rank = rank,
                   .weight_bytes = int64_t(loader.device_bytes()),
                   .kv_bytes_per_token = KvCache::bytes_per_token(lm->kv_layouts(), DType::kBF16, o.kv_dtype),
                   .state_bytes_per_sequence = KvCache::bytes_per_state_slot(lm->kv_layouts(), DType::kBF16),
                   .activation_bytes = activation_estimate(config, shard, o, rank, moe_layers(*lm)),
                   .micro_batches = lm->splits_into_micro_batches()});
  }
  return out;
}

}  // namespace kiln::runtime
