// `kiln bench op`'s entry point on the GPU, on a few cheap cases (--only rms_norm
// --iters 2): the ceilings it measures first are positive and of a plausible order for a
// GPU, and every row it reports is consistent with its own work and time.
// It checks the harness, not the GPU's speed: benchmarks measure that (docs/PERF.md).
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "backends/cuda/device.h"
#include "backends/cuda/kernels/kernels.h"
#include "cli/bench_op.h"
#include "gpu/gpu_test_util.h"

namespace kiln {
namespace {

TEST(CudaBenchOp, MeasuresTheCeilingsThenTimesTheCasesOnlyKeeps) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const cli::BenchOpOptions options{.smem_cap = gpu_testing::smem_cap(), .iters = 2, .only = "rms_norm"};
  auto report = cli::run_bench_op(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();

  // Bounds a units slip (x1000) would leave: the H100 measures about 3,000 GB/s and
  // 642 TFLOP/s (docs/PERF.md).
  const cli::OpCeilings& c = report->ceilings;
  EXPECT_GT(c.copy_gbs, 100.0);
  EXPECT_LT(c.copy_gbs, 20000.0);
  EXPECT_GT(c.mma_bf16_tflops, 10.0);
  EXPECT_LT(c.mma_bf16_tflops, 5000.0);
  if (cuda::mma_peak_supported(cuda::MmaKind::kE4m3)) {
    EXPECT_GT(c.mma_e4m3_tflops, 10.0);
    EXPECT_LT(c.mma_e4m3_tflops, 10000.0);
  } else {
    EXPECT_EQ(c.mma_e4m3_tflops, 0.0);
  }
  EXPECT_GT(c.wgmma_bf16_tflops, 0.0);
  EXPECT_GT(report->floor_us, 0.0);
  EXPECT_FALSE(report->device.empty());

  ASSERT_FALSE(report->rows.empty());
  for (const cli::OpRow& r : report->rows) {
    SCOPED_TRACE(r.label());
    EXPECT_EQ(r.op, "rms_norm");
    EXPECT_NE(r.label().find(options.only), std::string::npos);
    EXPECT_GT(r.time_us, 0.0);
    EXPECT_GE(r.iters, 1);
    EXPECT_LE(r.iters, options.iters);
    // rms_norm is counted in bytes against the copy bandwidth, never in FLOPs.
    EXPECT_GT(r.bytes, 0.0);
    EXPECT_EQ(r.flops, 0.0);
    EXPECT_NEAR(r.achieved, r.bytes / (r.time_us * 1e3), 1e-9 * r.achieved);
    EXPECT_NEAR(r.fraction, r.achieved / c.copy_gbs, 1e-9 * r.fraction);
    EXPECT_GT(r.fraction, 0.0);
    EXPECT_EQ(r.fraction_wgmma, 0.0);
  }

  // --json writes what was measured.
  const nlohmann::ordered_json j = cli::op_bench_json(*report);
  EXPECT_EQ(j["ceilings"]["copy_gbs"].get<double>(), c.copy_gbs);
  EXPECT_EQ(j["ceilings"]["mma_bf16_tflops"].get<double>(), c.mma_bf16_tflops);
  ASSERT_EQ(j["rows"].size(), report->rows.size());
  EXPECT_EQ(j["rows"][0]["time_us"].get<double>(), report->rows[0].time_us);
}

}  // namespace
}  // namespace kiln
