#include "cli/build_info.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#ifdef KILN_HAVE_CUDA
#include "backends/cuda/device.h"
#endif

// Set on this file alone by CMakeLists.txt, so a new commit recompiles one file.
#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif
#ifndef KILN_GIT_DESCRIBE
#define KILN_GIT_DESCRIBE ""
#endif

namespace kiln::cli {

std::string version_string() {
  const std::string git = KILN_GIT_DESCRIBE;
  return std::string(KILN_VERSION) + (git.empty() ? "" : " (git " + git + ")");
}

bool cuda_built() {
#ifdef KILN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string cuda_archs_built() {
#ifdef KILN_CUDA_ARCHS_BUILT
  return KILN_CUDA_ARCHS_BUILT;
#else
  return "";
#endif
}

DriverFacts probe_driver() {
  DriverFacts f;
  // RTLD_NOLOAD would only see a library already loaded; a real load (then unloaded) is what
  // the CUDA runtime itself does first.
  if (void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    f.libcuda = true;
    ::dlclose(h);
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("nvidia", 0) == 0) f.dev_nodes.push_back(e.path().string());
  }
  std::sort(f.dev_nodes.begin(), f.dev_nodes.end());
  std::ifstream v("/proc/driver/nvidia/version");
  std::getline(v, f.proc_version);
  return f;
}

std::string driver_problem(const DriverFacts& f) {
  // /dev/nvidia0, /dev/nvidia1, ...: one per GPU (nvidiactl, nvidia-uvm are not GPUs).
  const bool gpu_node = std::any_of(f.dev_nodes.begin(), f.dev_nodes.end(), [](const std::string& p) {
    const std::string tail = p.substr(p.rfind('/') + 1);
    return tail.size() > 6 && std::all_of(tail.begin() + 6, tail.end(), [](char c) { return c >= '0' && c <= '9'; });
  });
  const bool module = !f.proc_version.empty() || !f.dev_nodes.empty();
  if (!f.libcuda && !module) {
    return "no NVIDIA driver: libcuda.so.1 is not installed, there is no /proc/driver/nvidia and no /dev/nvidia* "
           "device";
  }
  if (!f.libcuda) {
    return "the NVIDIA kernel driver is present but libcuda.so.1, its user-space library, is not found (install the "
           "driver's libcuda package; in a container, start it with the NVIDIA container toolkit, e.g. --gpus all)";
  }
  if (!module) {
    return "libcuda.so.1 is installed but the NVIDIA kernel module is not loaded (no /proc/driver/nvidia, no "
           "/dev/nvidia* device)";
  }
  if (!gpu_node) {
    return "the NVIDIA driver is loaded but there is no /dev/nvidiaN device node (no GPU given to this machine or "
           "container?)";
  }
  return "";
}

BackendChoice choose_backend(const std::string& requested, bool has_cuda_build, int cuda_devices) {
  if (requested != "auto") return {.backend = requested, .why = ""};
  if (!has_cuda_build) return {.backend = "cpu", .why = "auto: this build has no CUDA backend"};
  if (cuda_devices <= 0) return {.backend = "cpu", .why = "auto: no CUDA device"};
  return {.backend = "cuda",
          .why = "auto: " + std::to_string(cuda_devices) + " CUDA device" + (cuda_devices > 1 ? "s" : "")};
}

int cuda_device_count() {
#ifdef KILN_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

BackendChoice choose_backend(const std::string& requested) {
  if (requested != "auto") return choose_backend(requested, cuda_built(), 0);
#ifdef KILN_HAVE_CUDA
  BackendChoice c = choose_backend(requested, true, cuda::device_count());
  if (c.backend == "cpu") {
    const std::string problem = driver_problem(probe_driver());
    if (!problem.empty()) c.why += " (" + problem + ")";
  }
  return c;
#else
  return choose_backend(requested, false, 0);
#endif
}

}  // namespace kiln::cli
