// Jinja parser: a port of @huggingface/jinja 0.5.11 src/parser.ts (same grammar, same
// operator precedence, same error messages).
#pragma once

#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace kiln::jinja {

// Nesting deeper than this (blocks inside blocks, parentheses inside parentheses) is an
// error rather than a deep recursion: each parenthesis level counts 2, so about 500
// levels parse (the reference's own JavaScript stack gives out somewhat later).
inline constexpr int kMaxParseDepth = 1024;

// Returns the kProgram node. Throws JinjaError (kSyntax / kUnsupported) with the source
// offset of the offending token. `source_size` is the offset reported at end of input.
NodePtr parse(const std::vector<Token>& tokens, uint32_t source_size);

}  // namespace kiln::jinja
