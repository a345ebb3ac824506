// kiln with its test hooks on: the end-to-end server tests run this binary instead of
// `kiln`. The only difference is ServeHooks::test_output_header (a request's
// "X-Kiln-Test-Output" header is the text its samples emit), which drives the tool-call
// and reasoning paths on a random-weight model. `kiln` itself cannot turn it on.
#include "cli/commands.h"

int main(int argc, char** argv) { return kiln::cli::run_cli(argc, argv, {.test_output_header = true}); }
