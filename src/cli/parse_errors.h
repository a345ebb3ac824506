// Command-line parse errors in kiln's form: "kiln: error: ..." on stderr and exit code 2
// (argparse's and clang's code for a usage error; 1 stays for a command that ran and
// failed), with "did you mean --port?" for a mistyped flag or command.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
class ParseError;
}  // namespace CLI

namespace kiln::cli {

inline constexpr int kUsageExitCode = 2;

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of
// two adjacent characters each count 1 ("prot" -> "port" is 1).
size_t edit_distance(std::string_view a, std::string_view b);

// The name in `known` nearest to `typo` when it is a near miss (one edit for names of up to
// four characters, two beyond; ties go to the first), else "".
std::string nearest_name(std::string_view typo, const std::vector<std::string>& known);

// Prints a CLI11 parse error as "kiln: error: <command>: ..." to stderr and returns
// kUsageExitCode; --help / --help-all / --version print what CLI11 prints and return 0.
// argv: the arguments that were parsed (the mistyped flags are found among them).
int report_parse_error(const CLI::App& app, const CLI::ParseError& e, int argc, const char* const* argv);

}  // namespace kiln::cli
