// TokenMasker: the set of vocabulary tokens a Matcher accepts next, as a packed bitmask.
//
// The vocabulary (token id -> bytes) is stored once as a trie laid out in preorder. A mask
// walks it depth first on a MatcherScratch over the matcher: at each node the byte is
// checked against the bytes the current Earley set can scan (a bit test), a rejected byte
// skips its whole subtree, and only nodes with children advance the recognizer. A token is
// allowed iff every byte of it is accepted, so the mask equals trying each token with
// accept + rollback (tests/grammar/token_mask_test.cpp checks exactly that).
//
// Cost: one Earley step per visited trie node with children; the nodes visited are the
// prefixes of allowed tokens (plus one bit test per rejected child).
//
// Tokens with no bytes (special tokens) are never allowed, except the end-of-sequence id,
// allowed exactly when the matcher is_complete().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "grammar/matcher.h"

namespace kiln::grammar {

class TokenMasker {
 public:
  // vocab[t] = the bytes of token t (empty for special tokens).
  TokenMasker(const std::vector<std::string>& vocab, std::optional<uint32_t> eos_id);

  size_t vocab_size() const { return vocab_size_; }
  size_t mask_words() const { return (vocab_size_ + 31) / 32; }  // uint32 words per mask
  size_t n_nodes() const { return nodes_.size(); }

  // bitmask: mask_words() words; bit t (word t / 32, bit t % 32) set iff token t may follow.
  void fill_mask(const Matcher& m, uint32_t* bitmask) const;

 private:
  struct Node {
    uint8_t byte;
    uint32_t depth;         // bytes before this node's byte (0: a child of the root)
    uint32_t subtree_end;   // index of the first node after this node's subtree
    uint32_t tokens_begin;  // tokens ending at this node: token_ids_[begin, end)
    uint32_t tokens_end;
  };
  size_t vocab_size_;
  std::optional<uint32_t> eos_id_;
  uint32_t max_depth_ = 0;
  std::vector<Node> nodes_;  // preorder
  std::vector<uint32_t> token_ids_;
};

}  // namespace kiln::grammar
