#include "models/registry.h"

#include <utility>

namespace kiln::models {
namespace {

constexpr std::pair<const char*, Builder> kRegistry[] = {
    {"LlamaForCausalLM", build_llama},
    {"Qwen3ForCausalLM", build_qwen3},
    {"Qwen3MoeForCausalLM", build_qwen3_moe},
    {"Glm4MoeForCausalLM", build_glm4_moe},
    {"DeepseekV3ForCausalLM", build_deepseek_v3},  // also Kimi K2 / K2.5 text models
    {"DeepseekV32ForCausalLM", build_deepseek_v32},  // DeepSeek sparse attention
    {"GlmMoeDsaForCausalLM", build_glm_moe_dsa},     // GLM-5; likewise
    {"GptOssForCausalLM", build_gpt_oss},
    {"Qwen3NextForCausalLM", build_qwen3_next},
    {"Qwen3_5MoeForCausalLM", build_qwen3_next},
    {"Qwen3_5MoeForConditionalGeneration", build_qwen3_next},  // its language model
    {"MiniMaxM2ForCausalLM", build_minimax_m2},
};

}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const auto& [name, fn] : kRegistry) out.emplace_back(name);
  return out;
}

Status check_architecture(const std::string& architecture) {
  for (const auto& [name, fn] : kRegistry)
    if (architecture == name) return Status::Ok();
  std::string list;
  for (const auto& [name, fn] : kRegistry) list += (list.empty() ? "" : ", ") + std::string(name);
  return unsupported("architecture \"" + architecture + "\" is not supported; supported: " + list);
}

Result<model::CausalLM> build_model(const formats::ModelConfig& config, model::WeightLoader& loader) {
  for (const auto& [name, fn] : kRegistry) {
    if (config.architecture == name) return fn(config, loader);
  }
  return check_architecture(config.architecture);
}

}  // namespace kiln::models
