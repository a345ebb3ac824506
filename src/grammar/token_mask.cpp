#include "grammar/token_mask.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/check.h"

namespace kiln::grammar {

TokenMasker::TokenMasker(const std::vector<std::string>& vocab, std::optional<uint32_t> eos_id)
    : vocab_size_(vocab.size()), eos_id_(eos_id) {
  KILN_CHECK(!eos_id || *eos_id < vocab.size()) << "eos id " << *eos_id << " of " << vocab.size();
  // Sorted byte strings give the trie's preorder directly: each string adds the nodes of
  // its bytes after the prefix it shares with the previous string.
  std::vector<uint32_t> order(vocab.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return vocab[a] < vocab[b]; });
  // Sorted order also makes a token's end node non-decreasing (a prefix sorts first), so
  // the token ranges fill in the same pass.
  std::vector<uint32_t> path;  // node index per depth of the current string
  const std::string* prev = nullptr;
  for (uint32_t id : order) {
    const std::string& s = vocab[id];
    if (s.empty()) continue;  // special tokens: never in the trie
    size_t common = 0;
    if (prev)
      while (common < prev->size() && common < s.size() && (*prev)[common] == s[common]) ++common;
    path.resize(common);
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      const auto n_tokens = static_cast<uint32_t>(token_ids_.size());
      nodes_.push_back({.byte = static_cast<uint8_t>(s[d]), .depth = static_cast<uint32_t>(d),
                        .tokens_begin = n_tokens, .tokens_end = n_tokens});
    }
    KILN_CHECK_EQ(nodes_[path.back()].tokens_end, token_ids_.size());
    token_ids_.push_back(id);
    nodes_[path.back()].tokens_end = static_cast<uint32_t>(token_ids_.size());
    max_depth_ = std::max<uint32_t>(max_depth_, static_cast<uint32_t>(s.size()));
    prev = &s;
  }
  std::vector<uint32_t> open;  // nodes whose subtree is not closed yet
  for (size_t i = 0; i <= nodes_.size(); ++i) {
    const uint32_t depth = i < nodes_.size() ? nodes_[i].depth : 0;
    while (!open.empty() && nodes_[open.back()].depth >= depth) {
      nodes_[open.back()].subtree_end = static_cast<uint32_t>(i);
      open.pop_back();
    }
    if (i < nodes_.size()) open.push_back(static_cast<uint32_t>(i));
  }
}

void TokenMasker::fill_mask(const Matcher& m, uint32_t* bitmask) const {
  std::memset(bitmask, 0, mask_words() * sizeof(uint32_t));
  MatcherScratch scratch(m);
  // allowed[d]: the bytes the recognizer can scan after the first d bytes of the path.
  std::vector<ByteSet> allowed(max_depth_ + 1);
  allowed[0] = scratch.allowed_bytes();
  for (size_t i = 0; i < nodes_.size();) {
    const Node& n = nodes_[i];
    while (scratch.depth() > n.depth) scratch.pop();
    if (!allowed[n.depth].has(n.byte)) {
      i = n.subtree_end;
      continue;
    }
    for (uint32_t t = n.tokens_begin; t < n.tokens_end; ++t)
      bitmask[token_ids_[t] >> 5] |= uint32_t{1} << (token_ids_[t] & 31);
    if (n.subtree_end > i + 1) {  // has children: advance (cannot fail: the byte is allowed)
      const bool ok = scratch.push(n.byte);
      KILN_CHECK(ok) << "byte " << int(n.byte) << " in the allowed set but not scanned";
      allowed[n.depth + 1] = scratch.allowed_bytes();
    }
    ++i;
  }
  if (eos_id_ && m.is_complete()) bitmask[*eos_id_ >> 5] |= uint32_t{1} << (*eos_id_ & 31);
}

}  // namespace kiln::grammar
