// Regex -> grammar: full-match semantics against hand-checked strings, JSON-string mode
// escaping, and clear errors for what is refused.
#include "grammar/regex.h"

#include <gtest/gtest.h>

#include "grammar/matcher.h"

namespace kiln::grammar {
namespace {

bool full_match(const std::string& pattern, std::string_view s) {
  auto g = regex_to_grammar(pattern);
  EXPECT_TRUE(g.ok()) << pattern << ": " << g.status().to_string();
  if (!g.ok()) return false;
  Matcher m(CompiledGrammar::compile(*g).value());
  return m.accept(s) && m.is_complete();
}

void expect_regex(const std::string& pattern, std::initializer_list<const char*> good, std::initializer_list<const char*> bad) {
  for (const char* s : good) EXPECT_TRUE(full_match(pattern, s)) << pattern << " should match " << s;
  for (const char* s : bad) EXPECT_FALSE(full_match(pattern, s)) << pattern << " should not match " << s;
}

TEST(Regex, LiteralsClassesAndEscapes) {
  expect_regex("abc", {"abc"}, {"ab", "abcd", ""});
  expect_regex("a.c", {"abc", "a c", "aéc"}, {"a\nc", "ac"});
  expect_regex("[a-c0-2_]+", {"a", "c1_", "000"}, {"", "d", "a-"});
  expect_regex("[^a-c]", {"d", "é", "\n"}, {"a", "b", ""});
  expect_regex("\\d\\w\\s\\.", {"1a .", "9_\t."}, {"a1 .", "11 x"});
  expect_regex("[\\d.-]+", {"1.-2"}, {"a"});
  expect_regex("\\D\\W\\S", {"a-b", "é!x"}, {"1-b", "aab", "a- "});
  expect_regex("\\x41\\u00e9\\t", {"Aé\t"}, {"Ae\t"});
  expect_regex("日本+", {"日本", "日本本"}, {"日"});
  expect_regex("a\\+\\(\\)", {"a+()"}, {"a"});
}

TEST(Regex, GroupsAlternationAndQuantifiers) {
  expect_regex("(ab|cd)*e", {"e", "abe", "abcdabe"}, {"ab", "abce"});
  expect_regex("(?:x|y)+?z", {"xz", "xyxz"}, {"z"});
  expect_regex("(?<year>\\d{4})-(?P<m>\\d{2})", {"2024-01"}, {"24-01"});
  expect_regex("a{3}", {"aaa"}, {"aa", "aaaa"});
  expect_regex("a{2,}", {"aa", "aaaaa"}, {"a"});
  expect_regex("a{1,3}b?", {"a", "aaab", "ab"}, {"", "aaaab", "abb"});
  expect_regex("^(foo|bar)$", {"foo", "bar"}, {"foobar"});
  expect_regex("^a|b$", {"a", "b"}, {"ab"});
  expect_regex("x{,2}", {"x{,2}"}, {"xx"});  // not a count: literal braces, as in Python
}

TEST(Regex, JsonStringSearchModeEscapesAndIsUnanchored) {
  auto run = [](const std::string& pattern, std::string_view json_contents) {
    Grammar g;
    auto s = regex_to_sequence(g, pattern, RegexMode::kJsonStringSearch);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    g.set_start(g.add_rule("s", {*s}));
    Matcher m(CompiledGrammar::compile(g).value());
    return m.accept(json_contents) && m.is_complete();
  };
  EXPECT_TRUE(run("^a\"b$", "a\\\"b"));
  EXPECT_FALSE(run("^a\"b$", "a\"b"));
  EXPECT_TRUE(run("^\\n$", "\\n"));
  EXPECT_TRUE(run("^.+$", "x\\\\y"));  // '.' matches a backslash, written escaped
  EXPECT_TRUE(run("b", "abc"));      // unanchored: anything around
  EXPECT_FALSE(run("^b", "abc"));
  EXPECT_TRUE(run("^b", "bc\\u0001"));
}

TEST(Regex, RefusedConstructsHaveClearErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"(a)\\1", "backreferences"},  {"a(?=b)", "lookaround"},        {"(?<!a)b", "lookaround"},
      {"\\bword", "word boundaries"}, {"a^b", "anchors"},              {"a{3,1}", "repetition count"},
      {"a{20000}", "repetition count"}, {"[é]", "non-ASCII"},          {"(ab", "missing ')'"},
      {"ab)", "unbalanced"},         {"*a", "quantifier without"},   {"[ab", "missing ']'"},
      {"a++", "possessive"},         {"\\q", "unknown escape"},
  };
  for (const auto& [pattern, what] : cases) {
    auto g = regex_to_grammar(pattern);
    ASSERT_FALSE(g.ok()) << pattern;
    EXPECT_NE(g.status().message().find(what), std::string::npos) << pattern << ": " << g.status().message();
  }
}

// What a request's pattern may cost (grammar.h): groups nest at most kMaxGroupDepth deep
// (100,000 levels overflowed the server's stack), counted repetitions add at most
// kMaxRules rules, and an error quotes a long pattern by its start.
TEST(Regex, NestingAndSizeAreBounded) {
  const auto nested = [](int levels) { return std::string(size_t(levels), '(') + "a" + std::string(size_t(levels), ')'); };
  EXPECT_TRUE(full_match(nested(kMaxGroupDepth), "a"));
  for (int levels : {kMaxGroupDepth + 1, 100000}) {
    auto g = regex_to_grammar(nested(levels));
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("offset 128: groups nested deeper than 128"), std::string::npos)
        << g.status().message().substr(0, 300);
    EXPECT_LT(g.status().message().size(), 200u);  // the pattern quoted by its first 80 bytes
  }
  std::string many;  // 30 x 10,002 rules
  for (int i = 0; i < 30; ++i) many += "(a{0,10000})";
  auto big = regex_to_grammar(many);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("the grammar is too large: more than 250000 rules"), std::string::npos)
      << big.status().message();
  // Nested counts are not multiplied (a count's body is one rule reference).
  auto deep_counts = regex_to_grammar("((a{10000}){10000}){10000}");
  ASSERT_TRUE(deep_counts.ok()) << deep_counts.status().message();
  EXPECT_LT(deep_counts->rules().size(), 31000u);
  // 100,000 groups of one name get distinct names in linear time (once quadratic: 16 s
  // for 10,000).
  std::string groups;
  for (int i = 0; i < 100000; ++i) groups += "(a)";
  auto g = regex_to_grammar(groups);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->rules().back().name, "regex");
  EXPECT_EQ(g->rules()[g->rules().size() - 2].name, "regex_group_100000");
}

}  // namespace
}  // namespace kiln::grammar
