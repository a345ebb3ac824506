// The kiln command line: `kiln serve`, `kiln logits`, `kiln generate`, `kiln demo-model`, ...
// Output contracts (stable; tests and later tools rely on them):
//   logits   -> stdout {"logits": [[...vocab floats...], ... one row per prompt position]}
//   generate -> stdout {"tokens": [...]}; with --prompt TEXT: the generated text and a newline
// Errors go to stderr as "kiln: error: ..." with a non-zero exit code: 2 for a command line
// that does not parse (parse_errors.h), 1 for a command that ran and failed.
#pragma once

namespace kiln::cli {

// What only a test build of kiln sets (tests/server/kiln_test_server.cpp): `kiln` itself
// passes none, so no flag or variable of a normal run can turn them on.
struct ServeHooks {
  bool test_output_header = false;  // server::ServerOptions::test_output_header
};

int run_cli(int argc, char** argv, const ServeHooks& hooks = {});

}  // namespace kiln::cli
