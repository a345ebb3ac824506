#include "grammar/token_mask.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <mutex>
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
      const uint32_t parent = path.empty() ? kNoParent : path.back();
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      const auto n_tokens = static_cast<uint32_t>(token_ids_.size());
      nodes_.push_back({.byte = static_cast<uint8_t>(s[d]), .depth = static_cast<uint32_t>(d), .parent = parent,
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
  build_plain_index(vocab);
  build_loop_index(vocab);
}

namespace {

// Below a node with a subtree this big and no loop carried down, a walk probes for one.
constexpr uint32_t kLoopProbeMin = 32;

using detail::Chart;
using detail::Item;
using PosKind = CompiledGrammar::PosKind;

// The items a walk from the last set can read: in the last set those that scan or wait on a
// rule; below it only those waiting on a rule (what completions look up).
bool relevant(const CompiledGrammar& g, const Item& it, bool last) {
  const PosKind k = g.pos[it.pos].kind;
  return k == PosKind::kRule || (last && k == PosKind::kBytes);
}

// Plain JSON string text as a UTF-8 automaton: kU0 between characters, the others inside
// one (how many continuation bytes remain; the restricted second bytes of E0, ED, F0, F4).
enum Utf8State : uint8_t { kU0, kU1, kU2, kU3, kE0, kED, kF0, kF4, kNStates, kFail = 0xFF };

// With all_ascii, any well-formed UTF-8 (every ASCII byte between characters): the
// character loops' summaries.
struct PlainAutomaton {
  uint8_t next[kNStates][256];
  ByteSet bytes[kNStates];  // the bytes each state takes
  explicit PlainAutomaton(bool all_ascii = false) {
    std::memset(next, kFail, sizeof next);
    auto set = [&](uint8_t from, unsigned lo, unsigned hi, uint8_t to) {
      for (unsigned b = lo; b <= hi; ++b) next[from][b] = to;
    };
    set(kU0, 0x20, 0x7F, kU0);
    next[kU0][uint8_t('"')] = next[kU0][uint8_t('\\')] = kFail;
    if (all_ascii) set(kU0, 0x00, 0x7F, kU0);
    set(kU0, 0xC2, 0xDF, kU1);
    set(kU0, 0xE0, 0xE0, kE0);
    set(kU0, 0xE1, 0xEF, kU2);
    set(kU0, 0xED, 0xED, kED);
    set(kU0, 0xF0, 0xF0, kF0);
    set(kU0, 0xF1, 0xF3, kU3);
    set(kU0, 0xF4, 0xF4, kF4);
    set(kU1, 0x80, 0xBF, kU0);
    set(kU2, 0x80, 0xBF, kU1);
    set(kU3, 0x80, 0xBF, kU2);
    set(kE0, 0xA0, 0xBF, kU1);
    set(kED, 0x80, 0x9F, kU1);
    set(kF0, 0x90, 0xBF, kU2);
    set(kF4, 0x80, 0x8F, kU2);
    for (int u = 0; u < kNStates; ++u)
      for (int b = 0; b < 256; ++b)
        if (next[u][b] != kFail) bytes[u].add(uint8_t(b), uint8_t(b));
  }
};
const PlainAutomaton& plain_automaton() {
  static const PlainAutomaton a;
  return a;
}
const PlainAutomaton& utf8_automaton() {
  static const PlainAutomaton a(true);
  return a;
}

// The probe of one plain character from the walker's top set (index `from`): see token_mask.h.
constexpr uint32_t kSelf = UINT32_MAX, kPrev = UINT32_MAX - 1;
struct Probe {
  uint32_t from = 0;
  bool have_next = false;
  std::vector<uint8_t> path, rep;   // bytes pushed; the path to the first next set
  std::vector<Item> next, canon;    // the next set (origins: kSelf, kPrev, or below `from`)
};

bool item_less(const Item& a, const Item& b) { return a.pos != b.pos ? a.pos < b.pos : a.origin < b.origin; }
bool item_eq(const Item& a, const Item& b) { return a.pos == b.pos && a.origin == b.origin; }

// The top set's items that later steps read (those that scan or wait on a rule: completed
// items are never looked at again), its own index as kSelf, sorted.
template <class Walker>
void self_canon(const Walker& w, std::vector<Item>& out) {
  const uint32_t self = w.top_index();
  out.clear();
  for (const Item& it : w.top())
    if (relevant(w.grammar(), it, true)) out.push_back({it.pos, it.origin == self ? kSelf : it.origin});
  std::sort(out.begin(), out.end(), item_less);
}

// Pushes every class of plain bytes the automaton takes in `state` (all must scan, none may
// complete into an opaque set); at a character's end, compares the set with p.next. `first`:
// instead of the automaton's bytes, these (the lead bytes of the multibyte forms).
template <class Walker>
bool probe_from(Walker& w, uint8_t state, Probe& p, const ByteSet* first = nullptr) {
  const CompiledGrammar& g = w.grammar();
  const PlainAutomaton& a = plain_automaton();
  const std::span<const Item> top = w.top();
  const ByteSet allowed = detail::allowed_bytes(g, top);
  const ByteSet& want = first ? *first : a.bytes[state];
  for (int i = 0; i < 4; ++i)
    if (want.bits[i] & ~allowed.bits[i]) return false;
  // Bytes grouped by (next state, the items that scan them): one push per group.
  std::vector<const ByteSet*> scanners;
  for (const Item& it : top)
    if (g.pos[it.pos].kind == PosKind::kBytes) scanners.push_back(&g.byte_sets[g.pos[it.pos].value]);
  if (scanners.size() > 256) return false;
  struct Group {
    uint8_t next;
    std::array<uint64_t, 4> sig;
    uint8_t byte;
  };
  std::vector<Group> groups;
  for (int b = 0; b < 256; ++b) {
    if (!want.has(uint8_t(b))) continue;
    Group gr{a.next[state][b], {}, uint8_t(b)};
    for (size_t j = 0; j < scanners.size(); ++j)
      if (scanners[j]->has(uint8_t(b))) gr.sig[j >> 6] |= uint64_t{1} << (j & 63);
    auto same = [&](const Group& o) { return o.next == gr.next && o.sig == gr.sig; };
    if (std::find_if(groups.begin(), groups.end(), same) == groups.end()) groups.push_back(gr);
  }
  for (const Group& gr : groups) {
    if (!w.try_push(gr.byte)) return false;
    p.path.push_back(gr.byte);
    bool ok = true;
    if (gr.next == kU0) {
      const uint32_t self = w.top_index();
      p.canon.clear();
      for (const Item& it : w.top()) {
        if (!relevant(g, it, true)) continue;
        uint32_t o = it.origin;
        if (o == self) o = kSelf;
        else if (o == p.from) o = kPrev;
        else if (o > p.from) ok = false;  // reads a set inside the character: path dependent
        p.canon.push_back({it.pos, o});
      }
      std::sort(p.canon.begin(), p.canon.end(), item_less);
      if (ok && !p.have_next) {
        p.next.swap(p.canon);
        p.rep = p.path;
        p.have_next = true;
      } else if (ok) {
        ok = std::equal(p.next.begin(), p.next.end(), p.canon.begin(), p.canon.end(), item_eq);
      }
    } else {
      ok = probe_from(w, gr.next, p);
    }
    p.path.pop_back();
    w.pop();
    if (!ok) return false;
  }
  return true;
}

// After pushing a character from the set at index `from` whose canonical items are `cur`:
// whether the top set equals it up to its own index (no origin at or after `from`).
template <class Walker>
bool loops_back(const Walker& w, uint32_t from, const std::vector<Item>& cur, std::vector<Item>& tmp) {
  const uint32_t self = w.top_index();
  tmp.clear();
  for (const Item& it : w.top()) {
    if (!relevant(w.grammar(), it, true)) continue;
    if (it.origin == self) tmp.push_back({it.pos, kSelf});
    else if (it.origin >= from) return false;
    else tmp.push_back(it);
  }
  std::sort(tmp.begin(), tmp.end(), item_less);
  return std::equal(tmp.begin(), tmp.end(), cur.begin(), cur.end(), item_eq);
}

// The real chart on top of a matcher.
struct RealWalker {
  MatcherScratch scratch;
  const CompiledGrammar& g;
  uint32_t base_top;  // the matcher's last set
  const CompiledGrammar& grammar() const { return g; }
  std::span<const Item> top() const { return scratch.top(); }
  uint32_t top_index() const { return base_top + static_cast<uint32_t>(scratch.depth()); }
  bool try_push(uint8_t byte) { return push(byte); }
  size_t depth() const { return scratch.depth(); }
  bool push(uint8_t byte) {
    const bool ok = scratch.push(byte);
    KILN_CHECK(ok) << "byte " << int(byte) << " in the allowed set but not scanned";
    return true;
  }
  void pop() { scratch.pop(); }
  ByteSet allowed_bytes() const { return scratch.allowed_bytes(); }
};

// A local view (opaque sets first, the last set last) and sets built on it; a push whose
// closure would read an opaque set is refused.
struct ViewWalker {
  const CompiledGrammar& g;
  const Chart& view;
  Chart& upper;
  detail::Workspace& ws;
  const CompiledGrammar& grammar() const { return g; }
  std::span<const Item> top() const {
    return upper.n_sets() ? upper.set(upper.n_sets() - 1) : view.set(view.n_sets() - 1);
  }
  uint32_t top_index() const { return view.n_sets() - 1 + upper.n_sets(); }
  bool try_push(uint8_t byte) { return push(byte); }
  size_t depth() const { return upper.n_sets(); }
  bool push(uint8_t byte) {
    ws.touched_opaque = false;
    const bool ok = detail::advance(g, &view, upper, byte, ws);
    KILN_CHECK(ok) << "byte " << int(byte) << " in the allowed set but not scanned";
    if (!ws.touched_opaque) return true;
    upper.pop_set();
    return false;
  }
  void pop() { upper.pop_set(); }
  ByteSet allowed_bytes() const {
    return detail::allowed_bytes(g, upper.n_sets() ? upper.set(upper.n_sets() - 1) : view.set(view.n_sets() - 1));
  }
};

// The local view of `chart` into `view` (opaque sets empty) and its key: the number of opaque
// sets, then per kept set its item count and (pos, renumbered origin) pairs.
void build_view(const CompiledGrammar& g, const Chart& chart, Chart& view, uint32_t& n_opaque,
                std::vector<uint32_t>& key) {
  const uint32_t last = chart.n_sets() - 1;
  // Kept: the last set and the sets where its items waiting on a rule start: what a JSON
  // string body needs (a character completes into the set after the opening quote). The
  // origins of items waiting on a byte stay opaque: the string's own (before its opening
  // quote) is read only after the closing one, and keeping it would split the key by the
  // string's context.
  std::vector<uint32_t> kept{last}, opaque;
  auto find = [](const std::vector<uint32_t>& v, uint32_t s) { return std::find(v.begin(), v.end(), s) != v.end(); };
  for (const Item& it : chart.set(last))
    if (relevant(g, it, false) && !find(kept, it.origin)) kept.push_back(it.origin);
  for (uint32_t s : kept)
    for (const Item& it : chart.set(s))
      if (relevant(g, it, s == last) && !find(kept, it.origin) && !find(opaque, it.origin)) opaque.push_back(it.origin);
  // Labels: opaque sets 0.., kept ones after them in chart order, the last set last.
  std::sort(kept.begin(), kept.end());
  n_opaque = static_cast<uint32_t>(opaque.size());
  auto label = [&](uint32_t s) -> uint32_t {
    auto k = std::lower_bound(kept.begin(), kept.end(), s);
    if (k != kept.end() && *k == s) return n_opaque + static_cast<uint32_t>(k - kept.begin());
    return static_cast<uint32_t>(std::find(opaque.begin(), opaque.end(), s) - opaque.begin());
  };
  view.items.clear();
  view.begin.assign(n_opaque + 1, 0);
  key.clear();
  key.push_back(n_opaque);
  for (uint32_t s : kept) {
    const size_t key_count = key.size();
    key.push_back(0);
    for (const Item& it : chart.set(s)) {
      if (!relevant(g, it, s == last)) continue;
      // Filtering keeps a sorted set sorted, and a set small enough to scan stays so.
      view.items.push_back({it.pos, label(it.origin)});
      key.push_back(it.pos);
      key.push_back(view.items.back().origin);
      ++key[key_count];
    }
    view.begin.push_back(static_cast<uint32_t>(view.items.size()));
  }
}

}  // namespace

size_t SharedMaskCache::n_entries() const {
  std::shared_lock lock(mu_);
  return entries_.size();
}

size_t SharedMaskCache::KeyHash::operator()(const std::vector<uint32_t>& key) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t x : key) h = (h ^ x) * 0x100000001b3ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

