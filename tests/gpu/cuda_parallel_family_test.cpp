// Every family fixture, bf16 and quantized, and the Gated DeltaNet hybrids, split over
// several GPUs (NCCL): TP2, TP2 with expert parallelism, PP2 (and TP2 x PP2, TP4 where 4
// GPUs are visible), with a bf16 and an e4m3 KV cache.
//
// The reference is the CPU backend in its bf16-activation mode split the same way (the
// same ranks over in-process groups): the split changes bf16 roundings (each rank's GEMM
// sums half of K, the partial sums meet in a bf16 all-reduce), and on the MoE fixtures
// those alone flip near-tied expert choices against one GPU (docs/GPU-TESTS.md: one GPU
// against the fp32 CPU differs by up to 0.36 x max|logit| on gpt_oss for that reason).
// The reference rounds at the same points, the all-reduce included (the one-shot
// all-reduce sums in fp32 in rank order as the CPU does; NCCL's larger sums do not), and
// a row may instead match the CPU on one rank (a near-tie the reference's split flipped:
// either_reference_error), so the bound is
// cuda_family_test's (2e-2 x max|logit|, or twice one GPU's own error against the CPU on
// the fixture where that is larger): a wrong shard (head, column, expert, scale block)
// is off by O(1). Prefill logits on the warp attention kernels (fp32 softmax, as the
// reference). Then greedy decoding of a continuous batch on the automatic attention paths
// (decode steps replayed as CUDA graphs) against one GPU doing the same: the same tokens,
// or diverging only at a near-tie of one GPU's logits. The split's logits against one
// GPU's are reported.
// Each load has a time limit: a layout that hangs fails here instead of stalling the
// suite (the ranks' watchdog).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstdio>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "cli/common.h"
#include "gpu/gpu_test_util.h"
#include "models/fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

constexpr double kTol = 2e-2;
constexpr double kNearTie = 5e-2;  // cuda_family_test's margin for a greedy divergence

struct Layout {
  const char* name;
  runtime::ParallelConfig parallel;
  bool fp8_kv = false;
};

const Layout kLayouts[] = {
    {"tp2", {.tensor_parallel = 2}},
    {"tp2_ep", {.tensor_parallel = 2, .expert_parallel = true}},
    {"pp2", {.pipeline_parallel = 2}},
    {"tp2_fp8kv", {.tensor_parallel = 2}, true},
    {"pp2_fp8kv", {.pipeline_parallel = 2}, true},
    {"tp2_pp2", {.tensor_parallel = 2, .pipeline_parallel = 2}},
    // Steps as two micro-batches whose sums overlap (CausalLM::micro_batch_rows; by default
    // only without peer access and from 1,024 rows): here every step not recorded.
    {"tp2_micro", {.tensor_parallel = 2, .micro_batch_rows = 2}},
    {"tp2_ep_micro", {.tensor_parallel = 2, .expert_parallel = true, .micro_batch_rows = 2}},
    {"tp4", {.tensor_parallel = 4}},
    {"tp4_ep", {.tensor_parallel = 4, .expert_parallel = true}},
};

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

runtime::EngineOptions options(const Layout& l) {
  runtime::EngineOptions opt{.block_size = 16,
                             .max_model_len = 256,
                             .max_num_seqs = 8,
                             .kv_cache_bytes = int64_t(64) << 20,
                             .kv_cache_dtype = l.fp8_kv ? runtime::KvCacheDtype::kFp8 : runtime::KvCacheDtype::kBf16};
  opt.parallel = l.parallel;
  opt.parallel.watchdog_seconds = 60;
  return opt;
}

// GPU ranks with the attention path forced ("warp": the fp32 warp kernels, whose softmax
// mirrors the reference) or chosen ("" = auto: FA2 / split-KV, which round the
// probabilities to bf16 as the reference does not).
Result<std::unique_ptr<runtime::Engine>> load(const std::string& dir, const Layout& l, const char* attention_path) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  if (*attention_path) ::setenv("KILN_ATTENTION_PATH", attention_path, 1);
  for (int r = 0; r < l.parallel.world(); ++r) {
    auto be = cuda::make_cuda_backend({.device = r, .smem_cap = gpu_testing::smem_cap()});
    if (!be.ok()) break;
    backends.push_back(std::move(be).value());
  }
  ::unsetenv("KILN_ATTENTION_PATH");
  if (int(backends.size()) < l.parallel.world()) return internal_error("no CUDA backend for every rank");
  runtime::EngineOptions opt = options(l);
