// Regular expression -> Grammar. The pattern always matches the whole input (kFullMatch)
// or, for a JSON schema "pattern", a JSON string's decoded contents with the schema's
// search semantics (kJsonStringSearch: unanchored ends match any characters).
//
// Supported: literals (UTF-8 included), '.', classes [a-z] [^...] with \d \w \s inside,
// escapes \d \D \w \W \s \S \n \t \r \f \v \0 \xHH \uHHHH and escaped punctuation, groups
// (...) (?:...) (?<name>...) (?P<name>...), alternation, * + ? {m} {m,} {m,n} (lazy '?'
// suffixes accepted: the language is the same), ^ and $ at the ends of a top-level branch.
// Refused with an error: backreferences, lookaround, \b \B, anchors elsewhere, possessive
// quantifiers, non-ASCII ranges in classes, counts above 10000.
//
// '.' and negated classes match any UTF-8 character (not a byte) except those excluded.
// In kJsonStringSearch mode a character that JSON must escape is written escaped ('"' as
// \", '\\' as \\\\, controls as \n \t \r \b \f or \u00XX), exactly one way.
#pragma once

#include <string_view>

#include "core/status.h"
#include "grammar/grammar.h"

namespace kiln::grammar {

enum class RegexMode { kFullMatch, kJsonStringSearch };

// Adds the rules for `pattern` to `g`; returns the sequence that matches it.
Result<Sequence> regex_to_sequence(Grammar& g, std::string_view pattern, RegexMode mode);
// A grammar whose sentences are exactly the strings `pattern` matches in full.
Result<Grammar> regex_to_grammar(std::string_view pattern);

}  // namespace kiln::grammar
