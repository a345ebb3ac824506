#include "cli/parse_errors.h"

#include <algorithm>
#include <iostream>

#include <CLI/CLI.hpp>

namespace kiln::cli {
namespace {

// The command the error is about: the deepest subcommand parsed so far, with its path
// ("kiln bench serve").
const CLI::App* deepest_command(const CLI::App& app, std::string& path) {
  const CLI::App* cmd = &app;
  path = "kiln";
  while (!cmd->get_subcommands().empty()) {
    cmd = cmd->get_subcommands().front();
    path += " " + cmd->get_name();
  }
  return cmd;
}

// The long option names (without "--") a flag may name at `cmd`: its own and its parents'.
std::vector<std::string> long_names(const CLI::App* cmd) {
  std::vector<std::string> names;
  for (const CLI::App* c = cmd; c != nullptr; c = c->get_parent()) {
    for (const CLI::Option* opt : c->get_options())
      for (const std::string& n : opt->get_lnames()) names.push_back(n);
  }
  return names;
}

std::string subcommand_names(const CLI::App* cmd) {
  std::string names;
  for (const CLI::App* sub : cmd->get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

}  // namespace

size_t edit_distance(std::string_view a, std::string_view b) {
  // d[i][j]: distance between a[0, i) and b[0, j).
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, substitute});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string nearest_name(std::string_view typo, const std::vector<std::string>& known) {
  const size_t limit = typo.size() <= 4 ? 1 : 2;
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& k : known) {
    const size_t d = edit_distance(typo, k);
    if (d < best_distance) {
      best = k;
      best_distance = d;
    }
  }
  return best;
}

int report_parse_error(const CLI::App& app, const CLI::ParseError& e, int argc, const char* const* argv) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // help, version
  std::string path;
  const CLI::App* cmd = deepest_command(app, path);
  std::string message = e.what();
  // The flags no option of the command (or its parents) is named for, as typed.
  const std::vector<std::string> known = long_names(cmd);
  std::string unknown;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) continue;
    const std::string name = arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    const std::string near = nearest_name(name, known);
    unknown += (unknown.empty() ? "" : ", ") + ("--" + name) + (near.empty() ? "" : " (did you mean --" + near + "?)");
  }
  const bool extras = dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr;
  const bool no_command = dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && message == "A subcommand is required";
  if ((extras || no_command) && !unknown.empty()) {
    message = "unknown option " + unknown + "; " + path + " --help lists the options";
  } else if (extras) {
    if (const size_t colon = message.find(": "); colon != std::string::npos) message = "unexpected argument" + message.substr(colon);
  } else if (no_command) {
    message = "a command is required (" + subcommand_names(cmd) + "); " + path + " --help describes them";
  }
  // "kiln: error: serve: ...", or "kiln: error: ..." for the program itself.
  std::cerr << "kiln: error: " << (cmd == &app ? "" : path.substr(5) + ": ") << message << "\n";
  return kUsageExitCode;
}

}  // namespace kiln::cli
