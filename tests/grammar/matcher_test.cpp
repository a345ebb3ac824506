// The Earley matcher on small hand-written grammars: recursion (left, right, nested),
// empty rules, repetition bounds, all-or-nothing accept, rollback.
#include "grammar/matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace kiln::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> compile(const Grammar& g) {
  auto cg = CompiledGrammar::compile(g);
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  return std::move(cg).value();
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  Matcher m(g);
  return m.accept(s) && m.is_complete();
}

// S ::= "(" S ")" S | <empty>   (balanced parentheses)
std::shared_ptr<const CompiledGrammar> parens() {
  Grammar g;
  uint32_t s = g.add_rule("s");
  g.set_alternatives(s, {Grammar::cat({Grammar::literal("("), {Element::ref(s)}, Grammar::literal(")"),
                                       {Element::ref(s)}}),
                         {}});
  g.set_start(s);
  return compile(g);
}

bool balanced(std::string_view s) {
  int d = 0;
  for (char c : s) {
    d += c == '(' ? 1 : -1;
    if (d < 0) return false;
  }
  return d == 0;
}

TEST(Matcher, BalancedParenthesesAgainstACounter) {
  auto g = parens();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) s += (rng() & 1) ? '(' : ')';
    EXPECT_EQ(matches(g, s), balanced(s)) << s;
  }
}

