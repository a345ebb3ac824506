#include "server/served_model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/log.h"
#include "core/json_bounded.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "tokenizer/deepseek_v32.h"
#include "tokenizer/harmony.h"

namespace kiln::server {
namespace {

bool has(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

// The prompt up to its trailing newlines and spaces (where a template's think tag ends it).
std::string_view without_trailing_space(std::string_view prompt) {
  size_t end = prompt.size();
  while (end > 0 && (prompt[end - 1] == '\n' || prompt[end - 1] == ' ')) --end;
  return prompt.substr(0, end);
}

}  // namespace

tokenizer::ToolFormat detect_tool_format(std::string_view src) {
  using tokenizer::ToolFormat;
  if (has(src, "<|channel|>")) return ToolFormat::kHarmony;
  if (has(src, "<|tool_calls_section_begin|>")) return ToolFormat::kKimiK2;
  if (has(src, "｜DSML｜")) return ToolFormat::kDeepSeekV32;
  if (has(src, "<｜tool▁calls▁begin｜>") || has(src, "<｜tool▁call▁begin｜>")) return ToolFormat::kDeepSeekV3;
  if (has(src, "<arg_key>")) return ToolFormat::kGlm45;
  if (has(src, "<tool_call>")) return ToolFormat::kHermes;
  return ToolFormat::kNone;
}

Result<std::unique_ptr<ServedModel>> ServedModel::load(const std::string& dir, const ServedModelOptions& options) {
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    return not_found(dir + " has no tokenizer.json: kiln serves text, so it needs the model's tokenizer "
                           "(--tokenizer DIR points at another directory that has one)");
  }
  KILN_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::load(dir));
  std::unique_ptr<ServedModel> m(new ServedModel(std::move(tok)));
  m->name_ = options.name;
  if (std::optional<int32_t> eos = m->tokenizer_.eos_id()) m->stop_ids_.push_back(*eos);

  KILN_RETURN_IF_ERROR(m->load_sampling_defaults(options.generation_config_dir));

  auto chat = tokenizer::ChatTemplate::load(dir);
  std::string source;
  if (chat.ok()) {
    // The tool-use variant where a model has several: that is where the syntax shows.
    source = chat->source(ordered_json{{"tools", ordered_json::array()}});
    m->chat_ = std::move(chat).value();
  } else if (chat.status().code() != StatusCode::kNotFound) {
    return chat.status().with_context("loading the chat template of " + dir);
  } else if (options.architecture == "DeepseekV32ForCausalLM") {
    // DeepSeek-V3.2 ships its prompt format as Python (V3.2-Exp shipped a Jinja template,
    // which the branch above takes).
    m->deepseek_v32_ = true;
  } else {
    KILN_LOG(kWarn, dir << " has no chat template: /v1/chat/completions and /v1/messages are off");
  }

  const tokenizer::ToolFormat detected =
      m->deepseek_v32_ ? tokenizer::ToolFormat::kDeepSeekV32 : detect_tool_format(source);
  m->tool_syntax_.deepseek_fenced = has(source, "```json");
  if (options.tool_call_parser == "auto") {
    m->tool_format_ = detected;
  } else {
    KILN_ASSIGN_OR_RETURN(m->tool_format_, tokenizer::parse_tool_format(options.tool_call_parser));
  }
  m->tool_syntax_.format = m->tool_format_;
  // GPT-OSS prompts are rendered by kiln's harmony renderer, which follows the shipped
  // template but also takes what OpenAI clients send routinely (null content, ...).
  m->harmony_ = detected == tokenizer::ToolFormat::kHarmony && m->chat_.has_value();
  if (options.reasoning_parser == "auto") {
    m->reasoning_ = m->deepseek_v32_ || (detected != tokenizer::ToolFormat::kHarmony && has(source, "<think>"));
  } else if (options.reasoning_parser == "think") {
    m->reasoning_ = true;
  } else if (options.reasoning_parser != "none") {
    return invalid_argument("unknown reasoning parser \"" + options.reasoning_parser +
                            "\" (expected auto, think or none)");
  }
  KILN_LOG(kInfo, "chat: template " << (m->harmony_        ? "harmony"
                                        : m->deepseek_v32_ ? "DeepSeek-V3.2 encoder"
                                        : m->chat_         ? "jinja"
                                                           : "none")
                                    << ", tool calls "
                                    << tokenizer::tool_format_name(m->tool_format_) << ", reasoning "
                                    << (m->tool_format_ == tokenizer::ToolFormat::kHarmony ? "harmony channels"
                                        : m->reasoning_                                      ? "<think>"
                                                                                             : "none"));
  return m;
}

Status ServedModel::load_sampling_defaults(const std::string& dir) {
  if (dir.empty()) return Status::Ok();
  const std::string path = dir + "/generation_config.json";
  std::ifstream f(path);
  if (!f) return Status::Ok();
  std::stringstream ss;
  ss << f.rdbuf();
  std::string why;
  const ordered_json g = parse_json_explained<ordered_json>(ss.str(), &why);
  if (!why.empty()) return corrupt(path + ": " + why);
  if (!g.is_object()) return corrupt(path + " is not a JSON object");
  // do_sample false means greedy, whatever temperature says.
  const bool greedy = g.contains("do_sample") && g["do_sample"].is_boolean() && !g["do_sample"].get<bool>();
  auto number = [&](const char* key, double& out) {
    if (g.contains(key) && g[key].is_number()) out = g[key].get<double>();
  };
  number("temperature", defaults_.temperature);
  number("top_p", defaults_.top_p);
  number("min_p", defaults_.min_p);
  number("repetition_penalty", defaults_.repetition_penalty);
  if (g.contains("top_k") && g["top_k"].is_number_integer()) defaults_.top_k = std::max<int64_t>(0, g["top_k"].get<int64_t>());
  if (greedy) defaults_.temperature = 0.0;
  if (!(defaults_.temperature >= 0 && defaults_.top_p > 0 && defaults_.top_p <= 1 && defaults_.min_p >= 0 &&
        defaults_.min_p <= 1 && defaults_.repetition_penalty > 0)) {
    return corrupt(path + " has sampling values out of range");
  }
  return Status::Ok();
}

