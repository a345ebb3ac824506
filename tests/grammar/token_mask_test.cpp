// Token masks: fill_mask equals trying every token with accept + rollback, rollback
// restores masks exactly, EOS only when complete, generated documents pass token by token
// through a toy vocabulary, with and without a MaskCache; and a timing print (not asserted)
// for a ~30k-token vocabulary.
#include "grammar/token_mask.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>
#include <unordered_map>

#include "grammar/json_instances.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace kiln::grammar {
namespace {

using testing::ojson;

const char* kSchema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
    "age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array","items":{"type":"string"}},
    "kind":{"enum":["cat","dog","cow"]},"score":{"type":"number"},
    "child":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["name","kind"],"additionalProperties":false})";

std::shared_ptr<const CompiledGrammar> schema_grammar(const char* text) {
  auto g = json_schema_text_to_grammar(text);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return CompiledGrammar::compile(*g).value();
}

// All 256 single bytes, n random strings (JSON-ish pieces, random bytes, UTF-8), and a few
// empty (special) tokens; the last one is EOS.
std::vector<std::string> toy_vocab(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  static const char* kPieces[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "name", "age", "kind", "tags", "cat", "dog",
                                  "1", "0", "9", "-", ".", "e", "true", "null", "\\", "n", "u", "é", "😀", "ch", "ild"};
  while (v.size() < n + 256) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < len; ++i) {
      if (rng() % 5 == 0) s += static_cast<char>(rng() % 256);
      else s += kPieces[rng() % (sizeof kPieces / sizeof *kPieces)];
    }
    v.push_back(s);
  }
  v.push_back("");
  v.push_back("");  // EOS
  return v;
}

std::vector<uint32_t> brute_force_mask(Matcher& m, const std::vector<std::string>& vocab, uint32_t eos) {
  std::vector<uint32_t> mask((vocab.size() + 31) / 32, 0);
  for (uint32_t t = 0; t < vocab.size(); ++t) {
    bool ok;
    if (vocab[t].empty()) {
      ok = t == eos && m.is_complete();
    } else {
      ok = m.accept(vocab[t]);
      if (ok) m.rollback(1);
    }
    if (ok) mask[t >> 5] |= 1u << (t & 31);
  }
  return mask;
}

// Greedy longest-match tokenization (the vocabulary holds every single byte).
std::vector<uint32_t> tokenize(const std::string& doc, const std::vector<std::string>& vocab) {
  std::unordered_map<std::string, uint32_t> ids;
  size_t max_len = 0;
  for (uint32_t t = 0; t < vocab.size(); ++t) {
    if (!vocab[t].empty()) ids.emplace(vocab[t], t);
    max_len = std::max(max_len, vocab[t].size());
  }
  std::vector<uint32_t> out;
  for (size_t i = 0; i < doc.size();) {
    for (size_t len = std::min(max_len, doc.size() - i); len > 0; --len) {
      auto it = ids.find(doc.substr(i, len));
      if (it != ids.end()) {
        out.push_back(it->second);
        i += len;
        break;
      }
    }
  }
  return out;
}

bool bit(const std::vector<uint32_t>& mask, uint32_t t) { return (mask[t >> 5] >> (t & 31)) & 1; }

// Documents generated from the schema, token by token through a toy vocabulary: every
// state's mask against brute force, with and without a MaskCache.
void expect_masks_along_documents(const std::string& schema_text, int n_docs) {
  auto g = schema_grammar(schema_text.c_str());
  const std::vector<std::string> vocab = toy_vocab(3000, 5);
  const uint32_t eos = static_cast<uint32_t>(vocab.size() - 1);
  TokenMasker masker(vocab, eos);
  const ojson schema = ojson::parse(schema_text);
  testing::InstanceGenerator gen(schema, 99);
  MaskCache cache;
  int n_states = 0;
  for (int d = 0; d < n_docs; ++d) {
    const std::string doc = gen.serialize(gen.generate(schema));
    const std::vector<uint32_t> tokens = tokenize(doc, vocab);
    Matcher m(g);
    std::vector<uint32_t> mask(masker.mask_words());
    std::vector<uint32_t> cached(masker.mask_words());
    for (size_t i = 0; i <= tokens.size(); ++i) {
      masker.fill_mask(m, mask.data());
      ASSERT_EQ(mask, brute_force_mask(m, vocab, eos)) << doc << " after " << i << " tokens";
      masker.fill_mask(m, cached.data(), &cache);
      ASSERT_EQ(cached, mask) << doc << " after " << i << " tokens (cached)";
      ++n_states;
      if (i == tokens.size()) break;
      ASSERT_TRUE(bit(mask, tokens[i])) << "token '" << vocab[tokens[i]] << "' of " << doc << " masked out";
      ASSERT_TRUE(m.accept(vocab[tokens[i]]));
    }
    EXPECT_TRUE(m.is_complete());
    EXPECT_TRUE(bit(mask, eos));
  }
  std::printf("[ masks ] %d states compared with brute force over %zu tokens; cache %zu hits, %zu misses\n",
              n_states, vocab.size(), cache.n_hits(), cache.n_misses());
}

