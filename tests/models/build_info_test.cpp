// --backend auto's choice and the NVIDIA driver diagnosis (cli/build_info.h), as pure
// functions of what the build and the machine show.
#include "cli/build_info.h"

#include <cctype>

#include <gtest/gtest.h>

namespace kiln::cli {
namespace {

TEST(BackendChoice, AutoPicksCudaOnlyWithACudaBuildAndADevice) {
  EXPECT_EQ(choose_backend("auto", /*has_cuda_build=*/true, /*cuda_devices=*/1).backend, "cuda");
  EXPECT_EQ(choose_backend("auto", true, 4).backend, "cuda");
  EXPECT_EQ(choose_backend("auto", true, 0).backend, "cpu");
  EXPECT_EQ(choose_backend("auto", false, 0).backend, "cpu");
  EXPECT_EQ(choose_backend("auto", false, 2).backend, "cpu");  // GPUs, but no kernels to run on them
}

TEST(BackendChoice, AutoSaysWhy) {
  EXPECT_EQ(choose_backend("auto", false, 2).why, "auto: this build has no CUDA backend");
  EXPECT_EQ(choose_backend("auto", true, 0).why, "auto: no CUDA device");
  EXPECT_EQ(choose_backend("auto", true, 1).why, "auto: 1 CUDA device");
  EXPECT_EQ(choose_backend("auto", true, 2).why, "auto: 2 CUDA devices");
}

TEST(BackendChoice, AnExplicitBackendIsTakenAsGiven) {
  // cuda without a CUDA build stays cuda: make_backend then fails saying the build lacks it.
  for (const bool build : {false, true}) {
    for (const int devices : {0, 1}) {
      for (const std::string b : {"cpu", "cuda"}) {
        const BackendChoice c = choose_backend(b, build, devices);
        EXPECT_EQ(c.backend, b);
        EXPECT_EQ(c.why, "");
      }
    }
  }
}

TEST(BackendChoice, ThisBuildsAutoMatchesWhetherItHasCuda) {
  const BackendChoice c = choose_backend("auto");
  if (!cuda_built()) {
    EXPECT_EQ(c.backend, "cpu");
    EXPECT_EQ(c.why, "auto: this build has no CUDA backend");
    EXPECT_EQ(cuda_archs_built(), "");
  } else {
    EXPECT_NE(cuda_archs_built(), "");
  }
}

TEST(DriverProblem, NamesWhatIsMissing) {
  const std::string proc = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15";
  struct Case {
    DriverFacts facts;
    std::string expect;  // a substring of the problem; "" when there is none
  } cases[] = {
      {{.libcuda = false, .dev_nodes = {}, .proc_version = ""}, "no NVIDIA driver: libcuda.so.1 is not installed"},
      {{.libcuda = false, .dev_nodes = {"/dev/nvidia0", "/dev/nvidiactl"}, .proc_version = proc},
       "libcuda.so.1, its user-space library, is not found"},
      {{.libcuda = true, .dev_nodes = {}, .proc_version = ""}, "the NVIDIA kernel module is not loaded"},
      {{.libcuda = true, .dev_nodes = {"/dev/nvidia-uvm", "/dev/nvidiactl"}, .proc_version = proc},
       "no /dev/nvidiaN device node"},
      {{.libcuda = true, .dev_nodes = {"/dev/nvidia0", "/dev/nvidiactl"}, .proc_version = proc}, ""},
      {{.libcuda = true, .dev_nodes = {"/dev/nvidia12"}, .proc_version = ""}, ""},
  };
  for (const Case& c : cases) {
    const std::string problem = driver_problem(c.facts);
    if (c.expect.empty()) {
      EXPECT_EQ(problem, "") << "libcuda " << c.facts.libcuda << ", " << c.facts.dev_nodes.size() << " nodes";
    } else {
      EXPECT_NE(problem.find(c.expect), std::string::npos) << problem;
    }
  }
}

TEST(Version, NamesTheProjectVersion) {
  const std::string v = version_string();
  ASSERT_FALSE(v.empty());
  EXPECT_NE(v.rfind("unknown", 0), 0u) << v;  // CMake's project() version reached the build
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(v[0]))) << v;
}

}  // namespace
}  // namespace kiln::cli
