#include "grammar/grammar.h"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "core/check.h"

namespace kiln::grammar {

int ByteSet::count() const {
  int n = 0;
  for (uint64_t w : bits) n += std::popcount(w);
  return n;
}

int ByteSet::single() const {
  if (count() != 1) return -1;
  for (int w = 0; w < 4; ++w)
    if (bits[size_t(w)]) return 64 * w + std::countr_zero(bits[size_t(w)]);
  return -1;
}

namespace {

std::string byte_text(unsigned b, bool in_class) {
  if (b >= 0x21 && b < 0x7f && b != '\\' && b != '"' && !(in_class && (b == ']' || b == '-' || b == '^')))
    return std::string(1, static_cast<char>(b));
  switch (b) {
    case ' ': return " ";
    case '\\': return "\\\\";
    case '"': return "\\\"";
    case '\n': return "\\n";
    case '\t': return "\\t";
    case '\r': return "\\r";
    default: break;
  }
  if (in_class && (b == ']' || b == '-' || b == '^')) return std::string("\\") + static_cast<char>(b);
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02X", b);
  return buf;
}

}  // namespace

std::string ByteSet::to_string() const {
  if (const int b = single(); b >= 0) return "\"" + byte_text(unsigned(b), false) + "\"";
  if (count() == 256) return "[\\x00-\\xFF]";
  // Print the shorter of the set and its complement.
  bool negate = count() > 128;
  const ByteSet s = negate ? complement() : *this;
  std::string out = negate ? "[^" : "[";
  for (unsigned b = 0; b < 256;) {
    if (!s.has(b)) {
      ++b;
      continue;
    }
    unsigned e = b;
    while (e + 1 < 256 && s.has(e + 1)) ++e;
    out += byte_text(b, true);
    if (e > b) out += (e > b + 1 ? "-" : "") + byte_text(e, true);
    b = e + 1;
  }
  return out + "]";
}

std::string too_large_message() {
  return "the grammar is too large: more than " + std::to_string(kMaxRules) +
         " rules (a counted repetition {m,n} costs n + 2 of them)";
}

uint32_t Grammar::add_rule(std::string name, std::vector<Sequence> alternatives) {
  std::string unique = name;
  if (names_.count(unique)) {
    // The first free name_N from 2, as a search from 2 each time would find: names are never
    // removed, so every N below where the last search stopped is still taken.
    int& next = next_suffix_.try_emplace(name, 2).first->second;
    do unique = name + "_" + std::to_string(next++);
    while (names_.count(unique));
  }
  names_.insert(unique);
  rules_.push_back({.name = std::move(unique), .alternatives = std::move(alternatives)});
  return static_cast<uint32_t>(rules_.size() - 1);
}

void Grammar::set_alternatives(uint32_t rule, std::vector<Sequence> alternatives) {
  KILN_CHECK_LT(rule, rules_.size());
  rules_[rule].alternatives = std::move(alternatives);
}

Element Grammar::alternation(std::string name, std::vector<Sequence> alternatives) {
  // Many literals (an enum, a regex's words) become a trie, unless its rules
  // would take the grammar past half its budget (then one rule, as any other alternation).
  if (alternatives.size() >= kLiteralTrieMin) {
    std::vector<std::string> words;
    for (const Sequence& alt : alternatives) {
      std::string w;
      for (const Element& e : alt) {
        const int b = e.kind == Element::Kind::kBytes ? e.bytes.single() : -1;
        if (b < 0) break;
        w += static_cast<char>(b);
      }
      if (w.size() != alt.size()) break;
      words.push_back(std::move(w));
    }
    if (words.size() == alternatives.size())
      if (const std::optional<uint32_t> root = literal_trie(name, std::move(words))) return Element::ref(*root);
  }
  return Element::ref(add_rule(std::move(name), std::move(alternatives)));
}

// The trie's nodes are the sorted, distinct words' points of parting: node k holds the
// words of [lo, hi), which share their first `depth` bytes; each of its alternatives is a
// branch: the bytes up to the branch's next point of parting (or where one of its words
// ends), then that node's rule, or the bytes alone where the branch is one word. A node
// where a word ends has an empty alternative. Planned breadth-first with a list, not
// recursion (a chain of words each a prefix of the next nests deep), then made rules.
std::optional<uint32_t> Grammar::literal_trie(const std::string& name, std::vector<std::string> words) {
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  struct Branch {
    size_t word, from, to;  // the bytes words[word][from, to)
    size_t child;           // the node after them, or 0: none (the root is no one's child)
  };
  struct Node {
    size_t lo, hi, depth;
    std::vector<Branch> branches;
    bool ends = false;  // a word ends here: an empty alternative
  };
  std::vector<Node> nodes{{0, words.size(), 0, {}}};
  for (size_t k = 0; k < nodes.size(); ++k) {
    const size_t lo = nodes[k].lo, hi = nodes[k].hi, depth = nodes[k].depth;
    std::vector<Branch> branches;
    size_t i = lo;
    const bool ends = words[i].size() == depth;  // (sorted: the one that ends here is first)
    if (ends) ++i;
    while (i < hi) {
      size_t j = i + 1;  // the branch: the words whose byte at depth is words[i]'s
      while (j < hi && words[j][depth] == words[i][depth]) ++j;
      // Sorted, so the branch's common prefix is its first and last words'.
      const std::string& a = words[i];
      const std::string& b = words[j - 1];
      size_t end = depth + 1;
      while (end < a.size() && end < b.size() && a[end] == b[end]) ++end;
      size_t child = 0;
      if (j - i > 1 || a.size() > end) {
        child = nodes.size();
        nodes.push_back({i, j, end, {}});
      }
      branches.push_back({i, depth, end, child});
      i = j;
    }
    nodes[k].branches = std::move(branches);
    nodes[k].ends = ends;
    if (rules_.size() + nodes.size() > kMaxRules / 2) return std::nullopt;
  }
  const uint32_t base = static_cast<uint32_t>(rules_.size());
  for (size_t k = 0; k < nodes.size(); ++k) add_rule(name);
  for (size_t k = 0; k < nodes.size(); ++k) {
    std::vector<Sequence> alts;
    if (nodes[k].ends) alts.emplace_back();
    for (const Branch& br : nodes[k].branches) {
      Sequence alt = literal(std::string_view(words[br.word]).substr(br.from, br.to - br.from));
      if (br.child != 0) alt.push_back(Element::ref(base + static_cast<uint32_t>(br.child)));
      alts.push_back(std::move(alt));
    }
    rules_[base + k].alternatives = std::move(alts);
  }
  return base;
}

Element Grammar::optional(std::string name, Sequence body) {
  return alternation(std::move(name), {std::move(body), {}});
}

Element Grammar::star(std::string name, Sequence body) {
  // S ::= S body | <empty>   (left recursion: constant Earley items per byte)
  uint32_t s = add_rule(std::move(name));
  Sequence rec{Element::ref(s)};
  rec.insert(rec.end(), body.begin(), body.end());
  set_alternatives(s, {std::move(rec), {}});
  return Element::ref(s);
}

Element Grammar::plus(std::string name, Sequence body) {
  // P ::= P body | body
  uint32_t p = add_rule(std::move(name));
  Sequence rec{Element::ref(p)};
  rec.insert(rec.end(), body.begin(), body.end());
  set_alternatives(p, {std::move(rec), std::move(body)});
  return Element::ref(p);
}

Element Grammar::text_without(std::string name, std::string_view stop) {
  KILN_CHECK(!stop.empty()) << name << ": text_without an empty string";
  for (size_t k = 1; k < stop.size(); ++k)
    KILN_CHECK(stop.substr(0, k) != stop.substr(stop.size() - k)) << name << ": '" << stop << "' overlaps itself";
  // State q < m: the text so far ends in the first q bytes of `stop` (and contains no whole
  // `stop`). Without self-overlap, a byte either extends the match, restarts it at 1 (the
  // byte is stop[0]) or drops it to 0.
  const size_t m = stop.size();
  const auto next = [&](size_t q, uint8_t b) -> size_t {
    if (uint8_t(stop[q]) == b) return q + 1;
    return uint8_t(stop[0]) == b ? 1 : 0;
  };
  std::vector<uint32_t> state(m);
  for (size_t q = 0; q < m; ++q) state[q] = add_rule(name + "_" + std::to_string(q));
  std::vector<std::vector<Sequence>> alts(m);
  alts[0].push_back({});  // the empty text
  for (size_t p = 0; p < m; ++p) {
    std::vector<ByteSet> to(m);
    for (unsigned b = 0; b < 256; ++b)
      if (size_t q = next(p, uint8_t(b)); q < m) to[q].add(uint8_t(b), uint8_t(b));
    for (size_t q = 0; q < m; ++q)
      if (!to[q].empty()) alts[q].push_back({Element::ref(state[p]), Element::byte_set(to[q])});
  }
  std::vector<Sequence> any;
  for (size_t q = 0; q < m; ++q) {
    set_alternatives(state[q], std::move(alts[q]));
    any.push_back({Element::ref(state[q])});
  }
  return alternation(std::move(name), std::move(any));
}

Element Grammar::embed(const Grammar& other) {
  KILN_CHECK_LT(other.start_, other.rules_.size()) << "embed: a grammar without a start rule";
  // Grammars built apart (each tool's arguments) share this one's budget.
  if (other.too_large() || rules_.size() + other.rules_.size() > kMaxRules) {
    too_large_ = true;
    return Element::ref(add_rule("embedded"));
  }
  const uint32_t base = static_cast<uint32_t>(rules_.size());
  for (const Rule& r : other.rules_) add_rule(r.name);
  for (size_t i = 0; i < other.rules_.size(); ++i) {
    std::vector<Sequence> alts = other.rules_[i].alternatives;
    for (Sequence& seq : alts)
      for (Element& e : seq)
        if (e.kind == Element::Kind::kRule) e.rule += base;
    set_alternatives(base + static_cast<uint32_t>(i), std::move(alts));
  }
  return Element::ref(base + other.start_);
}

Element Grammar::repeat(std::string name, Sequence body, uint32_t min, std::optional<uint32_t> max) {
  KILN_CHECK(!max || *max >= min) << name << ": {" << min << "," << *max << "}";
  if (!max && min == 0) return star(std::move(name), std::move(body));
  if (!max && min == 1) return plus(std::move(name), std::move(body));
  // Counting rules C_0 ::= <empty>, C_i ::= C_{i-1} body, all left-linear so that after i
  // copies the recognizer holds a constant number of items, whatever the bound.
  const uint32_t top_count = max ? *max : min;
  if (rules_.size() + top_count + 3 > kMaxRules) {
    too_large_ = true;
    return Element::ref(add_rule(std::move(name)));
  }
  // A body of several elements becomes a rule of its own, so that each count costs two
  // elements, not a copy of it: "<1,000 bytes>"{10000} was 10 million elements.
  if (body.size() > 1) body = {Element::ref(add_rule(name + "_body", {std::move(body)}))};
  std::vector<uint32_t> counts{add_rule(name + "_0", {{}})};
  for (uint32_t i = 1; i <= top_count; ++i) {
    Sequence seq{Element::ref(counts.back())};
    seq.insert(seq.end(), body.begin(), body.end());
    counts.push_back(add_rule(name + "_" + std::to_string(i), {std::move(seq)}));
  }
  uint32_t top = add_rule(std::move(name));
  std::vector<Sequence> alts;
  if (max) {
    for (uint32_t i = min; i <= *max; ++i) alts.push_back({Element::ref(counts[i])});
  } else {  // R ::= C_min | R body
    alts.push_back({Element::ref(counts[min])});
    Sequence rec{Element::ref(top)};
    rec.insert(rec.end(), body.begin(), body.end());
    alts.push_back(std::move(rec));
  }
  set_alternatives(top, std::move(alts));
  return Element::ref(top);
}

Sequence Grammar::literal(std::string_view s) {
  Sequence seq;
  for (char c : s) seq.push_back(Element::byte(static_cast<uint8_t>(c)));
  return seq;
}

std::vector<Sequence> Grammar::utf8_multibyte() {
  auto r = [](unsigned lo, unsigned hi) { return Element::byte_set(ByteSet::range(lo, hi)); };
  const Element cont = r(0x80, 0xBF);
  return {{r(0xC2, 0xDF), cont},
          {Element::byte(0xE0), r(0xA0, 0xBF), cont},
          {Element::byte_set(ByteSet::range(0xE1, 0xEC).add(0xEE, 0xEF)), cont, cont},
          {Element::byte(0xED), r(0x80, 0x9F), cont},  // no surrogates
          {Element::byte(0xF0), r(0x90, 0xBF), cont, cont},
          {r(0xF1, 0xF3), cont, cont, cont},
          {Element::byte(0xF4), r(0x80, 0x8F), cont, cont}};
}

Sequence Grammar::cat(std::initializer_list<Sequence> parts) {
  Sequence out;
  for (const Sequence& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

size_t Grammar::n_elements() const {
  size_t n = 0;
  for (const Rule& r : rules_)
    for (const Sequence& a : r.alternatives) n += a.size();
  return n;
}

Status Grammar::validate() const {
  if (too_large()) return invalid_argument(too_large_message());
  if (start_ >= rules_.size()) return internal_error("grammar has no start rule");
  for (const Rule& r : rules_)
    for (const Sequence& a : r.alternatives)
      for (const Element& e : a)
        if (e.kind == Element::Kind::kRule && e.rule >= rules_.size())
          return internal_error("rule " + r.name + " refers to rule " + std::to_string(e.rule) +
                                " of " + std::to_string(rules_.size()));
  return Status::Ok();
}

std::string Grammar::to_string() const {
  auto print_rule = [&](const Rule& r) {
    std::string out = r.name + " ::=";
    if (r.alternatives.empty()) out += " <nothing>";
    for (size_t a = 0; a < r.alternatives.size(); ++a) {
      if (a) out += " |";
      const Sequence& seq = r.alternatives[a];
      if (seq.empty()) out += " \"\"";
      for (size_t i = 0; i < seq.size();) {
        const Element& e = seq[i];
        if (e.kind == Element::Kind::kRule) {
          out += " " + rules_[e.rule].name;
          ++i;
          continue;
        }
        if (e.bytes.count() != 1) {
          out += " " + e.bytes.to_string();
          ++i;
          continue;
        }
        // Merge a run of single bytes into one quoted literal.
        std::string lit;
        for (; i < seq.size() && seq[i].kind == Element::Kind::kBytes && seq[i].bytes.count() == 1; ++i) {
          std::string one = seq[i].bytes.to_string();
          lit += one.substr(1, one.size() - 2);
        }
        out += " \"" + lit + "\"";
      }
    }
    return out + "\n";
  };
  std::string out;
  if (start_ < rules_.size()) out += print_rule(rules_[start_]);
  for (uint32_t r = 0; r < rules_.size(); ++r)
    if (r != start_) out += print_rule(rules_[r]);
  return out;
}

}  // namespace kiln::grammar