TEST(TokenMask, EqualsBruteForceAlongGeneratedDocuments) { expect_masks_along_documents(kSchema, 8); }

// An enum of 300 strings (a trie of rules: Grammar::alternation) made of the toy
// vocabulary's pieces, many of them prefixes of others, and an array of them.
TEST(TokenMask, LargeEnumMasksEqualBruteForce) {
  static const char* kParts[] = {"cat", "dog", "ch", "ild", "c", "a", "é", "na", "me", "1", "\\\"", " "};
  std::mt19937 rng(41);
  ojson values = ojson::array();
  for (int i = 0; i < 300; ++i) {
    std::string w;
    const int n = 1 + int(rng() % 5);
    for (int k = 0; k < n; ++k) w += kParts[rng() % (sizeof kParts / sizeof *kParts)];
    values.push_back(ojson::parse("\"" + w + "\""));
  }
  ojson schema = ojson::parse(R"({"type":"object","properties":{"kind":{},"more":{"type":"array","items":{}}},
      "required":["kind","more"],"additionalProperties":false})");
  schema["properties"]["kind"]["enum"] = values;
  schema["properties"]["more"]["items"]["enum"] = values;
  // The enums are tries (many rules), not one rule of 300 alternatives each.
  auto g = json_schema_text_to_grammar(schema.dump());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  size_t enum_rules = 0, widest = 0;
  for (const Rule& r : g->rules())
    if (r.name.rfind("enum", 0) == 0) ++enum_rules, widest = std::max(widest, r.alternatives.size());
  EXPECT_GT(enum_rules, 40u);
  EXPECT_LT(widest, 300u);
  expect_masks_along_documents(schema.dump(), 12);
}

// The cache along hand-written documents heavy in what it keys on: long strings, escapes,
// UTF-8, nested objects and arrays (strings at several depths share entries), with and
// without a schema; every state compared with brute force, and most of them cache hits.
TEST(TokenMask, CachedMasksEqualBruteForceInLongStringsAndNesting) {
  const std::vector<std::string> vocab = toy_vocab(3000, 8);
  const uint32_t eos = static_cast<uint32_t>(vocab.size() - 1);
  TokenMasker masker(vocab, eos);
  const std::string long_text = "a long string with \\\"escapes\\\" \\n\\t\\u00e9 é 😀 name: \\\\ cat, dog {[ ]} ";
  const std::string s = "\"" + long_text + long_text + "\"";
  const std::vector<std::pair<const char*, std::string>> cases = {
      {kSchema, R"({"name":"abc","tags":[)" + s + "," + s + R"(],"kind":"cat","child":{"name":"x\"y","tags":[)" + s +
                    R"(],"kind":"dog","child":{"name":"é😀","tags":[)" + s + R"(],"kind":"cow","child":null}}})"},
      {R"({"type":"object"})", R"({"a":)" + s + R"(,"b":{"c":[)" + s + R"(,{"d":)" + s + R"(}],"e":)" + s +
                                   R"(},)" + s + R"(:[[[)" + s + "]]]}"},
  };
  for (const auto& [schema_text, doc] : cases) {
    auto g = schema_grammar(schema_text);
    MaskCache cache;
    Matcher m(g);
    const std::vector<uint32_t> tokens = tokenize(doc, vocab);
    std::vector<uint32_t> mask(masker.mask_words());
    for (size_t i = 0; i <= tokens.size(); ++i) {
      masker.fill_mask(m, mask.data(), &cache);
      ASSERT_EQ(mask, brute_force_mask(m, vocab, eos)) << doc << " after " << i << " tokens";
      if (i == tokens.size()) break;
      ASSERT_TRUE(bit(mask, tokens[i])) << "token '" << vocab[tokens[i]] << "' of " << doc << " masked out";
      ASSERT_TRUE(m.accept(vocab[tokens[i]]));
    }
    EXPECT_TRUE(m.is_complete()) << doc;
    EXPECT_GT(cache.n_hits(), 2 * cache.n_misses()) << doc;
    std::printf("[ cache ] %zu states: %zu hits, %zu misses, %zu entries\n", tokens.size() + 1, cache.n_hits(),
                cache.n_misses(), cache.n_entries());
  }
}

