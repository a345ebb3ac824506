// Added tokens of tokenizer.json ("added_tokens"): found in the input before the model runs,
// with the Rust AddedVocabulary rules: leftmost-longest matching, two passes (tokens with
// normalized=false on the raw text, normalized=true ones on each normalized piece), and
// the single_word / lstrip / rstrip flags.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tokenizer::hf {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A piece of the input: an added token (id >= 0) or text to hand to the model (id < 0).
struct Segment {
  int32_t id;
  size_t begin, end;  // byte range in the matched text
};

class AddedVocab {
 public:
  AddedVocab() = default;
  // `normalize` is the tokenizer's normalizer: tokens with normalized=true are matched by
  // their normalized content, as Rust builds its second automaton.
  AddedVocab(std::vector<AddedToken> tokens,
             const std::function<std::string(std::string)>& normalize);

  // Rust AddedVocabulary::find_matches over `text` with the tokens whose `normalized` flag
  // equals `normalized_set`. The segments cover all of `text` in order.
  void split(std::string_view text, bool normalized_set, std::vector<Segment>& out) const;

  bool has_normalized() const { return !tries_[1].nodes.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie; node 0 is the root, whose children sit in a direct 256-entry table.
  struct Trie {
    struct Node {
      std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
      int32_t token = -1;                                  // index into tokens_
    };
    std::vector<Node> nodes;
    std::array<int32_t, 256> root{};
    void insert(std::string_view s, int32_t token);
    // Longest token starting at text[i], or -1.
    int32_t longest_at(std::string_view text, size_t i, size_t* len) const;
  };

  std::vector<AddedToken> tokens_;
  Trie tries_[2];  // [0]: normalized=false, [1]: normalized=true
};

}  // namespace kiln::tokenizer::hf