#ifdef KILN_HAVE_NCCL
  opt.comms = cli::cuda_comm_world;
#endif
  return runtime::Engine::load(dir, std::move(backends), opt);
}

// The same layout on CPU ranks in bf16-activation mode (in-process groups).
Result<std::unique_ptr<runtime::Engine>> load_reference(const std::string& dir, const Layout& l) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < l.parallel.world(); ++r) backends.push_back(cpu::make_cpu_backend({.bf16_activations = true}));
  return runtime::Engine::load(dir, std::move(backends), options(l));
}

// Row by row (one row per prompt position), the split GPU's logits against the CPU
// split alike, or against the CPU on one rank where that is closer: on the MoE fixtures
// the reference's own split flips near-tied expert choices of single tokens against one
// rank (kimi_k2 0.444, deepseek_v3 0.199, gpt_oss_d64 0.06-0.13 of max|logit| on the CPU
// alone, every shard exact in fp32: docs/GPU-TESTS.md), and the GPU's split may fall on
// either side of such a tie. A wrong shard is off in every row against both.
// Rows of one check: each row's error against the nearer reference, and the largest
// row difference between the two references themselves (the CPU split alike against the
// CPU on one rank), all over the split reference's max |logit|.
struct RowErrors {
  std::vector<double> row;
  double worst = 0.0, references_apart = 0.0;
  int nearer_one = 0;  // rows nearer the one-rank reference
};

double max_abs(const std::vector<std::vector<float>>& rows) {
  double m = 0.0;
  for (const auto& row : rows)
    for (float v : row) m = std::max(m, std::abs(double(v)));
  return m;
}

RowErrors either_reference_error(const std::vector<std::vector<float>>& have,
                                 const std::vector<std::vector<float>>& split,
                                 const std::vector<std::vector<float>>& one) {
  const double max_ref = max_abs(split);
  RowErrors e;
  for (size_t r = 0; r < split.size(); ++r) {
    double d_split = 0.0, d_one = 0.0, apart = 0.0;
    for (size_t i = 0; i < split[r].size(); ++i) {
      d_split = std::max(d_split, std::abs(double(have[r][i]) - double(split[r][i])));
      d_one = std::max(d_one, std::abs(double(have[r][i]) - double(one[r][i])));
      apart = std::max(apart, std::abs(double(split[r][i]) - double(one[r][i])));
    }
    if (d_one < d_split) ++e.nearer_one;
    e.row.push_back(std::min(d_split, d_one) / max_ref);
    e.worst = std::max(e.worst, e.row.back());
    e.references_apart = std::max(e.references_apart, apart / max_ref);
  }
  return e;
}

// Whether the rows pass the bound: every row within it, or all but one, where that row is
// off by no more than the two references are apart in some row. A near-tied expert choice
// in a late MoE layer moves its token's row alone (the rows after it read that token's
// KV only through layers before the flip), as the references' own split does: on the CPU
// alone, deepseek_v3 TP2 parts from one rank in rows 8 and 20 only (0.199, 0.151 of
// max|logit|), gpt_oss_d64 TP2+EP in rows 0, 5, 26 (0.058-0.128), every other row within
// 0.007-0.016. The split GPU's own roundings (its MoE GEMV sums in another order than the
// CPU's) flip such a choice in a row where neither reference does: deepseek_v3 TP2 row 3
// (0.125 against both), gpt_oss_d64 TP2+EP row 23 (0.056) and with the e4m3 KV cache row
// 13 (0.105), every other row within 0.007-0.026 (2 x H200, 2026-11-29; with the grouped
// MoE path instead of the GEMV the deepseek_v3 row matches the split reference exactly).
// A wrong shard, scale block or kernel is off in many rows.
bool rows_pass(const RowErrors& e, double tol) {
  int beyond = 0;
  double worst_beyond = 0.0;
  for (double x : e.row) {
    if (x < tol) continue;
    ++beyond;
    worst_beyond = std::max(worst_beyond, x);
  }
  return beyond == 0 || (beyond == 1 && worst_beyond <= e.references_apart);
}

