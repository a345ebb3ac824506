// Jinja lexer: the template preprocessing and tokenizer of @huggingface/jinja 0.5.11
// (src/lexer.ts), with the options its Template uses: lstrip_blocks and trim_blocks on.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja {

enum class TokenType : uint8_t {
  kText,
  kNumericLiteral,
  kStringLiteral,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenSquareBracket,
  kCloseSquareBracket,
  kOpenCurlyBracket,
  kCloseCurlyBracket,
  kComma,
  kDot,
  kColon,
  kPipe,
  kCallOperator,
  kAdditiveBinaryOperator,
  kMultiplicativeBinaryOperator,
  kExponentiationBinaryOperator,
  kComparisonBinaryOperator,
  kUnaryOperator,
  kComment,
};

// The reference's name for a token type ("OpenStatement"), used in error messages.
const char* token_type_name(TokenType t);

struct Token {
  TokenType type;
  std::string value;
  uint32_t offset;  // byte offset of the token in the original template source
};

// The template after the reference's preprocess(): one trailing newline dropped,
// lstrip_blocks (spaces and tabs before "{%", "{#", "{-" at a line start removed),
// trim_blocks (the newline after "%}", "#}", "-}" removed) and {% generation %} /
// {% endgeneration %} markers removed. origin[i] is the source offset of text[i].
struct Preprocessed {
  std::string text;
  std::vector<uint32_t> origin;  // text.size() + 1 entries
};
Preprocessed preprocess(std::string_view source);

// Throws JinjaError (kSyntax) with the reference's message and the source offset.
std::vector<Token> tokenize(std::string_view source);

}  // namespace kiln::jinja
