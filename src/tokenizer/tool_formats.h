// The marker-delimited tool-call formats: markers plus a body parser for BlockToolParser.
#pragma once

#include <nlohmann/json.hpp>

#include "tokenizer/tool_blocks.h"

namespace kiln::tokenizer::detail {

// Qwen3 / Qwen2.5 / Hermes: <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>.
// "parameters" is accepted for "arguments", as is a string holding a JSON object; a call
// without arguments gets {}.
BlockSyntax hermes_syntax();

// GLM-4.5 / 4.6: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>;
// GLM-4.7 drops the newlines. `tools` (OpenAI schemas) types the values, see tool_formats.cpp.
BlockSyntax glm45_syntax(const nlohmann::ordered_json& tools);

// Kimi K2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
// <|tool_call_argument_begin|>{json}<|tool_call_end|>...<|tool_calls_section_end|>.
// The id is the model's own "functions.NAME:IDX" (Kimi's template renders it back).
BlockSyntax kimi_k2_syntax();

// DeepSeek-V3 / R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
// ```json\n{json}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>; V3.1:
// <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>. One parser takes both.
BlockSyntax deepseek_v3_syntax();

// DeepSeek-V3.2 ("DSML", after a blank line): <｜DSML｜function_calls>
// <｜DSML｜invoke name="NAME"><｜DSML｜parameter name="K" string="true">V</｜DSML｜parameter>...
// </｜DSML｜invoke>...</｜DSML｜function_calls>, newlines between the tags. A value with
// string="true" is the raw text; string="false" is JSON (the raw text where it does not
// parse). A parameter without the attribute is JSON if it parses, else text.
BlockSyntax dsml_syntax();

}  // namespace kiln::tokenizer::detail
