#include "model/build.h"

#include <cmath>
#include <tuple>

#include "model/rope.h"

namespace kiln::model {

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer); }

Result<Attention> load_attention(WeightLoader& w, const formats::ModelConfig& c, int64_t layer,
                                 const std::string& prefix, const AttentionOptions& opt) {
  Attention a;
  a.d_head = c.d_head;
  if (c.n_heads % c.n_kv_heads != 0) {
    return corrupt("num_attention_heads (" + std::to_string(c.n_heads) +
                   ") is not a multiple of num_key_value_heads (" + std::to_string(c.n_kv_heads) + ")");
  }
  // Tensor parallelism: each rank takes n_heads / tp query heads and the KV heads they
  // read: n_kv_heads / tp of them, or, with fewer KV heads than ranks, the one KV head
  // of its query heads (replicated on tp / n_kv_heads ranks).
  const Shard& sh = w.shard();
  const int64_t tp = sh.tp_size, r = sh.tp_rank;
  if (c.n_heads % tp != 0 || (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0)) {
    return unsupported("tensor-parallel size " + std::to_string(tp) + " does not divide " +
                       std::to_string(c.n_heads) + " attention heads and " + std::to_string(c.n_kv_heads) +
                       " KV heads (nor do the KV heads divide it)");
  }
  a.n_heads = c.n_heads / tp;
  a.n_kv_heads = c.n_kv_heads % tp == 0 ? c.n_kv_heads / tp : 1;
  const int64_t kv_first = c.n_kv_heads % tp == 0 ? r * a.n_kv_heads : r / (tp / c.n_kv_heads);
  const int64_t d_q = c.n_heads * a.d_head, d_kv = c.n_kv_heads * a.d_head;
  const int64_t q_rows = a.n_heads * a.d_head, kv_rows = a.n_kv_heads * a.d_head;
  const int64_t qf = opt.output_gate ? 2 : 1;  // rows per query row: [q | gate] per head
  const Part q_part = Part::rows(r * q_rows * qf, q_rows * qf), kv_part = Part::rows(kv_first * a.d_head, kv_rows);
  // (One allocation where the backend computes adjacent linears as one product.)
  KILN_ASSIGN_OR_RETURN(std::vector<ops::Weight> qkv,
                        w.adjacent_linears({{.prefix = prefix + ".q_proj", .n_out = d_q * qf, .part = q_part},
                                            {.prefix = prefix + ".k_proj", .n_out = d_kv, .part = kv_part},
                                            {.prefix = prefix + ".v_proj", .n_out = d_kv, .part = kv_part}},
                                           c.d_model, opt.qkv_bias));
  a.q = std::move(qkv[0]), a.k = std::move(qkv[1]), a.v = std::move(qkv[2]);
  a.output_gate = opt.output_gate;
  KILN_ASSIGN_OR_RETURN(a.o, w.linear(prefix + ".o_proj", c.d_model, d_q, opt.o_bias, Part::cols(r * q_rows, q_rows),
                                      /*bias_here=*/r == 0));
  if (opt.qk_norm) {
    KILN_ASSIGN_OR_RETURN(a.q_norm, w.norm(prefix + ".q_norm.weight", {a.d_head}, c.norm_weight_offset));
    KILN_ASSIGN_OR_RETURN(a.k_norm, w.norm(prefix + ".k_norm.weight", {a.d_head}, c.norm_weight_offset));
  }
  if (opt.qk_norm_full) {
    // Whole on every rank; each rank's part of the row is its heads' columns, and the
    // KV heads replicated over tp / n_kv_heads ranks come from the first of those.
    FullWidthNorm qn{.col_begin = r * q_rows}, kn{.col_begin = kv_first * a.d_head};
    KILN_ASSIGN_OR_RETURN(qn.weight, w.tensor(prefix + ".q_norm.weight", {d_q}));
    KILN_ASSIGN_OR_RETURN(kn.weight, w.tensor(prefix + ".k_norm.weight", {d_kv}));
    for (int j = 0; j < int(tp); ++j) qn.sources.push_back(j);
    const int64_t kv_step = c.n_kv_heads % tp == 0 ? 1 : tp / c.n_kv_heads;
    for (int64_t j = 0; j < tp; j += kv_step) kn.sources.push_back(int(j));
    a.q_norm_full = std::move(qn);
    a.k_norm_full = std::move(kn);
  }
  if (opt.sinks) {
    KILN_ASSIGN_OR_RETURN(a.sinks, w.tensor(prefix + ".sinks", {c.n_heads}, Part::rows(r * a.n_heads, a.n_heads)));
  }
  a.norm_eps = float(c.rms_norm_eps);
  KILN_ASSIGN_OR_RETURN(a.rope, make_rope_table(c.rope, a.d_head, ops::RopeStyle::kHalf));
  a.scale = float(1.0 / std::sqrt(double(a.d_head)));
  a.sliding_window = int32_t(c.sliding_window_of_layer(layer));
  return a;
}

