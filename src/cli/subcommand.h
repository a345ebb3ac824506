// How CLI files contribute subcommands: each add_*_command(s) registers its
// CLI11 options on `app` and appends (subcommand, what to run when it was parsed).
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace kiln::cli {

using Subcommands = std::vector<std::pair<CLI::App*, std::function<int()>>>;

void add_inspect_command(CLI::App& app, Subcommands& commands);  // inspect_command.cpp
void add_doctor_command(CLI::App& app, Subcommands& commands);   // doctor_command.cpp
struct ServeHooks;
void add_serve_command(CLI::App& app, Subcommands& commands, const ServeHooks& hooks);  // serve_command.cpp
// bench_serve.cpp: `bench` with serve and report, and op (add_bench_op_command, bench_op.cpp).
void add_bench_command(CLI::App& app, Subcommands& commands);
void add_bench_op_command(CLI::App& bench, Subcommands& commands);

}  // namespace kiln::cli
