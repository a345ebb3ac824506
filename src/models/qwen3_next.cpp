// Gated DeltaNet hybrids: Qwen3-Next (Qwen3NextForCausalLM) and Qwen3.5 / 3.6 MoE
// (Qwen3_5MoeForCausalLM, and the language model of the released
// Qwen3_5MoeForConditionalGeneration, whose vision tower is skipped). Linear-attention
// layers (layer_types "linear_attention") beside gated full-attention layers (QK-norm,
// partial rotary, an output gate), softmax top-k MoE with a sigmoid-gated shared expert,
// RMSNorms that scale by (1 + w); the MTP layer (mtp.*) for --speculative-method mtp.
#include "core/log.h"
#include "model/build.h"
#include "models/registry.h"

namespace kiln::models {
namespace {

Result<model::GatedDeltaNet> load_gated_delta_net(model::WeightLoader& w, const formats::ModelConfig& c,
                                                  const std::string& p, bool grouped) {
  model::GatedDeltaNet g;
  const int64_t nk = c.linear_n_k_heads, nv = c.linear_n_v_heads, dk = c.linear_d_k, dv = c.linear_d_v;
  g.d_k = dk;
  g.d_v = dv;
  g.conv_kernel = c.linear_conv_kernel;
  g.grouped = grouped;
  if (nk <= 0 || nv <= 0 || dk <= 0 || dv <= 0 || g.conv_kernel <= 0 || nv % nk != 0) {
    return corrupt("linear attention needs positive linear_num_key_heads, linear_num_value_heads (a multiple of "
                   "the key heads), linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim");
  }
  // Tensor parallelism: each rank takes nk / tp key heads and the value heads that read
  // them (nv / tp), with their convolution channels, gates and state; out_proj is split by
  // its inputs (a partial sum the group all-reduces, like o_proj).
  const model::Shard& sh = w.shard();
  if (nk % sh.tp_size != 0) {
    return unsupported("tensor-parallel size " + std::to_string(sh.tp_size) + " does not divide the " +
                       std::to_string(nk) + " linear-attention key heads");
  }
  g.n_k_heads = nk / sh.tp_size;
  g.n_v_heads = nv / sh.tp_size;
  const int64_t r = nv / nk, g0 = sh.tp_rank * g.n_k_heads, h0 = sh.tp_rank * g.n_v_heads;
  const int64_t key_dim = nk * dk, value_dim = nv * dv, channels = 2 * key_dim + value_dim;
  const int64_t kl = g.n_k_heads * dk, vl = g.n_v_heads * dv;  // this rank's widths
  // This rank's rows of [q | k | v]: its key heads' q and k, its value heads' v.
  const std::vector<std::pair<int64_t, int64_t>> qkv_rows = {{g0 * dk, kl}, {key_dim + g0 * dk, kl},
                                                             {2 * key_dim + h0 * dv, vl}};
  if (grouped) {  // per key head: [q | k | v (r heads) | z (r heads)], then [b (r) | a (r)]
    const int64_t width = 2 * dk + 2 * r * dv;
    KILN_ASSIGN_OR_RETURN(g.qkv, w.linear(p + ".in_proj_qkvz", nk * width, c.d_model, false,
                                          model::Part::rows(g0 * width, g.n_k_heads * width)));
    KILN_ASSIGN_OR_RETURN(g.b, w.linear(p + ".in_proj_ba", 2 * nv, c.d_model, false,
                                        model::Part::rows(g0 * 2 * r, g.n_k_heads * 2 * r)));
  } else {
    if (sh.tp_size == 1) {
      KILN_ASSIGN_OR_RETURN(g.qkv, w.linear(p + ".in_proj_qkv", channels, c.d_model, false));
    } else {
      for (const auto& [begin, count] : qkv_rows) {
        KILN_ASSIGN_OR_RETURN(ops::Weight part, w.linear(p + ".in_proj_qkv", channels, c.d_model, false,
                                                         model::Part::rows(begin, count)));
        g.qkv_parts.push_back(std::move(part));
      }
    }
    KILN_ASSIGN_OR_RETURN(g.z, w.linear(p + ".in_proj_z", value_dim, c.d_model, false, model::Part::rows(h0 * dv, vl)));
    KILN_ASSIGN_OR_RETURN(g.b, w.linear(p + ".in_proj_b", nv, c.d_model, false, model::Part::rows(h0, g.n_v_heads)));
    KILN_ASSIGN_OR_RETURN(g.a, w.linear(p + ".in_proj_a", nv, c.d_model, false, model::Part::rows(h0, g.n_v_heads)));
  }
  KILN_ASSIGN_OR_RETURN(Tensor conv, w.tensor_rows(p + ".conv1d.weight", {channels, 1, g.conv_kernel},
                                                   sh.tp_size == 1 ? std::vector<std::pair<int64_t, int64_t>>{{0, channels}}
                                                                   : qkv_rows));
  g.conv_weight = conv.reshape({g.conv_channels(), g.conv_kernel});
  KILN_ASSIGN_OR_RETURN(g.a_log, w.tensor(p + ".A_log", {nv}, model::Part::rows(h0, g.n_v_heads)));
  KILN_ASSIGN_OR_RETURN(g.dt_bias, w.tensor(p + ".dt_bias", {nv}, model::Part::rows(h0, g.n_v_heads)));
  KILN_ASSIGN_OR_RETURN(g.norm, w.tensor(p + ".norm.weight", {dv}));  // used as is: w, not (1 + w)
  g.norm_eps = float(c.rms_norm_eps);
  KILN_ASSIGN_OR_RETURN(g.o, w.linear(p + ".out_proj", c.d_model, value_dim, false, model::Part::cols(h0 * dv, vl),
                                      /*bias_here=*/sh.tp_rank == 0));
  return g;
}

Result<model::Moe> load_moe(model::WeightLoader& w, const formats::ModelConfig& c, const std::string& p,
                            bool norm_topk_prob) {
  model::Moe moe;
  KILN_ASSIGN_OR_RETURN(moe.router, w.linear(p + ".gate", c.n_experts, c.d_model, false));
  KILN_ASSIGN_OR_RETURN(moe.experts, model::load_experts(w, p + ".experts", c.n_experts, c.d_model, c.d_ff_expert));
  moe.routing = {.kind = ops::RouterKind::kSoftmaxTopK,
                 .n_experts = int32_t(c.n_experts),
                 .top_k = int32_t(c.n_experts_active),
                 .norm_topk_prob = norm_topk_prob};
  if (c.d_ff_shared_expert > 0) {
    KILN_ASSIGN_OR_RETURN(model::Mlp shared, model::load_mlp(w, p + ".shared_expert", c.d_model, c.d_ff_shared_expert));
    moe.shared = std::move(shared);
    KILN_ASSIGN_OR_RETURN(moe.shared_gate, w.linear(p + ".shared_expert_gate", 1, c.d_model, false));
  }
  return moe;
}

}  // namespace

Result<model::CausalLM> build_qwen3_next(const formats::ModelConfig& config, model::WeightLoader& w) {
  formats::ModelConfig c = config;
  c.norm_weight_offset = 1.0;  // Qwen3NextRMSNorm: x * (1 + w)
  const bool qwen35 = c.model_type.starts_with("qwen3_5");
  if (c.layer_types.empty()) {  // older configs: every full_attention_interval-th layer is full attention
    int64_t interval = 4;
    if (c.raw.contains("full_attention_interval") && c.raw["full_attention_interval"].is_number_integer())
      interval = c.raw["full_attention_interval"].get<int64_t>();
    for (int64_t i = 0; i < c.n_layers; ++i)
      c.layer_types.push_back((i + 1) % std::max<int64_t>(1, interval) == 0 ? "full_attention" : "linear_attention");
  }
  if (c.n_experts <= 0 || c.n_experts_active <= 0 || c.d_ff_expert <= 0) {
    return corrupt(c.architecture + " needs num_experts, num_experts_per_tok and moe_intermediate_size");
  }
  if (!c.language_model_prefix.empty()) {
    w.skip_prefix("model.visual.");
    KILN_LOG(kInfo, "vision-language checkpoint: serving its language model; the vision tower is not loaded");
  }
  // The multi-token prediction layer (mtp_num_hidden_layers): under mtp., a gated
  // full-attention layer (vLLM's qwen3_next_mtp); bound as layer n_layers.
  if (c.n_mtp_layers == 0) w.skip_prefix("mtp.");
  const model::MtpNames mtp = model::qwen3_next_mtp_names();
  return model::build_decoder(w, c, [&](int64_t i, const std::string& p, model::DecoderLayer& l) -> Status {
    const std::string type = i < int64_t(c.layer_types.size()) ? c.layer_types[size_t(i)] : "full_attention";
    if (type == "linear_attention") {
      KILN_ASSIGN_OR_RETURN(l.attn, load_gated_delta_net(w, c, p + ".linear_attn", /*grouped=*/!qwen35));
    } else if (type == "full_attention") {
      KILN_ASSIGN_OR_RETURN(l.attn, model::load_attention(w, c, i, p + ".self_attn",
                                                          {.qkv_bias = c.attention_bias,
                                                           .o_bias = c.attention_bias,
                                                           .qk_norm = true,
                                                           .output_gate = true}));
    } else {
      return unsupported("layer " + std::to_string(i) + " has layer type \"" + type +
                         "\" (expected linear_attention or full_attention)");
    }
    // Qwen3.5: every layer is MoE and always renormalises its top-k; Qwen3-Next as Qwen3-MoE.
    bool sparse = qwen35 || (i + 1) % std::max<int64_t>(1, c.decoder_sparse_step) == 0;
    for (int64_t d : c.mlp_only_layers) sparse = sparse && (qwen35 || d != i);
    if (!sparse) {
      KILN_ASSIGN_OR_RETURN(l.ffn, model::load_mlp(w, p + ".mlp", c.d_model, c.d_ff));
    } else {
      KILN_ASSIGN_OR_RETURN(l.ffn, load_moe(w, c, p + ".mlp", qwen35 || c.norm_topk_prob));
    }
    return Status::Ok();
  }, &mtp);
}

}  // namespace kiln::models
