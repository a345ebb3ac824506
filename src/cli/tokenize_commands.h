// `kiln tokenize` and `kiln detokenize`: the tokenizer of a model directory (tokenizer.json,
// optionally tokenizer_config.json; no weights needed) on the command line.
// Output contracts (stable; tests rely on them):
//   tokenize --model DIR --text T [--no-special]  -> stdout: one JSON array of ids
//   tokenize --model DIR --file F [--no-special]  -> stdout: F holds one JSON string per line;
//                                                    one JSON id array per line, same order
//   detokenize --model DIR --ids 1,2,3 [--skip-special] -> stdout: one JSON string
// Special tokens are added as the tokenizer.json post-processor says unless --no-special.
// Errors: "kiln: error: ..." on stderr, exit code 1, nothing on stdout.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace kiln::cli {

struct TokenizeOptions {
  std::string model;      // directory holding tokenizer.json
  std::string text;       // --text (used when has_text)
  bool has_text = false;  // --text given (it may be empty)
  std::string file;       // --file: one JSON string per line
  bool no_special = false;
};

struct DetokenizeOptions {
  std::string model;
  std::string ids;  // "1,2,3"
  bool skip_special = false;
};

int run_tokenize(const TokenizeOptions& options, std::ostream& out, std::ostream& err);
int run_detokenize(const DetokenizeOptions& options, std::ostream& out, std::ostream& err);

// Registers both subcommands on `app`; each parsed one runs its entry in `commands`.
void add_tokenize_commands(CLI::App& app,
                           std::vector<std::pair<CLI::App*, std::function<int()>>>& commands);

}  // namespace kiln::cli
