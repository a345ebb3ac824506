// The Jinja lexer: @huggingface/jinja's preprocessing (trim_blocks, lstrip_blocks,
// generation markers) with a map back to source offsets, and its tokens.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_lexer.h"

namespace kiln::jinja {
namespace {

std::string types(const std::vector<Token>& tokens) {
  std::string out;
  for (const Token& t : tokens) out += std::string(out.empty() ? "" : " ") + token_type_name(t.type);
  return out;
}

TEST(JinjaLexer, PreprocessDropsOneTrailingNewline) {
  EXPECT_EQ(preprocess("abc\n").text, "abc");
  EXPECT_EQ(preprocess("abc\n\n").text, "abc\n");
  EXPECT_EQ(preprocess("abc\r\n").text, "abc\r");
}

TEST(JinjaLexer, PreprocessTrimAndLstripBlocks) {
  EXPECT_EQ(preprocess("  {% if x %}\nA\n\t{%- endif %}\nB").text, "{% if x %}A\n{%- endif %}B");
  // Only the newline after a block is trimmed, never \r\n as a whole.
  EXPECT_EQ(preprocess("{% if x %}\r\nA").text, "{% if x %}\r\nA");
  // lstrip_blocks starts a line after \r too, and leaves expressions alone.
  EXPECT_EQ(preprocess("a\r  {% x %}\n  {{ y }}").text, "a\r{% x %}  {{ y }}");
  EXPECT_EQ(preprocess("text -}\nnext").text, "text -}next");
}

TEST(JinjaLexer, PreprocessRemovesGenerationMarkers) {
  EXPECT_EQ(preprocess("a \n{% generation %}\n b {% endgeneration %} c").text, "a \n b  c");
  EXPECT_EQ(preprocess("a  {%- generation -%}  b").text, "ab");
  EXPECT_EQ(preprocess("{% generations %}").text, "{% generations %}");
}

TEST(JinjaLexer, PreprocessMapsOffsetsBackToTheSource) {
  const std::string source = "  {% if x %}\nAB";
  const Preprocessed p = preprocess(source);
  ASSERT_EQ(p.text, "{% if x %}AB");
  ASSERT_EQ(p.origin.size(), p.text.size() + 1);
  EXPECT_EQ(p.origin[0], 2u);                  // '{' after the stripped indent
  EXPECT_EQ(p.origin[p.text.find('A')], 13u);  // after the trimmed newline
  EXPECT_EQ(p.origin.back(), source.size());
}

TEST(JinjaLexer, TokenizesTextTagsAndExpressions) {
  const auto tokens = tokenize("Hi {{ user.name | upper }}!{# c #}{% if a >= 1 %}x{% endif %}");
  EXPECT_EQ(types(tokens),
            "Text OpenExpression Identifier Dot Identifier Pipe Identifier CloseExpression Text Comment "
            "OpenStatement Identifier Identifier ComparisonBinaryOperator NumericLiteral CloseStatement Text "
            "OpenStatement Identifier CloseStatement");
  EXPECT_EQ(tokens[0].value, "Hi ");
  EXPECT_EQ(tokens[9].value, " c ");
  EXPECT_EQ(tokens[2].offset, 6u);
}

TEST(JinjaLexer, MinusIsASignOnlyWhereAnOperandIsExpected) {
  auto tokens = tokenize("{{ a - 1 }}");
  EXPECT_EQ(types(tokens), "OpenExpression Identifier AdditiveBinaryOperator NumericLiteral CloseExpression");
  tokens = tokenize("{{ [-1, - 2.5, -x] }}");
  EXPECT_EQ(tokens[2].value, "-1");
  EXPECT_EQ(tokens[4].type, TokenType::kUnaryOperator);  // "- 2.5": the sign is separate
  EXPECT_EQ(tokens[5].value, "2.5");
  EXPECT_EQ(tokens[7].type, TokenType::kUnaryOperator);
}

TEST(JinjaLexer, WhitespaceControlStripsText) {
  auto tokens = tokenize("a \n {%- if x -%} \n b{{- y -}} c");
  ASSERT_EQ(tokens[0].type, TokenType::kText);
  EXPECT_EQ(tokens[0].value, "a");
  EXPECT_EQ(tokens[5].value, "b");
  EXPECT_EQ(tokens.back().value, "c");
  // Unicode whitespace counts (JavaScript's \s).
  tokens = tokenize("a\u3000{%- if x %}");
  EXPECT_EQ(tokens[0].value, "a");
}

TEST(JinjaLexer, StringEscapes) {
  const auto tokens = tokenize(R"({{ 'a\n\t\\\'\x41\u00e9\ud83d\ude00' }})");
  EXPECT_EQ(tokens[1].value, "a\n\t\\'A\u00e9\U0001F600");
  // A lone surrogate stays one (WTF-8) until output.
  EXPECT_EQ(tokenize(R"({{ '\ud83dx' }})")[1].value, "\xED\xA0\xBDx");
}

TEST(JinjaLexer, NestedDictLiteralKeepsClosingBraces) {
  EXPECT_EQ(types(tokenize("{{ {'a': {'b': 1}} }}")),
            "OpenExpression OpenCurlyBracket StringLiteral Colon OpenCurlyBracket StringLiteral Colon "
            "NumericLiteral CloseCurlyBracket CloseCurlyBracket CloseExpression");
}

TEST(JinjaLexer, ErrorsCarryTheSourceOffset) {
  try {
    tokenize("line\n{{ 'open");
    FAIL() << "expected an error";
  } catch (const JinjaError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kSyntax);
    EXPECT_EQ(e.message(), "Unexpected end of input");
    EXPECT_EQ(e.offset(), 13);
  }
  try {
    tokenize("{{ a ? b }}");
    FAIL() << "expected an error";
  } catch (const JinjaError& e) {
    EXPECT_EQ(e.message(), "Unexpected character: ?");
    EXPECT_EQ(e.offset(), 5);
  }
  EXPECT_THROW(tokenize("{{ '\\q' }}"), JinjaError);
  EXPECT_THROW(tokenize("{# no end"), JinjaError);
}

}  // namespace
}  // namespace kiln::jinja
