#include "cli/commands.h"

int main(int argc, char** argv) { return kiln::cli::run_cli(argc, argv); }
