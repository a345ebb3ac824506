// The built-in demo model: a small gpt-oss-shaped checkpoint (sinks, sliding
// window, YaRN, 16 experts top-4, clamped SwiGLU) with seeded random bf16
// weights, written by kiln itself so the README's first command needs no download.
#pragma once

#include <string>

#include "core/status.h"

namespace kiln::cli {

// $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; plus "/demo-gpt-oss".
std::string demo_model_dir();
// Writes config.json + model.safetensors into dir (created if needed). Deterministic.
Status write_demo_model(const std::string& dir);
// Returns demo_model_dir(), writing the model first if it is not there yet.
Result<std::string> ensure_demo_model();

}  // namespace kiln::cli
