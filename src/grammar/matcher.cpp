#include "grammar/matcher.h"

#include <algorithm>

#include "core/check.h"

namespace kiln::grammar {

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(const Grammar& grammar) {
  KILN_RETURN_IF_ERROR(grammar.validate());
  auto cg = std::make_shared<CompiledGrammar>();
  const auto& rules = grammar.rules();
  const uint32_t n_rules = static_cast<uint32_t>(rules.size()) + 1;  // + the augmented start
  cg->start_rule = n_rules - 1;
  cg->alt_starts.resize(n_rules);
  for (const Rule& r : rules) cg->rule_names.push_back(r.name);
  cg->rule_names.push_back("<start>");

  auto add_alt = [&](uint32_t rule, const Sequence& seq) {
    cg->alt_starts[rule].push_back(static_cast<uint32_t>(cg->pos.size()));
    for (const Element& e : seq) {
      if (e.kind == Element::Kind::kRule) {
        cg->pos.push_back({PosKind::kRule, e.rule});
        continue;
      }
      // Identical byte sets share one entry (JSON grammars repeat a handful of them).
      auto it = std::find(cg->byte_sets.begin(), cg->byte_sets.end(), e.bytes);
      uint32_t idx = static_cast<uint32_t>(it - cg->byte_sets.begin());
      if (it == cg->byte_sets.end()) cg->byte_sets.push_back(e.bytes);
      cg->pos.push_back({PosKind::kBytes, idx});
    }
    cg->pos.push_back({PosKind::kEnd, rule});
  };
  for (uint32_t r = 0; r < rules.size(); ++r)
    for (const Sequence& seq : rules[r].alternatives) add_alt(r, seq);
  add_alt(cg->start_rule, {Element::ref(grammar.start())});
  cg->accept_pos = cg->alt_starts[cg->start_rule][0] + 1;

  cg->waits.resize(cg->pos.size());
  for (size_t p = 0; p < cg->pos.size(); ++p)
    cg->waits[p] = cg->pos[p].kind == PosKind::kRule ? cg->pos[p].value : kNoRule;

  // Nullable rules: fixed point over "some alternative is all nullable rules".
  cg->nullable.assign(n_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < n_rules; ++r) {
      if (cg->nullable[r]) continue;
      for (uint32_t p : cg->alt_starts[r]) {
        while (cg->pos[p].kind == PosKind::kRule && cg->nullable[cg->pos[p].value]) ++p;
        if (cg->pos[p].kind == PosKind::kEnd) {
          cg->nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(cg));
}

namespace detail {
namespace {

// Sets up to this size are left unsorted and scanned linearly on completion.
constexpr size_t kSortedSetMin = 32;

// The set builder: items of the new set k are appended to upper.items from `start`.
struct SetBuilder {
  const CompiledGrammar& g;
  const Chart* lower;
  Chart& upper;
  Workspace& ws;
  uint32_t k;  // index of the set being built (over lower then upper)
  size_t start;

  uint32_t n_lower() const { return lower ? lower->n_sets() : 0; }
  std::span<const Item> set(uint32_t s) const {
    return s < n_lower() ? lower->set(s) : upper.set(s - n_lower());
  }

  void reset_table(size_t capacity) {
    size_t want = 64;
    while (want < capacity * 2) want *= 2;
    if (ws.table.size() < want) {
      ws.table.assign(want, 0);
      ws.used.clear();
    }
    for (uint32_t slot : ws.used) ws.table[slot] = 0;
    ws.used.clear();
  }

  void add(uint32_t pos, uint32_t origin) {
    if ((ws.used.size() + 1) * 2 > ws.table.size()) grow();
    const uint64_t key = ((uint64_t{pos} << 32) | origin) + 1;
    const size_t mask = ws.table.size() - 1;
    size_t h = (key * 0x9E3779B97F4A7C15ull) >> 20;
    for (;; ++h) {
      uint64_t& slot = ws.table[h & mask];
      if (slot == key) return;
      if (slot == 0) {
        slot = key;
        ws.used.push_back(static_cast<uint32_t>(h & mask));
        upper.items.push_back({pos, origin});
        return;
      }
    }
  }

  void grow() {  // double the table and re-add this set's items (rare: sets are small)
    std::vector<Item> items(upper.items.begin() + static_cast<ptrdiff_t>(start), upper.items.end());
    ws.table.assign(ws.table.size() * 2, 0);
    ws.used.clear();
    upper.items.resize(start);
    for (const Item& it : items) add(it.pos, it.origin);  // same order: indices stay valid
  }

  void close() {
    ++ws.stamp;
    if (ws.stamp == 0) {  // wrapped: clear the stamps
      std::fill(ws.predicted.begin(), ws.predicted.end(), 0);
      ws.stamp = 1;
    }
    for (size_t i = start; i < upper.items.size(); ++i) {
      const Item it = upper.items[i];
      const CompiledGrammar::Pos p = g.pos[it.pos];
      if (p.kind == CompiledGrammar::PosKind::kRule) {
        const uint32_t r = p.value;
        if (ws.predicted[r] != ws.stamp) {
          ws.predicted[r] = ws.stamp;
          for (uint32_t a : g.alt_starts[r]) add(a, k);
        }
        if (g.nullable[r]) add(it.pos + 1, it.origin);
      } else if (p.kind == CompiledGrammar::PosKind::kEnd && it.origin != k) {
        // Complete: advance the items of set `origin` that wait on this rule. (origin == k
        // is an empty match, already advanced at prediction time.)
        if (it.origin < ws.n_opaque_sets) {
          ws.touched_opaque = true;
          continue;
        }
        std::span<const Item> older = set(it.origin);
        ws.tmp.clear();
        if (older.size() <= kSortedSetMin) {
          for (const Item& w : older)
            if (g.waits[w.pos] == p.value) ws.tmp.push_back(w);
        } else {
          auto first = std::lower_bound(older.begin(), older.end(), p.value,
                                        [&](const Item& x, uint32_t r) { return g.waits[x.pos] < r; });
          for (auto w = first; w != older.end() && g.waits[w->pos] == p.value; ++w) ws.tmp.push_back(*w);
        }
        for (const Item& w : ws.tmp) add(w.pos + 1, w.origin);
      }
    }
    // Sort large sets by the rule each item waits on, for the binary search of later
    // completions; small ones are scanned (cheaper than sorting them).
    if (upper.items.size() - start > kSortedSetMin)
      std::sort(upper.items.begin() + static_cast<ptrdiff_t>(start), upper.items.end(),
                [&](const Item& a, const Item& b) { return g.waits[a.pos] < g.waits[b.pos]; });
    upper.begin.push_back(static_cast<uint32_t>(upper.items.size()));
  }
};

}  // namespace

bool advance(const CompiledGrammar& g, const Chart* lower, Chart& upper, uint8_t byte, Workspace& ws) {
  if (ws.predicted.size() < g.alt_starts.size()) ws.predicted.resize(g.alt_starts.size(), 0);
  SetBuilder b{g, lower, upper, ws, 0, upper.items.size()};
  b.k = b.n_lower() + upper.n_sets();
  KILN_CHECK_GT(b.k, 0u);
  std::span<const Item> prev = b.set(b.k - 1);
  // Scan into tmp first: `prev` may live in upper.items, which add() appends to.
  ws.tmp.clear();
  for (const Item& it : prev) {
    const CompiledGrammar::Pos p = g.pos[it.pos];
    if (p.kind == CompiledGrammar::PosKind::kBytes && g.byte_sets[p.value].has(byte))
      ws.tmp.push_back({it.pos + 1, it.origin});
  }
  if (ws.tmp.empty()) return false;
  b.reset_table(prev.size());
  std::vector<Item> scanned;
  scanned.swap(ws.tmp);
  for (const Item& it : scanned) b.add(it.pos, it.origin);
  scanned.swap(ws.tmp);
  b.close();
  return true;
}

ByteSet allowed_bytes(const CompiledGrammar& g, std::span<const Item> top) {
  ByteSet s;
  for (const Item& it : top)
    if (g.pos[it.pos].kind == CompiledGrammar::PosKind::kBytes) s.add(g.byte_sets[g.pos[it.pos].value]);
  return s;
}

bool contains_accept(const CompiledGrammar& g, std::span<const Item> top) {
  for (const Item& it : top)
    if (it.pos == g.accept_pos && it.origin == 0) return true;
  return false;
}

}  // namespace detail

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g) : g_(std::move(g)) {
  // Set 0: the closure of the augmented start rule's prediction.
  ws_.predicted.assign(g_->alt_starts.size(), 0);
  detail::SetBuilder b{*g_, nullptr, chart_, ws_, 0, 0};
  b.reset_table(16);
  for (uint32_t a : g_->alt_starts[g_->start_rule]) b.add(a, 0);
  b.close();
}

bool Matcher::accept(std::string_view bytes) {
  const uint32_t mark = chart_.n_sets();
  for (char c : bytes) {
    if (!detail::advance(*g_, nullptr, chart_, static_cast<uint8_t>(c), ws_)) {
      while (chart_.n_sets() > mark) chart_.pop_set();
      return false;
    }
  }
  accept_marks_.push_back(mark);
  return true;
}

void Matcher::rollback(int n) {
  KILN_CHECK(n >= 0 && n <= n_accepts()) << "rollback " << n << " of " << n_accepts();
  if (n == 0) return;
  const uint32_t mark = accept_marks_[accept_marks_.size() - n];
  accept_marks_.resize(accept_marks_.size() - n);
  while (chart_.n_sets() > mark) chart_.pop_set();
}

bool Matcher::is_complete() const { return detail::contains_accept(*g_, chart_.set(chart_.n_sets() - 1)); }
ByteSet Matcher::allowed_bytes() const { return detail::allowed_bytes(*g_, chart_.set(chart_.n_sets() - 1)); }
bool Matcher::can_continue() const { return !allowed_bytes().empty(); }

}  // namespace kiln::grammar
