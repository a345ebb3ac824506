#include "cli/commands.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/build_info.h"
#include "cli/common.h"
#include "cli/demo.h"
#include "cli/demo_tokenizer.h"
#include "cli/parse_errors.h"
#include "cli/render_command.h"
#include "cli/subcommand.h"
#include "cli/tokenize_commands.h"
#include "core/log.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {
namespace {

Result<std::vector<int32_t>> parse_tokens(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used]))) ++used;
    if (item.empty() || used != item.size() || v < 0 || v > INT32_MAX) {
      return invalid_argument("--tokens: \"" + item + "\" is not a token id (expected e.g. 1,2,3)");
    }
    out.push_back(int32_t(v));
  }
  if (out.empty()) return invalid_argument("--tokens is empty");
  return out;
}

// --model, else the built-in demo model.
Result<std::string> model_dir(const CommonOptions& o) {
  if (!o.model.empty()) return o.model;
  KILN_ASSIGN_OR_RETURN(std::string dir, ensure_demo_model());
  KILN_LOG(kInfo, "no --model given: using the built-in demo model in " << dir);
  return dir;
}

Result<std::unique_ptr<runtime::Engine>> open_engine(const CommonOptions& o) {
  // One sequence at a time: a KV cache for one full-length sequence is enough.
  KILN_ASSIGN_OR_RETURN(const std::string dir, model_dir(o));
  runtime::EngineOptions options = engine_options(o);
  options.max_num_seqs = 1;
  return load_engine(dir, o, options);
}

int cmd_logits(const CommonOptions& o, const std::string& tokens_arg) {
  if (tokens_arg.empty()) return fail(invalid_argument("logits needs --tokens"));
  auto tokens = parse_tokens(tokens_arg);
  if (!tokens.ok()) return fail(tokens.status());
  auto engine = open_engine(o);
  if (!engine.ok()) return fail(engine.status());
  auto logits = (*engine)->logits(*tokens);
  if (!logits.ok()) return fail(logits.status());
  nlohmann::json j = {{"logits", *logits}};
  std::cout << j.dump() << "\n";
  return 0;
}

struct GenerateOptions {
  std::string prompt;  // --prompt: text in, text out (used when has_prompt; it may be empty)
  bool has_prompt = false;
  int max_tokens = 16;
  runtime::SamplingParams sampling;
  bool ignore_eos = false;
  bool stats = false;
};

