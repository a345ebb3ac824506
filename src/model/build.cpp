#include "model/build.h"

#include <cmath>

#include "model/rope.h"

namespace kiln::model {

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer); }

Result<Attention> load_attention(WeightLoader& w, const formats::ModelConfig& c, int64_t layer,
                                 const std::string& prefix, const AttentionOptions& opt) {
  Attention a;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.d_head = c.d_head;
  if (a.n_heads % a.n_kv_heads != 0) {
    return corrupt("num_attention_heads (" + std::to_string(a.n_heads) +
                   ") is not a multiple of num_key_value_heads (" + std::to_string(a.n_kv_heads) + ")");
  }
  const int64_t d_q = a.n_heads * a.d_head, d_kv = a.n_kv_heads * a.d_head;
  KILN_ASSIGN_OR_RETURN(a.q, w.linear(prefix + ".q_proj", d_q, c.d_model, opt.qkv_bias));
  KILN_ASSIGN_OR_RETURN(a.k, w.linear(prefix + ".k_proj", d_kv, c.d_model, opt.qkv_bias));
  KILN_ASSIGN_OR_RETURN(a.v, w.linear(prefix + ".v_proj", d_kv, c.d_model, opt.qkv_bias));
  KILN_ASSIGN_OR_RETURN(a.o, w.linear(prefix + ".o_proj", c.d_model, d_q, opt.o_bias));
  if (opt.qk_norm) {
    KILN_ASSIGN_OR_RETURN(a.q_norm, w.tensor(prefix + ".q_norm.weight", {a.d_head}));
    KILN_ASSIGN_OR_RETURN(a.k_norm, w.tensor(prefix + ".k_norm.weight", {a.d_head}));
  }
  if (opt.sinks) {
    KILN_ASSIGN_OR_RETURN(a.sinks, w.tensor(prefix + ".sinks", {a.n_heads}));
  }
  a.norm_eps = float(c.rms_norm_eps);
  KILN_ASSIGN_OR_RETURN(a.rope, make_rope_table(c.rope, a.d_head, ops::RopeStyle::kHalf));
  a.scale = float(1.0 / std::sqrt(double(a.d_head)));
  a.sliding_window = int32_t(c.sliding_window_of_layer(layer));
  return a;
}

Result<Mla> load_mla(WeightLoader& w, const formats::ModelConfig& c, const std::string& prefix) {
  Mla m;
  m.n_heads = c.n_heads;
  m.d_nope = c.d_nope;
  m.d_rope = c.d_rope;
  m.d_v = c.d_v;
  m.d_latent = c.d_latent;
  if (m.d_nope <= 0 || m.d_rope <= 0 || m.d_v <= 0 || m.d_latent <= 0) {
    return corrupt("MLA needs positive qk_nope_head_dim, qk_rope_head_dim, v_head_dim and kv_lora_rank");
  }
  const int64_t d_q = m.n_heads * (m.d_nope + m.d_rope);
  const bool bias = c.attention_bias;
  if (c.q_lora_rank > 0) {
    KILN_ASSIGN_OR_RETURN(m.q_a, w.linear(prefix + ".q_a_proj", c.q_lora_rank, c.d_model, bias));
    KILN_ASSIGN_OR_RETURN(m.q_a_norm, w.tensor(prefix + ".q_a_layernorm.weight", {c.q_lora_rank}));
    KILN_ASSIGN_OR_RETURN(m.q_b, w.linear(prefix + ".q_b_proj", d_q, c.q_lora_rank, false));
  } else {
    KILN_ASSIGN_OR_RETURN(m.q, w.linear(prefix + ".q_proj", d_q, c.d_model, false));
  }
  KILN_ASSIGN_OR_RETURN(
      m.kv_a, w.linear(prefix + ".kv_a_proj_with_mqa", m.d_latent + m.d_rope, c.d_model, bias));
  KILN_ASSIGN_OR_RETURN(m.kv_a_norm, w.tensor(prefix + ".kv_a_layernorm.weight", {m.d_latent}));
  KILN_ASSIGN_OR_RETURN(
      m.kv_b, w.linear(prefix + ".kv_b_proj", m.n_heads * (m.d_nope + m.d_v), m.d_latent, false));
  KILN_ASSIGN_OR_RETURN(m.o, w.linear(prefix + ".o_proj", c.d_model, m.n_heads * m.d_v, bias));
  m.norm_eps = float(c.rms_norm_eps);
  // DeepSeek pairs rotary dims (2i, 2i+1); the pairing is the same for q and k, so
  // kiln keeps them in place (transformers permutes both, which leaves q.k unchanged).
  KILN_ASSIGN_OR_RETURN(m.rope, make_rope_table(c.rope, m.d_rope,
                                                c.rope_interleave ? ops::RopeStyle::kInterleaved
                                                                  : ops::RopeStyle::kHalf));
  // Softmax scale: 1/sqrt(d_nope + d_rope), times m(s, mscale_all_dim)^2 under YaRN.
  double scale = 1.0 / std::sqrt(double(m.d_nope + m.d_rope));
  if (c.rope.type != "default" && c.rope.mscale_all_dim && *c.rope.mscale_all_dim != 0) {
    const double ms = yarn_get_mscale(c.rope.factor, *c.rope.mscale_all_dim);
    scale *= ms * ms;
  }
  m.scale = float(scale);
  return m;
}

