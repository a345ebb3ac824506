// `kiln bench op` where no GPU runs it: bad options are refused before anything runs, a
// kiln without the CUDA backend says so with a non-zero exit, and the --json layout of
// a report. The bench itself runs in tests/gpu/cuda_bench_op_test.cpp.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/bench_op.h"
#include "run_kiln.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

using testing::KilnRun;
using testing::run_kiln;

TEST(BenchOpCli, BadOptionsAreRefusedWithAMessageNamingThem) {
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"bench op --iters 0", "--iters"},
      {"bench op --iters -3", "--iters"},
      {"bench op --iters many", "--iters"},
      {"bench op --smem-cap -1", "--smem-cap"},
      {"bench op --frobnicate", "--frobnicate"},
      {"bench op --only", "--only"},  // a value is required
  };
  for (const Case& c : cases) {
    const KilnRun r = run_kiln(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << "\nstdout: " << r.out;  // no table was started
  }
}

TEST(BenchOpCli, HelpListsItsOptions) {
  const KilnRun r = run_kiln("bench op --help");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* option : {"--smem-cap", "--iters", "--only", "--json"})
    EXPECT_NE(r.out.find(option), std::string::npos) << option << "\n" << r.out;
}

TEST(BenchOpCli, WithoutTheCudaBackendFailsSayingSo) {
  if (KILN_BINARY_HAS_CUDA) GTEST_SKIP() << "this kiln has the CUDA backend: tests/gpu runs kiln bench op";
  const fs::path json = fs::temp_directory_path() / ("kiln_bench_op_" + std::to_string(::getpid()) + ".json");
  const KilnRun r = run_kiln("bench op --iters 2 --only rms_norm --json " + json.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("kiln: error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("built without"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("CUDA backend"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_FALSE(fs::exists(json));  // nothing was measured, so nothing is written

  // The entry point says the same to a caller.
  const auto report = cli::run_bench_op({.iters = 2, .only = "rms_norm"});
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kUnsupported);
}

TEST(BenchOpJson, HoldsTheCeilingsAndEveryRowWithItsWorkAndFraction) {
  cli::OpBenchReport report{.device = "NVIDIA H100 80GB HBM3", .sm_count = 132,
                            .options = {.smem_cap = 101376, .iters = 20, .only = "linear"},
                            .ceilings = {.copy_gbs = 3000.0, .mma_bf16_tflops = 640.0, .mma_e4m3_tflops = 0.0,
                                         .wgmma_bf16_tflops = 989.0},
                            .floor_us = 11.2};
  report.rows.push_back({.op = "linear", .shape = "o 4096->2048", .rows = 1, .time_us = 28.6, .iters = 20,
                         .bytes = 16.8e6, .achieved = 587.4, .fraction = 0.1958});
  report.rows.push_back({.op = "linear", .shape = "o 4096->2048", .rows = 2048, .time_us = 63.9, .iters = 20,
                         .flops = 34.4e9, .achieved = 538.3, .fraction = 0.841, .fraction_wgmma = 0.544,
                         .note = "fp32 GEMM output"});
  const nlohmann::ordered_json j = cli::op_bench_json(report);

  EXPECT_EQ(j["device"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(j["options"]["iters"], 20);
  EXPECT_EQ(j["options"]["only"], "linear");
  EXPECT_EQ(j["ceilings"]["copy_gbs"], 3000.0);
  EXPECT_EQ(j["ceilings"]["mma_bf16_tflops"], 640.0);
  EXPECT_TRUE(j["ceilings"]["mma_e4m3_tflops"].is_null());  // no such instruction: not a 0 TFLOP/s ceiling
  EXPECT_EQ(j["ceilings"]["wgmma_bf16_tflops"], 989.0);
  EXPECT_EQ(j["timing_floor_us"], 11.2);
  ASSERT_EQ(j["rows"].size(), 2u);

  const auto& decode = j["rows"][0];
  EXPECT_EQ(decode["label"], "linear o 4096->2048 rows 1");
  EXPECT_EQ(decode["time_us"], 28.6);
  EXPECT_EQ(decode["bytes"], 16.8e6);
  EXPECT_FALSE(decode.contains("flops"));
  EXPECT_EQ(decode["achieved_gbs"], 587.4);
  EXPECT_EQ(decode["ceiling"], "copy_gbs");
  EXPECT_EQ(decode["fraction"], 0.1958);
  EXPECT_FALSE(decode.contains("fraction_wgmma"));
  EXPECT_EQ(decode["note"], "");

  const auto& prefill = j["rows"][1];
  EXPECT_EQ(prefill["flops"], 34.4e9);
  EXPECT_FALSE(prefill.contains("bytes"));
  EXPECT_EQ(prefill["achieved_tflops"], 538.3);
  EXPECT_EQ(prefill["ceiling"], "mma_bf16_tflops");
  EXPECT_EQ(prefill["fraction"], 0.841);
  EXPECT_EQ(prefill["fraction_wgmma"], 0.544);
  EXPECT_EQ(prefill["note"], "fp32 GEMM output");
}

}  // namespace
}  // namespace kiln
