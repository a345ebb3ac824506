// Streaming output parsers: split the text a model generates into reasoning, content and
// tool calls while it is generated.
//
// A parser consumes text deltas: the detokenized text of each generated token, with
// special tokens rendered as their literal strings ("<think>", "<|channel|>",
// "<｜tool▁sep｜>"). It never depends on token ids, so the caller may feed any split of
// the text; the events it yields are the same whatever the split (the property tests
// check every split of every sample). A partial marker at the end of a delta is held
// back until the next delta disambiguates it, as is an incomplete UTF-8 sequence, so
// every event's text is whole UTF-8 when the input is.
//
// Malformed output is never thrown away: a tool call whose body does not parse, or that
// is still open at finish(), comes out as content with its exact original text.
//
// Tool calls are emitted whole, when their end marker arrives: kToolCallBegin, one
// kToolCallArgs holding the complete arguments JSON, kToolCallEnd. Buffering one call
// is what lets a malformed call fall back to content; the arguments of one call are
// usually a few dozen tokens.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln::tokenizer {

enum class ParseEventKind {
  kContent,        // text: user-visible content
  kReasoning,      // text: reasoning ("thinking", the harmony analysis channel)
  kToolCallBegin,  // tool_index, id, name
  kToolCallArgs,   // tool_index, text: a piece of the arguments JSON
  kToolCallEnd,    // tool_index
};

struct ParseEvent {
  ParseEventKind kind = ParseEventKind::kContent;
  std::string text;
  int tool_index = -1;  // 0, 1, ... in the order of the calls in this generation
  std::string id;       // kToolCallBegin: the model's id (Kimi K2) or prefix + index
  std::string name;     // kToolCallBegin: the function name
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments_json;  // a JSON object, compact (nlohmann dump), keys in model order
};

// The whole of a generation, for non-streaming responses (and for tests).
struct ParsedOutput {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // Consumes the next piece of generated text; appends the events it completes.
  virtual void feed(std::string_view delta, std::vector<ParseEvent>& out) = 0;
  // End of generation: releases everything held back.
  virtual void finish(std::vector<ParseEvent>& out) = 0;
};

// Tool-call syntaxes. Each parser also accepts the close variants its family emits.
enum class ToolFormat {
  // No tool calls: all non-reasoning text is content.
  kNone,
  // Qwen3, Qwen2.5, Hermes: <tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>
  kHermes,
  // GLM-4.5 / 4.6 / 4.7: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>
  kGlm45,
  // <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
  // <|tool_call_argument_begin|>{..}<|tool_call_end|><|tool_calls_section_end|>
  kKimiK2,
  // V3 / R1 (function<｜tool▁sep｜>NAME\n```json ..```) and V3.1 (NAME<｜tool▁sep｜>{..})
  kDeepSeekV3,
  // V3.2 DSML: <｜DSML｜function_calls><｜DSML｜invoke name="F"><｜DSML｜parameter
  // name="K" string="true">V</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>
  kDeepSeekV32,
  // GPT-OSS channels; reasoning is the analysis channel (ReasoningOptions are ignored).
  kHarmony,
};

// When the reasoning of an output never closes (no end tag before finish()).
enum class UnclosedReasoning {
  kReasoning,  // it stays reasoning: streamed as it comes (a generation cut by max_tokens)
  kContent,    // it is content: reasoning is held until </think>; without one, all is content
};

// <think>...</think> reasoning (Qwen3, DeepSeek-R1 / V3.1, GLM-4.5+, Kimi K2 thinking).
// Reasoning is recognised only at the start of the output (after optional whitespace);
// a later "<think>" is content. Newlines right after <think>, right before </think> and
// right after </think> are dropped, as the Qwen3 / GLM templates strip them on re-render.
struct ReasoningOptions {
  bool enabled = false;
  // The prompt already opened the block (the template ends with "<think>\n": DeepSeek-R1,
  // DeepSeek-V3.1 thinking, Qwen3 *-Thinking-2507): output starts as reasoning, and a
  // redundant leading "<think>" is swallowed.
  bool starts_in_reasoning = false;
  UnclosedReasoning unclosed = UnclosedReasoning::kReasoning;
};

struct ParserOptions {
  ReasoningOptions reasoning;
  // OpenAI tools ([{"type": "function", "function": {"name", "parameters"}}]): GLM uses
  // the parameter types to decide whether an <arg_value> is a string or JSON.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  // Ids of calls that carry none (every format but Kimi K2): prefix + tool index.
  std::string tool_call_id_prefix = "call_";
};

// "none", "hermes" (= "qwen3"), "glm45" (= "glm47"), "kimi_k2", "deepseek_v3"
// (= "deepseek_v31"), "deepseek_v32", "harmony" (= "gpt_oss").
Result<ToolFormat> parse_tool_format(std::string_view name);
std::string_view tool_format_name(ToolFormat format);

std::unique_ptr<OutputParser> make_output_parser(ToolFormat format, const ParserOptions& options);

// Adds one event to a ParsedOutput. Events out of order (arguments of a call that has not
// begun) are a parser bug and abort.
void apply_event(const ParseEvent& event, ParsedOutput& output);

// One-shot parse of a complete generation: feed(text) + finish().
ParsedOutput parse_all(ToolFormat format, const ParserOptions& options, std::string_view text);

}  // namespace kiln::tokenizer
