// ServedModel: the text side of the model being served: its name, tokenizer, chat
// template and output parsers (which tool-call syntax and reasoning markers its replies
// use). The engine side is runtime::AsyncEngine.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "grammar/grammar.h"
#include "runtime/sampler.h"
#include "server/structured_output.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/parser_output.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

using ordered_json = nlohmann::ordered_json;

struct ServedModelOptions {
  std::string name;                    // the id clients send as "model"
  std::string tool_call_parser = "auto";  // auto (from the chat template), none, or a ToolFormat name
  std::string reasoning_parser = "auto";  // auto (<think> in the template), none, or think
  // Where generation_config.json is (the checkpoint directory): its sampling values are
  // the defaults of requests that do not set them, as the model's authors intended.
  std::string generation_config_dir;
  // config.json's architectures[0]. DeepseekV32ForCausalLM without a chat template gets
  // kiln's DeepSeek-V3.2 encoder (tokenizer/deepseek_v32.h): DeepSeek ships a Python one.
  std::string architecture;
};

// A request's sampling defaults: OpenAI's and Anthropic's (temperature 1, no filters),
// overridden by the checkpoint's generation_config.json.
struct SamplingDefaults {
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
};

class ServedModel {
 public:
  // tokenizer.json (+ tokenizer_config.json, chat template) from `dir`. A model without
  // a chat template serves completions only.
  static Result<std::unique_ptr<ServedModel>> load(const std::string& dir, const ServedModelOptions& options);

  const std::string& name() const { return name_; }
  const tokenizer::Tokenizer& tokenizer() const { return tokenizer_; }
  bool has_chat_template() const { return chat_.has_value() || harmony_ || deepseek_v32_; }
  tokenizer::ToolFormat tool_format() const { return tool_format_; }
  bool reasoning() const { return reasoning_; }
  // The end-of-turn ids a chat reply stops at: the tokenizer's eos token (the model's
  // config eos ids are the engine's).
  const std::vector<int32_t>& stop_token_ids() const { return stop_ids_; }
  const SamplingDefaults& sampling_defaults() const { return defaults_; }

  // Renders OpenAI-shaped messages (content already a string or null, tool call
  // arguments parsed) with the model's template. kwargs: chat_template_kwargs, plus
  // reasoning_effort where given. Errors are the template's (kInvalidArgument).
  Result<std::string> render_chat(const ordered_json& messages, const std::optional<ordered_json>& tools,
                                  const ordered_json& kwargs) const;
  // Parser options for one chat reply to `prompt` (a prompt that ends inside an opened
  // <think> block starts the reply in reasoning).
  tokenizer::ParserOptions parser_options(std::string_view prompt, const ordered_json& tools) const;

  // Structured output: g compiled, with this model's vocabulary for the grammar engine
  // (every token's bytes and the mask trie, built once, on the first call; thread-safe).
  // Special tokens have no bytes there except the markers its tool-call syntax and
  // channels spell (syntax_markers), so a grammar can ask for those.
  Result<std::shared_ptr<const runtime::OutputConstraint>> constraint(const grammar::Grammar& g) const;
  // A chat reply to `prompt` constrained to `body` (a document, or tool_call_grammar's tool
  // calls): the constraint starts where the reply's reasoning ends.
  Result<std::shared_ptr<const runtime::OutputConstraint>> chat_constraint(const grammar::Grammar& body,
                                                                           std::string_view prompt,
                                                                           bool tool_calls) const;
  ToolSyntax tool_syntax() const { return tool_syntax_; }

 private:
  explicit ServedModel(tokenizer::Tokenizer t) : tokenizer_(std::move(t)) {}
  Status load_sampling_defaults(const std::string& dir);

  std::string name_;
  tokenizer::Tokenizer tokenizer_;
  std::optional<tokenizer::ChatTemplate> chat_;
  bool harmony_ = false;  // GPT-OSS: kiln's harmony renderer (tokenizer/harmony.h)
  bool deepseek_v32_ = false;  // DeepSeek-V3.2: kiln's encoder (tokenizer/deepseek_v32.h)
  tokenizer::ToolFormat tool_format_ = tokenizer::ToolFormat::kNone;
  ToolSyntax tool_syntax_;
  bool reasoning_ = false;
  std::vector<int32_t> stop_ids_;
  SamplingDefaults defaults_;
  mutable std::once_flag vocabulary_once_;  // structured output's vocabulary (constraint())
  mutable std::shared_ptr<const std::vector<std::string>> token_bytes_;
  mutable std::shared_ptr<const grammar::TokenMasker> masker_;
  // Compiled grammars by their text, each with the masks all its requests share (32 kept:
  // agents send the same schemas again and again).
  struct KnownGrammar {
    std::shared_ptr<const grammar::CompiledGrammar> compiled;
    std::shared_ptr<grammar::SharedMaskCache> masks;
  };
  mutable std::mutex grammars_mu_;
  mutable std::unordered_map<std::string, KnownGrammar> grammars_;
};

// Which tool-call syntax a chat template's source speaks (kNone if no known one).
tokenizer::ToolFormat detect_tool_format(std::string_view template_source);

}  // namespace kiln::server