void TokenMasker::build_plain_index(const std::vector<std::string>& vocab) {
  const PlainAutomaton& a = plain_automaton();
  // need[t]: characters started by a plain token, kOtherToken for any other.
  std::vector<uint16_t> need(vocab.size(), kOtherToken);
  for (size_t t = 0; t < vocab.size(); ++t) {
    if (vocab[t].empty()) continue;
    uint8_t u = kU0;
    uint32_t n = 0;
    for (char c : vocab[t]) {
      if (u == kU0) ++n;
      u = a.next[u][uint8_t(c)];
      if (u == kFail) break;
    }
    if (u != kFail && n <= kMaxNeed) need[t] = static_cast<uint16_t>(n);
  }
  sub_need_.assign(nodes_.size(), 0);
  for (size_t i = 0; i < nodes_.size(); ++i)
    for (uint32_t k = nodes_[i].tokens_begin; k < nodes_[i].tokens_end; ++k)
      sub_need_[i] = std::max(sub_need_[i], need[token_ids_[k]]);
  for (size_t i = nodes_.size(); i-- > 0;)  // children come after their parent
    if (nodes_[i].parent != kNoParent)
      sub_need_[nodes_[i].parent] = std::max(sub_need_[nodes_[i].parent], sub_need_[i]);
  plain_mask_.assign(mask_words(), 0);
  for (size_t t = 0; t < vocab.size(); ++t) {
    if (vocab[t].empty() || need[t] == kOtherToken) continue;
    plain_by_need_.push_back(static_cast<uint32_t>(t));
    plain_mask_[t >> 5] |= uint32_t{1} << (t & 31);
    max_need_ = std::max(max_need_, need[t]);
  }
  std::stable_sort(plain_by_need_.begin(), plain_by_need_.end(), [&](uint32_t x, uint32_t y) { return need[x] < need[y]; });
  plain_need_end_.assign(size_t(max_need_) + 1, 0);
  for (uint32_t t : plain_by_need_) ++plain_need_end_[need[t]];
  for (size_t n = 1; n < plain_need_end_.size(); ++n) plain_need_end_[n] += plain_need_end_[n - 1];
}

