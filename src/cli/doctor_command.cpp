// `kiln doctor`: first what any machine can tell (the version, whether this build has the
// CUDA backend and for which architectures, the CPU backend's threads, the NVIDIA driver as
// the system shows it, what --backend auto picks); then, on a GPU, the GPU, its limits,
// driver / CUDA / cuBLAS versions, whether this build has a kernel image for it, and every
// kernel path with its self-test result against the CPU reference.
// Exit code 1 when the CUDA backend this build has cannot run here or a required path
// fails; a build without CUDA has nothing more to check (0).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>

#include "cli/build_info.h"
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

int run_cuda_doctor(int device, int smem_cap) {
  auto info = cuda::query_device(device);
  if (!info.ok()) {
    std::printf("kiln doctor: %s\n", info.status().to_string().c_str());
    return 1;
  }
  std::printf("\n");
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

// What holds on every machine, whatever the build.
void print_build_and_host(int threads) {
  std::printf("kiln               %s\n", version_string().c_str());
  if (cuda_built()) {
    std::printf("CUDA backend       built for %s\n", cuda_archs_built().c_str());
  } else {
    std::printf("CUDA backend       not in this build (KILN_CUDA=OFF: nvcc was not found at configure time, or it "
                "was turned off)\n");
  }
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  if (threads > 0) {
    std::printf("CPU backend        %d thread%s (--threads %d; %u hardware threads)\n", threads, threads > 1 ? "s" : "",
                threads, hw);
  } else {
    std::printf("CPU backend        %u threads (--threads 0: all hardware threads)\n", hw);
  }
  const DriverFacts facts = probe_driver();
  const std::string problem = driver_problem(facts);
  if (!problem.empty()) {
    std::printf("NVIDIA driver      %s\n", problem.c_str());
  } else {
    std::string nodes;
    for (const std::string& n : facts.dev_nodes) nodes += (nodes.empty() ? "" : " ") + n;
    std::printf("NVIDIA driver      %s; %s\n", facts.proc_version.empty() ? "libcuda.so.1 loads" : facts.proc_version.c_str(),
                nodes.c_str());
  }
  const BackendChoice choice = choose_backend("auto");
  std::printf("--backend auto     %s (%s)\n", choice.backend.c_str(), choice.why.c_str());
  if (!cuda_built() && problem.empty()) {
    std::printf("note               this machine has an NVIDIA driver: a build with the CUDA backend (nvcc found, or "
                "cmake -DKILN_CUDA=ON) would serve on its GPU\n");
  }
}

}  // namespace

void add_doctor_command(CLI::App& app, Subcommands& commands) {
  auto device = std::make_shared<int>(0);
  auto smem_cap = std::make_shared<int>(0);
  auto threads = std::make_shared<int>(0);
  CLI::App* cmd = app.add_subcommand(
      "doctor", "what this build can run here: the backends, the NVIDIA driver, the GPU and every kernel path");
  cmd->add_option("--device", *device, "CUDA device index");
  cmd->add_option("--smem-cap", *smem_cap, "shared memory per block the kernels must fit (0: device limit)");
  cmd->add_option("--threads", *threads, "CPU threads (0: all)");
  commands.emplace_back(cmd, [=] {
    print_build_and_host(*threads);
#ifdef KILN_HAVE_CUDA
    return run_cuda_doctor(*device, *smem_cap);
#else
    return 0;
#endif
  });
}

}  // namespace kiln::cli
