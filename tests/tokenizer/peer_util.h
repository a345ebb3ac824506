// Shared by the tokenizer tests that run the npm peers: a shell command's output and
// exit code, the peers' node_modules, a file's bytes.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kiln::testing {

// stdout of `command` (run by the shell); *exit_code is its exit status, -1 if it did not exit.
inline std::string run_command(const std::string& command, int* exit_code) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *exit_code = -1;
    return out;
  }
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int st = ::pclose(pipe);
  *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// node_modules of the npm peers: the last line scripts/npm-peers prints ("" if it failed).
inline const std::string& node_modules() {
  static const std::string dir = [] {
    int code = 0;
    std::istringstream out(run_command(std::string(KILN_SOURCE_DIR) + "/scripts/npm-peers", &code));
    std::string line, last;
    while (std::getline(out, line))
      if (!line.empty()) last = line;
    return code == 0 ? last : std::string();
  }();
  return dir;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kiln::testing
