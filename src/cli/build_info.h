// What this kiln is and what the machine offers it: the version (`kiln --version`), the
// backends compiled in, the NVIDIA driver as the system shows it, and the choice
// `--backend auto` makes from those. `kiln doctor` prints all of it; `kiln serve` prints the
// backend choice in its start-up line.
#pragma once

#include <string>
#include <vector>

namespace kiln::cli {

// "0.1.0 (git 2106d07)": CMake's project() version and `git describe` of the source tree
// at configure time (no git part outside a git checkout).
std::string version_string();

// The CUDA backend in this build: "" when not built, else the architectures compiled
// ("90 120a", CMake's KILN_CUDA_ARCHS).
bool cuda_built();
std::string cuda_archs_built();
// CUDA devices this machine has (0 without the CUDA backend in this build, or a driver).
int cuda_device_count();

// What the system shows of an NVIDIA driver, without calling CUDA: the CUDA runtime's own
// error when there is none ("CUDA driver version is insufficient for CUDA runtime version")
// does not say what is missing.
struct DriverFacts {
  bool libcuda = false;                  // libcuda.so.1, the driver's user-space library, loads
  std::vector<std::string> dev_nodes;    // /dev/nvidia0, /dev/nvidiactl, ... (sorted)
  std::string proc_version;              // /proc/driver/nvidia/version, first line ("": absent)
};
DriverFacts probe_driver();
// "" when the facts show a usable driver, else one line saying what is missing.
std::string driver_problem(const DriverFacts& facts);

// `--backend auto`: cuda when the build has the CUDA backend and a device is present, else
// cpu; "cpu" and "cuda" are taken as given. `why` says how auto decided ("" when given).
struct BackendChoice {
  std::string backend;  // "cpu" or "cuda"
  std::string why;
};
BackendChoice choose_backend(const std::string& requested, bool has_cuda_build, int cuda_devices);
// choose_backend with this build and this machine (the CUDA device count; when auto falls
// back to the CPU in a CUDA build, `why` carries driver_problem).
BackendChoice choose_backend(const std::string& requested);

}  // namespace kiln::cli
