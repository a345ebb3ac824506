// A model's chat template: loads it from a Hugging Face model directory and renders a
// conversation to the prompt string, byte for byte as transformers.js does
// (apply_chat_template over @huggingface/jinja).
//
//   KILN_ASSIGN_OR_RETURN(auto chat, ChatTemplate::load(model_dir));
//   nlohmann::ordered_json context = chat.build_context({.messages = messages});
//   KILN_ASSIGN_OR_RETURN(std::string prompt, chat.render(context));
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/jinja_template.h"

namespace kiln::tokenizer {

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content, ...}]
  std::optional<nlohmann::ordered_json> tools;                        // OpenAI function schemas; absent: none
  bool add_generation_prompt = true;
  // Extra template variables passed through (enable_thinking, reasoning_effort,
  // builtin_tools, ...); they override the standard ones of the same name.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Where the template comes from, first found wins (as in transformers):
  //   chat_template.jinja; chat_template.json {"chat_template": ...};
  //   tokenizer_config.json "chat_template".
  // The value may be a string or a list of {"name", "template"}: `name` selects one;
  // empty selects "tool_use" when a render passes tools and the model has one, else
  // "default". Special tokens (bos_token, eos_token, ...) come from
  // tokenizer_config.json, as strings or {"content": ...} objects.
  // Errors: kNotFound (no template), kCorrupt (bad JSON, template does not parse),
  // kUnsupported (a construct the Jinja engine lacks), kInvalidArgument (unknown name).
  static Result<ChatTemplate> load(const std::string& model_dir, const std::string& name = "");
  // A template given as text; special_tokens: {"bos_token": "<s>", ...}.
  static Result<ChatTemplate> from_source(
      std::string source, nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());

  // The context apply_chat_template renders with: messages, add_generation_prompt,
  // tools (null when absent), documents (null), the special tokens, then the kwargs.
  nlohmann::ordered_json build_context(const ChatRequest& request) const;

  // Renders a context (usually from build_context). A template's raise_exception(msg)
  // comes back as kInvalidArgument with exactly `msg`.
  Result<std::string> render(const nlohmann::ordered_json& context,
                             const jinja::RenderOptions& options = {}) const;

  // The template source that renders a context (the named one, see load()).
  const std::string& source(const nlohmann::ordered_json& context = {}) const;
  std::vector<std::string> names() const;
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  struct Named {
    std::string name;
    jinja::JinjaTemplate template_;
  };
  ChatTemplate(std::vector<Named> templates, nlohmann::ordered_json special_tokens, std::string fixed_name)
      : templates_(std::move(templates)),
        special_tokens_(std::move(special_tokens)),
        fixed_name_(std::move(fixed_name)) {}
  const jinja::JinjaTemplate& select(const nlohmann::ordered_json& context) const;

  std::vector<Named> templates_;
  nlohmann::ordered_json special_tokens_;
  std::string fixed_name_;
};

}  // namespace kiln::tokenizer
