// GLM-4.5 / 4.6 / 4.7 (Glm4MoeForCausalLM): partial rotary, optional QK-norm,
// q/k/v bias (o_proj has none), grouped sigmoid routing with a shared expert,
// dense MLP on the first first_k_dense_replace layers. The MTP layer
// (num_nextn_predict_layers, stored as an extra model.layers.N) is not used.
#include "models/grouped_moe.h"
#include "models/registry.h"

namespace kiln::models {

Result<model::CausalLM> build_glm4_moe(const formats::ModelConfig& c, model::WeightLoader& w) {
  return model::build_decoder(w, c, [&](int64_t i, const std::string& p, model::DecoderLayer& l) {
    KILN_ASSIGN_OR_RETURN(l.attn, model::load_attention(w, c, i, p + ".self_attn",
                                                        {.qkv_bias = c.attention_bias,
                                                         .o_bias = false,
                                                         .qk_norm = c.use_qk_norm}));
    if (i >= c.first_k_dense_replace) {
      KILN_ASSIGN_OR_RETURN(l.ffn, load_grouped_sigmoid_moe(c, w, p + ".mlp"));
    } else {
      KILN_ASSIGN_OR_RETURN(l.ffn, model::load_mlp(w, p + ".mlp", c.d_model, c.d_ff));
    }
    return Status::Ok();
  });
}

}  // namespace kiln::models