template <class Walker>
uint16_t TokenMasker::fill_plain(Walker& w, uint32_t* bitmask) const {
  // Chains longer than this leave the longer plain tokens to the walk (maxLength in the
  // thousands would otherwise probe up to max_need_ characters).
  constexpr uint32_t kMaxChain = 64;
  if (max_need_ == 0) return 0;
  const size_t depth0 = w.depth();
  Probe p;
  std::vector<Item> cur;
  self_canon(w, cur);
  uint32_t j = 0;        // plain texts of up to j characters are accepted
  bool decided = false;  // and every plain token is decided (accepted or refused)
  bool accept_all = false;
  for (;;) {
    p.from = w.top_index();
    p.have_next = false;
    p.path.clear();
    if (!probe_from(w, kU0, p) || !p.have_next) {
      // Closed: the set scans no byte that starts plain text, so any plain token needing
      // more than j characters is refused.
      const ByteSet allowed = detail::allowed_bytes(w.grammar(), w.top());
      const ByteSet& start = plain_automaton().bytes[kU0];
      decided = true;
      for (int i = 0; i < 4; ++i)
        if (allowed.bits[i] & start.bits[i]) decided = false;
      break;
    }
    ++j;
    if (std::equal(p.next.begin(), p.next.end(), cur.begin(), cur.end(), item_eq) || j >= max_need_) {
      decided = accept_all = true;  // a loop: the same future after every plain character
      break;
    }
    if (j >= kMaxChain) break;
    for (uint8_t b : p.rep) KILN_CHECK(w.try_push(b)) << "a probed byte refused";
    self_canon(w, cur);
  }
  while (w.depth() > depth0) w.pop();
  if (accept_all) {
    for (size_t i = 0; i < plain_mask_.size(); ++i) bitmask[i] |= plain_mask_[i];
  } else if (j > 0) {
    for (uint32_t k = 0; k < plain_need_end_[std::min<uint32_t>(j, max_need_)]; ++k)
      bitmask[plain_by_need_[k] >> 5] |= uint32_t{1} << (plain_by_need_[k] & 31);
  }
  return decided ? kMaxNeed : static_cast<uint16_t>(j);
}

