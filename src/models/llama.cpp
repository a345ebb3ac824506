// Dense decoder families: Llama (LlamaForCausalLM) and Qwen3 (Qwen3ForCausalLM,
// which adds per-head QK-norm).
#include "model/build.h"
#include "models/registry.h"

namespace kiln::models {
namespace {

Result<model::CausalLM> build_dense(const formats::ModelConfig& c, model::WeightLoader& w,
                                    const model::AttentionOptions& attn_opt) {
  return model::build_decoder(w, c, [&](int64_t i, const std::string& p, model::DecoderLayer& l) {
    KILN_ASSIGN_OR_RETURN(l.attn, model::load_attention(w, c, i, p + ".self_attn", attn_opt));
    KILN_ASSIGN_OR_RETURN(l.ffn, model::load_mlp(w, p + ".mlp", c.d_model, c.d_ff));
    return Status::Ok();
  });
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
