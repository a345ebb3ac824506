// Tensor parallelism over a d_ff that does not divide into whole scale blocks per rank:
// the loader splits it into whole blocks unevenly (model::Shard::split_units), with the
// matching gate / up / down partition, instead of refusing it. Checkpoints here are the
// quantized fixtures with their expert (and shared-expert) d_ff cut to a width of an odd
// number of blocks, in each format's on-disk layout; every layout must give one rank's
// logits (within the fp32 bound of parallel_test) and greedy tokens.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "temp_dir.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr double kLogitTolerance = 1e-4;

TEST(SplitUnits, WholeBlocksFirstRanksOneMore) {
  const auto parts = [](int64_t n, int64_t unit, int tp) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int r = 0; r < tp; ++r) out.push_back(model::Shard{.tp_rank = r, .tp_size = tp}.split_units(n, unit));
    return out;
  };
  using P = std::vector<std::pair<int64_t, int64_t>>;
  // gpt-oss-120b: d_ff 2880 = 90 MXFP4 blocks; TP4 as 23 / 23 / 22 / 22 blocks.
  EXPECT_EQ(parts(2880, 32, 4), (P{{0, 736}, {736, 736}, {1472, 704}, {2176, 704}}));
  // ... and TP8: 90 = 8 x 11 + 2.
  const P tp8 = parts(2880, 32, 8);
  EXPECT_EQ(tp8[0], (std::pair<int64_t, int64_t>{0, 384}));
  EXPECT_EQ(tp8[2], (std::pair<int64_t, int64_t>{768, 352}));
  EXPECT_EQ(tp8[7].first + tp8[7].second, 2880);
  EXPECT_EQ(parts(96, 32, 2), (P{{0, 64}, {64, 32}}));
  // Divisible: the even split, whatever the unit.
  EXPECT_EQ(parts(768, 16, 4), (P{{0, 192}, {192, 192}, {384, 192}, {576, 192}}));
  EXPECT_EQ(parts(768, 1, 4), parts(768, 16, 4));
  // A partial last block stays with its rank; a rank may get nothing.
  EXPECT_EQ(parts(100, 32, 2), (P{{0, 64}, {64, 36}}));
  EXPECT_EQ(parts(64, 32, 4)[3], (std::pair<int64_t, int64_t>{64, 0}));
}


bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Copies fixture `name` to `dir` with the routed and shared experts' d_ff cut from
// `from` to `to` (the first `to` columns: whole blocks of every format). A tensor's
// d_ff axis: rows of gate / up (axis 1 of gpt-oss's stacked gate_up_proj), inputs of
// down (gpt-oss's down_proj_blocks: its block axis); its length there scales by to / from
// (packed bytes, scale blocks and int32 words alike). weight_shape tensors are rewritten.
void write_cut_fixture(const std::string& name, int64_t from, int64_t to, const std::string& config_key,
                       const std::string& dir) {
  auto ckpt = formats::Checkpoint::open(testing::fixture_dir(name));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  std::vector<std::pair<std::string, Tensor>> out;
  for (const std::string& t : ckpt->names()) {
    auto v = ckpt->get(t);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    Tensor x = *v;
    const bool expert = t.find(".mlp.experts") != std::string::npos || t.find(".mlp.shared_experts") != std::string::npos;
    const bool rows = t.find("gate_proj") != std::string::npos || t.find("up_proj") != std::string::npos;
    const bool down = t.find("down_proj") != std::string::npos;
    if (expert && (rows || down) && x.rank() >= 1) {
      if (ends_with(t, "weight_shape")) {
        Tensor s = host_tensor(DType::kI32, {2});
        std::memcpy(s.data, x.data, 8);
        s.as<int32_t>()[rows ? 0 : 1] = int32_t(to);
        out.emplace_back(t, s);
        continue;
      }
      // gpt-oss stacks its experts: mlp.experts.gate_up_proj_* [E, 2 d_ff, ...].
      const bool stacked = t.find(".mlp.experts.gate_up_proj") != std::string::npos ||
                           t.find(".mlp.experts.down_proj") != std::string::npos;
      int axis = -1;
      if (rows) {
        axis = stacked ? 1 : 0;
      } else if (!ends_with(t, "_bias") && !ends_with(t, "input_scale") && !ends_with(t, "weight_scale_2")) {
        axis = ends_with(t, "_blocks") ? x.rank() - 2 : x.rank() - 1;
      }
      if (axis >= 0) {
        ASSERT_EQ(x.shape.dims[axis] * to % from, 0) << t;
        model::Part part;
        for (int d = 0; d <= axis; ++d) part.dims.push_back({0, d == axis ? x.shape.dims[axis] * to / from : -1});
        auto cut = model::slice_part(x, part);
        ASSERT_TRUE(cut.ok()) << t << ": " << cut.status().to_string();
        Tensor copy = host_tensor(cut->dtype, cut->shape);
        std::memcpy(copy.data, cut->data, cut->nbytes());
        x = copy;
      }
    }
    out.emplace_back(t, x);
  }
  ASSERT_TRUE(formats::write_safetensors(dir + "/model.safetensors", out).ok());
  nlohmann::json config = testing::read_json(testing::fixture_dir(name) + "/config.json");
  ASSERT_EQ(config[config_key].get<int64_t>(), from);
  config[config_key] = to;
  std::ofstream(dir + "/config.json") << config.dump(2);
}

