// `kiln render`: a conversation through the model's chat template, as transformers.js
// apply_chat_template(..., tokenize=False) renders it (no weights needed).
// Output contract (stable; tests rely on it):
//   render --model DIR --messages FILE.json [--tools FILE.json] [--no-generation-prompt]
//          [--kwargs JSON] [--template NAME]
//     -> stdout: the prompt string exactly, no newline added
// FILE.json holds a list of messages (or {"messages": [...]}); --tools a list of
// OpenAI-style tool schemas (or {"tools": [...]}); --kwargs a JSON object of extra
// template variables ('{"enable_thinking": false}'). --template picks a named template.
// A DeepseekV32ForCausalLM directory without a template renders with kiln's DeepSeek-V3.2
// encoder (tokenizer/deepseek_v32.h; --kwargs '{"thinking": true}' for thinking mode; it
// always ends with the assistant turn's opening, --no-generation-prompt has no effect).
// Errors (a template's raise_exception included): "kiln: error: ..." on stderr, exit
// code 1, nothing on stdout.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace kiln::cli {

struct RenderCommandOptions {
  std::string model;          // directory with tokenizer_config.json / chat_template.jinja
  std::string messages;       // JSON file
  std::string tools;          // JSON file, optional
  std::string kwargs;         // JSON object text, optional
  std::string template_name;  // optional
  bool no_generation_prompt = false;
};

int run_render(const RenderCommandOptions& options, std::ostream& out, std::ostream& err);

void add_render_command(CLI::App& app, std::vector<std::pair<CLI::App*, std::function<int()>>>& commands);

}  // namespace kiln::cli