void TokenMasker::build_loop_index(const std::vector<std::string>& vocab) {
  const PlainAutomaton& a = utf8_automaton();
  auto add_byte = [](Chars& c, uint8_t b) {
    if (b >= 0x80) c.flags |= kCharsMb;
    else if (b < 64) c.lo |= uint64_t{1} << b;
    else c.hi |= uint64_t{1} << (b - 64);
  };
  token_chars_.assign(vocab.size(), Chars{});
  for (size_t t = 0; t < vocab.size(); ++t) {
    if (vocab[t].empty()) continue;  // never allowed by a loop
    Chars& c = token_chars_[t];
    uint8_t u = kU0;
    for (char ch : vocab[t]) {
      add_byte(c, uint8_t(ch));
      if (u != kFail) u = a.next[u][uint8_t(ch)];
    }
    if (u != kFail) c.flags |= kCharsOk;
  }
  // Per node: its byte and everything below; "ok" (every path from the node's byte down is
  // well-formed UTF-8 from a character boundary) from the automaton states each subtree
  // accepts, computed bottom-up (children follow their parent in preorder).
  node_chars_.assign(nodes_.size(), Chars{});
  std::vector<uint16_t> below(nodes_.size(), 0xFFFF);  // states every child's subtree accepts
  for (size_t i = nodes_.size(); i-- > 0;) {
    Chars& c = node_chars_[i];
    add_byte(c, nodes_[i].byte);
    uint16_t ok = 0;
    for (int u = 0; u < kNStates; ++u) {
      const uint8_t nx = a.next[u][nodes_[i].byte];
      if (nx != kFail && ((below[i] >> nx) & 1)) ok |= uint16_t(1u << u);
    }
    if (ok & 1u << kU0) c.flags |= kCharsOk;
    const uint32_t parent = nodes_[i].parent;
    if (parent == kNoParent) continue;
    below[parent] &= ok;
    Chars& pc = node_chars_[parent];
    pc.lo |= c.lo;
    pc.hi |= c.hi;
    pc.flags |= c.flags & kCharsMb;
  }
}

