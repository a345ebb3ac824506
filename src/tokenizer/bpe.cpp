#include "tokenizer/bpe.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "tokenizer/unicode.h"

namespace kiln::tokenizer::hf {
namespace {

using json = nlohmann::json;

constexpr uint64_t kEmptyKey = ~uint64_t(0);
constexpr uint32_t kNoRank = ~uint32_t(0);
// Words with at most this many initial symbols merge by scanning a rank array (no heap,
// no allocation); longer ones use a priority queue as in Rust. Both give the same result.
constexpr size_t kSmallWordSymbols = 64;

Result<std::pair<std::string, std::string>> parse_merge(const json& m, size_t rank) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');  // Rust splitn(2, ' ')
    if (space == std::string::npos) {
      return corrupt("BPE merge " + std::to_string(rank) + " \"" + s + "\" has no space");
    }
    return std::make_pair(s.substr(0, space), s.substr(space + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return corrupt("BPE merge " + std::to_string(rank) + " must be \"a b\" or [\"a\", \"b\"]");
}

std::string optional_string(const json& m, const char* key) {
  auto it = m.find(key);
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

void Bpe::MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  keys_.assign(cap, kEmptyKey);
  values_.assign(cap, MergeValue{});
  mask_ = cap - 1;
}

void Bpe::MergeTable::insert(int32_t a, int32_t b, MergeValue v) {
  const uint64_t k = key(a, b);
  size_t i = size_t((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  while (keys_[i] != kEmptyKey && keys_[i] != k) i = (i + 1) & mask_;
  keys_[i] = k;
  values_[i] = v;
}

const Bpe::MergeValue* Bpe::MergeTable::find(int32_t a, int32_t b) const {
  const uint64_t k = key(a, b);
  size_t i = size_t((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  while (true) {
    if (keys_[i] == k) return &values_[i];
    if (keys_[i] == kEmptyKey) return nullptr;
    i = (i + 1) & mask_;
  }
}

Result<std::unique_ptr<Bpe>> Bpe::from_json(const json& m) {
  if (!m.is_object()) return corrupt("tokenizer.json \"model\" must be an object");
  std::string type = optional_string(m, "type");
  if (type.empty() && m.contains("merges")) type = "BPE";  // old files without "type"
  if (type != "BPE") {
    return unsupported("model type \"" + (type.empty() ? std::string("(none)") : type) +
                       "\" is not supported (kiln supports BPE)");
  }
  if (auto it = m.find("dropout"); it != m.end() && it->is_number() && it->get<double>() > 0) {
    return unsupported("BPE dropout is not supported (it makes encoding random)");
  }
  auto vocab_it = m.find("vocab");
  if (vocab_it == m.end() || !vocab_it->is_object()) {
    return corrupt("BPE: \"vocab\" must be an object of token -> id");
  }
  std::unique_ptr<Bpe> bpe(new Bpe());
  bpe->vocab_.reserve(vocab_it->size());
  int64_t max_id = -1;
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return corrupt("BPE: vocab entry \"" + it.key() + "\" must map to a non-negative id");
    }
    const auto id = int32_t(it.value().get<int64_t>());
    bpe->vocab_.emplace(it.key(), id);
    max_id = std::max<int64_t>(max_id, id);
  }
  bpe->id_to_token_.resize(size_t(max_id + 1));
  bpe->has_token_.assign(size_t(max_id + 1), false);
  bpe->bmp_char_ids_.assign(0x10000, -1);
  for (const auto& [token, id] : bpe->vocab_) {
    bpe->id_to_token_[size_t(id)] = token;
    bpe->has_token_[size_t(id)] = true;
    if (!token.empty() && utf8_seq_len(static_cast<unsigned char>(token[0])) == token.size()) {
      size_t i = 0;
      const uint32_t cp = utf8_next(token, i);
      if (cp < 0x10000) {
        bpe->bmp_char_ids_[cp] = id;
      } else {
        bpe->astral_char_ids_[cp] = id;
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    static const char* kHex = "0123456789ABCDEF";
    const std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    auto it = bpe->vocab_.find(name);
    bpe->byte_ids_[b] = it == bpe->vocab_.end() ? -1 : it->second;
  }
  bpe->continuing_subword_prefix_ = optional_string(m, "continuing_subword_prefix");
  bpe->end_of_word_suffix_ = optional_string(m, "end_of_word_suffix");
  bpe->byte_fallback_ = m.value("byte_fallback", false);
  bpe->fuse_unk_ = m.value("fuse_unk", false);
  bpe->ignore_merges_ = m.value("ignore_merges", false);
  if (const std::string unk = optional_string(m, "unk_token"); !unk.empty()) {
    if (auto it = bpe->vocab_.find(unk); it != bpe->vocab_.end()) {
      bpe->unk_id_ = it->second;
    } else {
      KILN_LOG(kWarn, "BPE unk_token \"" << unk << "\" is not in the vocabulary; unknown "
                                          << "characters will be dropped");
    }
  }

  auto merges_it = m.find("merges");
  if (merges_it == m.end() || !merges_it->is_array()) {
    return corrupt("BPE: \"merges\" must be an array");
  }
  const size_t prefix_len = bpe->continuing_subword_prefix_.size();
  bpe->merges_.reserve(merges_it->size());
  std::string merged;
  for (size_t rank = 0; rank < merges_it->size(); ++rank) {
    KILN_ASSIGN_OR_RETURN(auto pair, parse_merge((*merges_it)[rank], rank));
    const auto& [a, b] = pair;
    auto ia = bpe->vocab_.find(a), ib = bpe->vocab_.find(b);
    if (ia == bpe->vocab_.end() || ib == bpe->vocab_.end()) {
      return corrupt("BPE merge " + std::to_string(rank) + " (\"" + a + "\", \"" + b +
                     "\") uses a token that is not in the vocabulary");
    }
    merged = a;
    merged.append(b, std::min(prefix_len, b.size()));
    auto in = bpe->vocab_.find(merged);
    if (in == bpe->vocab_.end()) {
      return corrupt("BPE merge " + std::to_string(rank) + ": \"" + merged +
                     "\" is not in the vocabulary");
    }
    bpe->merges_.insert(ia->second, ib->second, MergeValue{uint32_t(rank), in->second});
  }
  return bpe;
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size() || !has_token_[size_t(id)]) return nullptr;
  return &id_to_token_[size_t(id)];
}

std::optional<int32_t> Bpe::char_id(uint32_t cp) const {
  if (cp < 0x10000) {
    const int32_t id = bmp_char_ids_[cp];
    return id < 0 ? std::nullopt : std::optional<int32_t>(id);
  }
  auto it = astral_char_ids_.find(cp);
  return it == astral_char_ids_.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

// Rust BPE::merge_word before merge_all: one symbol per character.
void Bpe::initial_symbols(std::string_view w, std::vector<Symbol>& syms) const {
  syms.clear();
  auto add = [&](int32_t id) {
    const auto n = int32_t(syms.size());
    syms.push_back(Symbol{id, n - 1, -1});
    if (n > 0) syms[size_t(n - 1)].next = n;
  };
  const bool affixes = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  int32_t pending_unk = -1;  // an unk waiting to be fused with the next unknown character
  std::string s;
  size_t i = 0;
  while (i < w.size()) {
    const size_t start = i;
    const uint32_t cp = utf8_next(w, i);
    std::optional<int32_t> id;
    if (!affixes) {
      id = char_id(cp);
      s.assign(w.substr(start, i - start));
    } else {
      s.clear();
      if (start > 0) s += continuing_subword_prefix_;
      s.append(w.substr(start, i - start));
      if (i >= w.size()) s += end_of_word_suffix_;
      id = token_to_id(s);
    }
    if (id) {
      if (pending_unk >= 0) add(pending_unk);
      pending_unk = -1;
      add(*id);
      continue;
    }
    if (byte_fallback_ &&
        std::all_of(s.begin(), s.end(), [&](char c) { return byte_ids_[uint8_t(c)] >= 0; })) {
      for (char c : s) add(byte_ids_[uint8_t(c)]);  // Rust leaves a pending unk pending here
      continue;
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);
}

// Repeatedly merges the lowest-ranked adjacent pair (leftmost on ties), scanning a rank array.
void Bpe::merge_small(std::vector<Symbol>& syms) const {
  const size_t n = syms.size();
  uint32_t rank[kSmallWordSymbols];
  int32_t new_id[kSmallWordSymbols];
  auto update = [&](int32_t i) {
    const Symbol& s = syms[size_t(i)];
    const MergeValue* m = s.next < 0 ? nullptr : merges_.find(s.id, syms[size_t(s.next)].id);
    rank[i] = m ? m->rank : kNoRank;
    new_id[i] = m ? m->new_id : -1;
  };
  for (size_t i = 0; i < n; ++i) update(int32_t(i));
  while (true) {
    int32_t best = -1;
    uint32_t best_rank = kNoRank;
    for (int32_t i = 0; i >= 0; i = syms[size_t(i)].next) {
      if (rank[i] < best_rank) {
        best_rank = rank[i];
        best = i;
      }
    }
    if (best < 0) return;
    Symbol& left = syms[size_t(best)];
    const Symbol right = syms[size_t(left.next)];
    left.id = new_id[best];
    left.next = right.next;
    if (right.next >= 0) syms[size_t(right.next)].prev = best;
    update(best);
    if (left.prev >= 0) update(left.prev);
  }
}

// Rust Word::merge_all: a min-heap on (rank, position) with lazy invalidation.
void Bpe::merge_heap(std::vector<Symbol>& syms) const {
  struct Entry {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Entry> heap;  // reused: long words come one after another
  thread_local std::vector<uint8_t> removed;
  heap.clear();
  removed.assign(syms.size(), 0);
  const auto later = std::greater<Entry>();
  auto push = [&](int32_t i) {
    const Symbol& s = syms[size_t(i)];
    if (s.next < 0) return;
    if (const MergeValue* m = merges_.find(s.id, syms[size_t(s.next)].id)) {
      heap.push_back(Entry{m->rank, i, m->new_id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) push(int32_t(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Entry top = heap.back();
    heap.pop_back();
    Symbol& left = syms[size_t(top.pos)];
    if (removed[size_t(top.pos)] || left.next < 0) continue;
    const Symbol right = syms[size_t(left.next)];
    const MergeValue* m = merges_.find(left.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    removed[size_t(left.next)] = 1;
    left.id = top.new_id;
    left.next = right.next;
    if (right.next >= 0) syms[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  if (heap.capacity() > kMaxKeptSymbols) {
    std::vector<Entry>().swap(heap);
    std::vector<uint8_t>().swap(removed);
  }
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out, bool force_heap) const {
  thread_local std::vector<Symbol> syms;
  initial_symbols(word, syms);
  if (syms.empty()) return;
  if (syms.size() <= kSmallWordSymbols && !force_heap) {
    merge_small(syms);
  } else {
    merge_heap(syms);
  }
  for (int32_t i = 0; i >= 0; i = syms[size_t(i)].next) out.push_back(syms[size_t(i)].id);
  if (syms.capacity() > kMaxKeptSymbols) std::vector<Symbol>().swap(syms);
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out.size();
  merge_word(word, out, /*force_heap=*/false);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) {
      cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + long(before), out.end()));
    }
  }
}

std::vector<int32_t> Bpe::merge_word_for_test(std::string_view word, bool heap) const {
  std::vector<int32_t> out;
  merge_word(word, out, heap);
  return out;
}

}  // namespace kiln::tokenizer::hf
