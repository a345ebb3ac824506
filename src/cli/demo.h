// The built-in demo model: a 7.5 M-parameter gpt-oss-architecture model (sinks, sliding
// window, YaRN, 8 experts top-2) trained on English text Debian ships (scripts/demo/,
// docs/DEMO.md), committed in the Hugging Face layout under models/kiln-demo, so the
// README's first command needs no download and no GPU.
#pragma once

#include <string>

#include "core/status.h"

namespace kiln::cli {

// $KILN_DEMO_MODEL, else the source tree's models/kiln-demo (fixed at build time).
std::string demo_model_dir();
// demo_model_dir() once its files are there (kNotFound saying where to find them if not).
Result<std::string> ensure_demo_model();
// Copies the demo's checkpoint files into dir (created if needed).
Status copy_demo_model(const std::string& dir);

}  // namespace kiln::cli