std::shared_ptr<const std::vector<uint32_t>> TokenMasker::loop_mask(const Loop& l) const {
  const auto key = std::make_tuple(l.set.lo, l.set.hi, uint8_t(l.set.flags & kCharsMb));
  {
    std::lock_guard lock(loop_mu_);
    if (auto it = loop_masks_.find(key); it != loop_masks_.end()) return it->second;
  }
  auto m = std::make_shared<std::vector<uint32_t>>(mask_words(), 0);
  for (size_t t = 0; t < token_chars_.size(); ++t)
    if (within(token_chars_[t], l)) (*m)[t >> 5] |= uint32_t{1} << (t & 31);
  std::lock_guard lock(loop_mu_);
  if (loop_masks_.size() >= 64) loop_masks_.clear();  // a few loop sets per grammar
  return loop_masks_.emplace(key, std::move(m)).first->second;
}

void TokenMasker::mark_subtree(size_t i, uint32_t* bitmask) const {
  const size_t end = nodes_[i].subtree_end;
  const uint32_t last = end < nodes_.size() ? nodes_[end].tokens_begin : static_cast<uint32_t>(token_ids_.size());
  for (uint32_t k = nodes_[i].tokens_begin; k < last; ++k)
    bitmask[token_ids_[k] >> 5] |= uint32_t{1} << (token_ids_[k] & 31);
}

