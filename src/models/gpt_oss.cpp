// gpt-oss (GptOssForCausalLM): attention with q/k/v/o bias and per-head sinks,
// alternating sliding-window / full layers, YaRN RoPE, top-k-then-softmax
// routing with a router bias, experts with the clamped SwiGLU (alpha 1.702,
// limit 7) and biases, gate/up interleaved in one fused projection.
//
// BF16 checkpoints store experts input-major: gate_up_proj [E, d_model, 2*d_ff],
// down_proj [E, d_ff, d_model]; the MXFP4 release stores them output-major as
// *_blocks [E, rows, K/32, 16] + *_scales [E, rows, K/32] (formats/quant.h).
#include <tuple>

#include "model/build.h"
#include "models/registry.h"

namespace kiln::models {

Result<model::CausalLM> build_gpt_oss(const formats::ModelConfig& c, model::WeightLoader& w) {
  const int64_t n_exp = c.n_experts, d_ff = c.d_ff, d = c.d_model;
  if (n_exp <= 0 || c.n_experts_active <= 0 || d_ff <= 0) {
    return corrupt("GptOssForCausalLM needs num_local_experts, num_experts_per_tok and intermediate_size");
  }
  return model::build_decoder(w, c, [&](int64_t i, const std::string& p, model::DecoderLayer& l) {
    KILN_ASSIGN_OR_RETURN(l.attn, model::load_attention(w, c, i, p + ".self_attn",
                                                        {.qkv_bias = c.attention_bias,
                                                         .o_bias = c.attention_bias,
                                                         .sinks = true}));
    const std::string e = p + ".mlp.experts";
    // Tensor parallelism splits every expert's d_ff in whole MXFP4 blocks, unevenly where
    // they do not divide (gate/up rows stay interleaved: rows [2 f0, 2 (f0 + part)) are
    // gate and up of columns [f0, f0 + part)); expert parallelism gives each rank whole
    // experts. The down bias is added on one rank.
    const model::Shard& sh = w.shard();
    const auto [first, count] = sh.experts(n_exp);
    int64_t part = d_ff, f0 = 0;
    if (!sh.expert_parallel) {
      KILN_ASSIGN_OR_RETURN(const auto cols, model::ffn_columns(w, e, d_ff, "intermediate columns of " + e));
      std::tie(f0, part) = cols;
    }
    const bool down_bias_here = sh.expert_parallel || sh.tp_rank == 0;
    model::Moe moe;
    KILN_ASSIGN_OR_RETURN(moe.router, w.dense_linear(p + ".mlp.router", n_exp, d, true));
    KILN_ASSIGN_OR_RETURN(Tensor gate_up_bias, w.tensor(e + ".gate_up_proj_bias", {n_exp, 2 * d_ff},
                                                        {{{first, count}, {2 * f0, 2 * part}}}));
    Tensor down_bias;
    if (down_bias_here) {
      KILN_ASSIGN_OR_RETURN(down_bias, w.tensor(e + ".down_proj_bias", {n_exp, d}, model::Part::rows(first, count)));
    } else {
      w.skip_prefix(e + ".down_proj_bias");
    }
    const auto bias_of = [&](const Tensor& b, int64_t x) { return b.defined() ? b.index0(x) : Tensor{}; };
    moe.experts.d_ff = part;
    moe.experts.first_expert = int32_t(first);
    moe.experts.gate_up_interleaved = true;
    const bool mxfp4 = w.quant().kind == formats::QuantKind::kMxfp4 && w.quant().is_quantized(e);
    if (mxfp4) {
      // MXFP4 release: output-major blocks, gate/up rows interleaved like the bf16 columns.
      KILN_ASSIGN_OR_RETURN(auto gate_up, w.mxfp4_experts(e + ".gate_up_proj", n_exp, 2 * d_ff, d, first, count,
                                                          model::Part::rows(2 * f0, 2 * part)));
      KILN_ASSIGN_OR_RETURN(auto down, w.mxfp4_experts(e + ".down_proj", n_exp, d, d_ff, first, count,
                                                       model::Part::cols(f0, part)));
      for (int64_t x = 0; x < count; ++x) {
        moe.experts.gate_up.push_back({.bias = gate_up_bias.index0(x), .quant = gate_up[size_t(x)]});
        moe.experts.down.push_back({.bias = bias_of(down_bias, x), .quant = down[size_t(x)]});
      }
    } else {
      if (w.has(e + ".gate_up_proj_blocks")) {
        return corrupt(e + ".gate_up_proj_blocks is MXFP4 but config.json has no mxfp4 quantization_config "
                       "covering " + e);
      }
      KILN_ASSIGN_OR_RETURN(Tensor gate_up, w.tensor(e + ".gate_up_proj", {n_exp, d, 2 * d_ff},
                                                     {{{first, count}, {0, -1}, {2 * f0, 2 * part}}}));
      KILN_ASSIGN_OR_RETURN(Tensor down, w.tensor(e + ".down_proj", {n_exp, d_ff, d}, {{{first, count}, {f0, part}}}));
      for (int64_t x = 0; x < count; ++x) {  // per-expert views of the stacked tensors
        moe.experts.gate_up.push_back(
            {.data = gate_up.index0(x), .transposed = true, .bias = gate_up_bias.index0(x)});
        moe.experts.down.push_back({.data = down.index0(x), .transposed = true, .bias = bias_of(down_bias, x)});
      }
    }
    moe.routing = {.kind = ops::RouterKind::kTopKSoftmax,
                   .n_experts = int32_t(n_exp),
                   .top_k = int32_t(c.n_experts_active)};
    moe.glu = {.kind = ops::GluKind::kGptOssClamp, .alpha = 1.702f, .limit = 7.0f};
    l.ffn = std::move(moe);
    return Status::Ok();
  });
}

}  // namespace kiln::models
