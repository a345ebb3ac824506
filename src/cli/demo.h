// The built-in demo model: a small gpt-oss-shaped checkpoint (sinks, sliding
// window, YaRN, 16 experts top-4, clamped SwiGLU) with seeded random bf16
// weights, written by kiln itself so the README's first command needs no download.
#pragma once

#include <string>

#include "core/status.h"

namespace kiln::cli {

// $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; plus "/demo-gpt-oss".
std::string demo_model_dir();
// Writes config.json, generation_config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json (ChatML chat template, demo_tokenizer.h) and the version stamp
// kiln-demo.json into dir (created if needed). Deterministic.
Status write_demo_model(const std::string& dir);
// Returns demo_model_dir(), writing the model first if it is not there yet or was written
// by a kiln whose demo files differ (a missing file or another kiln-demo.json version).
Result<std::string> ensure_demo_model();

}  // namespace kiln::cli