// A SharedMaskCache behind four sequences' caches on four threads at once (each walking
// its own documents, the same schema): every mask equals the uncached one, and the second
// and later threads mostly hit what the others walked.
TEST(TokenMask, SharedCacheAcrossThreadsEqualsTheUncachedMasks) {
  auto g = schema_grammar(kSchema);
  const std::vector<std::string> vocab = toy_vocab(3000, 5);
  const uint32_t eos = static_cast<uint32_t>(vocab.size() - 1);
  const TokenMasker masker(vocab, eos);
  const ojson schema = ojson::parse(kSchema);
  auto shared = std::make_shared<SharedMaskCache>();
  std::vector<std::string> docs;
  testing::InstanceGenerator gen(schema, 7);
  for (int d = 0; d < 16; ++d) docs.push_back(gen.serialize(gen.generate(schema)));
  std::atomic<int> mismatches{0}, states{0};
  std::atomic<size_t> hits{0}, misses{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      MaskCache cache(64, shared);
      std::vector<uint32_t> mask(masker.mask_words()), want(masker.mask_words());
      for (size_t d = size_t(t); d < docs.size(); d += 4) {
        Matcher m(g);
        const std::vector<uint32_t> tokens = tokenize(docs[d], vocab);
        for (size_t i = 0; i <= tokens.size(); ++i) {
          masker.fill_mask(m, mask.data(), &cache);
          masker.fill_mask(m, want.data());
          mismatches += mask != want;
          ++states;
          if (i == tokens.size() || !m.accept(vocab[tokens[i]])) break;
        }
      }
      hits += cache.n_hits();
      misses += cache.n_misses();
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0) << "of " << states.load() << " states";
  // Sharing: the misses are about the distinct views, each walked once by whichever thread
  // met it first (two threads may miss one view at the same moment: the bound allows every
  // view twice: 164-186 misses of 163 views measured, the old bound of hits > 4 misses failed
  // once at 186 on a loaded 2-core machine); four threads without the shared cache miss 541.
  EXPECT_LT(misses.load(), 2 * shared->n_entries()) << hits.load() << " hits, " << misses.load() << " misses";
  EXPECT_GT(shared->n_entries(), 0u);
  std::printf("[ shared ] %d states on 4 threads: %zu hits, %zu misses, %zu shared entries\n", states.load(),
              hits.load(), misses.load(), shared->n_entries());
}

TEST(TokenMask, RollbackRestoresMasksExactly) {
  auto g = schema_grammar(kSchema);
  const std::vector<std::string> vocab = toy_vocab(2000, 6);
  const uint32_t eos = static_cast<uint32_t>(vocab.size() - 1);
  TokenMasker masker(vocab, eos);
  const ojson schema = ojson::parse(kSchema);
  testing::InstanceGenerator gen(schema, 7);
  const std::string doc = gen.serialize(gen.generate(schema));
  const std::vector<uint32_t> tokens = tokenize(doc, vocab);
  Matcher m(g);
  std::vector<std::vector<uint32_t>> masks;
  for (uint32_t t : tokens) {
    masks.emplace_back(masker.mask_words());
    masker.fill_mask(m, masks.back().data());
    ASSERT_TRUE(m.accept(vocab[t]));
  }
  // Roll back 1, 2, 3... tokens at a time from the end, comparing with the masks recorded.
  std::vector<uint32_t> mask(masker.mask_words());
  for (size_t k = 1; k <= 3 && m.n_accepts() > 0; ++k) {
    const int n = std::min<int>(static_cast<int>(k), m.n_accepts());
    m.rollback(n);
    masker.fill_mask(m, mask.data());
    ASSERT_EQ(mask, masks[m.n_accepts()]);
    // Re-accept a different acceptable token, then roll it back too: still the same mask.
    for (uint32_t t = 0; t < vocab.size(); ++t) {
      if (!vocab[t].empty() && bit(mask, t) && t != tokens[m.n_accepts()]) {
        ASSERT_TRUE(m.accept(vocab[t]));
        m.rollback(1);
        break;
      }
    }
    masker.fill_mask(m, mask.data());
    ASSERT_EQ(mask, masks[m.n_accepts()]);
  }
}