Result<Mla> load_mla(WeightLoader& w, const formats::ModelConfig& c, const std::string& prefix) {
  Mla m;
  m.d_nope = c.d_nope;
  m.d_rope = c.d_rope;
  m.d_v = c.d_v;
  m.d_latent = c.d_latent;
  if (m.d_nope <= 0 || m.d_rope <= 0 || m.d_v <= 0 || m.d_latent <= 0) {
    return corrupt("MLA needs positive qk_nope_head_dim, qk_rope_head_dim, v_head_dim and kv_lora_rank");
  }
  // Tensor parallelism: heads split (q / q_b, kv_b rows, o columns); the latent
  // projections and cache are whole on every rank.
  const Shard& sh = w.shard();
  if (c.n_heads % sh.tp_size != 0) {
    return unsupported("tensor-parallel size " + std::to_string(sh.tp_size) + " does not divide " +
                       std::to_string(c.n_heads) + " attention heads");
  }
  m.n_heads = c.n_heads / sh.tp_size;
  const int64_t h0 = sh.tp_rank * m.n_heads, d_qk = m.d_nope + m.d_rope;
  const int64_t d_q = c.n_heads * d_qk;
  const Part q_part = Part::rows(h0 * d_qk, m.n_heads * d_qk);
  const bool bias = c.attention_bias;
  if (c.q_lora_rank > 0) {
    KILN_ASSIGN_OR_RETURN(m.q_a, w.linear(prefix + ".q_a_proj", c.q_lora_rank, c.d_model, bias));
    KILN_ASSIGN_OR_RETURN(m.q_a_norm, w.tensor(prefix + ".q_a_layernorm.weight", {c.q_lora_rank}));
    KILN_ASSIGN_OR_RETURN(m.q_b, w.linear(prefix + ".q_b_proj", d_q, c.q_lora_rank, false, q_part));
  } else {
    KILN_ASSIGN_OR_RETURN(m.q, w.linear(prefix + ".q_proj", d_q, c.d_model, false, q_part));
  }
  KILN_ASSIGN_OR_RETURN(
      m.kv_a, w.linear(prefix + ".kv_a_proj_with_mqa", m.d_latent + m.d_rope, c.d_model, bias));
  KILN_ASSIGN_OR_RETURN(m.kv_a_norm, w.tensor(prefix + ".kv_a_layernorm.weight", {m.d_latent}));
  const int64_t d_kvb = m.d_nope + m.d_v;
  KILN_ASSIGN_OR_RETURN(m.kv_b, w.linear(prefix + ".kv_b_proj", c.n_heads * d_kvb, m.d_latent, false,
                                         Part::rows(h0 * d_kvb, m.n_heads * d_kvb)));
  KILN_ASSIGN_OR_RETURN(m.o, w.linear(prefix + ".o_proj", c.d_model, c.n_heads * m.d_v, bias,
                                      Part::cols(h0 * m.d_v, m.n_heads * m.d_v), /*bias_here=*/sh.tp_rank == 0));
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

Result<std::pair<int64_t, int64_t>> ffn_columns(const WeightLoader& w, const std::string& down, int64_t d_ff,
                                                const std::string& what) {
  const Shard& sh = w.shard();
  const int64_t unit = w.input_cut_unit(down);
  const auto cols = sh.split_units(d_ff, unit);
  if (cols.second <= 0) {
    return unsupported("tensor-parallel size " + std::to_string(sh.tp_size) + " leaves rank " +
                       std::to_string(sh.tp_rank) + " none of the " + std::to_string(d_ff) + " " + what + " (" +
                       std::to_string((d_ff + unit - 1) / unit) + " blocks of " + std::to_string(unit) + ")");
  }
  return cols;
}

Result<Mlp> load_mlp(WeightLoader& w, const std::string& prefix, int64_t d_model, int64_t d_ff) {
  // Tensor parallelism: gate / up split by output (column parallel), down by input (row
  // parallel); each rank's down gives a partial sum the ranks add.
  KILN_ASSIGN_OR_RETURN(const auto cols, ffn_columns(w, prefix + ".down_proj", d_ff, "intermediate columns of " + prefix));
  const auto [f0, part] = cols;
  Mlp m;
  KILN_ASSIGN_OR_RETURN(m.gate, w.linear(prefix + ".gate_proj", d_ff, d_model, false, Part::rows(f0, part)));
  KILN_ASSIGN_OR_RETURN(m.up, w.linear(prefix + ".up_proj", d_ff, d_model, false, Part::rows(f0, part)));
  KILN_ASSIGN_OR_RETURN(m.down, w.linear(prefix + ".down_proj", d_model, d_ff, false, Part::cols(f0, part)));
  return m;
}

Result<ops::MoeExperts> load_experts(WeightLoader& w, const std::string& prefix, int64_t n_experts,
                                     int64_t d_model, int64_t d_ff, const ExpertNames& names) {
  // Expert parallelism: this rank's experts, whole. Else every expert split like an MLP.
  const Shard& sh = w.shard();
  const auto [first, count] = sh.experts(n_experts);
  int64_t part = d_ff, f0 = 0;
  if (!sh.expert_parallel && count > 0) {
    KILN_ASSIGN_OR_RETURN(const auto cols, ffn_columns(w, prefix + "." + std::to_string(first) + "." + names.down, d_ff,
                                                       "intermediate columns of the experts of " + prefix));
    std::tie(f0, part) = cols;
  }
  ops::MoeExperts ex;
  ex.d_ff = part;
  ex.first_expert = int32_t(first);
  for (int64_t e = first; e < first + count; ++e) {
    const std::string p = prefix + "." + std::to_string(e);
    KILN_ASSIGN_OR_RETURN(ops::Weight g, w.linear(p + "." + names.gate, d_ff, d_model, false, Part::rows(f0, part)));
    KILN_ASSIGN_OR_RETURN(ops::Weight u, w.linear(p + "." + names.up, d_ff, d_model, false, Part::rows(f0, part)));
    KILN_ASSIGN_OR_RETURN(ops::Weight d, w.linear(p + "." + names.down, d_model, d_ff, false, Part::cols(f0, part)));
    ex.gate.push_back(std::move(g));
    ex.up.push_back(std::move(u));
    ex.down.push_back(std::move(d));
  }
  if (count < n_experts) w.skip_prefix(prefix + ".");  // the other ranks' experts
  return ex;
}

Status load_embedding_and_head(WeightLoader& w, const formats::ModelConfig& c, CausalLM& lm) {
  // Tensor parallelism: the vocabulary split over the ranks (the last part shorter when
  // it does not divide); a pipeline's first stage embeds, its last one projects.
  const Shard& sh = w.shard();
  lm.vocab_size = c.vocab_size;
  lm.d_model = c.d_model;
  lm.norm_eps = float(c.rms_norm_eps);
  const auto [v0, rows] = sh.split(c.vocab_size);
  if (rows <= 0) return unsupported("tensor-parallel size " + std::to_string(sh.tp_size) + " exceeds the vocabulary");
  lm.vocab_begin = v0;
  lm.vocab_part = (c.vocab_size + sh.tp_size - 1) / sh.tp_size;
  const bool embed_here = sh.first_stage || (sh.last_stage && c.tie_word_embeddings);
  if (embed_here) {
    KILN_ASSIGN_OR_RETURN(lm.embed, w.tensor("model.embed_tokens.weight", {c.vocab_size, c.d_model}, Part::rows(v0, rows)));
  }
  if (!sh.last_stage) return Status::Ok();
  KILN_ASSIGN_OR_RETURN(lm.final_norm, w.norm("model.norm.weight", {c.d_model}, c.norm_weight_offset));
  if (c.tie_word_embeddings) {
    lm.lm_head.data = lm.embed;
  } else {
    KILN_ASSIGN_OR_RETURN(lm.lm_head, w.dense_linear("lm_head", c.vocab_size, c.d_model, false, Part::rows(v0, rows)));
  }
  return Status::Ok();
}

Status load_layer_norms(WeightLoader& w, const formats::ModelConfig& c, int64_t layer,
                        DecoderLayer& l) {
  return load_layer_norms(w, c, layer_prefix(layer), l);
}

Status load_layer_norms(WeightLoader& w, const formats::ModelConfig& c, const std::string& p, DecoderLayer& l) {
  KILN_ASSIGN_OR_RETURN(l.input_norm, w.norm(p + ".input_layernorm.weight", {c.d_model}, c.norm_weight_offset));
  KILN_ASSIGN_OR_RETURN(l.post_attn_norm,
                        w.norm(p + ".post_attention_layernorm.weight", {c.d_model}, c.norm_weight_offset));
  return Status::Ok();
}

}  // namespace kiln::model

