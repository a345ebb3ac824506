// JSON Schema -> Grammar, for structured output (response_format json_schema, strict tool
// arguments) as OpenAI strict mode and pydantic emit schemas. See README.md for the table of
// what is supported, checked loosely, and refused.
//
// Output form (what the grammar accepts):
//   - Whitespace: none, except at most one space after each ':' and ',' (`{"a": 1, "b": 2}`
//     and `{"a":1,"b":2}` both match). No newlines, no indentation, no space after '{' or
//     '[' or before '}' or ']', none around the document: a constrained reply cannot run on
//     in whitespace.
//   - Object properties in the schema's declared order; optional ones may be left out.
//     Properties not declared: refused unless additionalProperties is true or a schema, or
//     the object declares no properties at all (`{"type": "object"}` = any object).
//   - Strings: valid UTF-8, JSON escapes (\uXXXX surrogates only as valid pairs), no raw
//     control characters. Lengths count characters (an escape is one).
//   - enum / const values in their compact serialization (nlohmann dump, UTF-8 unescaped).
//
// Errors (Status kInvalidArgument, a 400 for the server) name the keyword and its JSON
// pointer: "unsupported JSON schema keyword 'patternProperties' at /properties/a/patternProperties".
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "grammar/grammar.h"

namespace kiln::grammar {

// The schema must be an ordered_json: property order is part of the output form.
Result<Grammar> json_schema_to_grammar(const nlohmann::ordered_json& schema);
// Parses `schema_text` (keeping key order) first; a parse error is an InvalidArgument.
Result<Grammar> json_schema_text_to_grammar(std::string_view schema_text);
// response_format json_object: any JSON object (same whitespace rule).
Grammar json_object_grammar();
// Any JSON value (same whitespace rule); the grammar of the schema `{}` / `true`.
Grammar json_value_grammar();

}  // namespace kiln::grammar
