// The CPU backend: the reference implementation of every op in ops/backend.h.
// Plain loops that read like the math, fp32 activations and accumulation,
// weights read in their stored dtype, threaded over independent rows with a
// fixed reduction order (results do not depend on the thread count).
#pragma once

#include <memory>

#include "ops/backend.h"

namespace kiln::cpu {

// n_threads <= 0: all hardware threads.
std::unique_ptr<ops::Backend> make_cpu_backend(int n_threads = 0);

}  // namespace kiln::cpu
