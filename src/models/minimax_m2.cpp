// MiniMax-M2 (MiniMaxM2ForCausalLM): GQA with a QK-norm over all heads' concatenation
// (q_norm [n_heads * d_head], k_norm [n_kv_heads * d_head], before the partial RoPE),
// and a sigmoid-routed MoE on every layer: top-k of sigmoid(logits) +
// e_score_correction_bias, weights the chosen sigmoids renormalised to sum 1, no shared
// expert, no routed scaling. Checkpoint names are the hub's: block_sparse_moe.gate,
// block_sparse_moe.e_score_correction_bias, block_sparse_moe.experts.E.{w1,w3,w2}
// (gate, up, down). The MTP modules of the hub checkpoint (use_mtp) are not used.
#include <cmath>

#include "model/build.h"
#include "models/registry.h"

namespace kiln::models {
namespace {

// The hub config.json gives the rotary width as rotary_dim (64 of head_dim 128) rather
// than partial_rotary_factor; transformers' config gives the factor. Accept either,
// and both when they agree.
Status apply_rotary_dim(formats::ModelConfig& c) {
  const auto it = c.raw.find("rotary_dim");
  if (it == c.raw.end() || it->is_null()) return Status::Ok();
  if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > c.d_head ||
      it->get<int64_t>() % 2 != 0) {
    return corrupt("MiniMaxM2ForCausalLM: rotary_dim should be an even integer in (0, head_dim " +
                   std::to_string(c.d_head) + "], got " + it->dump());
  }
  const double factor = double(it->get<int64_t>()) / double(c.d_head);
  const bool given = c.raw.contains("partial_rotary_factor") ||
                     (c.raw.contains("rope_parameters") && c.raw["rope_parameters"].is_object() &&
                      c.raw["rope_parameters"].contains("partial_rotary_factor"));
  if (given && std::abs(c.rope.partial_rotary_factor - factor) > 1e-9) {
    return corrupt("MiniMaxM2ForCausalLM: rotary_dim " + it->dump() + " of head_dim " + std::to_string(c.d_head) +
                   " disagrees with partial_rotary_factor " + std::to_string(c.rope.partial_rotary_factor));
  }
  c.rope.partial_rotary_factor = factor;
  return Status::Ok();
}

// Hub keys that would change the math; refused rather than ignored when they say so.
Status check_variant(const formats::ModelConfig& c) {
  const auto str = [&](const char* key, const char* want) -> Status {
    if (!c.raw.contains(key) || c.raw[key].is_null()) return Status::Ok();
    if (c.raw[key].is_string() && c.raw[key].get<std::string>() == want) return Status::Ok();
    return unsupported(std::string("MiniMaxM2ForCausalLM: ") + key + " " + c.raw[key].dump() +
                       " is not supported (only \"" + want + "\")");
  };
  KILN_RETURN_IF_ERROR(str("scoring_func", "sigmoid"));
  KILN_RETURN_IF_ERROR(str("qk_norm_type", "per_layer"));
  if (c.raw.contains("shared_intermediate_size") && c.raw["shared_intermediate_size"].is_number() &&
      c.raw["shared_intermediate_size"].get<double>() != 0) {
    return unsupported("MiniMaxM2ForCausalLM: shared experts (shared_intermediate_size " +
                       c.raw["shared_intermediate_size"].dump() + ") are not supported");
  }
  if (c.n_experts <= 0 || c.n_experts_active <= 0 || c.d_ff <= 0) {
    return corrupt("MiniMaxM2ForCausalLM needs num_local_experts, num_experts_per_tok and intermediate_size");
  }
  return Status::Ok();
}

}  // namespace

Result<model::CausalLM> build_minimax_m2(const formats::ModelConfig& config, model::WeightLoader& w) {
  formats::ModelConfig c = config;
  KILN_RETURN_IF_ERROR(check_variant(c));
  KILN_RETURN_IF_ERROR(apply_rotary_dim(c));
  return model::build_decoder(w, c, [&](int64_t i, const std::string& p, model::DecoderLayer& l) {
    KILN_ASSIGN_OR_RETURN(l.attn, model::load_attention(w, c, i, p + ".self_attn", {.qk_norm_full = true}));
    const std::string m = p + ".block_sparse_moe";
    model::Moe moe;
    // The router is not quantized (modules_to_not_convert: gate, e_score_correction_bias).
    KILN_ASSIGN_OR_RETURN(moe.router, w.dense_linear(m + ".gate", c.n_experts, c.d_model, false));
    KILN_ASSIGN_OR_RETURN(moe.correction_bias, w.tensor(m + ".e_score_correction_bias", {c.n_experts}));
    // Each expert's width is intermediate_size (there is no dense MLP).
    KILN_ASSIGN_OR_RETURN(moe.experts, model::load_experts(w, m + ".experts", c.n_experts, c.d_model, c.d_ff,
                                                           {.gate = "w1", .up = "w3", .down = "w2"}));
    // One group: top-k of sigmoid + bias over all experts; the op's 1e-20 in the
    // renormalisation is below fp32 resolution of a sum of k sigmoids.
    moe.routing = {.kind = ops::RouterKind::kSigmoidGroupedTopK,
                   .n_experts = int32_t(c.n_experts),
                   .top_k = int32_t(c.n_experts_active),
                   .n_group = 1,
                   .topk_group = 1,
                   .norm_topk_prob = true,
                   .routed_scaling_factor = 1.0f};
    l.ffn = std::move(moe);
    return Status::Ok();
  });
}

}  // namespace kiln::models
