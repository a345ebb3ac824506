// Pre-tokenizers of tokenizer.json: split a normalized piece of text into words, each of
// which the model encodes on its own. Semantics follow the Rust tokenizers crate.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "tokenizer/regex.h"

namespace kiln::tokenizer::hf {

// Words as [begin, end) byte ranges of one text buffer. Splitting only rewrites the
// ranges; a transforming step (ByteLevel) writes a new buffer.
struct Pieces {
  std::string text;
  std::vector<std::pair<size_t, size_t>> spans;

  std::string_view at(size_t i) const {
    return std::string_view(text).substr(spans[i].first, spans[i].second - spans[i].first);
  }
  void reset(std::string_view s) {
    text.assign(s);
    spans.assign(1, {0, s.size()});
  }
};

// Reusable buffers for one encode call.
struct PreTokenizeScratch {
  MatchScratch match;
  Pieces tmp;
  std::vector<std::pair<size_t, size_t>> spans;
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> matches;  // (range, is_match)
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(Pieces& pieces, PreTokenizeScratch& scratch) const = 0;
};

// How Split treats the matched delimiters (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Builds the pre-tokenizer of a tokenizer.json "pre_tokenizer" value (null -> nullptr).
// Supported: Sequence, Split (all five behaviours, invert), ByteLevel.
Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const nlohmann::json& j);

// The Split step on its own, for unit tests: splits `text` and returns the words.
std::vector<std::string> split_for_test(const Pattern& pattern, SplitBehavior behavior,
                                        bool invert, std::string_view text);

}  // namespace kiln::tokenizer::hf
