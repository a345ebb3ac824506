// GBNF -> Grammar: llama.cpp's JSON grammar (its grammars/json.gbnf, as published) accepts
// JSON and rejects what is not; the notation's pieces (comments, multi-line alternations,
// groups, counts, escapes, classes, '.') each against strings in and out of the language;
// errors name the line and column.
#include "grammar/gbnf.h"

#include <gtest/gtest.h>

#include "grammar/matcher.h"

namespace kiln::grammar {
namespace {

bool matches(const Grammar& g, std::string_view s) {
  auto cg = CompiledGrammar::compile(g);
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  Matcher m(*cg);
  return m.accept(s) && m.is_complete();
}

Grammar parse(std::string_view text) {
  auto g = gbnf_to_grammar(text);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? std::move(g).value() : Grammar{};
}

// llama.cpp's grammars/json.gbnf.
const char* const kJson = R"G(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)G";

TEST(Gbnf, LlamaCppsJsonGrammar) {
  const Grammar g = parse(kJson);
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5, -3e7, "x\n\u00e9"], "b": {"c": null, "d": true}})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, "{\n  \"k\": \"v\"\n}"));
  EXPECT_FALSE(matches(g, "[1, 2]")) << "root is an object";
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
  EXPECT_FALSE(matches(g, R"({"a": "tab	inside"})")) << "raw control characters";
  EXPECT_FALSE(matches(g, R"({"a": 1,})"));
  EXPECT_FALSE(matches(g, R"({"a": "\q"})"));
}

TEST(Gbnf, NotationPieces) {
  const Grammar g = parse(R"G(
# dates and a choice, over several lines
root ::= date " " weekday ( " " note )?
  | "never"
date ::= [0-9]{4} "-" [0-1] [0-9] "-" [0-3] [0-9]
weekday ::= "Mon" | "Tue"
  | "Wed"
note ::= "(" [a-z ]+ ")" | "\u00e9t\u00e9" | "\x41" .
)G");
  EXPECT_TRUE(matches(g, "2026-11-28 Wed"));
  EXPECT_TRUE(matches(g, "2026-11-28 Mon (a note)"));
  EXPECT_TRUE(matches(g, "never"));
  EXPECT_TRUE(matches(g, "1999-01-01 Tue été"));
  EXPECT_TRUE(matches(g, "1999-01-01 Tue A\xe2\x82\xac")) << "'.' is one UTF-8 character";
  EXPECT_FALSE(matches(g, "1999-01-01 Tue Ab c"));
  EXPECT_FALSE(matches(g, "2026-11-28 Thu"));
  EXPECT_FALSE(matches(g, "2026-11-28 Mon ()")) << "+ needs one";
  EXPECT_FALSE(matches(g, "226-11-28 Mon"));
  const Grammar counts = parse(R"G(root ::= "a"{2,3} "b"{2} "c"{1,} "d"?)G");
  EXPECT_TRUE(matches(counts, "aabbc"));
  EXPECT_TRUE(matches(counts, "aaabbcccd"));
  EXPECT_FALSE(matches(counts, "abbc"));
  EXPECT_FALSE(matches(counts, "aaaabbc"));
  EXPECT_FALSE(matches(counts, "aabbbc"));
  EXPECT_FALSE(matches(counts, "aabb"));
  // A rule used before it is defined, recursion.
  const Grammar nested = parse("root ::= list\nlist ::= \"(\" ( list )* \")\"");
  EXPECT_TRUE(matches(nested, "(()(()))"));
  EXPECT_FALSE(matches(nested, "(()"));
}

TEST(Gbnf, ErrorsNameTheLineAndColumn) {
  const auto message = [](std::string_view text) {
    auto g = gbnf_to_grammar(text);
    return g.ok() ? std::string("ok") : g.status().message();
  };
  EXPECT_NE(message("root ::= item\n").find("rule 'item' is used but never defined"), std::string::npos);
  EXPECT_NE(message("root ::= item\n").find("line 1, column 10"), std::string::npos) << message("root ::= item\n");
  EXPECT_NE(message("start ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"\nroot ::= \"b\"").find("line 2, column 1: rule 'root' is defined twice"),
            std::string::npos)
      << message("root ::= \"a\"\nroot ::= \"b\"");
  EXPECT_NE(message("root ::= \"abc").find("unterminated string"), std::string::npos);
  EXPECT_NE(message("root ::= (\"a\"").find("unbalanced '('"), std::string::npos);
  EXPECT_NE(message("root = \"a\"").find("expected '::='"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"{20000}").find("a count above 10000"), std::string::npos);
  EXPECT_NE(message("root ::= [a-z").find("unterminated character class"), std::string::npos);
  EXPECT_NE(message("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\" ;").find("line 1, column 14: unexpected character ';'"), std::string::npos)
      << message("root ::= \"a\" ;");
  // Bounds (grammar.h): groups 128 deep, 250,000 rules.
  const auto nested = [](int levels) {
    return "root ::= " + std::string(size_t(levels), '(') + "\"a\"" + std::string(size_t(levels), ')');
  };
  EXPECT_EQ(message(nested(128)), "ok");
  EXPECT_EQ(message(nested(100000)), "GBNF grammar at line 1, column 138: groups nested deeper than 128");
  std::string counts = "root ::=";
  for (int i = 0; i < 30; ++i) counts += " \"a\"{0,10000}";
  EXPECT_NE(message(counts).find("the grammar is too large: more than 250000 rules"), std::string::npos)
      << message(counts);
  // A counted body of many elements is a rule of its own, not a copy a count (1,000 bytes
  // x 10,000 counts was 10 million elements).
  auto long_body = gbnf_to_grammar("root ::= \"" + std::string(1000, 'a') + "\"{10000}");
  ASSERT_TRUE(long_body.ok()) << long_body.status().message();
  EXPECT_LT(long_body->n_elements(), 40000u);
  auto counted = gbnf_to_grammar("root ::= \"ab\"{2,3} \"ab\"{2,}");
  ASSERT_TRUE(counted.ok()) << counted.status().message();
  for (int n = 0; n <= 8; ++n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += "ab";
    EXPECT_EQ(matches(*counted, s), n >= 4) << s;
  }
  EXPECT_FALSE(matches(*counted, "ababa"));
}

// Grammars built apart and embedded (each tool's arguments) share one budget.
TEST(Gbnf, EmbeddedGrammarsShareTheBudget) {
  std::string text = "root ::=";
  for (int i = 0; i < 12; ++i) text += " \"a\"{0,10000}";  // 120,000+ rules
  auto part = gbnf_to_grammar(text);
  ASSERT_TRUE(part.ok()) << part.status().message();
  Grammar all;
  std::vector<Sequence> alts;
  for (int i = 0; i < 3; ++i) alts.push_back({all.embed(*part)});
  all.set_start(all.add_rule("root", std::move(alts)));
  EXPECT_TRUE(all.too_large());
  EXPECT_LE(all.rules().size(), kMaxRules + 2);  // the third copy was never made
  EXPECT_NE(all.validate().message().find("the grammar is too large"), std::string::npos);
}

}  // namespace
}  // namespace kiln::grammar
