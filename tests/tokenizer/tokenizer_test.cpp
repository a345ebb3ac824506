// Tokenizer pipeline tests on small hand-written tokenizer.json files: added tokens and their
// flags (the cases of the Rust AddedVocabulary tests), normalized added tokens, the
// TemplateProcessing post-processor, tokenizer_config.json, decode rules and load errors.
#include "tokenizer/tokenizer.h"

#include <atomic>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

namespace kiln::tokenizer {
namespace {

using json = nlohmann::json;
using Strings = std::vector<std::string>;

// A character-level BPE (no merges) over every character of `texts`, lowercased too, so that
// encode() shows exactly how the input was cut around the added tokens.
json char_level(const Strings& texts, json added = json::array(), json normalizer = nullptr) {
  std::set<std::string> chars;
  for (const std::string& t : texts) {
    for (const std::string& s : {t, hf::unicode_lowercase(t)}) {
      for (size_t i = 0; i < s.size();) {
        const size_t start = i;
        hf::utf8_next(s, i);
        chars.insert(s.substr(start, i - start));
      }
    }
  }
  json vocab = json::object();
  int id = 0;
  for (const std::string& c : chars) vocab[c] = id++;
  for (json& a : added) {
    if (!a.contains("id")) a["id"] = id++;
  }
  return {{"version", "1.0"},        {"added_tokens", added}, {"normalizer", normalizer},
          {"pre_tokenizer", nullptr}, {"post_processor", nullptr}, {"decoder", nullptr},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
}

json added_token(const std::string& content, bool special, json flags = json::object()) {
  json a = {{"content", content},  {"special", special}, {"single_word", false},
            {"lstrip", false},     {"rstrip", false},    {"normalized", !special}};
  for (auto it = flags.begin(); it != flags.end(); ++it) a[it.key()] = it.value();
  return a;
}

Tokenizer make(const json& tokenizer_json, const json& config = nullptr) {
  auto t = Tokenizer::load_from_json(tokenizer_json.dump(), config.is_null() ? "" : config.dump());
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

// encode() as readable pieces: added tokens as "{content}", runs of model tokens joined.
Strings pieces(const Tokenizer& tok, const std::string& text) {
  Strings out;
  bool in_text = false;
  for (int32_t id : tok.encode(text, false)) {
    const std::string t = tok.id_to_token(id).value_or("?");
    size_t i = 0;
    hf::utf8_next(t, i);
    const bool added = i < t.size();  // the model holds single characters only
    if (added) {
      out.push_back("{" + t + "}");
    } else if (in_text) {
      out.back() += t;
    } else {
      out.push_back(t);
    }
    in_text = !added;
  }
  return out;
}

const json kLowercase = {{"type", "Lowercase"}};

TEST(TokenizerAddedTokens, SpecialAndNormalizedTokensWithStripFlags) {
  const std::string text = "[CLS] My name is Anthony [SEP]";
  const Tokenizer tok = make(char_level(
      {text}, json::array({added_token("my", false, {{"lstrip", true}, {"rstrip", true}}),
                           added_token("name", false), added_token("ony", false, {{"single_word", true}}),
                           added_token("[CLS]", true), added_token("[SEP]", true)}),
      kLowercase));
  // "my" matches the lowercased text and takes the spaces on both sides; "ony" is inside a
  // word, so single_word rejects it.
  EXPECT_EQ(pieces(tok, text), (Strings{"{[CLS]}", "{my}", "{name}", " is anthony ", "{[SEP]}"}));
  // A special token (normalized=false) must match the raw text exactly.
  EXPECT_EQ(pieces(tok, "[cls]"), (Strings{"[cls]"}));
}

TEST(TokenizerAddedTokens, SingleWordNeedsNonWordCharactersAround) {
  const json mask = added_token("<mask>", false, {{"single_word", true}});
  const Tokenizer tok =
      make(char_level({"<mask> my name a ony, - \u25cc\u0330"}, json::array({mask}), kLowercase));
  EXPECT_EQ(pieces(tok, "<mask> My name <mask> A<mask> <mask>ony <mask>"),
            (Strings{"{<mask>}", " my name ", "{<mask>}", " a<mask> <mask>ony ", "{<mask>}"}));
  // Punctuation is not a word character; a combining mark is.
  EXPECT_EQ(pieces(tok, "<mask>, <mask>- \u25cc\u0330<mask>"),
            (Strings{"{<mask>}", ", ", "{<mask>}", "- \u25cc\u0330<mask>"}));
}

TEST(TokenizerAddedTokens, LstripRstripTakeUnicodeWhitespace) {
  const Tokenizer tok = make(char_level(
      {"hi there"}, json::array({added_token(
                        "<mask>", false, {{"lstrip", true}, {"rstrip", true}, {"single_word", true}})}),
      kLowercase));
  EXPECT_EQ(pieces(tok, "Hi <mask> there\t<mask>\t<mask>\u2000"),
            (Strings{"hi", "{<mask>}", "there", "{<mask>}", "{<mask>}"}));
}

TEST(TokenizerAddedTokens, LeftmostLongestAndNormalizedContent) {
  const Tokenizer tok = make(char_level(
      {"ab<|x|> "}, json::array({added_token("<|", true), added_token("<|x|>", true),
                                added_token("HeLLo", false)}),
      kLowercase));
  EXPECT_EQ(pieces(tok, "a<|x|>b<|"), (Strings{"a", "{<|x|>}", "b", "{<|}"}));
  // normalized=true: the token's content is normalized too, so it matches any casing.
  EXPECT_EQ(pieces(tok, "aHELLOb hello"), (Strings{"a", "{HeLLo}", "b ", "{HeLLo}"}));
}

TEST(TokenizerPostProcessor, TemplateProcessingAddsSpecialTokensOnRequest) {
  json j = char_level({"ab"}, json::array({added_token("<s>", true), added_token("</s>", true)}));
  const int s = j["added_tokens"][0]["id"], e = j["added_tokens"][1]["id"];
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens",
       {{"<s>", {{"id", "<s>"}, {"ids", {s}}, {"tokens", {"<s>"}}}},
        {"</s>", {{"id", "</s>"}, {"ids", {e}}, {"tokens", {"</s>"}}}}}}};
  const Tokenizer tok = make(j);
  const int32_t a = *tok.token_to_id("a"), b = *tok.token_to_id("b");
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{s, a, b, e}));
  EXPECT_EQ(tok.encode("ab", false), (std::vector<int32_t>{a, b}));
  EXPECT_EQ(tok.encode(""), (std::vector<int32_t>{s, e}));
  // The string form of a template means the same.
  j["post_processor"]["single"] = {"<s>", "$A:0", "</s>:0"};
  EXPECT_EQ(make(j).encode("ab"), (std::vector<int32_t>{s, a, b, e}));
  // A Sequence with the ByteLevel post-processor (no change to ids).
  j["post_processor"] = {{"type", "Sequence"},
                         {"processors", {{{"type", "ByteLevel"}}, j["post_processor"]}}};
  EXPECT_EQ(make(j).encode("ab"), (std::vector<int32_t>{s, a, b, e}));
}

