// The CLI contract: JSON on stdout, errors on stderr with a non-zero exit code.
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "fixture.h"
#include "run_kiln.h"

namespace kiln {
namespace {

using testing::KilnRun;
using testing::run_kiln;
using testing::run_kiln_env;

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

TEST(Cli, LogitsPrintsOneRowPerPositionMatchingTransformers) {
  const nlohmann::json g = testing::read_json(testing::fixture_dir("gpt_oss") + "/golden.json");
  const auto prompt = g["prompt_long"].get<std::vector<int32_t>>();
  KilnRun r = run_kiln("logits --model " + testing::fixture_dir("gpt_oss") + " --tokens " + join(prompt));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = nlohmann::json::parse(r.out)["logits"].get<std::vector<std::vector<float>>>();
  ASSERT_EQ(got.size(), prompt.size());
  EXPECT_LT(testing::relative_error(got, testing::golden_logits("gpt_oss", "long")), 1e-4);
}

TEST(Cli, GreedyGenerateReproducesTransformersTokens) {
  const nlohmann::json g = testing::read_json(testing::fixture_dir("deepseek_v3") + "/golden.json");
  const auto prompt = g["prompt_short"].get<std::vector<int32_t>>();
  const auto expected = g["greedy_short"].get<std::vector<int32_t>>();
  KilnRun r = run_kiln("generate --model " + testing::fixture_dir("deepseek_v3") + " --tokens " +
                   join(prompt) + " --max-tokens " + std::to_string(expected.size()) + " --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"].get<std::vector<int32_t>>(), expected);
}

TEST(Cli, NgramSpeculationGivesTheSameGreedyTokens) {
  // The golden transformers tokens again, now with drafts verified on the way; and MTP
  // drafts refused for a checkpoint without an MTP layer (transformers saves none).
  const nlohmann::json g = testing::read_json(testing::fixture_dir("deepseek_v3") + "/golden.json");
  const auto prompt = g["prompt_long"].get<std::vector<int32_t>>();
  const auto expected = g["greedy_long"].get<std::vector<int32_t>>();
  KilnRun r = run_kiln("generate --model " + testing::fixture_dir("deepseek_v3") + " --tokens " + join(prompt) +
                       " --max-tokens " + std::to_string(expected.size()) +
                       " --temperature 0 --speculative-method ngram --num-speculative-tokens 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"].get<std::vector<int32_t>>(), expected);
  KilnRun bad = run_kiln("generate --model " + testing::fixture_dir("qwen3_next") +
                         " --tokens 1,2,3 --max-tokens 2 --speculative-method mtp --num-speculative-tokens 3");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("mtp_num_hidden_layers"), std::string::npos) << bad.err;
}

TEST(Cli, SeededSamplingIsReproducibleAndSeedDependent) {
  const std::string base = "generate --model " + testing::fixture_dir("qwen3_moe") +
                           " --tokens 3,1,4,1,5 --max-tokens 16 --temperature 1.0 --top-p 0.95";
  KilnRun a = run_kiln(base + " --seed 7"), b = run_kiln(base + " --seed 7"), c = run_kiln(base + " --seed 8");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(Cli, BadInputsFailWithAClearMessage) {
  const std::string model = " --model " + testing::fixture_dir("llama");
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"logits --model /nonexistent/dir --tokens 1,2", "/nonexistent/dir"},
      {"logits" + model + " --tokens 1,x,3", "\"x\" is not a token id"},
      {"logits" + model + " --tokens 1,99999", "outside the vocabulary"},
      {"logits" + model, "needs --tokens"},
      {"generate" + model + " --tokens 1,2 --max-tokens 100000", "maximum context length is"},
      {"frobnicate", "frobnicate"},
  };
  for (const Case& c : cases) {
    KilnRun r = run_kiln(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
}

TEST(Cli, InspectReportsFormatsPerModuleGroup) {
  KilnRun r = run_kiln("inspect --model " + testing::fixture_dir("glm4_moe_nvfp4"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Glm4MoeForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("modelopt (nvfp4)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("routed experts     nvfp4 (12)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bytes on disk"), std::string::npos) << r.out;
  KilnRun bad = run_kiln("inspect --model /nonexistent");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("/nonexistent"), std::string::npos);
}

TEST(Cli, GenerateWithoutModelRunsTheBuiltInDemo) {
  const std::string cmd = "generate --max-tokens 8 --ignore-eos";
  KilnRun a = run_kiln(cmd);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const auto tokens = nlohmann::json::parse(a.out)["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(tokens.size(), 8u);
  KilnRun b = run_kiln(cmd);  // greedy: the same output again
  EXPECT_EQ(a.out, b.out);
  KilnRun missing = run_kiln_env("KILN_DEMO_MODEL=/nonexistent ", cmd);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("models/kiln-demo"), std::string::npos) << missing.err;
}

// The line of `help` that describes `option` ("" when none does).
std::string help_line(const std::string& help, const std::string& option) {
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    const size_t b = line.find_first_not_of(' ');
    if (b == std::string::npos || line.compare(b, option.size(), option) != 0) continue;
    const size_t end = b + option.size();  // "--port" must not match "--port-file"
    if (end == line.size() || (!std::isalnum(static_cast<unsigned char>(line[end])) && line[end] != '-')) return line;
  }
  return "";
}

TEST(Cli, AMistypedFlagGetsASuggestionAndExitCode2) {
  KilnRun r = run_kiln("serve --prot 8000");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("kiln: error: serve: unknown option --prot (did you mean --port?)", 0), 0u) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  KilnRun g = run_kiln("generate --max-token 4");
  EXPECT_EQ(g.exit_code, 2) << g.err;
  EXPECT_NE(g.err.find("unknown option --max-token (did you mean --max-tokens?)"), std::string::npos) << g.err;
  KilnRun far = run_kiln("generate --frobnicate");
  EXPECT_EQ(far.exit_code, 2) << far.err;
  EXPECT_NE(far.err.find("unknown option --frobnicate;"), std::string::npos) << far.err;  // nothing near it
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
  KilnRun cmd = run_kiln("serv");
  EXPECT_EQ(cmd.exit_code, 2) << cmd.err;
  EXPECT_NE(cmd.err.find("kiln: error: unknown command 'serv': did you mean serve?"), std::string::npos) << cmd.err;
}

TEST(Cli, EveryParseErrorIsAKilnErrorWithExitCode2) {
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"", "a command is required (logits, generate"},
      {"bench", "bench: a command is required (serve, report, op)"},
      {"--frobnicate", "unknown option --frobnicate"},
      {"serve --port 70000", "--port"},
      {"serve --backend gpu", "--backend"},
      {"generate --max-tokens", "--max-tokens"},  // its value is missing
      {"generate --max-tokens many", "--max-tokens"},
      {"generate --prompt hi --tokens 1,2", "excludes"},
      {"detokenize --model x", "--ids is required"},
      {"serve a b", "unexpected argument: b"},
  };
  for (const Case& c : cases) {
    KilnRun r = run_kiln(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.rfind("kiln: error: ", 0), 0u) << c.args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << "\nstderr: " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << "\nstdout: " << r.out;
  }
}

