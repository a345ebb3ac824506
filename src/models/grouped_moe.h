// The DeepSeek-style routed MoE shared by GLM-4.5+ and DeepSeek-V3 / Kimi K2:
// sigmoid scores + e_score_correction_bias, grouped top-k, routed_scaling_factor,
// n_shared_experts shared SwiGLU experts. Private to src/models.
#pragma once

#include "model/build.h"

namespace kiln::models {

Result<model::Moe> load_grouped_sigmoid_moe(const formats::ModelConfig& c, model::WeightLoader& w,
                                            const std::string& mlp_prefix);

}  // namespace kiln::models