TEST(TokenizerConfigFile, BosEosAndAddFlags) {
  const json j = char_level({"x"}, json::array({added_token("<s>", true), added_token("</s>", true)}));
  const Tokenizer tok = make(j, {{"add_bos_token", true},
                                 {"add_eos_token", false},
                                 {"bos_token", "<s>"},
                                 {"eos_token", {{"__type", "AddedToken"}, {"content", "</s>"}}}});
  EXPECT_EQ(tok.bos_id(), j["added_tokens"][0]["id"].get<int32_t>());
  EXPECT_EQ(tok.eos_id(), j["added_tokens"][1]["id"].get<int32_t>());
  EXPECT_EQ(tok.config().add_bos_token, true);
  EXPECT_EQ(tok.config().add_eos_token, false);
  const Tokenizer bare = make(j);
  EXPECT_FALSE(bare.bos_id().has_value());
  EXPECT_FALSE(bare.config().add_bos_token.has_value());
}

TEST(TokenizerDecode, SkipsUnknownIdsAndOptionallySpecialTokens) {
  const json j = char_level({"ab"}, json::array({added_token("<s>", true), added_token("<x>", false)}));
  const Tokenizer tok = make(j);
  const int32_t a = *tok.token_to_id("a"), s = *tok.token_to_id("<s>"), x = *tok.token_to_id("<x>");
  EXPECT_TRUE(tok.is_special(s));
  EXPECT_FALSE(tok.is_special(x));
  EXPECT_FALSE(tok.is_special(a));
  EXPECT_EQ(tok.vocab_size(), x + 1);
  const std::vector<int32_t> ids = {s, a, -5, 999999, x, a};
  // No decoder: tokens joined with spaces, as Rust does.
  EXPECT_EQ(tok.decode(ids), "<s> a <x> a");
  EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), "a <x> a");
  EXPECT_EQ(tok.decode({}), "");
  EXPECT_FALSE(tok.id_to_token(-1).has_value());
  EXPECT_FALSE(tok.token_to_id("zz").has_value());
}

