// The kiln command line: `kiln logits`, `kiln generate`, `kiln demo-model`.
// Output contracts (stable; tests and later tools rely on them):
//   logits   -> stdout {"logits": [[...vocab floats...], ... one row per prompt position]}
//   generate -> stdout {"tokens": [...]}
// Errors go to stderr as "kiln: error: ..." with a non-zero exit code.
#pragma once

namespace kiln::cli {

int run_cli(int argc, char** argv);

}  // namespace kiln::cli
