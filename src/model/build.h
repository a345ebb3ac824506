// Shared weight-binding helpers for the model families: the checkpoint naming
// conventions of Hugging Face decoder models ("model.layers.N.self_attn.q_proj").
#pragma once

#include <functional>
#include <string>

#include "formats/hf_config.h"
#include "model/blocks.h"
#include "model/loader.h"

namespace kiln::model {

struct AttentionOptions {
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;        // per head: q_norm / k_norm [d_head]
  bool qk_norm_full = false;   // over all heads: q_norm [n_heads * d_head], k_norm [n_kv_heads * d_head]
  bool sinks = false;
  bool output_gate = false;  // q_proj gives [q | gate] per head (Qwen3-Next, Qwen3.5)
};

// The names of one expert's three projections under prefix.E.
struct ExpertNames {
  const char* gate = "gate_proj";
  const char* up = "up_proj";
  const char* down = "down_proj";
};

// prefix = "model.layers.N.self_attn"
Result<Attention> load_attention(WeightLoader& w, const formats::ModelConfig& c, int64_t layer,
                                 const std::string& prefix, const AttentionOptions& opt);
// prefix = "model.layers.N.self_attn" (DeepSeek naming)
Result<Mla> load_mla(WeightLoader& w, const formats::ModelConfig& c, const std::string& prefix);
// This rank's columns [first, first + count) of an MLP's d_ff under tensor parallelism:
// whole scale blocks of `down` (the projection whose inputs the cut splits, so gate / up
// rows follow it), unevenly where they do not divide (Shard::split_units); an error
// naming `what` when a rank would hold none.
Result<std::pair<int64_t, int64_t>> ffn_columns(const WeightLoader& w, const std::string& down, int64_t d_ff,
                                                const std::string& what);
// prefix = "model.layers.N.mlp": gate_proj / up_proj / down_proj
Result<Mlp> load_mlp(WeightLoader& w, const std::string& prefix, int64_t d_model, int64_t d_ff);
// Per-expert tensors prefix.E.{gate,up,down}_proj.weight (Qwen3-MoE, GLM, DeepSeek, Kimi),
// or other names (MiniMax-M2: w1, w3, w2).
Result<ops::MoeExperts> load_experts(WeightLoader& w, const std::string& prefix, int64_t n_experts,
                                     int64_t d_model, int64_t d_ff, const ExpertNames& names = {});

// Embedding, final norm and lm_head (tied to the embedding when configured or absent).
Status load_embedding_and_head(WeightLoader& w, const formats::ModelConfig& c, CausalLM& lm);
// The two norms of decoder layer `layer` (or of the layer under `prefix`).
Status load_layer_norms(WeightLoader& w, const formats::ModelConfig& c, int64_t layer,
                        DecoderLayer& l);
Status load_layer_norms(WeightLoader& w, const formats::ModelConfig& c, const std::string& prefix, DecoderLayer& l);

std::string layer_prefix(int64_t layer);  // "model.layers.N"

// Binds attention and ffn of decoder layer `layer` ("model.layers.N" = prefix).
using LayerBinder =
    std::function<Status(int64_t layer, const std::string& prefix, DecoderLayer& l)>;
// Where a checkpoint keeps its first MTP layer's tensors: DeepSeek-V3 / GLM-4.5 as decoder
// layer N (model.layers.N.{enorm, hnorm, eh_proj, shared_head.norm}, with copies of the
// embedding and head kiln does not load); Qwen3-Next / Qwen3.5 under mtp.
// ({pre_fc_norm_embedding, pre_fc_norm_hidden, fc, norm}, its decoder layer mtp.layers.0),
// as vLLM's deepseek_mtp and qwen3_next_mtp read them.
struct MtpNames {
  std::string block;                        // the decoder layer's prefix
  std::string enorm, hnorm, eh_proj, head_norm;  // (eh_proj without ".weight")
  std::vector<std::string> copies;          // prefixes not loaded
  std::string all;                          // every MTP tensor's prefix (skipped when not loaded)
  bool zero_embedding_at_0 = true;          // MtpLayer::zero_embedding_at_0
};
MtpNames deepseek_mtp_names(int64_t layer);
MtpNames qwen3_next_mtp_names();
// The MTP layer (model::MtpLayer), bound as decoder layer `layer` (its index for `bind`):
// its norms and eh_proj, then its decoder layer as `bind` binds the others.
Result<MtpLayer> load_mtp_layer(WeightLoader& w, const formats::ModelConfig& c, int64_t layer, const MtpNames& names,
                                const LayerBinder& bind);
// The decoder stack every family shares: embedding, n_layers layers (their two
// norms, then `bind` for attention and ffn), final norm and lm_head; the first MTP layer
// when the shard asks for it (Shard::mtp), named as `mtp_names` says (default: DeepSeek's).
Result<CausalLM> build_decoder(WeightLoader& w, const formats::ModelConfig& c, const LayerBinder& bind,
                               const MtpNames* mtp_names = nullptr);

}  // namespace kiln::model