TEST(Cli, HelpShowsTheDefaults) {
  KilnRun serve = run_kiln("serve --help");
  ASSERT_EQ(serve.exit_code, 0) << serve.err;
  for (const auto& [option, value] : std::vector<std::pair<std::string, std::string>>{
           {"--port", "8000"},
           {"--host", "127.0.0.1"},
           {"--max-num-seqs", "256"},
           {"--block-size", "16"},
           {"--backend", "auto"},
           {"--kv-cache-dtype", "bf16"},
           {"--gpu-memory-utilization", "0.9"},
           {"--max-request-bytes", "32MiB"},
           {"--allowed-origins", "*"},
           {"--log-stats-interval", "10"},
       }) {
    const std::string line = help_line(serve.out, option);
    ASSERT_FALSE(line.empty()) << option << "\n" << serve.out;
    EXPECT_NE(line.find("=" + value), std::string::npos) << line;
  }
  KilnRun generate = run_kiln("generate --help");
  ASSERT_EQ(generate.exit_code, 0) << generate.err;
  EXPECT_NE(help_line(generate.out, "--max-tokens").find("=16"), std::string::npos) << generate.out;
  EXPECT_NE(help_line(generate.out, "--temperature").find("=0"), std::string::npos) << generate.out;
}

TEST(Cli, VersionPrintsTheProjectVersion) {
  KilnRun r = run_kiln("--version");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_GT(r.out.size(), 5u);
  EXPECT_EQ(r.out.rfind("kiln ", 0), 0u) << r.out;
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(r.out[5]))) << r.out;
}

TEST(Cli, ServeTakesTheModelAsAnArgumentOrAnOption) {
  // Both forms reach the model lookup, which names the directory it did not find.
  for (const std::string args : {"serve /nonexistent/kiln-model --port 0", "serve --model /nonexistent/kiln-model --port 0"}) {
    KilnRun r = run_kiln(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("kiln: error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("/nonexistent/kiln-model"), std::string::npos) << args << "\n" << r.err;
  }
}

TEST(Cli, ServeRefusesAnOriginWithoutAScheme) {
  KilnRun r = run_kiln("serve --allowed-origins http://ok.example,localhost:3000 --port 0");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("kiln: error: invalid argument: --allowed-origins \"localhost:3000\": an origin is scheme://host[:port]"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("listening"), std::string::npos) << r.err;
}

TEST(Cli, GeneratePromptPrintsTheTextOfTheTokensItsIdsGive) {
  KilnRun demo = run_kiln("demo-model");
  ASSERT_EQ(demo.exit_code, 0) << demo.err;
  const std::string dir = demo.out.substr(0, demo.out.find('\n'));
  KilnRun ids = run_kiln("tokenize --model " + dir + " --text 'Tell me a story'");
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  const auto prompt = nlohmann::json::parse(ids.out).get<std::vector<int32_t>>();
  KilnRun text = run_kiln("generate --prompt 'Tell me a story' --max-tokens 12 --ignore-eos");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  KilnRun tokens = run_kiln("generate --tokens " + join(prompt) + " --max-tokens 12 --ignore-eos");
  ASSERT_EQ(tokens.exit_code, 0) << tokens.err;
  const auto generated = nlohmann::json::parse(tokens.out)["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(generated.size(), 12u);
  KilnRun detok = run_kiln("detokenize --model " + dir + " --skip-special --ids " + join(generated));
  ASSERT_EQ(detok.exit_code, 0) << detok.err;
  const std::string expected = nlohmann::json::parse(detok.out).get<std::string>();
  EXPECT_FALSE(expected.empty());
  EXPECT_EQ(text.out, expected + "\n");
}

TEST(Cli, DoctorWithoutTheCudaBackendSaysWhatRunsHere) {
  if (KILN_BINARY_HAS_CUDA) GTEST_SKIP() << "this kiln has the CUDA backend: scripts/gpu-check runs kiln doctor";
  KilnRun r = run_kiln("doctor --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("kiln               ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("CUDA backend       not in this build"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CPU backend        "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CPU backend        1 thread (--threads 1; "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NVIDIA driver      "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--backend auto     cpu (auto: this build has no CUDA backend)"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln
