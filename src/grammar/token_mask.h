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
//
// Plain string runs (what makes a miss inside a JSON string cheap). Built once per
// vocabulary: the tokens whose bytes are "plain string text" (a prefix of a sequence of
// whole UTF-8 characters among 0x20-0x7F without '"' and '\\', and the well-formed
// multibyte forms: no overlongs, no surrogates), each with its need: the characters it
// starts (a trailing partial character counts one), and per trie node the largest need of
// its subtree (or "has another token"). Before a walk, the walker's state is probed: every
// class of plain character (one byte per group of bytes the UTF-8 automaton and the state's
// items treat alike) is pushed through, and the probe succeeds when all of them are scanned,
// none completes into an opaque set, and all lead to one same next set (same items; origins
// in the intermediate sets refused). Repeated from that set, it yields J: the number of plain
// characters any plain text of up to J characters is accepted for, and stops early with J
// unbounded when the next set equals the previous one up to its own index (a string body's
// loop: same future), or when a set scans no plain byte at all ("closed": plain tokens that
// need more than J are refused). The mask is then the plain tokens of need <= J, plus a walk
// that skips every subtree whose tokens are all decided. Inside a free string only the
// subtrees holding tokens with '"', '\\', control bytes or broken UTF-8 are walked; inside a
// maxLength string the chain runs to the bound. Anything the probe cannot prove (patterns,
// formats, other grammar) gives J = 0 and the plain walk, so masks stay exact.
//
// Character loops (what makes masks cheap inside format and pattern strings: an email's
// dot-atoms, `[a-z]+`, `\\w*`). A state loops on a character c when pushing c leads to a
// set equal to it up to its own index (the plain runs' loop test); then every string of such
// characters leaves the state unchanged, and any token made only of them is accepted. The
// probe tests one byte per group of ASCII bytes the state's items scan alike, and, when the
// multibyte forms are wanted, every well-formed multibyte character (as the plain probe);
// the result is a loop set L (ASCII bytes, and "all multibyte characters" or not). Per trie
// node the masker keeps a summary of the bytes of its subtree (its own byte and below: the
// ASCII bytes, whether any is >= 0x80, whether every path is well-formed UTF-8); a node
// whose summary lies within L, reached from a state looping on L, has its whole subtree of
// tokens accepted without a step; and where L holds from the top of the mask (its tokens are
// in the bitmask already), a subtree whose other bytes are all ones the looping state does
// not scan (an email's letters followed by accented ones) is decided too: nothing more in it. L carries down the walk through bytes in L (the state
// after them is the same); elsewhere the walk probes again below nodes with big subtrees.
// At the top of a mask the tokens made only of L's characters come from a bitmask built once
// per loop set (cached in the masker). The cache's tainted subtrees (steps that complete into
// a set outside the local view, e.g. the character that ends an email's atom) use the same
// test on the real chart, so a hit costs a probe instead of walking every letter subtree.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <tuple>
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
  // Character loops (above): an ASCII byte set and "every multibyte character"; a summary of
  // bytes (a node's subtree, a token) in the same form plus "well-formed UTF-8" (kCharsOk).
  struct Chars {
    uint64_t lo = 0, hi = 0;  // ASCII bytes 0-63, 64-127
    uint8_t flags = 0;        // kCharsMb, kCharsOk
  };
  static constexpr uint8_t kCharsMb = 1, kCharsOk = 2;
  static constexpr Chars kAllChars{~uint64_t{0}, ~uint64_t{0}, kCharsMb};  // probe candidates: all
  struct Loop {
    Chars set;             // lo / hi: the looping ASCII bytes; kCharsMb: every multibyte character loops
    ByteSet allowed;       // the bytes the looping state scans
    bool valid = false;
    bool in_mask = false;  // the tokens made of set's characters are already in the bitmask
  };
  // A token (or every token of a subtree) made only of l's characters: accepted.
  static bool within(const Chars& c, const Loop& l) {
    return l.valid && (c.flags & kCharsOk) && !(c.lo & ~l.set.lo) && !(c.hi & ~l.set.hi) &&
           (!(c.flags & kCharsMb) || (l.set.flags & kCharsMb));
  }
  // Every token of a subtree (summary c) either made of l's characters, or refused: its first
  // other byte, met in the looping state, is one that state does not scan. Then the subtree's
  // accepted tokens are exactly those within l.
  static bool decided(const Chars& c, const Loop& l) {
    if (!l.valid || (c.lo & ~l.set.lo & l.allowed.bits[0]) || (c.hi & ~l.set.hi & l.allowed.bits[1])) return false;
    if (!(c.flags & kCharsMb)) return true;
    if (l.set.flags & kCharsMb) return c.flags & kCharsOk;
    return (l.allowed.bits[2] | l.allowed.bits[3]) == 0;
  }
  // The loop set of the walker's state among `candidates` (ASCII bytes; kCharsMb: try the
  // multibyte characters too); invalid when nothing loops.
  template <class Walker>
  Loop probe_loop(Walker& walker, const Chars& candidates) const;
  // The tokens made only of l's characters (well-formed UTF-8, a trailing partial character
  // allowed), built once per loop set.
  std::shared_ptr<const std::vector<uint32_t>> loop_mask(const Loop& l) const;
  // Sets the bits of every token in node i's subtree.
  void mark_subtree(size_t i, uint32_t* bitmask) const;
  // The probe at the top of a mask (among `candidates`): invalid unless enough bytes are
  // allowed to be worth it; on success ORs loop_mask into bitmask, returns it with in_mask set.
  template <class Walker>
  Loop top_loop(Walker& walker, uint32_t* bitmask, const Chars& candidates) const;

  // Walks nodes [begin, end) (one subtree's descendants, or the whole trie) with `walker` at
  // the depth of their parent, allowed[depth] its scannable bytes; sets the bits of accepted
  // tokens. A push the walker refuses (context-dependent) appends the node to `tainted`.
  // Subtrees with sub_need_ <= skip_limit are skipped (decided beforehand: plain runs).
  // loops[d]: the loop the state after d bytes of the path is known to have (see above).
  template <class Walker>
  void walk(Walker& walker, size_t begin, size_t end, std::vector<ByteSet>& allowed, std::vector<Loop>& loops,
            uint32_t* bitmask, std::vector<uint32_t>* tainted, uint16_t skip_limit = 0) const;
  // Plain string runs (above): sets the bits of the plain tokens the walker's state accepts
  // for sure and returns the skip limit for the walk that completes the mask.
  template <class Walker>
  uint16_t fill_plain(Walker& walker, uint32_t* bitmask) const;
  void build_plain_index(const std::vector<std::string>& vocab);
  void build_loop_index(const std::vector<std::string>& vocab);
  const MaskCache::Entry& cached_entry(const Matcher& m, MaskCache& cache) const;

  size_t vocab_size_;
  std::optional<uint32_t> eos_id_;
  uint32_t max_depth_ = 0;
  std::vector<Node> nodes_;  // preorder
  std::vector<uint32_t> token_ids_;
  // Plain string runs: per node the largest need in its subtree, kOtherToken when it holds a
  // token that is not plain text; the plain tokens by need; their mask.
  static constexpr uint16_t kOtherToken = UINT16_MAX;
  static constexpr uint16_t kMaxNeed = UINT16_MAX - 1;
  std::vector<uint16_t> sub_need_;
  std::vector<uint32_t> plain_by_need_;     // token ids, need ascending
  std::vector<uint32_t> plain_need_end_;    // [n]: end in plain_by_need_ of the needs <= n
  std::vector<uint32_t> plain_mask_;        // every plain token
  uint16_t max_need_ = 0;
  // Character loops: per node its subtree's summary, per token its own; masks per loop set.
  std::vector<Chars> node_chars_;
  std::vector<Chars> token_chars_;
  mutable std::mutex loop_mu_;
  mutable std::map<std::tuple<uint64_t, uint64_t, uint8_t>, std::shared_ptr<const std::vector<uint32_t>>> loop_masks_;
};

}  // namespace kiln::grammar
