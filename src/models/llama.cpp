// Dense decoder families: Llama (LlamaForCausalLM) and Qwen3 (Qwen3ForCausalLM,
// which adds per-head QK-norm and never has attention bias).
#include "model/build.h"
#include "models/registry.h"

namespace kiln::models {
namespace {

Result<model::CausalLM> build_dense(const formats::ModelConfig& c, model::WeightLoader& w,
                                    const model::AttentionOptions& attn_opt) {
  model::CausalLM lm;
  KILN_RETURN_IF_ERROR(model::load_embedding_and_head(w, c, lm));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = model::layer_prefix(i);
    model::DecoderLayer l;
    KILN_RETURN_IF_ERROR(model::load_layer_norms(w, c, i, l));
    KILN_ASSIGN_OR_RETURN(l.attn, model::load_attention(w, c, i, p + ".self_attn", attn_opt));
    KILN_ASSIGN_OR_RETURN(l.ffn, model::load_mlp(w, p + ".mlp", c.d_model, c.d_ff));
    lm.layers.push_back(std::move(l));
  }
  return lm;
}

}  // namespace

Result<model::CausalLM> build_llama(const formats::ModelConfig& c, model::WeightLoader& w) {
  if (c.mlp_bias) return unsupported("LlamaForCausalLM with mlp_bias is not supported");
  // Llama's attention_bias puts a bias on all four projections.
  return build_dense(c, w, {.qkv_bias = c.attention_bias, .o_bias = c.attention_bias});
}

Result<model::CausalLM> build_qwen3(const formats::ModelConfig& c, model::WeightLoader& w) {
  return build_dense(c, w, {.qkv_bias = c.attention_bias, .o_bias = c.attention_bias, .qk_norm = true});
}

}  // namespace kiln::models
