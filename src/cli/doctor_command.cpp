// `kiln doctor`: the GPU, its limits, driver / CUDA / cuBLAS versions, whether
// this build has a kernel image for it, and every kernel path with its
// self-test result against the CPU reference.
#include <cstdio>
#include <memory>

#include "cli/subcommand.h"
#ifdef KILN_HAVE_CUDA
#include <cublasLt.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/selftest.h"
#endif

namespace kiln::cli {
namespace {

#ifdef KILN_HAVE_CUDA
std::string version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

int run_doctor(int device, int smem_cap) {
  auto info = cuda::query_device(device);
  if (!info.ok()) {
    std::printf("kiln doctor: %s\n", info.status().to_string().c_str());
    return 1;
  }
  const cuda::DeviceInfo& d = *info;
  std::printf("GPU                %s (device %d)\n", d.name.c_str(), d.index);
  std::printf("compute capability %d.%d (sm_%d), %d SMs\n", d.cc_major, d.cc_minor, d.cc(), d.sm_count);
  std::printf("shared memory      %d bytes per block (opt-in), %d per SM; --smem-cap %d\n", d.smem_per_block_optin,
              d.smem_per_sm, smem_cap > 0 ? smem_cap : d.smem_per_block_optin);
  std::printf("memory             %.1f GiB total, %.1f GiB free\n", double(d.total_memory) / (1 << 30),
              double(d.free_memory) / (1 << 30));
  std::printf("driver / runtime   CUDA %s / %s, cuBLASLt %zu\n", version(d.driver_version).c_str(),
              version(d.runtime_version).c_str(), cublasLtGetVersion());
  const cudaError_t image = cuda::probe_kernel_image();
  std::printf("kernels built for  %s: %s\n", KILN_CUDA_ARCHS_BUILT,
              image == cudaSuccess ? "an image runs on this GPU"
                                   : (std::string("NO image for this GPU (") + cudaGetErrorString(image) + ")").c_str());
  if (image != cudaSuccess) return 1;
  auto backend = cuda::make_cuda_backend({.device = device, .smem_cap = smem_cap});
  if (!backend.ok()) {
    std::printf("kiln doctor: %s\n", backend.status().to_string().c_str());
    return 1;
  }
  const auto results = cuda::run_self_test(**backend);
  std::printf("\n%-52s %-8s %-10s %s\n", "kernel path", "chosen", "self-test", "max rel err (tolerance)");
  int failed = 0;
  for (const cuda::PathResult& r : results) {
    failed += !r.passed && r.required;
    const char* result = !r.applicable ? "n/a" : r.passed ? "passed" : (r.required ? "FAILED" : "disabled");
    std::printf("%-52s %-8s %-10s %.2e (%.2e)%s%s\n", r.path.c_str(), r.passed ? "yes" : "no", result, r.rel_err,
                r.tolerance, r.detail.empty() ? "" : "  ", r.detail.c_str());
  }
  std::printf("\n%zu paths, %d required paths failed (a failed fast path is disabled, its fallback serves)\n",
              results.size(), failed);
  return failed ? 1 : 0;
}
#endif

}  // namespace

void add_doctor_command(CLI::App& app, Subcommands& commands) {
  auto device = std::make_shared<int>(0);
  auto smem_cap = std::make_shared<int>(0);
  CLI::App* cmd = app.add_subcommand("doctor", "check the GPU, the build's kernels and every kernel path");
  cmd->add_option("--device", *device, "CUDA device index");
  cmd->add_option("--smem-cap", *smem_cap, "shared memory per block the kernels must fit (0: device limit)");
  commands.emplace_back(cmd, [=] {
#ifdef KILN_HAVE_CUDA
    return run_doctor(*device, *smem_cap);
#else
    std::printf("kiln doctor: this build has no CUDA backend (nvcc was not found at build time)\n");
    return 1;
#endif
  });
}

}  // namespace kiln::cli