// A vocabulary for the plain string runs (token_mask.h): plain words of 1 to 80 characters
// (past the probe's chain of 64), UTF-8 characters whole and split at every byte, quotes,
// backslashes and escapes glued to words, control bytes, malformed UTF-8 (overlong,
// surrogate, past U+10FFFF, stray continuation bytes); the last token is EOS.
std::vector<std::string> string_vocab(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> chars = {"a", "b", "c", "z", " ", "é", "ß", "日", "本", "😀", "\x7f", "~", "{", ":", ","};
  const std::vector<std::string> odd = {"\"", "\\", "\\n", "\\\"", "\\u00e9", "\\ud83d\\ude00", "\x01", "\n", "\t",
                                        "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80", "\xbf\xbf", "\xf5",
                                        "\xe0\x80\x80", "\"}", "\",", "\":", "\"]", "2024-", "ab"};
  auto word = [&](int len) {
    std::string s;
    for (int i = 0; i < len; ++i) s += chars[rng() % chars.size()];
    return s;
  };
  for (int len : {2, 3, 4, 5, 6, 12, 13, 63, 64, 65, 70, 71, 80})
    for (int k = 0; k < 3; ++k) v.push_back(word(len));
  for (const std::string c : {"é", "日", "😀", "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf"})
    for (size_t cut = 1; cut < c.size(); ++cut) {
      v.push_back(c.substr(0, cut));
      v.push_back(c.substr(cut));
      v.push_back("ab" + c.substr(0, cut));
      v.push_back(c.substr(cut) + "ab");
    }
  while (v.size() < n) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < len; ++i) s += rng() % 10 < 7 ? chars[rng() % chars.size()] : odd[rng() % odd.size()];
    v.push_back(s);
  }
  v.push_back("");  // EOS
  return v;
}

// The first tokens two masks disagree on, for failure messages.
std::string mask_diff(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want,
                      const std::vector<std::string>& vocab) {
  std::string out;
  int n = 0;
  for (uint32_t t = 0; t < vocab.size() && n < 8; ++t) {
    const bool g = (got[t >> 5] >> (t & 31)) & 1, w = (want[t >> 5] >> (t & 31)) & 1;
    if (g == w) continue;
    out += (g ? " +'" : " -'") + ojson(vocab[t]).dump(-1, ' ', false, ojson::error_handler_t::replace) + "'";
    ++n;
  }
  return out;
}

// Before every byte of `doc` (which g accepts whole), the mask uncached and through one
// MaskCache equals brute force; then doc is complete.
void expect_masks_match_brute_force_at_every_byte(const TokenMasker& masker, const std::vector<std::string>& vocab,
                                                  uint32_t eos, const std::shared_ptr<const CompiledGrammar>& g,
                                                  const std::string& doc) {
  Matcher m(g);
  MaskCache cache;
  std::vector<uint32_t> mask(masker.mask_words()), cached(masker.mask_words());
  for (size_t i = 0; i <= doc.size(); ++i) {
    const std::vector<uint32_t> want = brute_force_mask(m, vocab, eos);
    masker.fill_mask(m, mask.data());
    ASSERT_TRUE(mask == want) << doc << " after " << i << " bytes:" << mask_diff(mask, want, vocab);
    masker.fill_mask(m, cached.data(), &cache);
    ASSERT_TRUE(cached == want) << doc << " after " << i << " bytes (cached):" << mask_diff(cached, want, vocab);
    if (i == doc.size()) break;
    ASSERT_TRUE(m.accept(doc.substr(i, 1))) << doc << " byte " << i;
  }
  EXPECT_TRUE(m.is_complete()) << doc;
}