// A logits check's rows (prompt positions), printed where one is beyond the bound: the
// split GPU against the CPU split alike and the CPU on one rank, and one GPU against the
// CPU on one rank, each over the split reference's max |logit| (rows_pass tells a lone
// flipped row from a fault that spans many).
void print_rows(const std::vector<std::vector<float>>& have, const std::vector<std::vector<float>>& split,
                const std::vector<std::vector<float>>& one, const std::vector<std::vector<float>>& one_gpu) {
  const double max_ref = max_abs(split);
  const auto diff = [&](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0.0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    return d / max_ref;
  };
  for (size_t r = 0; r < split.size(); ++r)
    std::printf("  row %2zu: split GPU vs CPU split %.4f, vs CPU one rank %.4f; one GPU vs CPU one rank %.4f\n", r,
                diff(have[r], split[r]), diff(have[r], one[r]), diff(one_gpu[r], one[r]));
}

class CudaParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CudaParallel, MatchesTheCpuSplitAlike) {
#ifndef KILN_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#endif
  const std::string fixture = std::get<0>(GetParam());
  const Layout& layout = kLayouts[std::get<1>(GetParam())];
  if (visible_gpus() < layout.parallel.world()) {
    GTEST_SKIP() << layout.name << " needs " << layout.parallel.world() << " GPUs, " << visible_gpus() << " visible";
  }
  const std::string dir = testing::fixture_dir(fixture);
  const nlohmann::json file = testing::read_json(dir + "/config.json");
  const nlohmann::json& config = file.contains("text_config") ? file["text_config"] : file;  // a VL checkpoint
  const int64_t heads = config["num_attention_heads"].get<int64_t>();
  // Gated DeltaNet layers split their key heads too.
  const int64_t linear_heads = config.value("linear_num_key_heads", heads);
  const auto t0 = std::chrono::steady_clock::now();
  auto many = load(dir, layout, "warp");
  if (heads % layout.parallel.tensor_parallel != 0 || linear_heads % layout.parallel.tensor_parallel != 0) {
    ASSERT_FALSE(many.ok()) << fixture << " loaded " << heads << " heads over " << layout.name;
    return;
  }
  ASSERT_TRUE(many.ok()) << many.status().to_string();
  Layout single = layout;
  single.parallel = {};
  auto ref = load_reference(dir, layout), ref_one = load_reference(dir, single);
  auto one = load(dir, single, "warp");
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_TRUE(ref_one.ok()) << ref_one.status().to_string();
  ASSERT_TRUE(one.ok()) << one.status().to_string();

  // Logits: the split GPU against the CPU split alike, within cuda_family_test's bound or
  // twice what one GPU differs from the CPU on this fixture (the fp16 / fp32 fixtures the
  // GPU rounds to bf16 at upload, the quantized kernels' sums, the e4m3 KV cache).
  const nlohmann::json g = testing::read_json(dir + "/golden.json");
  const auto prompt = g["prompt_long"].get<std::vector<int32_t>>();
  auto want = (*ref)->logits(prompt), have = (*many)->logits(prompt);
  auto want_one = (*ref_one)->logits(prompt), have_one = (*one)->logits(prompt);
  ASSERT_TRUE(want.ok() && have.ok() && want_one.ok() && have_one.ok());
  const RowErrors rows = either_reference_error(*have, *want, *want_one);
  const double err = rows.worst;
  const int rows_one = rows.nearer_one;
  const double err_split = testing::relative_error(*have, *want);
  const double err_one = testing::relative_error(*have_one, *want_one);
  const double tol = std::max(kTol, 2 * err_one);
  EXPECT_TRUE(rows_pass(rows, tol)) << fixture << " " << layout.name << ": max rel err " << err << ", bound " << tol
                                    << " (one GPU against the CPU: " << err_one << "; the references apart by "
                                    << rows.references_apart << ")";
  if (err >= tol) print_rows(*have, *want, *want_one, *have_one);
  const double vs_one_gpu = testing::relative_error(*have, *have_one);
  (*many).reset();  // the GPUs' memory and NCCL groups for the next load
  (*one).reset();

