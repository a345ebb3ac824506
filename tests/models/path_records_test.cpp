// Path records (kiln inspect, the load log): one record per run of layers with the same
// group, format and kernel path, from the backend's own description.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "formats/quant_config.h"
#include "model/inspect.h"
#include "model/loader.h"
#include "models/registry.h"

namespace kiln {
namespace {

std::vector<model::PathRecord> records(const std::string& fixture) {
  const std::string dir = testing::fixture_dir(fixture);
  auto config = formats::load_config(dir);
  auto quant = formats::load_quant_config(dir);
  auto ckpt = formats::Checkpoint::open(dir);
  EXPECT_TRUE(config.ok() && quant.ok() && ckpt.ok());
  auto be = cpu::make_cpu_backend(1);
  model::WeightLoader loader(*ckpt, *be, *quant);
  auto lm = models::build_model(*config, loader);
  EXPECT_TRUE(lm.ok()) << lm.status().to_string();
  return model::path_records(*lm, *be);
}

std::string row(const model::PathRecord& r) { return r.layers + " | " + r.group + " | " + r.format + " | " + r.path; }

TEST(PathRecords, LayerRunsPerGroup) {
  // deepseek_v3: 3 layers, the first dense (first_k_dense_replace 1), MLA attention.
  std::vector<std::string> got;
  for (const auto& r : records("deepseek_v3")) got.push_back(row(r));
  const std::vector<std::string> want = {
      "0-2 | attention (MLA) | bf16 | fp32 loops", "0 | dense MLP | bf16 | fp32 loops",
      "1-2 | router | bf16 | fp32 loops",          "1-2 | routed experts | bf16 | fp32 loops",
      "1-2 | shared experts | bf16 | fp32 loops",  " | lm_head | bf16 | fp32 loops"};
  EXPECT_EQ(got, want);
}

TEST(PathRecords, QuantizedExpertsNameTheirFormat) {
  bool found = false;
  for (const auto& r : records("gpt_oss_mxfp4")) {
    if (r.group != "routed experts") continue;
    found = true;
    EXPECT_EQ(r.format, "mxfp4");
    EXPECT_EQ(r.layers, "0-1");
    EXPECT_NE(r.path.find("dequantized from mxfp4"), std::string::npos) << r.path;
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace kiln