// --prompt TEXT: the text encoded as /v1/completions does (the post-processor's special
// tokens added, no chat template); the generated ids decoded without special tokens.
int cmd_generate(const CommonOptions& o, const std::string& tokens_arg, const GenerateOptions& g) {
  std::optional<tokenizer::Tokenizer> tok;
  Result<std::vector<int32_t>> tokens = std::vector<int32_t>{};
  if (g.has_prompt) {
    auto dir = model_dir(o);
    if (!dir.ok()) return fail(dir.status());
    auto loaded = tokenizer::Tokenizer::load(*dir);
    if (!loaded.ok()) return fail(loaded.status().with_context("--prompt needs the model's tokenizer"));
    tok = std::move(loaded).value();
    tokens = tok->encode(g.prompt, /*add_special_tokens=*/true);
    if (tokens->empty()) return fail(invalid_argument("--prompt encodes to no tokens"));
  } else {
    tokens = parse_tokens(tokens_arg.empty() ? std::string("1,2,3,4,5,6,7,8") : tokens_arg);
  }
  if (!tokens.ok()) return fail(tokens.status());
  auto engine = open_engine(o);
  if (!engine.ok()) return fail(engine.status());
  const auto t0 = std::chrono::steady_clock::now();
  auto result = (*engine)->generate(*tokens, g.max_tokens, g.sampling, g.ignore_eos);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!result.ok()) return fail(result.status());
  if (tok) {
    std::cout << tok->decode(result->tokens, /*skip_special_tokens=*/true) << "\n";
  } else {
    nlohmann::json out = {{"tokens", result->tokens}};
    if (g.sampling.logprobs >= 0) {
      // One entry per generated token: its logprob and the top alternatives.
      nlohmann::json lps = nlohmann::json::array();
      for (const runtime::SampledToken& t : result->logprobs) {
        nlohmann::json top = nlohmann::json::array();
        for (size_t j = 0; j < t.top_ids.size(); ++j)
          top.push_back({{"id", t.top_ids[j]}, {"logprob", t.top_logprobs[j]}});
        lps.push_back({{"token", t.token}, {"logprob", t.logprob}, {"top", std::move(top)}});
      }
      out["logprobs"] = std::move(lps);
    }
    std::cout << out.dump() << "\n";
  }
  if (g.stats) {
    const size_t n = result->tokens.size();
    std::fprintf(stderr, "kiln: %zu prompt + %zu generated tokens in %.3f s (%.1f tok/s overall)\n",
                 tokens->size(), n, seconds, double(n) / seconds);
    const runtime::EngineStats st = (*engine)->stats();
    if (st.spec_verified_seqs > 0) {
      std::fprintf(stderr, "kiln: speculative: %lld verify steps, %lld drafted, %lld accepted (%.1f%%), %.2f tokens per step\n",
                   (long long)st.spec_verified_seqs, (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens,
                   100.0 * double(st.spec_accepted_tokens) / double(std::max<int64_t>(1, st.spec_draft_tokens)),
                   double(n) / double(std::max<int64_t>(1, st.steps)));
    }
    // The wall time of Engine::step by kind (scheduling, the forward pass, sampling, the
    // MTP passes it queues: their drafts are waited for in the next step).
    const auto per = [](double s, int64_t n) { return s * 1e3 / double(std::max<int64_t>(1, n)); };
    std::fprintf(stderr,
                 "kiln: steps: %lld decode (%.3f ms each), %lld verify (%.3f ms each), %lld with prefill (%.3f ms "
                 "each); %lld ran a shape first or recorded it\n",
                 (long long)st.decode_steps.steps, per(st.decode_steps.seconds, st.decode_steps.steps),
                 (long long)st.verify_steps.steps, per(st.verify_steps.seconds, st.verify_steps.steps),
                 (long long)st.mixed_steps.steps, per(st.mixed_steps.seconds, st.mixed_steps.steps),
                 (long long)st.one_time_steps);
    if (st.mtp_draft_steps > 0)
      std::fprintf(stderr, "kiln: MTP drafts: %lld steps drafted, with the first pass and %.2f chained ones each\n",
                   (long long)st.mtp_draft_steps, double(st.mtp_chained_passes) / double(st.mtp_draft_steps));
    if (const runtime::AdaptiveDepth* depth = (*engine)->speculation_depth(); depth && st.spec_depth_steps > 0) {
      // The depth policy (runtime/adaptive_depth.h): what it chose and what it measured.
      const auto fmt_fixed = [](double v, int digits) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.*f", digits, v);
        return std::string(buf);
      };
      std::string acceptance;
      for (double a : depth->acceptance()) acceptance += (acceptance.empty() ? "" : " ") + fmt_fixed(a, 2);
      const runtime::StepCostModel cost = depth->cost_model(1);  // (generate runs one sequence)
      std::fprintf(stderr, "kiln: speculative depth (%s): mean k %.2f of %d over %lld steps (%lld probes); "
                   "acceptance by position %s; step cost %s\n",
                   depth->config().adaptive ? "adaptive" : "fixed",
                   double(st.spec_depth_total) / double(st.spec_depth_steps), depth->config().max_depth,
                   (long long)st.spec_depth_steps, (long long)depth->probes(), acceptance.c_str(),
                   cost.known ? (fmt_fixed(cost.fixed_s * 1e3, 3) + " ms + " + fmt_fixed(cost.per_row_s * 1e3, 3) +
                                 " ms per row").c_str()
                              : "not measured");
    }
  }
  return 0;
}

}  // namespace

