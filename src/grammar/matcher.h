// Matcher: an Earley recognizer over bytes for any Grammar (grammar.h), with rollback.
//
// The input is a stream of bytes fed in chunks (a chunk is typically one token's bytes).
// State after n bytes is the list of Earley sets 0..n; set i holds the items
// (alternative, dot, origin) alive after byte i. One byte costs a scan of the last set and
// the closure (predict / complete) of the new one; with the left-recursive repetition the
// front ends emit, a set holds O(grammar nesting depth) items, independent of input length.
// Completion looks up the items waiting on a rule in an older set: a linear scan of a small
// set, a binary search in a large one (those are sorted by the rule their items wait on).
//
// Empty rules follow Aycock and Horspool: predicting a nullable rule also advances the dot
// past it, so a completion whose origin is the current set never needs to be revisited.
//
// Memory: all sets are kept (rollback needs them): O(bytes accepted * items per set).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"

namespace kiln::grammar {

// The grammar flattened for the recognizer. Immutable, shared by all matchers of a request.
struct CompiledGrammar {
  enum class PosKind : uint8_t { kBytes, kRule, kEnd };
  // One entry per element of every alternative plus an end marker per alternative; an
  // Earley item's dot is an index into this table.
  struct Pos {
    PosKind kind;
    uint32_t value;  // kBytes: index into byte_sets; kRule: rule; kEnd: the alternative's rule
  };
  std::vector<Pos> pos;
  std::vector<uint32_t> waits;  // per pos: the rule it waits on, or kNoRule (sort key)
  std::vector<ByteSet> byte_sets;
  std::vector<std::vector<uint32_t>> alt_starts;  // per rule: first pos of each alternative
  std::vector<uint8_t> nullable;                  // per rule
  std::vector<std::string> rule_names;
  uint32_t start_rule = 0;  // the augmented start S' ::= S
  uint32_t accept_pos = 0;  // S' ::= S .

  static constexpr uint32_t kNoRule = UINT32_MAX;

  static Result<std::shared_ptr<const CompiledGrammar>> compile(const Grammar& g);
};

namespace detail {

struct Item {
  uint32_t pos;
  uint32_t origin;
};

// Earley sets in one flat array: set s is items[begin[s], begin[s + 1]).
struct Chart {
  std::vector<Item> items;
  std::vector<uint32_t> begin{0};
  uint32_t n_sets() const { return static_cast<uint32_t>(begin.size() - 1); }
  std::span<const Item> set(uint32_t s) const {
    return {items.data() + begin[s], items.data() + begin[s + 1]};
  }
  void pop_set() {
    begin.pop_back();
    items.resize(begin.back());
  }
};

// Scratch buffers for building a set (dedup table, prediction stamps).
struct Workspace {
  std::vector<uint64_t> table;  // open addressing; 0 = empty, else (pos << 32 | origin) + 1
  std::vector<uint32_t> used;   // occupied slots, to clear
  std::vector<uint32_t> predicted;  // per rule: stamp of the set it was last predicted in
  uint32_t stamp = 0;
  std::vector<Item> tmp;
  // Sets below this index are opaque (their items unknown): a completion that would look one
  // up sets touched_opaque instead. 0 for real charts; the token mask's cache walks a partial
  // view of a chart with some (token_mask.cpp).
  uint32_t n_opaque_sets = 0;
  bool touched_opaque = false;
};

// Build the set after `byte` on top of the sets of `lower` (may be null) then `upper`, and
// append it to `upper`. Returns false (and leaves both untouched) if no item scans `byte`.
bool advance(const CompiledGrammar& g, const Chart* lower, Chart& upper, uint8_t byte, Workspace& ws);
// The bytes the top set can scan.
ByteSet allowed_bytes(const CompiledGrammar& g, std::span<const Item> top);
bool contains_accept(const CompiledGrammar& g, std::span<const Item> top);

}  // namespace detail

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> g);

  // Advance over all of `bytes`, or, if some byte is rejected, not at all. Each successful
  // call (even with no bytes) is one chunk for rollback.
  bool accept(std::string_view bytes);
  // Undo the last n successful accept calls. n must not exceed n_accepts().
  void rollback(int n_accepts);
  int n_accepts() const { return static_cast<int>(accept_marks_.size()); }

  bool is_complete() const;   // the bytes so far are a whole sentence of the grammar
  bool can_continue() const;  // some byte can follow
  ByteSet allowed_bytes() const;
  size_t n_bytes() const { return chart_.n_sets() - 1; }
  const CompiledGrammar& grammar() const { return *g_; }
  const std::shared_ptr<const CompiledGrammar>& grammar_ptr() const { return g_; }
  const detail::Chart& chart() const { return chart_; }  // read-only, for the token mask's cache

 private:
  friend class MatcherScratch;
  std::shared_ptr<const CompiledGrammar> g_;
  detail::Chart chart_;
  std::vector<uint32_t> accept_marks_;  // number of sets before each accepted chunk
  detail::Workspace ws_;
};

// A speculative extension of a Matcher that does not copy it: bytes pushed here build sets
// on top of the base matcher's (which must outlive this and not change meanwhile). Used by
// the token mask to walk the vocabulary trie byte by byte.
class MatcherScratch {
 public:
  explicit MatcherScratch(const Matcher& base) : base_(&base) {}
  bool push(uint8_t byte) { return detail::advance(*base_->g_, &base_->chart_, upper_, byte, ws_); }
  void pop() { upper_.pop_set(); }
  size_t depth() const { return upper_.n_sets(); }
  std::span<const detail::Item> top() const {
    return upper_.n_sets() ? upper_.set(upper_.n_sets() - 1) : base_->chart_.set(base_->chart_.n_sets() - 1);
  }
  ByteSet allowed_bytes() const { return detail::allowed_bytes(*base_->g_, top()); }
  bool is_complete() const { return detail::contains_accept(*base_->g_, top()); }

 private:
  const Matcher* base_;
  detail::Chart upper_;
  detail::Workspace ws_;
};

}  // namespace kiln::grammar