Result<std::unique_ptr<runtime::Engine>> load(const std::string& dir, const runtime::ParallelConfig& p) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < p.world(); ++r) backends.push_back(cpu::make_cpu_backend(1));
  return runtime::Engine::load(dir, std::move(backends), {.block_size = 4, .max_model_len = 256, .parallel = p});
}

struct Case {
  const char* fixture;
  const char* key;  // config.json's expert d_ff
  int64_t from, to;
  int tp;
};

// gpt-oss MXFP4 d_ff 96 (3 blocks of 32: 64 / 32 at TP2) and 224 (7 blocks: 2/2/2/1 at
// TP4); GLM NVFP4 112 (7 blocks of 16); DeepSeek / Kimi INT4 96 (3 groups of 32).
const Case kCases[] = {
    {"gpt_oss_mxfp4", "intermediate_size", 256, 96, 2},
    {"gpt_oss_mxfp4", "intermediate_size", 256, 224, 4},
    {"glm4_moe_nvfp4", "moe_intermediate_size", 128, 112, 2},
    {"glm4_moe_nvfp4", "moe_intermediate_size", 128, 112, 4},
    {"deepseek_v3_int4", "moe_intermediate_size", 128, 96, 2},
};

class UnevenSplit : public ::testing::TestWithParam<int> {};

TEST_P(UnevenSplit, SameLogitsAndTokensAsOneRank) {
  const Case& c = kCases[GetParam()];
  testing::TempDir dir("kiln_uneven");
  write_cut_fixture(c.fixture, c.from, c.to, c.key, dir.path());
  if (HasFatalFailure()) return;
  auto one = load(dir.path(), {});
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  auto many = load(dir.path(), {.tensor_parallel = c.tp});
  ASSERT_TRUE(many.ok()) << many.status().to_string();
  const nlohmann::json g = testing::read_json(testing::fixture_dir(c.fixture) + "/golden.json");
  const auto prompt = g["prompt_long"].get<std::vector<int32_t>>();
  auto want = (*one)->logits(prompt);
  auto have = (*many)->logits(prompt);
  ASSERT_TRUE(want.ok() && have.ok());
  const double err = testing::relative_error(*have, *want);
  EXPECT_LT(err, kLogitTolerance) << c.fixture << " d_ff " << c.to << " at TP" << c.tp;
  const std::vector<std::vector<int32_t>> prompts = {prompt, g["prompt_short"].get<std::vector<int32_t>>()};
  auto a = (*one)->generate_batch(prompts, 6, {.temperature = 0.0f}, /*ignore_eos=*/true);
  auto b = (*many)->generate_batch(prompts, 6, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ((*b)[i].tokens, (*a)[i].tokens) << "prompt " << i;
}

INSTANTIATE_TEST_SUITE_P(Cut, UnevenSplit, ::testing::Range(0, int(std::size(kCases))), [](const auto& info) {
  const Case& c = kCases[info.param];
  return std::string(c.fixture) + "_dff" + std::to_string(c.to) + "_tp" + std::to_string(c.tp);
});

// A split that leaves a rank no whole block is refused with the numbers.
TEST(UnevenSplit, RankWithoutABlockIsAClearError) {
  testing::TempDir dir("kiln_uneven");
  write_cut_fixture("deepseek_v3_int4", 128, 96, "moe_intermediate_size", dir.path());
  if (HasFatalFailure()) return;
  auto e = load(dir.path(), {.tensor_parallel = 4});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("leaves rank 3 none of the 96"), std::string::npos) << e.status().to_string();
}

}  // namespace
}  // namespace kiln
