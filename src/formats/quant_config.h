// QuantConfig: which linear layers of a checkpoint are quantized, and how, read
// from config.json "quantization_config" (and hf_quant_config.json for NVIDIA
// ModelOpt exports). Supported methods:
//   "fp8"                 DeepSeek-V3 native block FP8 (weight_block_size, modules_to_not_convert)
//   "compressed-tensors"  float-quantized FP8 (strategy channel | block | tensor) and
//                         pack-quantized INT4 (symmetric, strategy group), with config_groups
//                         targets and the ignore list ("re:" entries are regexes)
//   "modelopt"            NVFP4 (quant_algo NVFP4, group_size 16, exclude_modules globs)
//   "mxfp4"               gpt-oss MXFP4 experts (modules_to_not_convert globs)
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "formats/quant.h"

namespace kiln::formats {

struct QuantConfig {
  std::string method;  // "" when the checkpoint is not quantized
  QuantKind kind = QuantKind::kNone;  // the format quantized linears use
  int32_t block_n = 0, block_k = 0;   // kFp8Block block; kInt4Group: block_k = group size
  int32_t group_size = 0;             // kNvfp4 16, kInt4Group 32, kMxfp4 32
  // Linear names ("model.layers.0.self_attn.q_proj") left unquantized. Each entry is
  // an exact name, "re:REGEX" (compressed-tensors; Python re.match, anchored at the
  // start) or a glob with '*' (ModelOpt, mxfp4, fp8 modules_to_not_convert; it also
  // covers the module's children: "model.layers.*.self_attn" covers its q_proj).
  std::vector<std::string> ignore;
  // compressed-tensors config_groups targets ("Linear", names, "re:" regexes).
  std::vector<std::string> targets;

  bool quantized() const { return kind != QuantKind::kNone; }
  // Is the linear `name` stored quantized (per this config)?
  bool is_quantized(const std::string& name) const;
};

// Reads quantization_config from config.json (and DIR/hf_quant_config.json if present).
// An unknown method or unsupported scheme is an error naming it.
Result<QuantConfig> load_quant_config(const std::string& dir);
Result<QuantConfig> parse_quant_config(const std::string& config_json, const std::string& hf_quant_json,
                                       const std::string& source);

}  // namespace kiln::formats