template <class Walker>
TokenMasker::Loop TokenMasker::probe_loop(Walker& w, const Chars& candidates) const {
  Loop out;
  const CompiledGrammar& g = w.grammar();
  const std::span<const Item> top = w.top();
  const ByteSet allowed = detail::allowed_bytes(g, top);
  const uint64_t lo = allowed.bits[0] & candidates.lo, hi = allowed.bits[1] & candidates.hi;
  const bool mb = (candidates.flags & kCharsMb) && allowed.has(0xC2);
  if (!lo && !hi && !mb) return out;
  // ASCII bytes grouped by the items that scan them: one push per group.
  std::vector<const ByteSet*> scanners;
  for (const Item& it : top)
    if (g.pos[it.pos].kind == PosKind::kBytes) scanners.push_back(&g.byte_sets[g.pos[it.pos].value]);
  if (scanners.size() > 256) return out;
  struct Group {
    std::array<uint64_t, 4> sig;
    uint64_t lo, hi;
    uint8_t byte;
  };
  std::vector<Group> groups;
  for (int b = 0; b < 128; ++b) {
    if (!(((b < 64 ? lo : hi) >> (b & 63)) & 1)) continue;
    std::array<uint64_t, 4> sig{};
    for (size_t j = 0; j < scanners.size(); ++j)
      if (scanners[j]->has(uint8_t(b))) sig[j >> 6] |= uint64_t{1} << (j & 63);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& o) { return o.sig == sig; });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{sig, 0, 0, uint8_t(b)});
    (b < 64 ? it->lo : it->hi) |= uint64_t{1} << (b & 63);
  }
  const uint32_t from = w.top_index();
  std::vector<Item> cur, tmp;
  self_canon(w, cur);
  for (const Group& gr : groups) {
    if (!w.try_push(gr.byte)) continue;
    if (loops_back(w, from, cur, tmp)) {
      out.set.lo |= gr.lo;
      out.set.hi |= gr.hi;
    }
    w.pop();
  }
  if (mb && (out.set.lo || out.set.hi)) {  // every multibyte character must come back to this set
    // (only tried where some ASCII byte loops: a probe that fails costs dozens of steps)
    Probe p;
    p.from = from;
    p.have_next = true;
    p.next = cur;
    ByteSet lead;
    lead.add(0xC2, 0xF4);
    if (probe_from(w, kU0, p, &lead)) out.set.flags |= kCharsMb;
  }
  out.valid = out.set.lo || out.set.hi || (out.set.flags & kCharsMb);
  out.allowed = allowed;
  return out;
}

template <class Walker>
TokenMasker::Loop TokenMasker::top_loop(Walker& w, uint32_t* bitmask, const Chars& candidates) const {
  // Worth a probe when many bytes can follow: a loop of a few bytes decides few tokens.
  constexpr int kMinAllowed = 4;
  const ByteSet allowed = w.allowed_bytes();
  if (std::popcount(allowed.bits[0]) + std::popcount(allowed.bits[1]) < kMinAllowed && !allowed.has(0xC2)) return {};
  Loop l = probe_loop(w, candidates);
  if (!l.valid) return l;
  const std::shared_ptr<const std::vector<uint32_t>> m = loop_mask(l);
  for (size_t i = 0; i < m->size(); ++i) bitmask[i] |= (*m)[i];
  l.in_mask = true;
  return l;
}