// Masks inside strings of every kind (free, escapes, UTF-8, maxLength below and above the
// probe's chain, minLength, patterns anchored and searched, a format, nested objects and
// arrays, a pattern whose first character picks a branch, and any JSON object) at every byte of documents, mid-character and mid-escape
// included: uncached and cached, each equal to brute force.
TEST(TokenMask, StringMasksEqualBruteForceAtEveryByte) {
  const std::vector<std::string> vocab = string_vocab(1500, 21);
  const uint32_t eos = static_cast<uint32_t>(vocab.size() - 1);
  const TokenMasker masker(vocab, eos);
  const char* kStrings = R"({"type":"object","properties":{"s":{"type":"string"},"b":{"type":"string","maxLength":3},
      "m":{"type":"string","minLength":2,"maxLength":70},"p":{"type":"string","pattern":"^[a-z ]+$"},
      "q":{"type":"string","pattern":"ab.c"},"d":{"type":"string","format":"date"},
      "n":{"type":"object","properties":{"t":{"type":"array","items":{"type":"string","maxLength":5}},
      "u":{"type":"string"}}},"r":{"type":"string","pattern":"^(a.*|[^a].?)$"}},
      "required":["s","b","m","p","q","d","n","r"],"additionalProperties":false})";
  std::string long_m;
  for (int i = 0; i < 35; ++i) long_m += i % 3 ? "é" : "a ";  // 58 characters
  long_m += "😀\\n\\\"日本bcdefghi";                               // 70 in all
  const std::vector<std::pair<const char*, std::string>> cases = {
      {kStrings, R"({"s":"x\"y\\ é😀 \u00e9\ud83d\ude00 z\/","b":"é😀a","m":")" + long_m +
                     R"(","p":"ab cd","q":"zzab😀c\n","d":"2024-02-29","n":{"t":["","日本\u00e9ab","\\\"\n"],"u":"{\"k\": [1]}"},"r":"a日本 xyz"})"},
      {kStrings, R"({"s":"","b":"","m":"ab","p":"a","q":"abxc","d":"1999-12-31","n":{},"r":"bé"})"},
      {R"({"type":"object"})", R"({"a":"x\"😀","b":{"c":["é\u00e9",{"d":"deep \"str\" 日本"}]},"e":"","f":[1,"\\"]})"},
  };
  for (const auto& [schema_text, doc] : cases)
    expect_masks_match_brute_force_at_every_byte(masker, vocab, eos, schema_grammar(schema_text), doc);
}

// The plain runs on a vocabulary of plain text only (every subtree decided without a walk)
// and on one with no plain token: still brute force.
TEST(TokenMask, StringMasksWithAllPlainAndNoPlainVocabularies) {
  const std::vector<std::vector<std::string>> vocabs = {
      {"a", "ab", "abc", "é", "日本", "😀😀", " ", "", "\xc3", "b\xe6\x97", ""},
      {"\"", "\\", "\\n", "\xff", "\x80", "\"}", "", ""}};
  auto g = schema_grammar(R"({"type":"array","items":{"type":"string","maxLength":2}})");
  for (const std::vector<std::string>& vocab : vocabs) {
    const uint32_t eos = static_cast<uint32_t>(vocab.size() - 1);
    const TokenMasker masker(vocab, eos);
    for (const std::string doc : {R"(["ab","é","","\n"])", R"(["日本"])"})
      expect_masks_match_brute_force_at_every_byte(masker, vocab, eos, g, doc);
  }
}

