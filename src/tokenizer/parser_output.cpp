#include "tokenizer/parser_output.h"

#include <utility>

#include "core/check.h"
#include "tokenizer/parser_harmony.h"
#include "tokenizer/parser_reasoning.h"
#include "tokenizer/parser_text.h"
#include "tokenizer/tool_formats.h"

namespace kiln::tokenizer {
namespace {

// kNone: all text is content.
class ContentParser final : public OutputParser {
 public:
  void feed(std::string_view delta, std::vector<ParseEvent>& out) override {
    content_.append(delta, out);
  }
  void finish(std::vector<ParseEvent>& out) override { content_.end_segment(false, out); }

 private:
  detail::TextStream content_{ParseEventKind::kContent, "", false, false};
};

// <think> splitting first, then the tool-call parser on the content that comes out of it.
class ReasoningThenTools final : public OutputParser {
 public:
  ReasoningThenTools(const ReasoningOptions& options, std::unique_ptr<OutputParser> inner)
      : split_(options), inner_(std::move(inner)) {}

  void feed(std::string_view delta, std::vector<ParseEvent>& out) override {
    std::string content;
    split_.feed(delta, out, content);
    if (!content.empty()) inner_->feed(content, out);
  }
  void finish(std::vector<ParseEvent>& out) override {
    std::string content;
    split_.finish(out, content);
    if (!content.empty()) inner_->feed(content, out);
    inner_->finish(out);
  }

 private:
  detail::ReasoningSplitter split_;
  std::unique_ptr<OutputParser> inner_;
};

struct FormatName {
  std::string_view name;
  ToolFormat format;
};

constexpr FormatName kFormatNames[] = {
    {"none", ToolFormat::kNone},
    {"hermes", ToolFormat::kHermes},
    {"qwen3", ToolFormat::kHermes},
    {"glm45", ToolFormat::kGlm45},
    {"glm47", ToolFormat::kGlm45},
    {"kimi_k2", ToolFormat::kKimiK2},
    {"deepseek_v3", ToolFormat::kDeepSeekV3},
    {"deepseek_v31", ToolFormat::kDeepSeekV3},
    {"deepseek_v32", ToolFormat::kDeepSeekV32},
    {"harmony", ToolFormat::kHarmony},
    {"gpt_oss", ToolFormat::kHarmony},
};

}  // namespace

Result<ToolFormat> parse_tool_format(std::string_view name) {
  for (const FormatName& f : kFormatNames)
    if (f.name == name) return f.format;
  std::string known;
  for (const FormatName& f : kFormatNames)
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  return invalid_argument("unknown tool-call format '" + std::string(name) + "' (known: " + known +
                          ")");
}

std::string_view tool_format_name(ToolFormat format) {
  for (const FormatName& f : kFormatNames)
    if (f.format == format) return f.name;  // the first name is the canonical one
  return "unknown";
}

std::unique_ptr<OutputParser> make_output_parser(ToolFormat format, const ParserOptions& options) {
  if (format == ToolFormat::kHarmony)
    return std::make_unique<detail::HarmonyParser>(options.tool_call_id_prefix);
  std::unique_ptr<OutputParser> tools;
  auto blocks = [&](detail::BlockSyntax syntax) {
    return std::make_unique<detail::BlockToolParser>(std::move(syntax),
                                                     options.tool_call_id_prefix);
  };
  switch (format) {
    case ToolFormat::kNone:
      tools = std::make_unique<ContentParser>();
      break;
    case ToolFormat::kHermes:
      tools = blocks(detail::hermes_syntax());
      break;
    case ToolFormat::kGlm45:
      tools = blocks(detail::glm45_syntax(options.tools));
      break;
    case ToolFormat::kKimiK2:
      tools = blocks(detail::kimi_k2_syntax());
      break;
    case ToolFormat::kDeepSeekV3:
      tools = blocks(detail::deepseek_v3_syntax());
      break;
    case ToolFormat::kDeepSeekV32:
      tools = blocks(detail::dsml_syntax());
      break;
    case ToolFormat::kHarmony:
      break;
  }
  KILN_CHECK(tools != nullptr) << "format " << int(format);
  if (!options.reasoning.enabled) return tools;
  return std::make_unique<ReasoningThenTools>(options.reasoning, std::move(tools));
}

void apply_event(const ParseEvent& event, ParsedOutput& output) {
  switch (event.kind) {
    case ParseEventKind::kContent:
      output.content += event.text;
      break;
    case ParseEventKind::kReasoning:
      output.reasoning += event.text;
      break;
    case ParseEventKind::kToolCallBegin:
      KILN_CHECK_EQ(event.tool_index, int(output.tool_calls.size()));
      output.tool_calls.push_back({.id = event.id, .name = event.name});
      break;
    case ParseEventKind::kToolCallArgs:
    case ParseEventKind::kToolCallEnd:
      KILN_CHECK_EQ(event.tool_index + 1, int(output.tool_calls.size()));
      if (event.kind == ParseEventKind::kToolCallArgs)
        output.tool_calls.back().arguments_json += event.text;
      break;
  }
}

ParsedOutput parse_all(ToolFormat format, const ParserOptions& options, std::string_view text) {
  std::unique_ptr<OutputParser> parser = make_output_parser(format, options);
  std::vector<ParseEvent> events;
  parser->feed(text, events);
  parser->finish(events);
  ParsedOutput output;
  for (const ParseEvent& e : events) apply_event(e, output);
  return output;
}

}  // namespace kiln::tokenizer