template <class Walker>
void TokenMasker::walk(Walker& walker, size_t begin, size_t end, std::vector<ByteSet>& allowed,
                       std::vector<Loop>& loops, uint32_t* bitmask, std::vector<uint32_t>* tainted,
                       uint16_t skip_limit) const {
  for (size_t i = begin; i < end;) {
    const Node& n = nodes_[i];
    if (sub_need_[i] <= skip_limit) {  // every token below is decided already
      i = n.subtree_end;
      continue;
    }
    while (walker.depth() > n.depth) walker.pop();
    if (!allowed[n.depth].has(n.byte)) {
      i = n.subtree_end;
      continue;
    }
    const Loop& l = loops[n.depth];
    // Every token below made of loop characters (or, when those are in the bitmask already,
    // every other one refused: below a loop found in the walk, a token's bytes before the
    // loop's state are not loop characters, so the loop mask does not say which are in).
    if (l.in_mask ? decided(node_chars_[i], l) : within(node_chars_[i], l)) {
      if (!l.in_mask) mark_subtree(i, bitmask);
      i = n.subtree_end;
      continue;
    }
    for (uint32_t t = n.tokens_begin; t < n.tokens_end; ++t)
      bitmask[token_ids_[t] >> 5] |= uint32_t{1} << (token_ids_[t] & 31);
    if (n.subtree_end > i + 1) {  // has children: advance (the byte is allowed, so it scans)
      if (!walker.push(n.byte)) {
        if (tainted) tainted->push_back(static_cast<uint32_t>(i));  // only a view refuses
        i = n.subtree_end;
        continue;
      }
      allowed[n.depth + 1] = walker.allowed_bytes();
      if (l.valid && n.byte < 0x80 && (((n.byte < 64 ? l.set.lo : l.set.hi) >> (n.byte & 63)) & 1))
        loops[n.depth + 1] = l;  // a loop character: the same state
      else if (skip_limit != kMaxNeed && n.subtree_end - i >= kLoopProbeMin)  // (kMaxNeed: plain runs did it)
        loops[n.depth + 1] = probe_loop(walker, node_chars_[i]);
      else
        loops[n.depth + 1] = Loop{};
    }
    ++i;
  }
}

const MaskCache::Entry& TokenMasker::cached_entry(const Matcher& m, MaskCache& cache) const {
  if (!cache.masker_) {
    cache.masker_ = this;
    cache.grammar_ = &m.grammar();
  }
  KILN_CHECK(cache.masker_ == this && cache.grammar_ == &m.grammar()) << "a MaskCache serves one masker and grammar";
  uint32_t n_opaque = 0;
  build_view(m.grammar(), m.chart(), cache.view_, n_opaque, cache.key_);
  if (auto it = cache.entries_.find(cache.key_); it != cache.entries_.end()) {
    ++cache.n_hits_;
    return *it->second;
  }
  if (cache.entries_.size() >= cache.max_entries_) cache.entries_.clear();
  SharedMaskCache* shared = cache.shared_.get();
  if (shared) {
    std::shared_lock lock(shared->mu_);
    KILN_CHECK(shared->masker_ == nullptr || (shared->masker_ == this && shared->grammar_ == &m.grammar()))
        << "a SharedMaskCache serves one masker and grammar";
    if (auto it = shared->entries_.find(cache.key_); it != shared->entries_.end()) {
      ++cache.n_hits_;
      return *cache.entries_.emplace(cache.key_, it->second).first->second;
    }
  }
  ++cache.n_misses_;
  auto e = std::make_shared<MaskCache::Entry>();
  e->mask.assign(mask_words(), 0);
  cache.ws_.n_opaque_sets = n_opaque;
  cache.upper_ = Chart{};
  ViewWalker walker{m.grammar(), cache.view_, cache.upper_, cache.ws_};
  std::vector<ByteSet> allowed(max_depth_ + 1);
  allowed[0] = walker.allowed_bytes();
  const uint16_t skip = fill_plain(walker, e->mask.data());
  std::vector<Loop> loops(max_depth_ + 1);
  if (skip != kMaxNeed) loops[0] = top_loop(walker, e->mask.data(), kAllChars);
  walk(walker, 0, nodes_.size(), allowed, loops, e->mask.data(), &e->tainted, skip);
  std::shared_ptr<const MaskCache::Entry> entry = std::move(e);
  if (shared) {  // another thread may have walked the same view meanwhile: equal masks, keep one
    std::unique_lock lock(shared->mu_);
    shared->masker_ = this;
    shared->grammar_ = &m.grammar();
    if (shared->entries_.size() >= shared->max_entries_) shared->entries_.clear();
    entry = shared->entries_.emplace(cache.key_, entry).first->second;
  }
  return *cache.entries_.emplace(cache.key_, std::move(entry)).first->second;
}