TEST(Matcher, PrefixesAreAcceptedButNotComplete) {
  auto g = parens();
  Matcher m(g);
  EXPECT_TRUE(m.is_complete());  // the empty string is a sentence
  EXPECT_TRUE(m.accept("(("));
  EXPECT_FALSE(m.is_complete());
  EXPECT_TRUE(m.can_continue());
  EXPECT_FALSE(m.accept("))x"));  // all or nothing: the two ')' are not kept
  EXPECT_EQ(m.n_bytes(), 2u);
  EXPECT_TRUE(m.accept("))"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.accept(")"));
}

TEST(Matcher, LeftRecursiveExpression) {
  // e ::= e "+" t | t ; t ::= t "*" f | f ; f ::= [0-9] | "(" e ")"
  Grammar g;
  uint32_t e = g.add_rule("e"), t = g.add_rule("t"), f = g.add_rule("f");
  g.set_alternatives(e, {{Element::ref(e), Element::byte('+'), Element::ref(t)}, {Element::ref(t)}});
  g.set_alternatives(t, {{Element::ref(t), Element::byte('*'), Element::ref(f)}, {Element::ref(f)}});
  g.set_alternatives(f, {{Element::byte_set(ByteSet::range('0', '9'))},
                         {Element::byte('('), Element::ref(e), Element::byte(')')}});
  g.set_start(e);
  auto cg = compile(g);
  for (const char* ok : {"1", "1+2", "1+2*3", "(1+2)*3", "((4))", "1*2*3+4+5*(6+7)"}) EXPECT_TRUE(matches(cg, ok)) << ok;
  for (const char* bad : {"", "+", "1+", "(1", "1)", "12", "1**2", "()"}) EXPECT_FALSE(matches(cg, bad)) << bad;
}

TEST(Matcher, NullableChainsAndEmptyRules) {
  // s ::= a b c "x" ; a ::= "" | "a" ; b ::= a a ; c ::= b | "c"
  Grammar g;
  uint32_t a = g.add_rule("a", {{}, Grammar::literal("a")});
  uint32_t b = g.add_rule("b", {{Element::ref(a), Element::ref(a)}});
  uint32_t c = g.add_rule("c", {{Element::ref(b)}, Grammar::literal("c")});
  uint32_t s = g.add_rule("s", {{Element::ref(a), Element::ref(b), Element::ref(c), Element::byte('x')}});
  g.set_start(s);
  auto cg = compile(g);
  for (const char* ok : {"x", "ax", "aax", "aaax", "aaaaax", "cx", "aaacx"}) EXPECT_TRUE(matches(cg, ok)) << ok;
  for (const char* bad : {"", "aaaaaax", "ccx", "xa", "acax"}) EXPECT_FALSE(matches(cg, bad)) << bad;
}

TEST(Matcher, RepeatBoundsAndStarPlusOptional) {
  for (uint32_t lo : {0u, 1u, 3u}) {
    for (std::optional<uint32_t> hi : {std::optional<uint32_t>{}, std::optional<uint32_t>{3}, std::optional<uint32_t>{5}}) {
      if (hi && *hi < lo) continue;
      Grammar g;
      Element r = g.repeat("r", Grammar::literal("ab"), lo, hi);
      g.set_start(g.add_rule("s", {{Element::byte('<'), r, Element::byte('>')}}));
      auto cg = compile(g);
      for (uint32_t n = 0; n < 9; ++n) {
        std::string s = "<";
        for (uint32_t i = 0; i < n; ++i) s += "ab";
        s += ">";
        EXPECT_EQ(matches(cg, s), n >= lo && (!hi || n <= *hi)) << s << " {" << lo << "," << hi.value_or(99) << "}";
      }
    }
  }
  Grammar g;
  Element o = g.optional("o", Grammar::literal("-"));
  Element p = g.plus("p", {Element::byte_set(ByteSet::range('0', '9'))});
  Element st = g.star("st", Grammar::literal("_"));
  g.set_start(g.add_rule("s", {{o, p, st}}));
  auto cg = compile(g);
  for (const char* ok : {"1", "-1", "123__", "-0_"}) EXPECT_TRUE(matches(cg, ok)) << ok;
  for (const char* bad : {"-", "_", "--1", "1_2"}) EXPECT_FALSE(matches(cg, bad)) << bad;
  EXPECT_NE(g.to_string().find("s ::="), std::string::npos) << g.to_string();
}

TEST(Matcher, RollbackRestoresEarlierStates) {
  auto g = parens();
  Matcher m(g);
  ASSERT_TRUE(m.accept("("));
  ASSERT_TRUE(m.accept("(("));
  ASSERT_TRUE(m.accept(")"));
  EXPECT_EQ(m.n_accepts(), 3);
  m.rollback(2);
  EXPECT_EQ(m.n_bytes(), 1u);
  EXPECT_TRUE(m.accept(")"));
  EXPECT_TRUE(m.is_complete());
  m.rollback(2);
  EXPECT_EQ(m.n_bytes(), 0u);
  EXPECT_TRUE(m.is_complete());
}

TEST(Matcher, LongInputsKeepSetsSmall) {
  // 100k bytes of a star: the last set's size does not grow with the input.
  Grammar g;
  Element st = g.star("chars", {Element::byte_set(ByteSet::range('a', 'z'))});
  g.set_start(g.add_rule("s", {{Element::byte('"'), st, Element::byte('"')}}));
  auto cg = compile(g);
  Matcher m(cg);
  ASSERT_TRUE(m.accept("\""));
  std::string chunk(1000, 'q');
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(m.accept(chunk));
  EXPECT_FALSE(m.is_complete());
  ASSERT_TRUE(m.accept("\""));
  EXPECT_TRUE(m.is_complete());
}

// text_without(stop) + stop: any text up to the first stop, checked against a search
// for every random string over a small alphabet that makes near-misses likely.
TEST(Matcher, TextWithoutAStopEndsAtItsFirstOccurrence) {
  for (const std::string stop : {"</think>", "<|", "ab"}) {
    Grammar g;
    Element text = g.text_without("text", stop);
    g.set_start(g.add_rule("s", {Grammar::cat({{text}, Grammar::literal(stop), Grammar::literal("!")})}));
    auto cg = compile(g);
    const std::string alphabet = stop + "x<";
    std::mt19937 rng(3);
    for (int trial = 0; trial < 3000; ++trial) {
      std::string s;
      const int n = int(rng() % 14);
      for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
      const size_t first = s.find(stop);
      const bool want = first != std::string::npos && s.substr(first + stop.size()) == "!";
      ASSERT_EQ(matches(cg, s), want) << "stop '" << stop << "', input '" << s << "'";
    }
  }
}

// alternation of kLiteralTrieMin or more literals builds a trie of rules; against the same
// words as one flat rule (add_rule), byte by byte: accepted, complete, the allowed bytes.
// Word sets with an empty word, duplicates, words that are prefixes of others (a chain
// "q", "qq", ... 40 deep: the trie's work list), bytes above 0x7F, and one word alone in
// its branch; then a quoted value around the trie, as an enum compiles.
TEST(Matcher, LiteralAlternationsAsATrieMatchTheFlatRule) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<std::string> words;
    const int n = int(Grammar::kLiteralTrieMin) + int(rng() % 200);
    const std::string alphabet = trial % 3 == 0 ? "ab" : trial % 3 == 1 ? "abcdxyz\x80\xff" : "q";
    for (int i = 0; i < n; ++i) {
      std::string w;
      const int len = trial % 3 == 2 ? 1 + i % 40 : int(rng() % 7);
      for (int k = 0; k < len; ++k) w += alphabet[rng() % alphabet.size()];
      words.push_back(w);
    }
    if (trial % 5 == 0) words.push_back("a very long word alone in its branch");
    std::vector<Sequence> alts;
    for (const std::string& w : words) alts.push_back(Grammar::literal(w));
    Grammar trie, flat;
    trie.set_start(trie.add_rule("top", {Grammar::cat({Grammar::literal("\""), {trie.alternation("enum", alts)},
                                                       Grammar::literal("\"")})}));
    flat.set_start(flat.add_rule(
        "top", {Grammar::cat({Grammar::literal("\""), {Element::ref(flat.add_rule("enum", alts))},
                              Grammar::literal("\"")})}));
    ASSERT_GT(trie.rules().size(), 2u) << "the trie was built";
    auto ct = compile(trie), cf = compile(flat);
    // Every word and every prefix and one-byte extension of a word, byte by byte.
    std::vector<std::string> inputs;
    for (const std::string& w : words) {
      const std::string q = "\"" + w + "\"";
      inputs.push_back(q);
      inputs.push_back(q + "x");
      inputs.push_back("\"" + w + "a\"");
      inputs.push_back("\"" + w.substr(0, w.size() / 2) + "\"");
    }
    for (const std::string& in : inputs) {
      Matcher mt(ct), mf(cf);
      for (size_t i = 0; i < in.size(); ++i) {
        const bool at = mt.accept(in.substr(i, 1)), af = mf.accept(in.substr(i, 1));
        ASSERT_EQ(at, af) << "trial " << trial << ", '" << in << "' at byte " << i;
        if (!af) break;
        ASSERT_EQ(mt.is_complete(), mf.is_complete()) << "'" << in << "' at byte " << i;
        ASSERT_EQ(mt.allowed_bytes(), mf.allowed_bytes()) << "'" << in << "' at byte " << i;
      }
    }
  }
  // Fewer than kLiteralTrieMin literals, or one element that is not a single byte: one rule.
  Grammar g;
  g.alternation("few", {Grammar::literal("a"), Grammar::literal("b")});
  std::vector<Sequence> mixed(Grammar::kLiteralTrieMin, Grammar::literal("ab"));
  mixed.push_back({Element::byte_set(ByteSet::range('a', 'z'))});
  g.alternation("mixed", mixed);
  EXPECT_EQ(g.rules().size(), 2u);
}

TEST(Matcher, EmbeddedGrammarsKeepTheirRules) {
  Grammar inner;  // balanced parentheses, as parens()
  uint32_t s = inner.add_rule("s");
  inner.set_alternatives(s, {Grammar::cat({Grammar::literal("("), {Element::ref(s)}, Grammar::literal(")"),
                                           {Element::ref(s)}}),
                             {}});
  inner.set_start(s);
  Grammar outer;
  outer.add_rule("unrelated", {Grammar::literal("zzz")});  // shifts the embedded rule numbers
  Element e = outer.embed(inner);
  outer.set_start(outer.add_rule("top", {Grammar::cat({Grammar::literal("<"), {e}, Grammar::literal(">")})}));
  auto cg = compile(outer);
  EXPECT_TRUE(matches(cg, "<(()())>"));
  EXPECT_TRUE(matches(cg, "<>"));
  EXPECT_FALSE(matches(cg, "<(()>"));
  EXPECT_FALSE(matches(cg, "<zzz>"));
}

}  // namespace
}  // namespace kiln::grammar
