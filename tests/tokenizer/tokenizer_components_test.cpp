// Unit tests of the tokenizer.json components on their own: normalizers, the Split
// pre-tokenizer behaviours, regex translation, the byte-level alphabet, decoders and the BPE
// merge loop. Expected values follow the Rust tokenizers crate (its own unit tests where
// they exist).
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace kiln::tokenizer::hf {
namespace {

using json = nlohmann::json;
using Strings = std::vector<std::string>;

std::string normalize(const json& config, std::string text) {
  auto n = make_normalizer(config);
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  (*n)->normalize(text);
  return text;
}

std::string decode(const json& config, Strings tokens) {
  auto d = make_decoder(config);
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  (*d)->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

Strings split(const Pattern& p, SplitBehavior b, std::string_view text, bool invert = false) {
  return split_for_test(p, b, invert, text);
}

Pattern regex(std::string_view pattern) {
  auto p = Pattern::regex(pattern);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return *p;
}

TEST(TokenizerNormalizer, UnicodeFormsComposeAndDecompose) {
  EXPECT_EQ(normalize({{"type", "NFC"}}, "e\u0301t\u00e9"), "\u00e9t\u00e9");
  EXPECT_EQ(normalize({{"type", "NFD"}}, "\u00e9"), "e\u0301");
  EXPECT_EQ(normalize({{"type", "NFKC"}}, "\ufb01 \u2460 \uff21"), "fi 1 A");
  EXPECT_EQ(normalize({{"type", "NFKD"}}, "\u1e9b\u0323"), "s\u0323\u0307");
  // Canonical reordering of combining marks and Hangul composition.
  EXPECT_EQ(normalize({{"type", "NFC"}}, "a\u0301\u0323"), "\u1ea1\u0301");
  EXPECT_EQ(normalize({{"type", "NFC"}}, "\u1100\u1161\u11a8"), "\uac01");
  EXPECT_EQ(normalize({{"type", "NFC"}}, "\uac00\u11a8"), "\uac01");
}

// unicode_normalize cuts the text before characters that cannot interact with what precedes
// them; it must agree with normalizing the whole string at once.
TEST(TokenizerNormalizer, PiecewiseNormalizationEqualsWholeString) {
  const std::vector<uint32_t> alphabet = {
      'a', 'e', 'o', ' ', '\n', 0xe9, 0x301, 0x323, 0x308, 0x30a, 0x327, 0x4e2d, 0x3042,
      0x304b, 0x3099, 0x30ab, 0xac00, 0x1100, 0x1161, 0x11a8, 0x439, 0x418, 0x306, 0x627,
      0x653, 0x654, 0x915, 0x93c, 0x93e, 0x94d, 0x2014, 0x212b, 0x2126, 0x1f600, 0x1f3fd,
      0x200d, 0xfe0f, 0xfb01, 0x2460, 0x0f73, 0x0374, 0x037e, 0xa0, 0x17f, 0x1e9b};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 4000; ++trial) {
    std::string s;
    const int n = int(rng() % 12);
    for (int k = 0; k < n; ++k) utf8_append(s, alphabet[rng() % alphabet.size()]);
    for (NormForm f : {NormForm::kNFC, NormForm::kNFD, NormForm::kNFKC, NormForm::kNFKD}) {
      ASSERT_EQ(unicode_normalize(s, f), unicode_normalize_whole(s, f))
          << "form " << int(f) << " text " << json(s).dump();
    }
  }
}

TEST(TokenizerNormalizer, ReplacePrependStripLowercaseSequence) {
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}},
                      " a  b "),
            "\u2581a\u2581\u2581b\u2581");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}},
                      "a \t\n b\u3000c"),
            "a b c");
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "\u2581"}}, "x"), "\u2581x");
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "\u2581"}}, ""), "");  // Rust: not on empty
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                      "\u3000 \tab c\u0085\n"),
            "ab c");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}, "  a  "),
            "  a");
  EXPECT_EQ(normalize({{"type", "Lowercase"}}, "HeLLo \u00c9\u0130"), "hello \u00e9i\u0307");
  EXPECT_EQ(normalize({{"type", "Sequence"},
                       {"normalizers",
                        {{{"type", "NFC"}},
                         {{"type", "Replace"}, {"pattern", {{"String", "\u00e9"}}}, {"content", "E"}}}}},
                      "e\u0301!"),
            "E!");
  EXPECT_EQ(normalize({{"type", "Sequence"}, {"normalizers", json::array()}}, "same"), "same");
}

