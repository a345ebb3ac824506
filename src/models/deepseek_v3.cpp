// DeepSeek-V3 / R1 and Kimi K2 (DeepseekV3ForCausalLM): multi-head latent
// attention, grouped sigmoid routing with shared experts, dense MLP on the first
// first_k_dense_replace layers (and off moe_layer_freq). MTP layers are not used.
#include "models/grouped_moe.h"
#include "models/registry.h"

namespace kiln::models {

Result<model::CausalLM> build_deepseek_v3(const formats::ModelConfig& c, model::WeightLoader& w) {
  const int64_t freq = std::max<int64_t>(1, c.moe_layer_freq);
  return model::build_decoder(w, c, [&](int64_t i, const std::string& p, model::DecoderLayer& l) {
    KILN_ASSIGN_OR_RETURN(l.attn, model::load_mla(w, c, p + ".self_attn"));
    if (c.n_experts > 0 && i >= c.first_k_dense_replace && i % freq == 0) {
      KILN_ASSIGN_OR_RETURN(l.ffn, load_grouped_sigmoid_moe(c, w, p + ".mlp"));
    } else {
      KILN_ASSIGN_OR_RETURN(l.ffn, model::load_mlp(w, p + ".mlp", c.d_model, c.d_ff));
    }
    return Status::Ok();
  });
}

}  // namespace kiln::models
