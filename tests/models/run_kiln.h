// Test helper: runs the built kiln binary (KILN_BINARY) and captures its exit code, stdout
// and stderr separately.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace kiln::testing {

struct KilnRun {
  int exit_code = -1;
  std::string out, err;
};

// Runs `env kiln args` in a shell; env is "" or "VAR=value ".
inline KilnRun run_kiln_env(const std::string& env, const std::string& args) {
  static std::atomic<int> calls{0};
  const std::string err_path = std::filesystem::temp_directory_path() /
                               ("kiln_test_err_" + std::to_string(::getpid()) + "_" + std::to_string(calls++));
  const std::string cmd = env + std::string(KILN_BINARY) + " " + args + " 2>" + err_path;
  KilnRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(err_path);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  std::filesystem::remove(err_path);
  return r;
}

inline KilnRun run_kiln(const std::string& args) { return run_kiln_env("", args); }

}  // namespace kiln::testing
