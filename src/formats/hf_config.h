// ModelConfig: the fields of a Hugging Face config.json that kiln's model
// families need, read from either key generation:
// - legacy (what real hub checkpoints use): rope_theta, rope_scaling {type|rope_type,...},
//   top-level partial_rotary_factor, num_local_experts / num_experts / n_routed_experts;
// - transformers 5: rope_parameters {rope_type, rope_theta, partial_rotary_factor, ...}.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kiln::formats {

struct RopeConfig {
  std::string type = "default";  // default | linear | llama3 | yarn
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;            // linear, llama3, yarn
  int64_t original_max_position_embeddings = 0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // yarn
  std::optional<double> attention_factor;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  bool truncate = true;
};

struct ModelConfig {
  std::string architecture;  // architectures[0], e.g. "GptOssForCausalLM"
  std::string model_type;

  int64_t vocab_size = 0;
  int64_t d_model = 0;        // hidden_size
  int64_t n_layers = 0;       // num_hidden_layers (a --num-layers cut lowers it)
  // Multi-token prediction layers stored after the decoder layers (DeepSeek-V3, GLM-4.5+:
  // num_nextn_predict_layers, as model.layers.{mtp_first_layer + i}); 0: none.
  int64_t n_mtp_layers = 0;
  int64_t mtp_first_layer = 0;  // num_hidden_layers as the checkpoint has it
  int64_t n_heads = 0;        // num_attention_heads
  int64_t n_kv_heads = 0;     // num_key_value_heads (default n_heads)
  int64_t d_head = 0;         // head_dim (default d_model / n_heads)
  int64_t d_ff = 0;           // intermediate_size (dense MLP)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  bool use_qk_norm = false;   // GLM (Qwen3 always has it: the family decides)
  RopeConfig rope;

  // Sliding window: applies to layers whose layer_types entry is "sliding_attention",
  // or to every layer when layer_types is empty and sliding_window is set.
  std::optional<int64_t> sliding_window;
  std::vector<std::string> layer_types;

  // MoE
  int64_t n_experts = 0;          // num_local_experts | num_experts | n_routed_experts
  int64_t n_experts_active = 0;   // num_experts_per_tok
  int64_t d_ff_expert = 0;        // moe_intermediate_size (gpt-oss: intermediate_size)
  int64_t n_shared_experts = 0;
  int64_t first_k_dense_replace = 0;
  int64_t decoder_sparse_step = 1;
  int64_t moe_layer_freq = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;

  // MLA (DeepSeek-V3 / Kimi K2)
  int64_t q_lora_rank = 0;        // 0: no q compression (q_proj)
  int64_t d_latent = 0;           // kv_lora_rank
  int64_t d_nope = 0;             // qk_nope_head_dim
  int64_t d_rope = 0;             // qk_rope_head_dim
  int64_t d_v = 0;                // v_head_dim
  bool rope_interleave = true;

  // Gated DeltaNet layers (layer_types "linear_attention": Qwen3-Next, Qwen3.5)
  int64_t linear_n_k_heads = 0;   // linear_num_key_heads
  int64_t linear_n_v_heads = 0;   // linear_num_value_heads
  int64_t linear_d_k = 0;         // linear_key_head_dim
  int64_t linear_d_v = 0;         // linear_value_head_dim
  int64_t linear_conv_kernel = 0; // linear_conv_kernel_dim
  int64_t d_ff_shared_expert = 0; // shared_expert_intermediate_size (Qwen's one gated shared expert)
  // RMSNorm weights stored as offsets from this: 1 for Qwen3-Next / Qwen3.5, whose norms
  // scale by (1 + w). Set by the family (models/), not read from the file.
  double norm_weight_offset = 0.0;
  // A vision-language checkpoint (Qwen3.5's ...ForConditionalGeneration): the fields above
  // come from its text_config, and its language model's weights are named
  // "model.language_model.*" where a causal LM's are "model.*" (empty otherwise).
  std::string language_model_prefix;
  // DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): the lightning indexer.
  int64_t index_topk = 0;         // 0: dense MLA
  int64_t d_index = 0;            // index_head_dim
  int64_t n_index_heads = 0;      // index_n_heads
  // Per layer "full" (runs its indexer) or "shared" (reuses the previous full layer's
  // top-k: GLM-5). From indexer_types, else index_topk_pattern ("FSS..." or a list),
  // else index_topk_freq / index_skip_topk_offset as transformers 5.17 derives them;
  // empty when index_topk is 0.
  std::vector<std::string> indexer_types;
  // Per layer "dense" or "sparse" MLP (transformers 5 configs), or empty.
  std::vector<std::string> mlp_layer_types;

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  // generation_config.json's eos_token_id (often adds the chat end-of-turn token).
  std::vector<int64_t> generation_eos_token_ids;

  nlohmann::json raw;  // the whole file, for family-specific keys

  // Is layer `i` a sliding-window layer, and with what window (0: full attention)?
  int64_t sliding_window_of_layer(int64_t i) const;
};

// Parses config.json text. `source` names the file in error messages.
Result<ModelConfig> parse_config(const std::string& json_text, const std::string& source);
// Reads DIR/config.json, and DIR/generation_config.json's eos_token_id when present.
Result<ModelConfig> load_config(const std::string& dir);

}  // namespace kiln::formats
