// Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3 attention (QK-norm), softmax top-k
// routing, per-expert SwiGLU, dense MLP on mlp_only_layers / off-step layers.
#include "model/build.h"
#include "models/registry.h"

namespace kiln::models {

Result<model::CausalLM> build_qwen3_moe(const formats::ModelConfig& c, model::WeightLoader& w) {
  if (c.n_experts <= 0 || c.n_experts_active <= 0 || c.d_ff_expert <= 0) {
    return corrupt("Qwen3MoeForCausalLM needs num_experts, num_experts_per_tok and moe_intermediate_size");
  }
  return model::build_decoder(w, c, [&](int64_t i, const std::string& p, model::DecoderLayer& l) {
    KILN_ASSIGN_OR_RETURN(l.attn, model::load_attention(w, c, i, p + ".self_attn",
                                                        {.qkv_bias = c.attention_bias,
                                                         .o_bias = c.attention_bias,
                                                         .qk_norm = true}));
    bool sparse = (i + 1) % std::max<int64_t>(1, c.decoder_sparse_step) == 0;
    for (int64_t d : c.mlp_only_layers) sparse = sparse && d != i;
    if (!sparse) {
      KILN_ASSIGN_OR_RETURN(l.ffn, model::load_mlp(w, p + ".mlp", c.d_model, c.d_ff));
      return Status::Ok();
    }
    model::Moe moe;
    KILN_ASSIGN_OR_RETURN(moe.router, w.linear(p + ".mlp.gate", c.n_experts, c.d_model, false));
    KILN_ASSIGN_OR_RETURN(moe.experts, model::load_experts(w, p + ".mlp.experts", c.n_experts,
                                                           c.d_model, c.d_ff_expert));
    moe.routing = {.kind = ops::RouterKind::kSoftmaxTopK,
                   .n_experts = int32_t(c.n_experts),
                   .top_k = int32_t(c.n_experts_active),
                   .norm_topk_prob = c.norm_topk_prob};
    l.ffn = std::move(moe);
    return Status::Ok();
  });
}

}  // namespace kiln::models
