#include "cli/render_command.h"

#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/json_bounded.h"
#include "formats/hf_config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/deepseek_v32.h"

namespace kiln::cli {
namespace {

using json = nlohmann::ordered_json;  // keeps the key order of messages and tool schemas

int fail(std::ostream& err, const Status& s) {
  err << "kiln: error: " << s.to_string() << "\n";
  return 1;
}

Result<json> read_json_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(std::string(flag) + ": cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string why;
  json j = parse_json_explained<json>(ss.str(), &why);
  if (!why.empty()) return invalid_argument(std::string(flag) + ": " + path + ": " + why);
  return j;
}

// A list, or an object holding the list under `key`.
Result<json> read_list(const std::string& path, const char* flag, const char* key) {
  KILN_ASSIGN_OR_RETURN(json j, read_json_file(path, flag));
  if (j.is_object() && j.contains(key)) j = j[key];
  if (!j.is_array())
    return invalid_argument(std::string(flag) + ": " + path + " must hold a JSON list (or {\"" + key +
                            "\": [...]})");
  return j;
}

}  // namespace

int run_render(const RenderCommandOptions& o, std::ostream& out, std::ostream& err) {
  if (o.model.empty()) return fail(err, invalid_argument("render needs --model (a model directory)"));
  if (o.messages.empty()) return fail(err, invalid_argument("render needs --messages (a JSON file)"));
  auto chat = tokenizer::ChatTemplate::load(o.model, o.template_name);
  // DeepSeek-V3.2 ships its prompt format as Python, no template: kiln's encoder, as serve.
  bool deepseek_v32 = false;
  if (!chat.ok() && chat.status().code() == StatusCode::kNotFound) {
    Result<formats::ModelConfig> config = formats::load_config(o.model);
    deepseek_v32 = config.ok() && config->architecture == "DeepseekV32ForCausalLM";
  }
  if (!chat.ok() && !deepseek_v32) return fail(err, chat.status());

  tokenizer::ChatRequest request;
  auto messages = read_list(o.messages, "--messages", "messages");
  if (!messages.ok()) return fail(err, messages.status());
  request.messages = std::move(messages).value();
  if (!o.tools.empty()) {
    auto tools = read_list(o.tools, "--tools", "tools");
    if (!tools.ok()) return fail(err, tools.status());
    request.tools = std::move(tools).value();
  }
  request.add_generation_prompt = !o.no_generation_prompt;
  if (!o.kwargs.empty()) {
    request.kwargs = parse_json_bounded<json>(o.kwargs);
    if (!request.kwargs.is_object())
      return fail(err, invalid_argument("--kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'"));
  }

  auto prompt = deepseek_v32 ? tokenizer::render_deepseek_v32(request.messages,
                                                              request.tools.value_or(json::array()),
                                                              tokenizer::deepseek_v32_options(request.kwargs))
                             : chat->render(chat->build_context(request));
  if (!prompt.ok()) return fail(err, prompt.status());
  out.write(prompt->data(), std::streamsize(prompt->size()));
  out.flush();
  return 0;
}

void add_render_command(CLI::App& app, std::vector<std::pair<CLI::App*, std::function<int()>>>& commands) {
  auto options = std::make_shared<RenderCommandOptions>();
  CLI::App* cmd =
      app.add_subcommand("render", "render a conversation with the model's chat template (prints the prompt)");
  cmd->add_option("--model", options->model, "model directory (tokenizer_config.json or chat_template.jinja)");
  cmd->add_option("--messages", options->messages, "JSON file: a list of messages, or {\"messages\": [...]}");
  cmd->add_option("--tools", options->tools, "JSON file: a list of tool schemas, or {\"tools\": [...]}");
  cmd->add_flag("--no-generation-prompt", options->no_generation_prompt,
                "do not end with the assistant turn header (add_generation_prompt=false)");
  cmd->add_option("--kwargs", options->kwargs,
                  "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
  cmd->add_option("--template", options->template_name,
                  "a named chat template (default: \"default\", or \"tool_use\" with --tools)");
  commands.emplace_back(cmd, [options] { return run_render(*options, std::cout, std::cerr); });
}

}  // namespace kiln::cli
