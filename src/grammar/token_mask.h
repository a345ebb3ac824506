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
//
// MaskCache (after xgrammar's adaptive token mask cache): a token walk from the last Earley
// set reads only a local part of the chart: the last set's items that scan or wait on a rule,
// and, through completions, the rule-waiting items of the sets their origins name. The cache
// keys a mask by a local view (the last set plus the sets its rule-waiting items start in,
// origins renumbered; any other set is opaque, contents unknown). A miss walks the trie on the
// view alone; a node whose step would complete into an opaque set (inside a JSON string: only
// the closing quote) is recorded as context-dependent and its subtree skipped. The entry is
// the mask of every other token (exact: the view holds all those steps read) plus those
// nodes, which each fill walks again on the real chart. Inside a string the key does not
// depend on the string's position or nesting depth, so it repeats.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.h"

namespace kiln::grammar {

class TokenMasker;

// Masks memoized per local view like MaskCache's, shared by every sequence of one grammar
// (and masker), across requests where the caller keeps it with the compiled grammar: a miss
// one sequence pays serves all. Thread safe; MaskCaches of many threads may share one.
class SharedMaskCache {
 public:
  explicit SharedMaskCache(size_t max_entries = 1024) : max_entries_(max_entries) {}
  size_t n_entries() const;

 private:
  friend class TokenMasker;
  friend class MaskCache;
  struct KeyHash {
    size_t operator()(const std::vector<uint32_t>& key) const;
  };
  struct Entry {
    std::vector<uint32_t> mask;      // mask_words(): the tokens decided by the local view
    std::vector<uint32_t> tainted;  // trie nodes whose subtrees need the real chart
  };
  size_t max_entries_;
  mutable std::shared_mutex mu_;
  const TokenMasker* masker_ = nullptr;  // set by the first use, under mu_
  const CompiledGrammar* grammar_ = nullptr;
  std::unordered_map<std::vector<uint32_t>, std::shared_ptr<const Entry>, KeyHash> entries_;
};

// Masks memoized per local Earley view (see above), for one TokenMasker and one grammar;
// one per request (or per grammar). Not thread safe.
class MaskCache {
 public:
  // Entries are ~vocab/8 bytes each; past max_entries the cache starts over. With `shared`,
  // a miss here looks there before walking the trie, and what it walks goes there too.
  explicit MaskCache(size_t max_entries = 4096, std::shared_ptr<SharedMaskCache> shared = nullptr)
      : max_entries_(max_entries), shared_(std::move(shared)) {}
  size_t n_entries() const { return entries_.size(); }
  size_t n_hits() const { return n_hits_; }
  size_t n_misses() const { return n_misses_; }

 private:
  friend class TokenMasker;
  using KeyHash = SharedMaskCache::KeyHash;
  using Entry = SharedMaskCache::Entry;
  size_t max_entries_;
  std::shared_ptr<SharedMaskCache> shared_;
  const TokenMasker* masker_ = nullptr;
  const CompiledGrammar* grammar_ = nullptr;
  std::unordered_map<std::vector<uint32_t>, std::shared_ptr<const Entry>, KeyHash> entries_;
  size_t n_hits_ = 0, n_misses_ = 0;
  // Scratch for building views and walking them.
  std::vector<uint32_t> key_;
  detail::Chart view_, upper_;
  detail::Workspace ws_;
};

class TokenMasker {
 public:
  // vocab[t] = the bytes of token t (empty for special tokens).
  TokenMasker(const std::vector<std::string>& vocab, std::optional<uint32_t> eos_id);

  size_t vocab_size() const { return vocab_size_; }
  size_t mask_words() const { return (vocab_size_ + 31) / 32; }  // uint32 words per mask
  size_t n_nodes() const { return nodes_.size(); }

  // bitmask: mask_words() words; bit t (word t / 32, bit t % 32) set iff token t may follow.
  // With a cache, the same mask from the cache's entry for m's local view (filled on a miss).
  void fill_mask(const Matcher& m, uint32_t* bitmask, MaskCache* cache = nullptr) const;

 private:
  struct Node {
    uint8_t byte;
    uint32_t depth;         // bytes before this node's byte (0: a child of the root)
    uint32_t parent;        // kNoParent for a child of the root
    uint32_t subtree_end;   // index of the first node after this node's subtree
    uint32_t tokens_begin;  // tokens ending at this node: token_ids_[begin, end)
    uint32_t tokens_end;
  };
  static constexpr uint32_t kNoParent = UINT32_MAX;

  // Walks nodes [begin, end) (one subtree's descendants, or the whole trie) with `walker` at
  // the depth of their parent, allowed[depth] its scannable bytes; sets the bits of accepted
  // tokens. A push the walker refuses (context-dependent) appends the node to `tainted`.
  template <class Walker>
  void walk(Walker& walker, size_t begin, size_t end, std::vector<ByteSet>& allowed, uint32_t* bitmask,
            std::vector<uint32_t>* tainted) const;
  const MaskCache::Entry& cached_entry(const Matcher& m, MaskCache& cache) const;

  size_t vocab_size_;
  std::optional<uint32_t> eos_id_;
  uint32_t max_depth_ = 0;
  std::vector<Node> nodes_;  // preorder
  std::vector<uint32_t> token_ids_;
};

}  // namespace kiln::grammar
