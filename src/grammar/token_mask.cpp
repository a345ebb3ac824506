#include "grammar/token_mask.h"

#include <algorithm>
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
}

namespace {

using detail::Chart;
using detail::Item;
using PosKind = CompiledGrammar::PosKind;

// The items a walk from the last set can read: in the last set those that scan or wait on a
// rule; below it only those waiting on a rule (what completions look up).
bool relevant(const CompiledGrammar& g, const Item& it, bool last) {
  const PosKind k = g.pos[it.pos].kind;
  return k == PosKind::kRule || (last && k == PosKind::kBytes);
}

// The real chart on top of a matcher.
struct RealWalker {
  MatcherScratch scratch;
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

template <class Walker>
void TokenMasker::walk(Walker& walker, size_t begin, size_t end, std::vector<ByteSet>& allowed, uint32_t* bitmask,
                       std::vector<uint32_t>* tainted) const {
  for (size_t i = begin; i < end;) {
    const Node& n = nodes_[i];
    while (walker.depth() > n.depth) walker.pop();
    if (!allowed[n.depth].has(n.byte)) {
      i = n.subtree_end;
      continue;
    }
    for (uint32_t t = n.tokens_begin; t < n.tokens_end; ++t)
      bitmask[token_ids_[t] >> 5] |= uint32_t{1} << (token_ids_[t] & 31);
    if (n.subtree_end > i + 1) {  // has children: advance (the byte is allowed, so it scans)
      if (!walker.push(n.byte)) {
        tainted->push_back(static_cast<uint32_t>(i));
        i = n.subtree_end;
        continue;
      }
      allowed[n.depth + 1] = walker.allowed_bytes();
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
  walk(walker, 0, nodes_.size(), allowed, e->mask.data(), &e->tainted);
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
  RealWalker real{MatcherScratch(m)};
  // allowed[d]: the bytes the recognizer can scan after the first d bytes of the path.
  std::vector<ByteSet> allowed(max_depth_ + 1);
  if (!cache) {
    std::memset(bitmask, 0, mask_words() * sizeof(uint32_t));
    allowed[0] = real.allowed_bytes();
    walk(real, 0, nodes_.size(), allowed, bitmask, nullptr);
  } else {
    const MaskCache::Entry& e = cached_entry(m, *cache);
    std::memcpy(bitmask, e.mask.data(), mask_words() * sizeof(uint32_t));
    // Each context-dependent subtree: push its path on the real chart, walk below it.
    std::vector<uint32_t> path, chain;  // nodes pushed; the next one's ancestors
    for (uint32_t t : e.tainted) {
      chain.clear();
      for (uint32_t a = t; a != kNoParent; a = nodes_[a].parent) chain.push_back(a);
      std::reverse(chain.begin(), chain.end());
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
      walk(real, t + 1, nodes_[t].subtree_end, allowed, bitmask, nullptr);
      while (real.depth() > path.size()) real.pop();
    }
  }
  if (eos_id_ && m.is_complete()) bitmask[*eos_id_ >> 5] |= uint32_t{1} << (*eos_id_ & 31);
}

}  // namespace kiln::grammar
