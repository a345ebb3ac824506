// GBNF (llama.cpp's grammar notation) -> Grammar: the grammar notation structured output
// takes (`structured_outputs.grammar`, llama.cpp's `grammar` field).
//
//   # a comment
//   root   ::= object
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= string ":" ws value
//   ws     ::= [ \t\n]{0,4}
//
// A rule is `name ::= alternatives` (names: letters, digits, '-' and '_'), ending at the end
// of its line unless the next line starts with '|' or the line ends inside parentheses. An
// alternative is a sequence of: "literals" (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH,
// UTF-8), [character classes] and [^negated ones] (regex.h's class syntax: ASCII ranges,
// \d \w \s, escapes; a negated class matches any other UTF-8 character), `.` (any UTF-8
// character), rule names (defined before or after use), ( groups ), each optionally
// followed by * + ? {m} {m,} {m,n}. The start rule is `root`.
//
// Errors (kInvalidArgument) name the line and column: a syntax error, a rule used but not
// defined, a rule defined twice, no `root`, a count above 10,000.
#pragma once

#include <string_view>

#include "core/status.h"
#include "grammar/grammar.h"

namespace kiln::grammar {

Result<Grammar> gbnf_to_grammar(std::string_view text);

}  // namespace kiln::grammar
