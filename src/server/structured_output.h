// Structured output as the APIs ask for it, turned into grammars (src/grammar) that the
// engine's sampler enforces token by token:
//   - a document: OpenAI `response_format` (json_object, json_schema), vLLM's
//     `structured_outputs` (json, regex, choice, grammar), llama.cpp's `json_schema` and
//     `grammar` (completions);
//   - tool calls: OpenAI `tool_choice` required / named, Anthropic any / tool, written in
//     the model's own tool-call syntax (the one its parser reads back), each call's
//     arguments following the function's parameter schema;
//   - framed by the model's reasoning: the constraint starts where the reasoning ends
//     (after </think>, or after harmony's analysis message), never inside it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "grammar/grammar.h"
#include "server/json_fields.h"
#include "tokenizer/parser_output.h"

namespace kiln::server {

using ordered_json = nlohmann::ordered_json;

// The document format a request asks for, or nullopt for free text. Reads
// `response_format` and `structured_outputs` (json / regex / choice / grammar, GBNF), and
// with `llama_cpp_fields` llama.cpp's `json_schema` and `grammar` (the /v1/completions
// extras). A schema, pattern or grammar the engine refuses is an error on `f` naming the
// field and where in it.
std::optional<grammar::Grammar> read_output_format(Fields& f, bool llama_cpp_fields);

// Which tool calls a reply must make.
struct ToolCallRule {
  std::optional<std::string> name;  // only this function; else any of the tools
  bool parallel = true;             // one or more calls; false: exactly one
};

// Per-family details of the syntax.
struct ToolSyntax {
  tokenizer::ToolFormat format = tokenizer::ToolFormat::kNone;
  bool deepseek_fenced = true;  // DeepSeek V3 / R1 `function<sep>NAME\n```json` (else V3.1's NAME<sep>JSON)
};

// The grammar of a block of tool calls in `syntax` for `tools` (OpenAI form, checked).
// Arguments follow each function's `parameters` schema; a schema the grammar engine
// cannot take is an error for a `strict` function and any JSON object otherwise.
Result<grammar::Grammar> tool_call_grammar(const ToolSyntax& syntax, const ordered_json& tools,
                                           const ToolCallRule& rule);

// tool_choice auto with a `strict` function: the reply is free text, and where it starts a
// block of tool calls (at the family's marker, e.g. "<tool_call>"), that block follows
// `calls` (tool_call_grammar's). nullopt for harmony (its calls are channel messages, not a
// marker in text) and for models without a known syntax.
std::optional<grammar::Grammar> lazy_tool_call_grammar(const ToolSyntax& syntax, const grammar::Grammar& calls);

// Where a reply's constrained part starts.
enum class ReasoningFrame {
  kNone,           // at the first token
  kThinkOptional,  // after an optional <think> ... </think> block the reply may open
  kThinkOpen,      // after the </think> closing the block the prompt opened
  kHarmony,        // after an optional analysis message (harmony channels)
};

// `body` placed after the reasoning `frame` allows. For harmony a document goes in the
// final channel (its header is added); tool calls (tool_call_grammar) carry their own.
grammar::Grammar after_reasoning(const grammar::Grammar& body, ReasoningFrame frame, bool tool_calls);

// The special tokens a format's grammars spell (the tool-call and channel markers): the
// grammar engine's vocabulary gives these their text, all other special tokens none.
const std::vector<std::string>& syntax_markers(tokenizer::ToolFormat format);

}  // namespace kiln::server