Result<std::string> ServedModel::render_chat(const ordered_json& messages, const std::optional<ordered_json>& tools,
                                             const ordered_json& kwargs) const {
  if (!has_chat_template()) {
    return invalid_argument("model " + name_ + " has no chat template; use /v1/completions with a prompt");
  }
  if (harmony_) {
    ordered_json input = kwargs.is_object() ? kwargs : ordered_json::object();
    input["messages"] = messages;
    input["tools"] = tools ? *tools : ordered_json::array();
    input["add_generation_prompt"] = true;
    KILN_ASSIGN_OR_RETURN(tokenizer::HarmonyConversation conv, tokenizer::harmony_conversation_from_json(input));
    return tokenizer::render_harmony(conv);
  }
  if (deepseek_v32_) {
    return tokenizer::render_deepseek_v32(messages, tools ? *tools : ordered_json::array(),
                                          tokenizer::deepseek_v32_options(kwargs));
  }
  tokenizer::ChatRequest req{.messages = messages, .tools = tools, .add_generation_prompt = true, .kwargs = kwargs};
  return chat_->render(chat_->build_context(req));
}

tokenizer::ParserOptions ServedModel::parser_options(std::string_view prompt, const ordered_json& tools) const {
  tokenizer::ParserOptions o;
  o.tools = tools.is_array() ? tools : ordered_json::array();
  o.reasoning.enabled = reasoning_;
  if (reasoning_) {
    // The template opened the block itself when the prompt ends in "<think>" (+ spaces).
    o.reasoning.starts_in_reasoning = without_trailing_space(prompt).ends_with("<think>");
  }
  return o;
}

Result<std::shared_ptr<const runtime::OutputConstraint>> ServedModel::constraint(const grammar::Grammar& g) const {
  // At most 32 grammars of 256 shared masks: vocab / 8 bytes each, 200 MB in all at worst
  // at a 200k vocabulary (a mask cache starts over when full).
  constexpr size_t kKnownGrammars = 32, kSharedMasks = 256;
  const std::string text = g.to_string();
  KnownGrammar known;
  {
    std::lock_guard lock(grammars_mu_);
    if (auto it = grammars_.find(text); it != grammars_.end()) known = it->second;
  }
  if (!known.compiled) {
    auto compiled = grammar::CompiledGrammar::compile(g);
    if (!compiled.ok()) return compiled.status();
    known = {.compiled = std::move(compiled).value(),
             .masks = std::make_shared<grammar::SharedMaskCache>(kSharedMasks)};
    std::lock_guard lock(grammars_mu_);
    if (grammars_.size() >= kKnownGrammars) grammars_.clear();
    known = grammars_.emplace(text, known).first->second;
  }
  std::call_once(vocabulary_once_, [&] {
    auto bytes = std::make_shared<std::vector<std::string>>();
    bytes->reserve(size_t(tokenizer_.vocab_size()));
    const std::vector<std::string>& markers = syntax_markers(tool_format_);
    for (int32_t id = 0; id < tokenizer_.vocab_size(); ++id) {
      std::optional<std::string> b = tokenizer_.token_bytes(id);
      if (!b && tokenizer_.is_special(id)) {
        const std::optional<std::string> text = tokenizer_.id_to_token(id);
        if (text && std::find(markers.begin(), markers.end(), *text) != markers.end()) b = text;
      }
      bytes->push_back(b.value_or(""));
    }
    masker_ = std::make_shared<grammar::TokenMasker>(*bytes, std::nullopt);  // end ids: the sampler's
    token_bytes_ = std::move(bytes);
    KILN_LOG(kInfo, "structured output: a vocabulary of " << token_bytes_->size() << " tokens ("
                                                          << masker_->n_nodes() << " trie nodes)");
  });
  auto c = std::make_shared<runtime::OutputConstraint>();
  c->grammar = known.compiled;
  c->shared_masks = known.masks;
  c->masker = masker_;
  c->token_bytes = token_bytes_;
  return std::shared_ptr<const runtime::OutputConstraint>(std::move(c));
}

Result<std::shared_ptr<const runtime::OutputConstraint>> ServedModel::chat_constraint(const grammar::Grammar& body,
                                                                                    std::string_view prompt,
                                                                                    bool tool_calls) const {
  ReasoningFrame frame = ReasoningFrame::kNone;
  if (harmony_) frame = ReasoningFrame::kHarmony;
  else if (!reasoning_ || without_trailing_space(prompt).ends_with("</think>")) frame = ReasoningFrame::kNone;  // closed by the template
  else if (parser_options(prompt, {}).reasoning.starts_in_reasoning) frame = ReasoningFrame::kThinkOpen;
  else frame = ReasoningFrame::kThinkOptional;
  return constraint(after_reasoning(body, frame, tool_calls));
}

}  // namespace kiln::server
