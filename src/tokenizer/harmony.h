// Harmony, the GPT-OSS prompt format: render_harmony turns an OpenAI-style conversation
// into the prompt text exactly as the chat_template.jinja shipped with openai/gpt-oss-20b
// and -120b renders it (HF transformers: trim_blocks, lstrip_blocks, tojson =
// json.dumps(ensure_ascii=False)). The output parser for the model's replies is
// parser_harmony.h (ToolFormat::kHarmony).
//
// Where the template and the openai/harmony library disagree, this follows the template,
// since that is what the checkpoints ship and what other engines render:
//   - an assistant tool call is "<|start|>assistant to=functions.NAME<|channel|>commentary
//     json<|message|>ARGS<|call|>" (harmony: "<|start|>assistant<|channel|>commentary
//     to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>");
//   - a tool result's content goes through tojson, so a string result is rendered quoted
//     and escaped (harmony: the raw text);
//   - object-typed parameters render as the template's macro does, with its stray
//     "\n" + 16 spaces before each property type.
//   - only the first tool call of an assistant message is rendered (the template assumes
//     one call per message).
//
// Where the template would raise on input an OpenAI client sends routinely, this renders
// instead (each noted where it happens in harmony.cpp): content or thinking null, tool_calls
// null or empty (= absent), content given as a list of text parts (joined), a tool
// without description (no comment line), arguments given as a JSON string (parsed first,
// as vLLM does, else rendered as the string), a non-string default next to an enum.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::tokenizer {

struct HarmonyConversation {
  // OpenAI chat messages. A first system or developer message becomes the developer
  // "# Instructions"; later ones are dropped (as the template does). Assistant reasoning
  // goes in "thinking"; it is rendered only where the template keeps it (before a tool
  // call with no later final answer, or a last assistant turn without generation prompt).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // OpenAI tools: [{"type": "function", "function": {"name", "description", "parameters"}}].
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  std::string model_identity = "You are ChatGPT, a large language model trained by OpenAI.";
  std::string reasoning_effort = "medium";  // low | medium | high
  std::string current_date;                 // "YYYY-MM-DD"; empty: today (local time)
  std::vector<std::string> builtin_tools;   // "browser", "python"
  bool add_generation_prompt = true;        // end with "<|start|>assistant"
};

// Reads {"messages", "tools", "model_identity", "reasoning_effort", "current_date",
// "builtin_tools", "add_generation_prompt"} (the template's inputs and kwargs; the date is
// what its strftime_now("%Y-%m-%d") returns). Missing keys keep their defaults.
Result<HarmonyConversation> harmony_conversation_from_json(const nlohmann::ordered_json& input);

// Errors: what the template raises (a tool message with no tool call before it, channel
// tags inside content or thinking, both content and thinking next to a tool call), no
// messages, a tool call or tool without a name.
Result<std::string> render_harmony(const HarmonyConversation& conversation);

// Python's json.dumps(value, ensure_ascii=False): the template's tojson.
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace kiln::tokenizer