Result<Mlp> load_mlp(WeightLoader& w, const std::string& prefix, int64_t d_model, int64_t d_ff) {
  Mlp m;
  KILN_ASSIGN_OR_RETURN(m.gate, w.linear(prefix + ".gate_proj", d_ff, d_model, false));
  KILN_ASSIGN_OR_RETURN(m.up, w.linear(prefix + ".up_proj", d_ff, d_model, false));
  KILN_ASSIGN_OR_RETURN(m.down, w.linear(prefix + ".down_proj", d_model, d_ff, false));
  return m;
}

Result<ops::MoeExperts> load_experts(WeightLoader& w, const std::string& prefix, int64_t n_experts,
                                     int64_t d_model, int64_t d_ff) {
  ops::MoeExperts ex;
  ex.d_ff = d_ff;
  for (int64_t e = 0; e < n_experts; ++e) {
    const std::string p = prefix + "." + std::to_string(e);
    KILN_ASSIGN_OR_RETURN(ops::Weight g, w.linear(p + ".gate_proj", d_ff, d_model, false));
    KILN_ASSIGN_OR_RETURN(ops::Weight u, w.linear(p + ".up_proj", d_ff, d_model, false));
    KILN_ASSIGN_OR_RETURN(ops::Weight d, w.linear(p + ".down_proj", d_model, d_ff, false));
    ex.gate.push_back(std::move(g));
    ex.up.push_back(std::move(u));
    ex.down.push_back(std::move(d));
  }
  return ex;
}

Status load_embedding_and_head(WeightLoader& w, const formats::ModelConfig& c, CausalLM& lm) {
  lm.vocab_size = c.vocab_size;
  lm.d_model = c.d_model;
  lm.norm_eps = float(c.rms_norm_eps);
  KILN_ASSIGN_OR_RETURN(lm.embed, w.tensor("model.embed_tokens.weight", {c.vocab_size, c.d_model}));
  KILN_ASSIGN_OR_RETURN(lm.final_norm, w.tensor("model.norm.weight", {c.d_model}));
  if (c.tie_word_embeddings) {
    lm.lm_head.data = lm.embed;
  } else {
    KILN_ASSIGN_OR_RETURN(lm.lm_head, w.dense_linear("lm_head", c.vocab_size, c.d_model, false));
  }
  return Status::Ok();
}

Status load_layer_norms(WeightLoader& w, const formats::ModelConfig& c, int64_t layer,
                        DecoderLayer& l) {
  const std::string p = layer_prefix(layer);
  KILN_ASSIGN_OR_RETURN(l.input_norm, w.tensor(p + ".input_layernorm.weight", {c.d_model}));
  KILN_ASSIGN_OR_RETURN(l.post_attn_norm,
                        w.tensor(p + ".post_attention_layernorm.weight", {c.d_model}));
  return Status::Ok();
}

}  // namespace kiln::model

namespace kiln::model {

Result<CausalLM> build_decoder(WeightLoader& w, const formats::ModelConfig& c, const LayerBinder& bind) {
  CausalLM lm;
  KILN_RETURN_IF_ERROR(load_embedding_and_head(w, c, lm));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    DecoderLayer l;
    KILN_RETURN_IF_ERROR(load_layer_norms(w, c, i, l));
    KILN_RETURN_IF_ERROR(bind(i, layer_prefix(i), l));
    lm.layers.push_back(std::move(l));
  }
  return lm;
}

}  // namespace kiln::model
