// The BPE model of tokenizer.json with the Rust tokenizers' semantics: a word is split into
// characters (unknown ones become <0xNN> byte tokens with byte_fallback, else unk, fused
// with fuse_unk), then the lowest-ranked adjacent pair is merged until none applies (ties:
// leftmost). ignore_merges: a word found whole in the vocabulary is one token.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace kiln::tokenizer::hf {

// Transparent hashing so maps keyed by std::string can be probed with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // From the tokenizer.json "model" object. A model "type" other than BPE is Unsupported.
  static Result<std::unique_ptr<Bpe>> from_json(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // null if the id has no token
  int32_t vocab_size() const { return int32_t(id_to_token_.size()); }  // max id + 1
  // The merge loop on its own, for tests: `heap` forces the priority-queue variant that
  // long words use (short words scan a rank array instead).
  std::vector<int32_t> merge_word_for_test(std::string_view word, bool heap) const;

 private:
  struct MergeValue {
    uint32_t rank;
    int32_t new_id;
  };
  // Open-addressing map (left id, right id) -> merge, probed for every candidate pair.
  class MergeTable {
   public:
    void reserve(size_t n);
    void insert(int32_t a, int32_t b, MergeValue v);  // a later duplicate wins, as in Rust
    const MergeValue* find(int32_t a, int32_t b) const;

   private:
    static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
    std::vector<uint64_t> keys_;
    std::vector<MergeValue> values_;
    size_t mask_ = 0;
  };
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // linked list over positions; -1 at the ends
  };

  Bpe() = default;
  std::optional<int32_t> char_id(uint32_t cp) const;
  void initial_symbols(std::string_view word, std::vector<Symbol>& syms) const;
  void merge_small(std::vector<Symbol>& syms) const;
  void merge_heap(std::vector<Symbol>& syms) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out, bool force_heap) const;

  TokenMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  MergeTable merges_;
  std::vector<int32_t> bmp_char_ids_;                  // code point < 0x10000 -> id or -1
  std::unordered_map<uint32_t, int32_t> astral_char_ids_;
  int32_t byte_ids_[256];                              // <0xNN> token ids, -1 if absent
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;

  // word -> ids for words shorter than kMaxCachedWordBytes, up to kCacheCapacity entries
  // (then no more inserts, as in Rust, whose cache holds 10,000). At most ~15 MB even when
  // every entry is a long word. Guarded: encode() may run on several threads.
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kCacheCapacity = 50000;
  // The per-thread merge buffers are freed after a word longer than this (a 4 MiB word
  // takes about 100 MB): the server tokenizes on hundreds of threads.
  static constexpr size_t kMaxKeptSymbols = size_t(1) << 16;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace kiln::tokenizer::hf