// A vocabulary for format and pattern strings (the character loops, token_mask.h): words
// of letters, digits and an email's special characters from 1 to 40 bytes, the same glued to
// '.', '@', '-', ':', quotes and spaces (tokens that leave a loop midway), date, time and uuid
// pieces, UTF-8 characters whole and split, and random glue of all of them; the last is EOS.
std::vector<std::string> format_vocab(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  const std::string word_chars = "abcdexyzQRS0129_+'!#~";
  const std::vector<std::string> pieces = {".", "@", "-", ":", "\"", "\",", "\"}", " ", "T", "Z", "é", "日本", "😀",
                                           "\xc3", "\xa9", "\xe6\x97", "\\n", "2024", "-02-", "29", "12:", ":00",
                                           "+01:00", ".123", "deadbeef", "-4a1b-", "e89b", ".com", "@mail", "a.b",
                                           "x@y", "192.", "168"};
  auto word = [&](int len) {
    std::string s;
    for (int i = 0; i < len; ++i) s += word_chars[rng() % word_chars.size()];
    return s;
  };
  for (int len : {1, 2, 3, 5, 8, 13, 21, 40})
    for (int k = 0; k < 4; ++k) v.push_back(word(len));
  while (v.size() < n) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < len; ++i) s += rng() % 10 < 6 ? word(1 + static_cast<int>(rng() % 6)) : pieces[rng() % pieces.size()];
    v.push_back(s);
  }
  v.push_back("");  // EOS
  return v;
}

const char* kFormats = R"({"type":"object","properties":{"e":{"type":"string","format":"email"},
    "d":{"type":"string","format":"date"},"t":{"type":"string","format":"date-time"},
    "u":{"type":"string","format":"uuid"},"h":{"type":"string","format":"time"},"i":{"type":"string","format":"ipv4"},
    "p":{"type":"string","pattern":"^[a-z]+$"},"w":{"type":"string","pattern":"^\\w+@[a-z]{2,5}$"},
    "a":{"type":"string","pattern":"^.*é$"},"n":{"type":"string","pattern":"^[^@]+@x$"},
    "x":{"type":"string","pattern":"^[a-z]*(é|日)x$"},"s":{"type":"string","pattern":"[A-Z0-9 ]*x"},
    "l":{"type":"array","items":{"type":"string","format":"email"}}},
    "required":["e","d","t","u","h","i","p","w","a","n","x","s","l"],"additionalProperties":false})";
const char* kFormatsDoc = R"({"e":"john.doe+x'y@mail.example-site.com","d":"2024-02-29","t":"2026-11-28T23:01:15.123+01:00",)"
                          R"("u":"123e4567-e89b-12d3-a456-426614174000","h":"12:34:56z","i":"192.168.0.255",)"
                          R"("p":"helloworld","w":"a_b9@abcde","a":"日本 x😀éé","n":"日本é😀 z.\"@x","x":"abcdeéx","s":"zzAB 9Qx",)"
                          R"("l":["a@b.c","x.y.z@q-r.st","me@x.io"]})";

// Masks inside format and pattern strings (email atoms and labels, dates, times, uuids,
// ipv4, looping and counted pattern classes, `.` over multibyte characters, an unanchored
// pattern, emails in an array) at every byte, uncached and cached: brute force.
TEST(TokenMask, FormatAndPatternMasksEqualBruteForceAtEveryByte) {
  const std::vector<std::string> vocab = format_vocab(2500, 39);
  const uint32_t eos = static_cast<uint32_t>(vocab.size() - 1);
  const TokenMasker masker(vocab, eos);
  expect_masks_match_brute_force_at_every_byte(masker, vocab, eos, schema_grammar(kFormats), kFormatsDoc);
  // A bare regex grammar (not a JSON string): the same loops outside JSON's string rules.
  auto re = regex_to_grammar("[a-z.]+@[a-z]+(\\.[a-z]+)*");
  ASSERT_TRUE(re.ok()) << re.status().to_string();
  expect_masks_match_brute_force_at_every_byte(masker, vocab, eos, CompiledGrammar::compile(*re).value(),
                                               "ab.cd.e@xyz.abc");
}

TEST(TokenMask, EosOnlyWhenCompleteAndSpecialTokensNever) {
  auto g = schema_grammar(R"({"type":"integer"})");
  const std::vector<std::string> vocab = {"1", "2", "", "-", "12", ""};
  TokenMasker masker(vocab, 5);
  Matcher m(g);
  uint32_t mask = 0;
  masker.fill_mask(m, &mask);
  EXPECT_EQ(mask, 0b011011u);  // 1 2 - 12; not the special token 2, not EOS
  ASSERT_TRUE(m.accept("1"));
  masker.fill_mask(m, &mask);
  EXPECT_EQ(mask, 0b110011u);  // digits and EOS
}

