// Engine::generate through the backend's sample op: per-token logprobs against the
// log_softmax of Engine::logits on the same sequence, parameter validation, and the
// `kiln generate --logprobs` output.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

std::unique_ptr<runtime::Engine> load(const std::string& name) {
  auto e = runtime::Engine::load(testing::fixture_dir(name), cpu::make_cpu_backend(2), {.max_model_len = 128});
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(GenerateLogprobs, EachTokenCarriesTheLogSoftmaxOfItsStepsLogits) {
  auto engine = load("qwen3");
  ASSERT_TRUE(engine);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  for (const runtime::SamplingParams& p :
       {runtime::SamplingParams{.logprobs = 4}, runtime::SamplingParams{.temperature = 1.2f, .top_p = 0.9f, .seed = 3,
                                                                         .logprobs = 4}}) {
    auto got = engine->generate(prompt, 6, p, /*ignore_eos=*/true);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->logprobs.size(), got->tokens.size());
    std::vector<int32_t> seq = prompt;
    for (size_t i = 0; i < got->tokens.size(); ++i) {
      // The logits that produced token i: the last row of the sequence so far.
      auto logits = engine->logits(seq);
      ASSERT_TRUE(logits.ok());
      const std::vector<float>& row = logits->back();
      const double m = *std::max_element(row.begin(), row.end());
      double s = 0.0;
      for (float x : row) s += std::exp(double(x) - m);
      const double lse = m + std::log(s);
      const runtime::SampledToken& t = got->logprobs[i];
      EXPECT_EQ(t.token, got->tokens[i]);
      EXPECT_NEAR(t.logprob, double(row[size_t(t.token)]) - lse, 1e-4) << "token " << i;
      std::vector<int32_t> order(row.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
      ASSERT_EQ(t.top_ids.size(), 4u);
      for (size_t j = 0; j < 4; ++j) {
        EXPECT_EQ(t.top_ids[j], order[j]) << "token " << i << " top " << j;
        EXPECT_NEAR(t.top_logprobs[j], double(row[size_t(order[j])]) - lse, 1e-4);
      }
      if (p.temperature == 0.0f) {
        EXPECT_EQ(t.token, order[0]);
      }
      seq.push_back(got->tokens[i]);
    }
  }
  auto none = engine->generate(prompt, 3, {}, true);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->logprobs.empty());
}

TEST(GenerateLogprobs, InvalidSamplingParametersAreAClearError) {
  auto engine = load("llama");
  ASSERT_TRUE(engine);
  for (const runtime::SamplingParams& p : {runtime::SamplingParams{.temperature = -1.0f},
                                           runtime::SamplingParams{.top_p = 0.0f},
                                           runtime::SamplingParams{.min_p = 1.5f},
                                           runtime::SamplingParams{.top_k = -3},
                                           runtime::SamplingParams{.logprobs = 21}}) {
    auto got = engine->generate({1, 2, 3}, 2, p);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << got.status().to_string();
  }
}

std::string run_kiln(const std::string& args, int* exit_code) {
  FILE* p = ::popen((std::string(KILN_BINARY) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p && (n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = p ? ::pclose(p) : -1;
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(GenerateLogprobs, CliPrintsLogprobsWhenAsked) {
  const std::string base = "generate --model " + testing::fixture_dir("llama") + " --tokens 1,2,3 --max-tokens 3";
  int code = -1;
  const std::string out = run_kiln(base + " --logprobs 2", &code);
  ASSERT_EQ(code, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  const auto tokens = j["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(j["logprobs"].size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const nlohmann::json& t = j["logprobs"][i];
    EXPECT_EQ(t["token"].get<int32_t>(), tokens[i]);
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top"].size(), 2u);
    EXPECT_EQ(t["top"][0]["id"].get<int32_t>(), tokens[i]);  // greedy: the best alternative
    EXPECT_GE(t["top"][0]["logprob"].get<double>(), t["top"][1]["logprob"].get<double>());
  }
  const std::string plain = run_kiln(base, &code);
  ASSERT_EQ(code, 0) << plain;
  EXPECT_FALSE(nlohmann::json::parse(plain).contains("logprobs"));
  const std::string bad = run_kiln(base + " --logprobs 21", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(bad.find("logprobs"), std::string::npos) << bad;
}

}  // namespace
}  // namespace kiln
