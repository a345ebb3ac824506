// The model registry: maps config.json "architectures" to a family builder.
// Adding a family = one file in src/models, one line in registry.cpp, one fixture.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "model/blocks.h"
#include "model/loader.h"

namespace kiln::models {

using Builder = Result<model::CausalLM> (*)(const formats::ModelConfig&, model::WeightLoader&);

// Builds the model for config.architecture, or an error listing the supported ones.
Result<model::CausalLM> build_model(const formats::ModelConfig& config, model::WeightLoader& loader);
std::vector<std::string> supported_architectures();
// Ok when a family builds `architecture`, else the error listing the supported ones.
Status check_architecture(const std::string& architecture);

// Family builders (one file each).
Result<model::CausalLM> build_llama(const formats::ModelConfig&, model::WeightLoader&);
Result<model::CausalLM> build_qwen3(const formats::ModelConfig&, model::WeightLoader&);
Result<model::CausalLM> build_qwen3_moe(const formats::ModelConfig&, model::WeightLoader&);
Result<model::CausalLM> build_glm4_moe(const formats::ModelConfig&, model::WeightLoader&);
Result<model::CausalLM> build_deepseek_v3(const formats::ModelConfig&, model::WeightLoader&);
Result<model::CausalLM> build_deepseek_v32(const formats::ModelConfig&, model::WeightLoader&);
Result<model::CausalLM> build_glm_moe_dsa(const formats::ModelConfig&, model::WeightLoader&);
Result<model::CausalLM> build_gpt_oss(const formats::ModelConfig&, model::WeightLoader&);
Result<model::CausalLM> build_qwen3_next(const formats::ModelConfig&, model::WeightLoader&);
Result<model::CausalLM> build_minimax_m2(const formats::ModelConfig&, model::WeightLoader&);

}  // namespace kiln::models
