// The CPU backend: the reference implementation of every op in ops/backend.h.
// Plain loops that read like the math, fp32 activations and accumulation,
// weights read in their stored dtype, threaded over independent rows with a
// fixed reduction order (results do not depend on the thread count).
#pragma once

#include <memory>

#include "ops/backend.h"

namespace kiln::cpu {

struct CpuOptions {
  int n_threads = 0;  // <= 0: all hardware threads
  // Store every activation an op writes rounded to bf16 (values stay fp32 in
  // memory; each op still computes in fp32). This is the reference for a backend
  // whose activations are bf16: it rounds at the same op boundaries, so the
  // comparison measures the kernels, not the storage precision (otherwise a
  // near-tie in MoE routing flips on bf16 noise alone). Quantized weights are read
  // as such a backend's tiles hold them (weight_row in cpu_internal.h: INT4 and FP8
  // values rounded to bf16).
  bool bf16_activations = false;
  // FP8 weights with one scale per 128 inputs (formats::fp8_w8a8_eligible) multiply
  // activations quantized to e4m3 per row and 128 inputs, as the CUDA backend's W8A8
  // GEMMs do for prefill-shaped calls: the reference those are tested against.
  bool fp8_activations = false;
};

// n_threads <= 0: all hardware threads.
std::unique_ptr<ops::Backend> make_cpu_backend(int n_threads = 0);
std::unique_ptr<ops::Backend> make_cpu_backend(const CpuOptions& options);

}  // namespace kiln::cpu
