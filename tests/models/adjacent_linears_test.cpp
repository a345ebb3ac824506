// Linears of one input loaded as row views of one matrix (WeightLoader::adjacent_linears,
// for a backend that computes them as one product: the CUDA backend's one GEMM for an
// attention's q, k and v): the same values as loaded apart, so the same logits bit for bit,
// from a checkpoint and from dummy weights, at 1, 2 and 4 ranks; the attention's linears
// do arrive adjacent, and quantized ones stay apart.
#include <gtest/gtest.h>

#include <atomic>
#include <optional>

#include "backends/cpu/cpu_backend.h"
#include "delegating_backend.h"
#include "fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

// The CPU reference, saying it fuses adjacent linears; counts the linears() calls whose
// weights lie one after the other.
class FusingBackend : public testing::DelegatingBackend {
 public:
  explicit FusingBackend(std::shared_ptr<std::atomic<int>> adjacent)
      : DelegatingBackend(cpu::make_cpu_backend({.n_threads = 1})), adjacent_(std::move(adjacent)) {}
  bool fuses_adjacent_linears() const override { return true; }
  void linears(const ops::LinearsArgs& a) override {
    bool adjacent = a.w[1] != nullptr;
    for (size_t i = 1; i < a.w.size() && a.w[i] != nullptr; ++i)
      adjacent = adjacent && !a.w[i]->quantized() && !a.w[i - 1]->quantized() &&
                 a.w[i]->data.data == static_cast<const char*>(a.w[i - 1]->data.data) + a.w[i - 1]->data.nbytes();
    if (adjacent) ++*adjacent_;
    ops::Backend::linears(a);
  }

 private:
  std::shared_ptr<std::atomic<int>> adjacent_;
};

// The logits of a prompt, or nothing where the layout does not load.
std::optional<std::vector<std::vector<float>>> logits(const std::string& fixture, int tp, bool fused,
                                                      runtime::LoadFormat format,
                                                      const std::shared_ptr<std::atomic<int>>& adjacent) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < tp; ++r) {
    if (fused) backends.push_back(std::make_unique<FusingBackend>(adjacent));
    else backends.push_back(cpu::make_cpu_backend({.n_threads = 1}));
  }
  auto e = runtime::Engine::load(testing::fixture_dir(fixture), std::move(backends),
                                 {.block_size = 4, .max_model_len = 64, .load_format = format,
                                  .parallel = {.tensor_parallel = tp}});
  if (!e.ok()) return std::nullopt;
  auto l = (*e)->logits({5, 17, 100, 42, 7, 9, 3});
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return std::nullopt;
  return *l;
}

struct Case {
  const char* fixture;
  bool fuses;  // whether its attention's q, k and v are dense (else loaded apart)
};

class AdjacentLinears : public ::testing::TestWithParam<Case> {};

TEST_P(AdjacentLinears, GiveTheLogitsOfLinearsLoadedApart) {
  const Case& c = GetParam();
  for (const runtime::LoadFormat format : {runtime::LoadFormat::kAuto, runtime::LoadFormat::kDummy})
    for (const int tp : {1, 2, 4}) {  // 4 ranks over 2 KV heads: each KV head on two ranks
      SCOPED_TRACE((format == runtime::LoadFormat::kDummy ? "dummy, tp " : "checkpoint, tp ") + std::to_string(tp));
      auto adjacent = std::make_shared<std::atomic<int>>(0);
      const auto apart = logits(c.fixture, tp, false, format, adjacent);
      const auto together = logits(c.fixture, tp, true, format, adjacent);
      ASSERT_EQ(together.has_value(), apart.has_value()) << "one of the two loads failed";
      if (!apart) {
        EXPECT_GT(tp, 1) << "one rank must load";
        continue;  // (a layout the fixture cannot take, e.g. its linear-attention heads over 4 ranks)
      }
      EXPECT_EQ(*together, *apart);
      if (c.fuses) EXPECT_GT(adjacent->load(), 0) << "no attention's q, k and v arrived as views of one matrix";
      else EXPECT_EQ(adjacent->load(), 0) << "quantized q, k and v must load apart";
    }
}

// Llama (plain), Qwen3 (q / k norms), gpt-oss (q / k / v biases, sinks; and with MXFP4
// experts), Qwen3-Next (a gated attention: q with its output gate's rows), Llama with FP8
// block-quantized linears (q, k and v apart).
INSTANTIATE_TEST_SUITE_P(Fixtures, AdjacentLinears,
                         ::testing::Values(Case{"llama", true}, Case{"qwen3", true}, Case{"gpt_oss", true},
                                           Case{"gpt_oss_mxfp4", true}, Case{"qwen3_next", true},
                                           Case{"llama_fp8_block", false}),
                         [](const auto& info) { return std::string(info.param.fixture); });

}  // namespace
}  // namespace kiln