TEST(TokenizerPreTokenizer, SplitBehaviours) {
  const Pattern dash = Pattern::literal("-");
  const std::string text = "The-final--countdown";
  EXPECT_EQ(split(dash, SplitBehavior::kRemoved, text), (Strings{"The", "final", "countdown"}));
  EXPECT_EQ(split(dash, SplitBehavior::kIsolated, text),
            (Strings{"The", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split(dash, SplitBehavior::kMergedWithPrevious, text),
            (Strings{"The-", "final-", "-", "countdown"}));
  EXPECT_EQ(split(dash, SplitBehavior::kMergedWithNext, text),
            (Strings{"The", "-final", "-", "-countdown"}));
  EXPECT_EQ(split(dash, SplitBehavior::kContiguous, text),
            (Strings{"The", "-", "final", "--", "countdown"}));
  // invert: the pattern describes the pieces to keep.
  EXPECT_EQ(split(regex("\\w+"), SplitBehavior::kRemoved, "hi, you!", true),
            (Strings{"hi", "you"}));
  EXPECT_EQ(split(dash, SplitBehavior::kIsolated, ""), Strings{});
  EXPECT_EQ(split(Pattern::literal(""), SplitBehavior::kIsolated, "abc"), Strings{"abc"});
}

TEST(TokenizerPreTokenizer, LlamaRegexWithUnicodeClassesCaseInsensitiveAndLookahead) {
  const Pattern p = regex(
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  EXPECT_EQ(split(p, SplitBehavior::kIsolated, "Hello   world"),
            (Strings{"Hello", "  ", " world"}));
  EXPECT_EQ(split(p, SplitBehavior::kIsolated, "I'M here, we'LL go"),
            (Strings{"I", "'M", " here", ",", " we", "'LL", " go"}));
  EXPECT_EQ(split(p, SplitBehavior::kIsolated, "1234567 x\r\n\r\n  y"),
            (Strings{"123", "456", "7", " x", "\r\n\r\n", " ", " y"}));
  EXPECT_EQ(split(p, SplitBehavior::kIsolated, "na\u00efve \u4e2d\u6587!!"),
            (Strings{"na\u00efve", " \u4e2d\u6587", "!!"}));
  EXPECT_EQ(split(p, SplitBehavior::kIsolated, "trailing  "), (Strings{"trailing", "  "}));
}

// Oniguruma (what the Rust tokenizers run) and PCRE2 disagree on a few escapes.
TEST(TokenizerRegex, OnigurumaEscapesKeepTheirMeaning) {
  EXPECT_EQ(onig_to_pcre2("\\s+(?!\\S)"), "[\\t-\\r\\x{85}\\p{Z}]+(?![^\\t-\\r\\x{85}\\p{Z}])");
  EXPECT_EQ(onig_to_pcre2("[^\\s\\p{L}]"), "[^\\t-\\r\\x{85}\\p{Z}\\p{L}]");
  EXPECT_EQ(onig_to_pcre2("[\\]\\s]"), "[\\]\\t-\\r\\x{85}\\p{Z}]");
  EXPECT_EQ(onig_to_pcre2("\\h+"), "[0-9a-fA-F]+");
  EXPECT_EQ(onig_to_pcre2("[[:alpha:]\\d]"), "[[:alpha:]\\d]");
  const Pattern ws = regex("\\s");
  MatchScratch m;
  size_t b = 0, e = 0;
  EXPECT_TRUE(ws.find("\u0085", 0, m, &b, &e));   // NEL is White_Space
  EXPECT_TRUE(ws.find("\u3000", 0, m, &b, &e));
  EXPECT_FALSE(ws.find("\u180e", 0, m, &b, &e));  // PCRE2's \s would take it
  EXPECT_FALSE(ws.find("\ufeff", 0, m, &b, &e));  // JS's \s would take it
  const Pattern ci = regex("(?i:'s)");
  EXPECT_TRUE(ci.find("'S", 0, m, &b, &e));
  EXPECT_TRUE(ci.find("'\u017f", 0, m, &b, &e));  // Unicode case folding, as in Oniguruma
  EXPECT_FALSE(Pattern::regex("(unclosed").ok());
}

TEST(TokenizerRegex, EmptyMatchesAdvanceLikeOniguruma) {
  const Pattern p = regex("x*");
  std::vector<std::pair<size_t, size_t>> got;
  MatchScratch m;
  p.for_each_match("axxb", m, [&](size_t b, size_t e) { got.emplace_back(b, e); });
  // (0,0) empty before 'a', then "xx", then the empty match at 3 is skipped (it follows the
  // previous match directly), then empty at 4.
  EXPECT_EQ(got, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 3}, {4, 4}}));
}

