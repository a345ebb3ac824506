// RoPE frequency tables from config, mirroring transformers' modeling_rope_utils
// (default, linear, llama3, yarn) so logits match the reference.
#pragma once

#include "core/status.h"
#include "formats/hf_config.h"
#include "ops/rope.h"

namespace kiln::model {

// `d_head` is the full head size the rope applies to (MLA: qk_rope_head_dim); the
// rotated size is int(d_head * partial_rotary_factor).
Result<ops::RopeTable> make_rope_table(const formats::RopeConfig& rope, int64_t d_head,
                                       ops::RopeStyle style);

// YaRN's m(s) = 0.1 * mscale * ln(s) + 1 (1 for s <= 1).
double yarn_get_mscale(double scale, double mscale);

}  // namespace kiln::model