void TokenMasker::fill_mask(const Matcher& m, uint32_t* bitmask, MaskCache* cache) const {
  RealWalker real{MatcherScratch(m), m.grammar(), m.chart().n_sets() - 1};
  // allowed[d]: the bytes the recognizer can scan after the first d bytes of the path.
  std::vector<ByteSet> allowed(max_depth_ + 1);
  std::vector<Loop> loops(max_depth_ + 1);
  if (!cache) {
    std::memset(bitmask, 0, mask_words() * sizeof(uint32_t));
    allowed[0] = real.allowed_bytes();
    const uint16_t skip = fill_plain(real, bitmask);
    if (skip != kMaxNeed) loops[0] = top_loop(real, bitmask, kAllChars);
    walk(real, 0, nodes_.size(), allowed, loops, bitmask, nullptr, skip);
  } else {
    const MaskCache::Entry& e = cached_entry(m, *cache);
    std::memcpy(bitmask, e.mask.data(), mask_words() * sizeof(uint32_t));
    // Many context-dependent subtrees (an email's atom: every character completes it into a
    // set outside the view): those made of the real state's loop characters are in its loop
    // mask; the others are walked with the loop carried down their path.
    constexpr size_t kMinTainted = 4;
    // Only the ASCII bytes on the tainted nodes' paths can make one decided: the probe tries
    // those (in a free string, the closing quote's subtrees: one push).
    Chars candidates;
    if (e.tainted.size() >= kMinTainted)
      for (uint32_t t : e.tainted) {
        candidates.flags |= node_chars_[t].flags & kCharsMb;
        for (uint32_t a = t; a != kNoParent; a = nodes_[a].parent) {
          const uint8_t b = nodes_[a].byte;
          if (b < 64) candidates.lo |= uint64_t{1} << b;
          else if (b < 128) candidates.hi |= uint64_t{1} << (b - 64);
        }
      }
    const Loop top = e.tainted.size() >= kMinTainted ? top_loop(real, bitmask, candidates) : Loop{};
    // Each context-dependent subtree: push its path on the real chart, walk below it.
    std::vector<uint32_t> path, chain;  // nodes pushed; the next one's ancestors
    auto in_loop = [&](uint8_t b) {
      return top.valid && b < 0x80 && (((b < 64 ? top.set.lo : top.set.hi) >> (b & 63)) & 1);
    };
    for (uint32_t t : e.tainted) {
      chain.clear();
      bool path_in_loop = top.valid;  // the bytes above t all loop
      for (uint32_t a = nodes_[t].parent; a != kNoParent; a = nodes_[a].parent) {
        chain.push_back(a);
        path_in_loop = path_in_loop && in_loop(nodes_[a].byte);
      }
      if (path_in_loop && decided(node_chars_[t], top)) continue;  // in the loop mask, or refused
      std::reverse(chain.begin(), chain.end());
      chain.push_back(t);
      size_t common = 0;
      while (common < path.size() && common < chain.size() && path[common] == chain[common]) ++common;
      while (path.size() > common) {
        real.pop();
        path.pop_back();
      }
      for (size_t d = common; d < chain.size(); ++d) {
        real.push(nodes_[chain[d]].byte);
        path.push_back(chain[d]);
      }
      allowed[path.size()] = real.allowed_bytes();
      if (path_in_loop && in_loop(nodes_[t].byte)) loops[path.size()] = top;
      else if (nodes_[t].subtree_end - t >= kLoopProbeMin) loops[path.size()] = probe_loop(real, node_chars_[t]);
      else loops[path.size()] = Loop{};
      walk(real, t + 1, nodes_[t].subtree_end, allowed, loops, bitmask, nullptr);
      while (real.depth() > path.size()) real.pop();
    }
  }
  if (eos_id_ && m.is_complete()) bitmask[*eos_id_ >> 5] |= uint32_t{1} << (*eos_id_ & 31);
}

}  // namespace kiln::grammar
