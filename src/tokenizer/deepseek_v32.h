// DeepSeek-V3.2's prompt format. The checkpoint ships no Jinja chat template but a Python
// encoder (deepseek_files/encoding/encoding_dsv32.py in the model repository, also in HF
// transformers' models/deepseek_v32); render_deepseek_v32 renders what its
// encode_messages(messages, thinking_mode, drop_thinking=True, add_default_bos_token=True)
// returns, byte for byte (tests/data/parsers/dsv32_*: its own test vectors).
//
//   <｜begin▁of▁sentence｜>SYSTEM[\n\n## Tools ... <functions>\n{fn json}\n...</functions>\n]
//   <｜User｜>TEXT<｜Assistant｜></think>           chat mode (or every user turn but the last)
//   <｜User｜>TEXT<｜Assistant｜><think>            thinking mode, last user turn
//   [REASONING</think>]TEXT[\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="F">\n
//     <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n...
//     </｜DSML｜invoke>\n</｜DSML｜function_calls>]<｜end▁of▁sentence｜>
//   \n\n<function_results>\n<result>OUT</result>...\n</function_results>\n\n<think> | </think>
//
// Reasoning of an assistant turn is rendered only after the last user turn, in thinking
// mode. A "developer" message is a user turn whose text is prefixed with the tools and
// "# The user's message is: "; in thinking mode one before the last user turn is dropped
// (the encoder's drop_thinking_messages does so).
//
// Where the encoder needs input an OpenAI request does not carry, this decides:
//   - tools (the request's `tools`) go on the first message when it is a system message
//     without tools of its own (as the reference test does), else on a system message
//     inserted first (as vLLM does);
//   - the mode is thinking when kwargs `thinking` or `enable_thinking` is true, else chat
//     (vLLM's default);
//   - tool call arguments may be an object or a JSON string holding one;
//   - content null renders as "" (the encoder formats Python's None for user and tool
//     messages, a Python accident, not part of the format).
// Errors (kInvalidArgument): what the encoder asserts (a tool message without a preceding
// assistant tool call to answer, a developer message without content, an assistant turn
// after the last user turn in thinking mode with neither reasoning nor tool calls), an
// unknown role, arguments that are not a JSON object.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace kiln::tokenizer {

struct DeepSeekV32Options {
  bool thinking = false;               // thinking_mode "thinking" (else "chat")
  bool add_bos = true;                 // add_default_bos_token
  bool drop_thinking = true;           // drop_thinking (only acts in thinking mode)
};

// `messages`: OpenAI chat messages (a message may carry its own "tools" and
// "response_format", as the encoder reads them). `tools`: the request's OpenAI tools.
Result<std::string> render_deepseek_v32(const nlohmann::ordered_json& messages,
                                        const nlohmann::ordered_json& tools,
                                        const DeepSeekV32Options& options);

// The options from chat_template_kwargs (`thinking` / `enable_thinking`).
DeepSeekV32Options deepseek_v32_options(const nlohmann::ordered_json& kwargs);

}  // namespace kiln::tokenizer