TEST(TokenizerByteLevel, AlphabetMapsEveryByteToADistinctPrintableCharacter) {
  const ByteLevelAlphabet& a = ByteLevelAlphabet::get();
  EXPECT_EQ(a.byte_to_utf8[' '], "\u0120");   // Ġ
  EXPECT_EQ(a.byte_to_utf8['\n'], "\u010a");  // Ċ
  EXPECT_EQ(a.byte_to_utf8['a'], "a");
  EXPECT_EQ(a.byte_to_utf8[0xAD], "\u0143");
  EXPECT_EQ(a.byte_to_utf8[0xE4], "\u00e4");
  for (int b = 0; b < 256; ++b) {
    size_t i = 0;
    EXPECT_EQ(a.byte_of(utf8_next(a.byte_to_utf8[size_t(b)], i)), b);
  }
}

TEST(TokenizerPreTokenizer, ByteLevelMapsBytesAndOptionallySplits) {
  auto pt = make_pre_tokenizer(
      {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}});
  ASSERT_TRUE(pt.ok()) << pt.status().to_string();
  Pieces p;
  p.reset("Hello w\u00f6rld");
  PreTokenizeScratch s;
  (*pt)->pre_tokenize(p, s);
  ASSERT_EQ(p.spans.size(), 2u);
  EXPECT_EQ(p.at(0), "\u0120Hello");
  EXPECT_EQ(p.at(1), "\u0120w\u00c3\u00b6rld");
}

TEST(TokenizerDecoder, ByteFallbackRunsAndInvalidBytes) {
  const json bf = {{"type", "ByteFallback"}};
  EXPECT_EQ(decode(bf, {"a", "<0xE4>", "<0xB8>", "<0xAD>", "b"}), "a\u4e2db");
  // An invalid run becomes one U+FFFD per byte (Rust), even its valid prefix.
  EXPECT_EQ(decode(bf, {"<0x61>", "<0xE4>", "x"}), "\ufffd\ufffdx");
  EXPECT_EQ(decode(bf, {"<0xFF>"}), "\ufffd");
  EXPECT_EQ(decode(bf, {"<0x4g>", "<0x41"}), "<0x4g><0x41");
}

