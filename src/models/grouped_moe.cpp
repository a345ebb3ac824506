#include "models/grouped_moe.h"

namespace kiln::models {

Result<model::Moe> load_grouped_sigmoid_moe(const formats::ModelConfig& c, model::WeightLoader& w,
                                            const std::string& p) {
  if (c.n_experts <= 0 || c.n_experts_active <= 0 || c.d_ff_expert <= 0) {
    return corrupt("routed MoE needs n_routed_experts, num_experts_per_tok and moe_intermediate_size");
  }
  model::Moe moe;
  // The router (MoEGate / TopkRouter) is not an nn.Linear: never quantized.
  KILN_ASSIGN_OR_RETURN(moe.router, w.dense_linear(p + ".gate", c.n_experts, c.d_model, false));
  KILN_ASSIGN_OR_RETURN(moe.correction_bias,
                        w.tensor(p + ".gate.e_score_correction_bias", {c.n_experts}));
  KILN_ASSIGN_OR_RETURN(moe.experts,
                        model::load_experts(w, p + ".experts", c.n_experts, c.d_model, c.d_ff_expert));
  moe.routing = {.kind = ops::RouterKind::kSigmoidGroupedTopK,
                 .n_experts = int32_t(c.n_experts),
                 .top_k = int32_t(c.n_experts_active),
                 .n_group = int32_t(c.n_group),
                 .topk_group = int32_t(c.topk_group),
                 .norm_topk_prob = c.norm_topk_prob,
                 .routed_scaling_factor = float(c.routed_scaling_factor)};
  if (c.n_group > 1 && c.n_experts / c.n_group < 2) {
    return corrupt("grouped routing scores each group by its top-2 experts; " +
                   std::to_string(c.n_experts / c.n_group) + " expert(s) per group is too few");
  }
  if (c.n_shared_experts > 0) {
    KILN_ASSIGN_OR_RETURN(moe.shared, model::load_mlp(w, p + ".shared_experts", c.d_model,
                                                      c.d_ff_expert * c.n_shared_experts));
  }
  return moe;
}

}  // namespace kiln::models
