// Where a model named on the command line lives: a checkpoint directory, or a Hugging
// Face id ("org/name") in the local Hugging Face cache, as huggingface_hub lays it out:
//   $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
//     /models--org--name/refs/main          (the commit hash)
//     /models--org--name/snapshots/<hash>/  (the files)
// No download: kiln never reaches the network.
#pragma once

#include <string>

#include "core/status.h"

namespace kiln::cli {

// The directory of `model`; kNotFound lists every place that was looked at.
Result<std::string> resolve_model_dir(const std::string& model);

// The Hugging Face hub cache directory the environment points at.
std::string hf_hub_cache_dir();

}  // namespace kiln::cli