  // Greedy decoding of a continuous batch with the automatic attention paths, decode
  // steps graph-replayed, against one GPU doing the same (the CPU's roundings differ from
  // the fast paths': cuda_family_test).
  // FP8 weights: W8A16 on both sides. Whether a GEMM quantizes its activations to e4m3
  // (W8A8) depends on its row count, which the split layouts' schedules change (a prefill
  // split in pipeline micro-batches); with W8A8 on, llama_fp8_block, deepseek_v3_fp8_block
  // and glm4_moe_fp8_channel diverged from one GPU at the first token (top-2 gaps 0.3-0.5),
  // with it off on both sides not at all (4 x H200, 2026-11-28). W8A8's own accuracy is
  // cuda_quant_test's.
  ::setenv("KILN_FP8_W8A8", "0", 1);
  auto fast = load(dir, layout, ""), one_fast = load(dir, single, "");
  ::unsetenv("KILN_FP8_W8A8");
  ASSERT_TRUE(fast.ok()) << fast.status().to_string();
  ASSERT_TRUE(one_fast.ok()) << one_fast.status().to_string();
  const std::vector<std::vector<int32_t>> prompts = {
      prompt, g["prompt_short"].get<std::vector<int32_t>>(),
      std::vector<int32_t>(prompt.begin(), prompt.begin() + long(prompt.size() / 2))};
  // Where the split parts from one GPU, the CPU split alike is the reference, as for the
  // logits above: on the MoE and sparse-attention fixtures the reference's own split flips
  // near-tied expert (or indexer) choices, after which the greedy tokens part from one
  // rank at margins that are no near-tie of the final logits (qwen3_5_moe, deepseek_v32 at
  // TP2: the prompt's logits equal the CPU split's to 0-0.01 while they differ from one
  // GPU's by 0.08-0.24 of max|logit|; 2 x H200, 2026-11-29). So a divergence passes where
  // the CPU split alike generates the same tokens, or where it is a near-tie against
  // either reference.
  auto a = (*one_fast)->generate_batch(prompts, 8, {.temperature = 0.0f}, /*ignore_eos=*/true);
  auto b = (*fast)->generate_batch(prompts, 8, {.temperature = 0.0f}, /*ignore_eos=*/true);
  auto c = (*ref)->generate_batch(prompts, 8, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  int diverged = 0, as_split = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& got = (*b)[i].tokens;
    const auto& want_tokens = (*a)[i].tokens;
    if (got == want_tokens) continue;
    ++diverged;
    if (got == (*c)[i].tokens) {
      ++as_split;
      continue;
    }
    const gpu_testing::Divergence d = gpu_testing::first_divergence(**one_fast, prompts[i], got, want_tokens);
    const gpu_testing::Divergence ds = gpu_testing::first_divergence(**ref, prompts[i], got, (*c)[i].tokens);
    EXPECT_LT(std::min(d.margin, ds.margin), kNearTie)
        << fixture << " " << layout.name << " prompt " << i << ": greedy diverged from one GPU at step " << d.at
        << " (top-2 margin " << d.top2_gap << ") and from the CPU split alike at step " << ds.at << " (" << ds.top2_gap
        << ")";
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s %s: max rel err %.3g vs the CPU split alike or one rank, row by row (%d of %zu rows nearer one "
              "rank; %.3g against the split alone; bound %.3g, one row up to the references' %.3g apart; one GPU vs "
              "CPU %.3g; split vs one GPU %.3g), "
              "%d of 3 greedy runs diverged from one GPU (%d as the CPU split alike does, the others at a near-tie), "
              "%.1f s\n",
              fixture.c_str(), layout.name, err, rows_one, want->size(), err_split, tol, rows.references_apart, err_one,
              vs_one_gpu, diverged,
              as_split, secs);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParallel,
                         ::testing::Combine(::testing::ValuesIn(testing::every_fixture()),
                                            ::testing::Range(0, int(std::size(kLayouts)))),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + kLayouts[std::get<1>(info.param)].name;
                         });
// The Gated DeltaNet hybrids: their linear-attention key heads split over the ranks.
INSTANTIATE_TEST_SUITE_P(Hybrid, CudaParallel,
                         ::testing::Combine(::testing::ValuesIn(testing::hybrid_fixtures()),
                                            ::testing::Range(0, int(std::size(kLayouts)))),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + kLayouts[std::get<1>(info.param)].name;
                         });

}  // namespace
}  // namespace kiln
