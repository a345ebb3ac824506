// The start-up self-test: each CUDA kernel path runs once on a small random
// problem and is compared with the CPU reference (in its bf16-activation mode).
// kiln refuses to serve with a path that fails; `kiln doctor` prints the table.
#pragma once

#include <string>
#include <vector>

#include "ops/backend.h"

namespace kiln::cuda {

struct PathResult {
  std::string path;       // "attention (warp, d 128, GQA 4, window, sinks)"
  bool passed = false;
  double rel_err = 0.0;   // max |cuda - cpu| / max |cpu|
  double tolerance = 0.0;
  std::string detail;     // why it failed
  bool required = true;   // false: a fast path with a fallback; a failure disables it instead
  bool applicable = true;  // false: the path cannot run on this GPU (detail says why); not run
};

// A batch of sequences, each (n_query newest tokens, context_len), whose block
// tables scatter blocks (sequence s owns blocks s, s + n_seqs, ...). Self-test
// and GPU tests build their batches with it.
ops::BatchMeta scattered_batch(const std::vector<std::pair<int, int>>& seqs, int block_size, int max_blocks);

// Runs every path on `gpu`; results in a fixed order.
std::vector<PathResult> run_self_test(ops::Backend& gpu);

// The first failure of a required path as an error ("self-test failed: <path>: ..."),
// or Ok. Failed optional paths were already disabled by run_self_test, with a log line.
Status self_test_status(const std::vector<PathResult>& results);

}  // namespace kiln::cuda
