// DeepSeek-V3.2 (DeepseekV32ForCausalLM) and GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3's
// MLA and grouped sigmoid MoE with DeepSeek sparse attention. Each layer's lightning
// indexer (self_attn.indexer.*) scores the context per query token and MLA attends to
// its top index_topk positions only (model::DsaIndexer; docs/ARCHITECTURE.md "DeepSeek
// sparse attention"). As transformers 5.17 computes them, the two differ in:
// - the indexer's rope: half-split on DeepSeek-V3.2, interleaved on GLM-5 (the main MLA
//   rope is interleaved on both);
// - GLM-5's indexer_types: a "shared" layer has no indexer and reuses the top-k of the
//   layer before it (the latest "full" one).
// The first MTP layer is loaded for --speculative-method mtp (see the binder below).
//
// KILN_DSA=dense (a benchmark baseline, docs/perf/2026-families.md): the
// same model with DeepSeek sparse attention off, as engines without DSA kernels run it:
// no indexer is loaded (its weights stay unused, no index cache), and every layer's MLA
// attends to all positions j <= p. Equal to the sparse model while a context holds at most
// index_topk tokens, different beyond. KILN_DSA unset, empty or "sparse": the model.
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/log.h"

#include "model/rope.h"
#include "models/grouped_moe.h"
#include "models/registry.h"

namespace kiln::models {
namespace {

// prefix = "model.layers.N.self_attn.indexer". Whole on every tensor-parallel rank (the
// inputs it reads, x and the q_a output, are whole there too), so every rank selects the
// same positions.
Result<model::DsaIndexer> load_indexer(model::WeightLoader& w, const formats::ModelConfig& c, const std::string& p,
                                       ops::RopeStyle rope_style) {
  model::DsaIndexer ix;
  ix.n_heads = c.n_index_heads;
  ix.d_index = c.d_index;
  ix.top_k = c.index_topk;
  if (c.q_lora_rank <= 0) return corrupt("DeepSeek sparse attention needs q_lora_rank (the indexer reads q_a's output)");
  if (c.d_rope > c.d_index) {
    return corrupt("index_head_dim (" + std::to_string(c.d_index) + ") is smaller than qk_rope_head_dim (" +
                   std::to_string(c.d_rope) + ")");
  }
  KILN_ASSIGN_OR_RETURN(ix.wq_b, w.linear(p + ".wq_b", ix.n_heads * ix.d_index, c.q_lora_rank, false));
  KILN_ASSIGN_OR_RETURN(ix.wk, w.linear(p + ".wk", ix.d_index, c.d_model, false));
  KILN_ASSIGN_OR_RETURN(ix.k_norm, w.tensor(p + ".k_norm.weight", {ix.d_index}));
  KILN_ASSIGN_OR_RETURN(ix.k_norm_bias, w.tensor(p + ".k_norm.bias", {ix.d_index}));
  // transformers keeps weights_proj in fp32 (_keep_in_fp32_modules): never quantized.
  KILN_ASSIGN_OR_RETURN(ix.weights_proj, w.dense_linear(p + ".weights_proj", ix.n_heads, c.d_model, false));
  // The model's rotary table (YaRN included) over the first qk_rope_head_dim dims.
  KILN_ASSIGN_OR_RETURN(ix.rope, model::make_rope_table(c.rope, c.d_rope, rope_style));
  ix.scale = float(1.0 / std::sqrt(double(ix.d_index)));
  ix.weight_scale = float(1.0 / std::sqrt(double(ix.n_heads)));
  return ix;
}

// KILN_DSA: false for the model as configured (unset, "" or "sparse"), true for "dense".
Result<bool> dsa_dense_from_env() {
  const char* v = std::getenv("KILN_DSA");
  if (v == nullptr || *v == '\0' || std::string(v) == "sparse") return false;
  if (std::string(v) == "dense") return true;
  return invalid_argument("KILN_DSA=" + std::string(v) + ": expected sparse (the default) or dense");
}

Result<model::CausalLM> build_dsa(const formats::ModelConfig& c, model::WeightLoader& w, ops::RopeStyle index_rope) {
  if (c.index_topk <= 0) return corrupt(c.architecture + " needs index_topk (DeepSeek sparse attention)");
  KILN_ASSIGN_OR_RETURN(const bool dense, dsa_dense_from_env());
  if (dense) {
    KILN_LOG(kWarn, "KILN_DSA=dense: " << c.architecture << " runs without DeepSeek sparse attention (no indexer, "
                                       << "MLA over every position; differs from the model beyond index_topk "
                                       << c.index_topk << " tokens): a benchmark baseline");
  }
  const int64_t freq = std::max<int64_t>(1, c.moe_layer_freq);
  const int64_t first = w.shard().layer_begin;
  return model::build_decoder(w, c, [&](int64_t i, const std::string& p, model::DecoderLayer& l) {
    KILN_ASSIGN_OR_RETURN(model::Mla mla, model::load_mla(w, c, p + ".self_attn"));
    // The MTP layer (i past the decoder layers: --speculative-method mtp) has an indexer of
    // its own, as vLLM's deepseek_mtp builds it for these models (its block a DSA layer with
    // the top-k buffer, indexed as layer 0, whose indexer is always "full").
    const bool mtp_layer = i >= c.mtp_first_layer;
    if (dense) {
      // dense MLA: neither an indexer nor a reused selection
    } else if (mtp_layer || c.indexer_types[size_t(i)] == "full") {
      KILN_ASSIGN_OR_RETURN(mla.indexer, load_indexer(w, c, p + ".self_attn.indexer", index_rope));
    } else if (i == first) {
      return unsupported("layer " + std::to_string(i) + " reuses the previous layer's DSA top-k (indexer_types "
                         "\"shared\"), which another pipeline stage computes: choose a pipeline split that starts "
                         "each stage at a \"full\" indexer layer");
    } else {
      mla.reuse_selection = true;
    }
    l.attn = std::move(mla);
    const bool moe = c.mlp_layer_types.empty() || mtp_layer
                         ? c.n_experts > 0 && i >= c.first_k_dense_replace && i % freq == 0
                         : c.mlp_layer_types[size_t(i)] == "sparse";
    if (moe) {
      KILN_ASSIGN_OR_RETURN(l.ffn, load_grouped_sigmoid_moe(c, w, p + ".mlp"));
    } else {
      KILN_ASSIGN_OR_RETURN(l.ffn, model::load_mlp(w, p + ".mlp", c.d_model, c.d_ff));
    }
    return Status::Ok();
  });
}

}  // namespace

Result<model::CausalLM> build_deepseek_v32(const formats::ModelConfig& c, model::WeightLoader& w) {
  return build_dsa(c, w, ops::RopeStyle::kHalf);
}

Result<model::CausalLM> build_glm_moe_dsa(const formats::ModelConfig& c, model::WeightLoader& w) {
  return build_dsa(c, w, ops::RopeStyle::kInterleaved);
}

}  // namespace kiln::models