namespace kiln::model {

MtpNames deepseek_mtp_names(int64_t layer) {
  const std::string p = layer_prefix(layer);
  // DeepSeek-V3 stores copies of the embedding and the output head in the layer; the
  // model's own are used (the technical report: the MTP modules share them).
  return {.block = p, .enorm = p + ".enorm.weight", .hnorm = p + ".hnorm.weight", .eh_proj = p + ".eh_proj",
          .head_norm = p + ".shared_head.norm.weight", .copies = {p + ".embed_tokens.", p + ".shared_head.head."},
          .all = p + "."};
}

MtpNames qwen3_next_mtp_names() {
  return {.block = "mtp.layers.0", .enorm = "mtp.pre_fc_norm_embedding.weight", .hnorm = "mtp.pre_fc_norm_hidden.weight",
          .eh_proj = "mtp.fc", .head_norm = "mtp.norm.weight", .copies = {}, .all = "mtp.", .zero_embedding_at_0 = false};
}

Result<MtpLayer> load_mtp_layer(WeightLoader& w, const formats::ModelConfig& c, int64_t layer, const MtpNames& names,
                                const LayerBinder& bind) {
  MtpLayer m;
  m.zero_embedding_at_0 = names.zero_embedding_at_0;
  KILN_ASSIGN_OR_RETURN(m.enorm, w.norm(names.enorm, {c.d_model}, c.norm_weight_offset));
  KILN_ASSIGN_OR_RETURN(m.hnorm, w.norm(names.hnorm, {c.d_model}, c.norm_weight_offset));
  KILN_ASSIGN_OR_RETURN(m.eh_proj, w.linear(names.eh_proj, c.d_model, 2 * c.d_model, false));
  KILN_ASSIGN_OR_RETURN(m.head_norm, w.norm(names.head_norm, {c.d_model}, c.norm_weight_offset));
  KILN_RETURN_IF_ERROR(load_layer_norms(w, c, names.block, m.block));
  KILN_RETURN_IF_ERROR(bind(layer, names.block, m.block));
  for (const std::string& copy : names.copies) w.skip_prefix(copy);
  return m;
}

Result<CausalLM> build_decoder(WeightLoader& w, const formats::ModelConfig& c, const LayerBinder& bind,
                               const MtpNames* mtp_names) {
  const Shard& sh = w.shard();
  const int64_t end = sh.layer_end < 0 ? c.n_layers : std::min(sh.layer_end, c.n_layers);
  CausalLM lm;
  KILN_RETURN_IF_ERROR(load_embedding_and_head(w, c, lm));
  lm.first_layer = sh.layer_begin;
  lm.first_stage = sh.first_stage;
  lm.last_stage = sh.last_stage;
  for (int64_t i = sh.layer_begin; i < end; ++i) {
    DecoderLayer l;
    KILN_RETURN_IF_ERROR(load_layer_norms(w, c, i, l));
    KILN_RETURN_IF_ERROR(bind(i, layer_prefix(i), l));
    lm.layers.push_back(std::move(l));
  }
  // The MTP layers (after the decoder layers in the checkpoint): the first one for
  // --speculative-method mtp, on the last stage; otherwise left alone.
  for (int64_t i = 0; i < c.n_mtp_layers; ++i) {
    const MtpNames names = mtp_names != nullptr ? *mtp_names : deepseek_mtp_names(c.mtp_first_layer + i);
    if (i == 0 && sh.mtp && sh.last_stage) {
      KILN_ASSIGN_OR_RETURN(lm.mtp, load_mtp_layer(w, c, c.mtp_first_layer, names, bind));
    } else {
      w.skip_prefix(names.all);
    }
  }
  // A pipeline stage leaves the other stages' tensors alone.
  if (!sh.first_stage || !sh.last_stage) {
    for (int64_t i = 0; i < c.n_layers; ++i)
      if (i < sh.layer_begin || i >= end) w.skip_prefix(layer_prefix(i) + ".");
    if (!sh.first_stage && !(sh.last_stage && c.tie_word_embeddings)) w.skip_prefix("model.embed_tokens.");
    if (!sh.last_stage) {
      w.skip_prefix("model.norm.");
      w.skip_prefix("lm_head.");
    }
  }
  return lm;
}

}  // namespace kiln::model