TEST(TokenizerDecoder, GemmaChainAndStrip) {
  const json gemma = {{"type", "Sequence"},
                      {"decoders",
                       {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                        {{"type", "ByteFallback"}},
                        {{"type", "Fuse"}}}}};
  EXPECT_EQ(decode(gemma, {"\u2581Hello", "\u2581\u2581wor", "ld", "<0xF0>", "<0x9F>", "<0x98>",
                           "<0x80>"}),
            " Hello  world\U0001F600");
  const json strip = {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 2}};
  EXPECT_EQ(decode(strip, {"  a  ", " b", "c ", "   "}), " a" "b" "c" "");
  const json llama2 = {{"type", "Sequence"},
                       {"decoders",
                        {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                         {{"type", "Fuse"}},
                         {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  EXPECT_EQ(decode(llama2, {"\u2581Hi", "\u2581there"}), "Hi there");
}

TEST(TokenizerDecoder, ByteLevelUsesRawBytesForTokensOutsideTheAlphabet) {
  const json bl = {{"type", "ByteLevel"}};
  EXPECT_EQ(decode(bl, {"Hello", "\u0120w\u00c3\u00b6rld"}), "Hello w\u00f6rld");
  EXPECT_EQ(decode(bl, {"<\uff5cUser\uff5c>", "\u0120hi"}), "<\uff5cUser\uff5c> hi");
  EXPECT_EQ(decode(bl, {"\u00e4", "\u00b8"}), "\ufffd");  // E4 B8: incomplete -> one U+FFFD
  EXPECT_EQ(decode(bl, {"\u00e4", "a"}), "\ufffda");
}

json tiny_bpe(const std::vector<std::string>& tokens, const json& merges) {
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
}

TEST(TokenizerBpe, LowestRankMergesFirstAndTiesGoLeft) {
  auto bpe = Bpe::from_json(tiny_bpe({"a", "b", "c", "aa", "ab", "bc", "abc", "aaa"},
                                     {"a b", "b c", "a a", "ab c", "aa a"}));
  ASSERT_TRUE(bpe.ok()) << bpe.status().to_string();
  auto ids = [&](std::string_view w) {
    std::vector<int32_t> out;
    (*bpe)->encode_word(w, out);
    return out;
  };
  EXPECT_EQ(ids("abc"), (std::vector<int32_t>{6}));     // a b -> ab, then ab c -> abc
  EXPECT_EQ(ids("aaa"), (std::vector<int32_t>{7}));     // a a at 0 (leftmost tie), then aa a
  EXPECT_EQ(ids("aaaa"), (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(ids("bca"), (std::vector<int32_t>{5, 0}));
}

TEST(TokenizerBpe, HeapAndRankArrayMergeLoopsAgree) {
  const std::vector<std::string> tokens = {"a", "b", "c", "ab", "ba", "bc", "ca", "aa", "abc",
                                           "bab", "aab", "cab", "abab", "bcab"};
  auto bpe = Bpe::from_json(tiny_bpe(
      tokens, {"a b", "b a", "b c", "c a", "a a", "ab c", "b ab", "a ab", "c ab", "ab ab",
               "bc ab"}));
  ASSERT_TRUE(bpe.ok()) << bpe.status().to_string();
  std::mt19937 rng(3);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string w;
    const size_t n = 1 + rng() % 150;  // both sides of the 64-symbol switch
    for (size_t k = 0; k < n; ++k) w.push_back("abc"[rng() % 3]);
    ASSERT_EQ((*bpe)->merge_word_for_test(w, false), (*bpe)->merge_word_for_test(w, true)) << w;
  }
}

TEST(TokenizerBpe, ByteFallbackUnkAndFuseUnk) {
  json m = tiny_bpe({"<unk>", "a", "<0xC3>", "<0xA9>"}, json::array());
  m["unk_token"] = "<unk>";
  m["byte_fallback"] = true;
  auto bf = Bpe::from_json(m);
  ASSERT_TRUE(bf.ok());
  std::vector<int32_t> out;
  (*bf)->encode_word("a\u00e9\u00e8a", out);  // é has byte tokens, è (C3 A8) does not
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 0, 1}));
  m["byte_fallback"] = false;
  m["fuse_unk"] = true;
  auto fused = Bpe::from_json(m);
  ASSERT_TRUE(fused.ok());
  out.clear();
  (*fused)->encode_word("a\u00e9\u00e8a\u00e8", out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 0, 1, 0}));
  m["fuse_unk"] = false;
  auto unfused = Bpe::from_json(m);
  out.clear();
  (*unfused)->encode_word("\u00e9\u00e8", out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 0}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  // "abc" is in the vocabulary but no merge builds it.
  json m = tiny_bpe({"a", "b", "c", "ab", "abc"}, {"a b"});
  auto plain = Bpe::from_json(m);
  std::vector<int32_t> out;
  (*plain)->encode_word("abc", out);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 2}));
  m["ignore_merges"] = true;
  auto ignoring = Bpe::from_json(m);
  out.clear();
  (*ignoring)->encode_word("abc", out);
  EXPECT_EQ(out, (std::vector<int32_t>{4}));
}

TEST(TokenizerBpe, MergesAsPairsAndContinuingSubwordPrefix) {
  json m = tiny_bpe({"a", "##b", "##c", "a##b", "ab", "##bc"}, json::array({{"a", "##b"}}));
  m["continuing_subword_prefix"] = "##";
  auto bpe = Bpe::from_json(m);
  ASSERT_TRUE(bpe.ok()) << bpe.status().to_string();
  std::vector<int32_t> out;
  (*bpe)->encode_word("abc", out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 2}));  // a + ##b -> "ab" (prefix dropped), then ##c
}

}  // namespace
}  // namespace kiln::tokenizer::hf