TEST(TokenizerEncode, InvalidUtf8IsDecodedLossilyFirst) {
  const Tokenizer tok = make(char_level({"a\ufffd"}));
  EXPECT_EQ(tok.encode("a\xff\xe4\xb8"), tok.encode("a\ufffd\ufffd"));
}

// The word cache is shared: concurrent encodes must give the single-threaded ids.
TEST(TokenizerEncode, ConcurrentEncodesAgree) {
  json j = char_level({"abc \n"});
  j["model"]["vocab"]["ab"] = 100;
  j["model"]["vocab"]["abc"] = 101;
  j["model"]["merges"] = {"a b", "ab c"};
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}};
  const Tokenizer tok = make(j);
  std::vector<std::string> texts;
  std::mt19937 rng(5);
  for (int i = 0; i < 400; ++i) {
    std::string t;
    for (int k = int(rng() % 60); k > 0; --k) t.push_back("abc \n"[rng() % 5]);
    texts.push_back(t);
  }
  const Tokenizer single = make(j);  // a separate cache
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(single.encode(t));
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = (size_t(w) * 37) % texts.size(), n = 0; n < texts.size(); ++n) {
          if (tok.encode(texts[i]) != expected[i]) ++wrong;
          i = (i + 1) % texts.size();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Errors: a clear Status naming the problem, never a crash.
Status load_error(const json& j) { return Tokenizer::load_from_json(j.dump()).status(); }

TEST(TokenizerErrors, MalformedJsonAndMissingModel) {
  auto bad = Tokenizer::load_from_json("{\"model\": {\"type\": \"BPE\",");
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(bad.status().message().find("not valid JSON"), std::string::npos);
  EXPECT_EQ(Tokenizer::load_from_json("[1, 2]").status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(load_error({{"normalizer", nullptr}}).code(), StatusCode::kCorrupt);
  auto missing = Tokenizer::load("/nonexistent/kiln/tokenizer");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("tokenizer.json"), std::string::npos);
  auto bad_config = Tokenizer::load_from_json(char_level({"a"}).dump(), "{oops");
  EXPECT_EQ(bad_config.status().code(), StatusCode::kCorrupt);
}

TEST(TokenizerErrors, UnsupportedComponentTypesAreNamed) {
  struct Case {
    const char* field;
    json value;
    const char* name;
  };
  const std::vector<Case> cases = {
      {"model", {{"type", "WordPiece"}, {"vocab", json::object()}}, "WordPiece"},
      {"model", {{"type", "Unigram"}, {"vocab", json::array()}}, "Unigram"},
      {"pre_tokenizer", {{"type", "Whitespace"}}, "Whitespace"},
      {"pre_tokenizer",
       {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Metaspace"}, {"replacement", "_"}}}}},
       "Metaspace"},
      {"normalizer", {{"type", "BertNormalizer"}}, "BertNormalizer"},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}}, "WordPiece"},
      {"post_processor", {{"type", "Frobnicate"}}, "Frobnicate"},
  };
  for (const Case& c : cases) {
    json j = char_level({"a"});
    j[c.field] = c.value;
    const Status s = load_error(j);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << c.name << ": " << s.to_string();
    EXPECT_NE(s.message().find(c.name), std::string::npos) << s.to_string();
  }
}

TEST(TokenizerErrors, BadModelAndComponentFields) {
  json j = char_level({"ab"});
  j["model"]["merges"] = {"a q"};
  Status s = load_error(j);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("merge 0"), std::string::npos) << s.to_string();
  j["model"]["merges"] = {"ab"};
  EXPECT_EQ(load_error(j).code(), StatusCode::kCorrupt);
  j = char_level({"ab"});
  j["model"]["vocab"]["c"] = "three";
  EXPECT_EQ(load_error(j).code(), StatusCode::kCorrupt);
  j = char_level({"ab"});
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  s = load_error(j);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("does not compile"), std::string::npos) << s.to_string();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
  EXPECT_NE(load_error(j).message().find("Sideways"), std::string::npos);
  j["pre_tokenizer"] = {{"type", "Split"}, {"behavior", "Isolated"}};
  EXPECT_EQ(load_error(j).code(), StatusCode::kCorrupt);
  j = char_level({"ab"});
  j["added_tokens"] = {{{"id", 5}}};
  EXPECT_EQ(load_error(j).code(), StatusCode::kCorrupt);
  j = char_level({"ab"});
  j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
  EXPECT_EQ(load_error(j).code(), StatusCode::kCorrupt);
  j["decoder"] = 17;
  EXPECT_EQ(load_error(j).code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace kiln::tokenizer
