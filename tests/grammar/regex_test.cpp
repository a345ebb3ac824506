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

}  // namespace
}  // namespace kiln::grammar