// A ~30k-token vocabulary shaped like a BPE one: words with and without a leading space,
// digits, punctuation runs, UTF-8 pieces.
std::vector<std::string> bpe_like_vocab(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  static const char* kPunct[] = {"\"", "\":", "\",", "{", "}", "[", "]", ", ", ": ", "\":\"", "\\n", ".", "-", "_", "()", "\n"};
  static const char* kUtf8[] = {"é", "ü", "日", "本", "😀", "ñ", "ß"};
  while (v.size() < n) {
    std::string s;
    switch (rng() % 10) {
      case 0: s = std::to_string(rng() % 1000); break;
      case 1: s = kPunct[rng() % 16]; s += kPunct[rng() % 16]; break;
      case 2: s = kUtf8[rng() % 7]; break;
      default: {
        if (rng() & 1) s = " ";
        const int len = 2 + static_cast<int>(rng() % 8);
        for (int i = 0; i < len; ++i) s += letters[std::min<size_t>(rng() % 26, rng() % 26)];
        if (rng() % 4 == 0) s[s[0] == ' ' ? 1 : 0] = static_cast<char>(std::toupper(s[s[0] == ' ' ? 1 : 0]));
      }
    }
    v.push_back(s);
  }
  return v;
}

// Email masks with a BPE-shaped vocabulary (big letter subtrees: whole subtrees decided by
// the loop, probes below big subtrees, the cache's tainted subtrees): brute force.
TEST(TokenMask, EmailMasksWithBpeLikeVocabularyEqualBruteForce) {
  std::vector<std::string> vocab = bpe_like_vocab(6000, 7);
  for (const char* s : {"@", ".", "@gmail", ".com", "john", "doe", "xample", "ex", "-", "_", "mail.", "a@b", ""})
    vocab.push_back(s);
  const uint32_t eos = static_cast<uint32_t>(vocab.size() - 1);
  const TokenMasker masker(vocab, eos);
  auto g = schema_grammar(R"({"type":"array","items":{"type":"string","format":"email"}})");
  expect_masks_match_brute_force_at_every_byte(masker, vocab, eos, g,
                                               R"(["john.doe@example.com","a_b-c@ex-ample.co.uk"])");
}

// This thread's CPU time: the machine is shared, wall time would count other jobs.
double thread_cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

TEST(TokenMask, BenchMaskTimePerStep) {
  auto g = schema_grammar(kSchema);
  const std::vector<std::string> vocab = bpe_like_vocab(30000, 11);
  const auto t0 = std::chrono::steady_clock::now();
  TokenMasker masker(vocab, std::nullopt);
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const ojson schema = ojson::parse(kSchema);
  testing::InstanceGenerator gen(schema, 3);
  std::vector<std::string> docs;
  for (int d = 0; d < 4; ++d) docs.push_back(gen.serialize(gen.generate(schema)));
  // Same documents without a cache, with a cold one (one per grammar, as a server would keep
  // it), and with that cache warm (a second request with the same schema and outputs).
  MaskCache cache;
  for (const int pass : {0, 1, 2}) {
    const bool use_cache = pass > 0;
    std::vector<double> us;
    std::vector<uint32_t> mask(masker.mask_words());
    for (const std::string& doc : docs) {
      const std::vector<uint32_t> tokens = tokenize(doc, vocab);
      Matcher m(g);
      for (uint32_t t : tokens) {
        const double a = thread_cpu_us();
        masker.fill_mask(m, mask.data(), use_cache ? &cache : nullptr);
        us.push_back(thread_cpu_us() - a);
        ASSERT_TRUE(bit(mask, t));
        ASSERT_TRUE(m.accept(vocab[t]));
      }
    }
    std::sort(us.begin(), us.end());
    std::printf("[ bench ] vocab %zu tokens, trie %zu nodes built in %.1f ms; fill_mask %s over %zu steps: "
                "p50 %.0f us, p99 %.0f us, max %.0f us (thread CPU time); cache %zu hits, %zu misses so far\n",
                vocab.size(), masker.n_nodes(), build_ms,
                pass == 0 ? "uncached" : pass == 1 ? "cache cold" : "cache warm", us.size(),
                us[us.size() / 2], us[us.size() * 99 / 100], us.back(), cache.n_hits(), cache.n_misses());
  }
}

}  // namespace
}  // namespace kiln::grammar