int run_cli(int argc, char** argv, const ServeHooks& hooks) {
  CLI::App app{"kiln: serve large Mixture-of-Experts checkpoints on consumer GPUs"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "print the help of every command and exit");
  app.set_version_flag("--version", "kiln " + version_string(), "print the version and exit");
  // Every option's help shows its default (subcommands inherit this from app).
  app.option_defaults()->always_capture_default();

  CommonOptions logits_opt;
  std::string logits_tokens;
  CLI::App* logits = app.add_subcommand("logits", "print fp32 logits for every prompt position as JSON");
  add_common(logits, logits_opt);
  logits->add_option("--tokens", logits_tokens, "prompt token ids, comma separated, e.g. 1,2,3");

  CommonOptions gen_opt;
  GenerateOptions gen;
  CLI::App* generate = app.add_subcommand(
      "generate", "generate from a prompt: text (--prompt) or token ids (--tokens); without --model: the built-in demo "
                  "model");
  add_common(generate, gen_opt);
  std::string gen_tokens;
  CLI::Option* gen_tokens_opt = generate->add_option(
      "--tokens", gen_tokens, "prompt token ids, comma separated (default 1,2,...,8); prints {\"tokens\": [...]}");
  CLI::Option* gen_prompt_opt = generate->add_option(
      "--prompt", gen.prompt,
      "prompt text, encoded with the model's tokenizer (no chat template); prints the generated text");
  gen_prompt_opt->excludes(gen_tokens_opt);
  generate->add_option("--max-tokens", gen.max_tokens, "tokens to generate")->check(CLI::NonNegativeNumber);
  generate->add_option("--temperature", gen.sampling.temperature, "0: greedy")->check(CLI::NonNegativeNumber);
  generate->add_option("--top-k", gen.sampling.top_k, "0: off")->check(CLI::NonNegativeNumber);
  generate->add_option("--top-p", gen.sampling.top_p, "1: off")->check(CLI::Range(0.0, 1.0));
  generate->add_option("--min-p", gen.sampling.min_p, "0: off")->check(CLI::Range(0.0, 1.0));
  generate->add_option("--seed", gen.sampling.seed, "sampling seed");
  generate->add_option("--logprobs", gen.sampling.logprobs,
                       "print each token's logprob and N top alternatives (0..20; -1: none; JSON: not with --prompt)")
      ->excludes(gen_prompt_opt);
  generate->add_flag("--ignore-eos", gen.ignore_eos, "do not stop at end-of-sequence tokens");
  generate->add_flag("--stats", gen.stats, "print timing to stderr");

  std::string demo_dir;
  CLI::App* demo = app.add_subcommand("demo-model", "print where the built-in demo model is, or copy it (--out)");
  demo->add_option("--out", demo_dir, "copy the demo checkpoint into this directory");
  int64_t demo_vocab = 0;
  demo->add_option("--tokenizer-only", demo_vocab,
                   "write a generated byte-level BPE tokenizer with the demo's chat template, with this many ids, "
                   "into --out (e.g. a test fixture's vocabulary, to serve it with --tokenizer)");

  Subcommands more;
  add_serve_command(app, more, hooks);
  add_bench_command(app, more);  // bench serve, bench report, bench op
  add_inspect_command(app, more);
  add_doctor_command(app, more);
  add_tokenize_commands(app, more);  // tokenize, detokenize
  add_render_command(app, more);

  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> commands;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) {
      commands.push_back(sub->get_name());
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (std::find(commands.begin(), commands.end(), argv[1]) == commands.end()) {
      const std::string near = nearest_name(argv[1], commands);
      std::fprintf(stderr, "kiln: error: unknown command '%s'%s (commands: %s)\n", argv[1],
                   near.empty() ? "" : (": did you mean " + near + "?").c_str(), names.c_str());
      return kUsageExitCode;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return report_parse_error(app, e, argc, argv);
  }
  if (logits->parsed()) return cmd_logits(logits_opt, logits_tokens);
  if (generate->parsed()) {
    gen.has_prompt = gen_prompt_opt->count() > 0;
    return cmd_generate(gen_opt, gen_tokens, gen);
  }
  for (const auto& [cmd, run] : more)
    if (cmd->parsed()) return run();
  if (demo->parsed()) {
    if (demo_vocab > 0) {
      if (demo_dir.empty()) return fail(invalid_argument("--tokenizer-only needs --out DIR"));
      std::error_code ec;
      std::filesystem::create_directories(demo_dir, ec);
      if (Status s = write_demo_tokenizer(demo_dir, demo_vocab); !s.ok()) return fail(s);
    } else if (!demo_dir.empty()) {
      if (Status s = copy_demo_model(demo_dir); !s.ok()) return fail(s);
    } else {
      auto dir = ensure_demo_model();
      if (!dir.ok()) return fail(dir.status());
      demo_dir = *dir;
    }
    std::printf("%s\n", demo_dir.c_str());
    return 0;
  }
  return kUsageExitCode;
}

}  // namespace kiln::cli
