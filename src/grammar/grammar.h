// Grammar: a context-free grammar over bytes, the one IR every structured-output front end
// (JSON schema, regex) compiles to and the matcher (matcher.h) runs.
//
//   rule        ::= alternative | alternative | ...     (no alternatives: matches nothing)
//   alternative ::= element element ...                 (no elements: matches the empty string)
//   element     ::= a set of bytes (one byte of input) | a reference to a rule
//
// Repetition, optional, star and plus are helpers that add auxiliary rules. Repetition is
// written left-recursively (S ::= S X | ...), which an Earley recognizer runs in constant
// items per input byte; right recursion would cost a chain of completions per byte.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"

namespace kiln::grammar {

// What a grammar from a request may cost. Rules: a counted repetition {m,n} adds n + 2 of
// them, so a short pattern could otherwise ask for billions. Group depth: each level of a
// regex's or GBNF rule's parentheses is a few stack frames of its parser (100,000 levels
// overflowed a server thread's stack).
inline constexpr size_t kMaxRules = 250000;
inline constexpr int kMaxGroupDepth = 128;
// "the grammar is too large: more than 250000 rules (...)", for a front end's error.
std::string too_large_message();

// A set of byte values: bit b set iff byte b is in the set.
struct ByteSet {
  std::array<uint64_t, 4> bits{};

  static ByteSet of(uint8_t b) { return ByteSet{}.add(b, b); }
  static ByteSet range(uint8_t lo, uint8_t hi) { return ByteSet{}.add(lo, hi); }
  ByteSet& add(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) bits[b >> 6] |= uint64_t{1} << (b & 63);
    return *this;
  }
  ByteSet& add(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) bits[i] |= o.bits[i];
    return *this;
  }
  ByteSet& remove(uint8_t b) {
    bits[b >> 6] &= ~(uint64_t{1} << (b & 63));
    return *this;
  }
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  int count() const;
  int single() const;  // the byte of a one-byte set, else -1
  ByteSet complement() const {
    ByteSet r;
    for (int i = 0; i < 4; ++i) r.bits[i] = ~bits[i];
    return r;
  }
  bool operator==(const ByteSet&) const = default;
  // "[a-z0-9_]" style, bytes outside printable ASCII as \xHH; one byte as 'a'.
  std::string to_string() const;
};

struct Element {
  enum class Kind : uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;
  uint32_t rule = 0;  // kRule: index into Grammar::rules()
  ByteSet bytes;      // kBytes

  static Element byte_set(const ByteSet& s) { return {.kind = Kind::kBytes, .bytes = s}; }
  static Element byte(uint8_t b) { return byte_set(ByteSet::of(b)); }
  static Element ref(uint32_t rule) { return {.kind = Kind::kRule, .rule = rule}; }
};

using Sequence = std::vector<Element>;

struct Rule {
  std::string name;
  std::vector<Sequence> alternatives;
};

class Grammar {
 public:
  // A new rule (names are made unique with a numeric suffix); fill it later with
  // set_alternatives, which is how recursive rules are built.
  uint32_t add_rule(std::string name, std::vector<Sequence> alternatives = {});
  void set_alternatives(uint32_t rule, std::vector<Sequence> alternatives);
  void set_start(uint32_t rule) { start_ = rule; }

  // Helpers: each returns a reference to a new auxiliary rule named after `name`.
  // alternation: kLiteralTrieMin or more alternatives that are all literals (one byte an
  // element) become a trie of rules (one a point where the words part), so that an Earley
  // set holds the branches at that point rather than every word: an enum of 10,000
  // strings cost up to 34 ms a token mask at its first byte (docs/perf/structured-output.md).
  static constexpr size_t kLiteralTrieMin = 16;
  Element alternation(std::string name, std::vector<Sequence> alternatives);
  Element optional(std::string name, Sequence body);  // body?
  Element star(std::string name, Sequence body);      // body*
  Element plus(std::string name, Sequence body);      // body+
  // body{min,max}; max nullopt = unbounded. Costs max + 2 rules when bounded (one more for
  // a body of several elements, which becomes a rule of its own).
  Element repeat(std::string name, Sequence body, uint32_t min, std::optional<uint32_t> max);

  // Free text: any bytes that do not contain `stop` (which must not overlap itself: no
  // proper prefix of it is also a suffix, as "</think>" and "<|"), as left-linear rules over
  // the states of its string-matching automaton. Followed by `stop`, it matches up to the
  // first `stop`: a reasoning block before a constrained answer.
  Element text_without(std::string name, std::string_view stop);
  // Copies `other`'s rules into this grammar; the reference is to its start rule. Past the
  // budget (together) it copies nothing and this grammar is too_large.
  Element embed(const Grammar& other);

  // The bytes of `s`, one element each.
  static Sequence literal(std::string_view s);
  // The well-formed UTF-8 encodings of U+0080..U+10FFFF (no surrogates, no overlongs) as
  // alternatives of byte sets: 2, 3 and 4-byte forms.
  static std::vector<Sequence> utf8_multibyte();
  // Concatenation helper: cat({a, b}, c) appends.
  static Sequence cat(std::initializer_list<Sequence> parts);

  const std::vector<Rule>& rules() const { return rules_; }
  // More than kMaxRules rules: validate refuses the grammar; a counted repetition past the
  // budget adds one empty rule instead of its count; front ends stop early.
  bool too_large() const { return too_large_ || rules_.size() > kMaxRules; }
  uint32_t start() const { return start_; }
  size_t n_elements() const;  // total elements over all alternatives (size measure)

  // Every rule reference in range and a start rule set. Broken grammars are bugs of the
  // front end, but a Status lets a front end report them as such. A too_large grammar is
  // an InvalidArgument that says so.
  Status validate() const;
  // One rule a line: `name ::= "lit" [a-z] other | ...`; the start rule first.
  std::string to_string() const;

 private:
  std::optional<uint32_t> literal_trie(const std::string& name, std::vector<std::string> words);

  std::vector<Rule> rules_;
  uint32_t start_ = UINT32_MAX;
  std::unordered_set<std::string> names_;  // for uniqueness
  // Where add_rule's search for a free name_N stopped, by name (n rules of one name cost
  // n lookups, not n^2 / 2: 10,000 regex groups took 16 s).
  std::unordered_map<std::string, int> next_suffix_;
  bool too_large_ = false;
};

}  // namespace kiln::grammar
