// Linears of one input loaded as row views of one matrix (WeightLoader::adjacent_linears,
// for a backend that computes them as one product: the CUDA backend's one GEMM for an
// attention's q, k and v): the same values as loaded apart, so the same logits bit for bit,
// from a checkpoint and from dummy weights, at one rank and at TP2; and the attention's
// linears do arrive adjacent.
#include <gtest/gtest.h>

#include <atomic>

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

std::vector<std::vector<float>> logits(const std::string& fixture, int tp, bool fused, runtime::LoadFormat format,
                                       std::shared_ptr<std::atomic<int>> adjacent) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < tp; ++r) {
    if (fused) backends.push_back(std::make_unique<FusingBackend>(adjacent));
    else backends.push_back(cpu::make_cpu_backend({.n_threads = 1}));
  }
  auto e = runtime::Engine::load(testing::fixture_dir(fixture), std::move(backends),
                                 {.block_size = 4, .max_model_len = 64, .load_format = format,
                                  .parallel = {.tensor_parallel = tp}});
  EXPECT_TRUE(e.ok()) << fixture << ": " << e.status().to_string();
  if (!e.ok()) return {};
  auto l = (*e)->logits({5, 17, 100, 42, 7, 9, 3});
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return l.ok() ? *l : std::vector<std::vector<float>>{};
}

class AdjacentLinears : public ::testing::TestWithParam<std::string> {};

TEST_P(AdjacentLinears, GiveTheLogitsOfLinearsLoadedApart) {
  for (const runtime::LoadFormat format : {runtime::LoadFormat::kAuto, runtime::LoadFormat::kDummy})
    for (const int tp : {1, 2}) {
      SCOPED_TRACE((format == runtime::LoadFormat::kDummy ? "dummy, tp " : "checkpoint, tp ") + std::to_string(tp));
      auto adjacent = std::make_shared<std::atomic<int>>(0);
      const auto apart = logits(GetParam(), tp, false, format, adjacent);
      ASSERT_EQ(adjacent->load(), 0);
      const auto together = logits(GetParam(), tp, true, format, adjacent);
      ASSERT_FALSE(apart.empty());
      EXPECT_EQ(together, apart);
      EXPECT_GT(adjacent->load(), 0) << "no attention's q, k and v arrived as views of one matrix";
    }
}

// Llama (plain), Qwen3 (q / k norms), gpt-oss (q / k / v biases, sinks).
INSTANTIATE_TEST_SUITE_P(Fixtures, AdjacentLinears, ::testing::Values("llama", "qwen3", "gpt_oss"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
