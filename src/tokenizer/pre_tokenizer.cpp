#include "tokenizer/pre_tokenizer.h"

#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace kiln::tokenizer::hf {
namespace {

using Span = std::pair<size_t, size_t>;
using Marked = std::pair<Span, bool>;

// The GPT-2 split of the ByteLevel pre-tokenizer when use_regex is true.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rust NormalizedString::split: turns the (range, is_match) list covering one word into the
// pieces to keep, appended to `out` (offsets shifted by `base`). Empty pieces are dropped,
// as PreTokenizedString::split does.
void apply_behavior(const std::vector<Marked>& matches, SplitBehavior behavior, size_t base,
                    std::vector<Span>& out) {
  auto emit = [&](Span s) {
    if (s.second > s.first) out.emplace_back(base + s.first, base + s.second);
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [s, m] : matches) emit(s);
      return;
    case SplitBehavior::kRemoved:
      for (const auto& [s, m] : matches) {
        if (!m) emit(s);
      }
      return;
    case SplitBehavior::kContiguous:
    case SplitBehavior::kMergedWithPrevious: {
      std::vector<Span> acc;
      bool previous_match = false;
      for (const auto& [s, m] : matches) {
        const bool merge = behavior == SplitBehavior::kContiguous ? m == previous_match
                                                                   : m && !previous_match;
        if (merge && !acc.empty()) {
          acc.back().second = s.second;
        } else {
          acc.push_back(s);
        }
        previous_match = m;
      }
      for (const Span& s : acc) emit(s);
      return;
    }
    case SplitBehavior::kMergedWithNext: {
      std::vector<Span> acc;
      bool previous_match = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        const auto& [s, m] = *it;
        if (m && !previous_match && !acc.empty()) {
          acc.back().first = s.first;
        } else {
          acc.push_back(s);
        }
        previous_match = m;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(*it);
      return;
    }
  }
}

// Rust Pattern::find_matches: (range, is_match) pieces covering all of `word`.
void find_matches(const Pattern& pattern, bool invert, std::string_view word, MatchScratch& ms,
                  std::vector<Marked>& out) {
  out.clear();
  if (word.empty()) {
    out.push_back({{0, 0}, invert});
    return;
  }
  size_t prev = 0;
  pattern.for_each_match(word, ms, [&](size_t b, size_t e) {
    if (prev != b) out.push_back({{prev, b}, invert});
    out.push_back({{b, e}, !invert});
    prev = e;
  });
  if (prev != word.size()) out.push_back({{prev, word.size()}, invert});
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void pre_tokenize(Pieces& pieces, PreTokenizeScratch& s) const override {
    s.spans.clear();
    for (size_t i = 0; i < pieces.spans.size(); ++i) {
      find_matches(pattern_, invert_, pieces.at(i), s.match, s.matches);
      apply_behavior(s.matches, behavior_, pieces.spans[i].first, s.spans);
    }
    pieces.spans.swap(s.spans);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// Maps every byte to its printable stand-in (ByteLevelAlphabet); optionally prefixes a space
// and splits with the GPT-2 regex first.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<PreTokenizer> gpt2_split)
      : add_prefix_space_(add_prefix_space), split_(std::move(gpt2_split)) {}

  void pre_tokenize(Pieces& pieces, PreTokenizeScratch& s) const override {
    if (add_prefix_space_) {
      Pieces& t = s.tmp;
      t.text.clear();
      t.spans.clear();
      for (size_t i = 0; i < pieces.spans.size(); ++i) {
        const std::string_view w = pieces.at(i);
        const size_t b = t.text.size();
        if (w.empty() || w[0] != ' ') t.text.push_back(' ');
        t.text.append(w);
        t.spans.emplace_back(b, t.text.size());
      }
      std::swap(pieces, t);
    }
    if (split_) split_->pre_tokenize(pieces, s);
    const auto& alphabet = ByteLevelAlphabet::get().byte_to_utf8;
    Pieces& t = s.tmp;
    t.text.clear();
    t.spans.clear();
    for (size_t i = 0; i < pieces.spans.size(); ++i) {
      const size_t b = t.text.size();
      for (char c : pieces.at(i)) t.text += alphabet[static_cast<unsigned char>(c)];
      t.spans.emplace_back(b, t.text.size());
    }
    std::swap(pieces, t);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<PreTokenizer> split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(Pieces& pieces, PreTokenizeScratch& s) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces, s);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

Result<SplitBehavior> parse_behavior(const json& j) {
  auto it = j.find("behavior");
  if (it == j.end() || !it->is_string()) {
    return corrupt("pre_tokenizer Split: \"behavior\" must be a string");
  }
  const std::string b = it->get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return unsupported("pre_tokenizer Split: behavior \"" + b + "\" is not supported");
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const json& j) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  KILN_ASSIGN_OR_RETURN(const std::string type, component_type(j, "pre_tokenizer"));
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return corrupt("pre_tokenizer Sequence: \"pretokenizers\" must be an array");
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const json& item : *it) {
      KILN_ASSIGN_OR_RETURN(auto part, make_pre_tokenizer(item));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "Split") {
    if (!j.contains("pattern")) return corrupt("pre_tokenizer Split: missing \"pattern\"");
    KILN_ASSIGN_OR_RETURN(Pattern pattern, parse_pattern(j["pattern"], "pre_tokenizer Split"));
    KILN_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(j));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(pattern), behavior, get_bool_or(j, "invert", false)));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<PreTokenizer> split;
    if (get_bool_or(j, "use_regex", true)) {
      KILN_ASSIGN_OR_RETURN(Pattern gpt2, Pattern::regex(kGpt2Regex));
      split.reset(new SplitPreTokenizer(std::move(gpt2), SplitBehavior::kIsolated, false));
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(get_bool_or(j, "add_prefix_space", true), std::move(split)));
  }
  return unsupported("pre_tokenizer type \"" + type +
                     "\" is not supported (kiln supports Sequence, Split, ByteLevel)");
}

std::vector<std::string> split_for_test(const Pattern& pattern, SplitBehavior behavior,
                                        bool invert, std::string_view text) {
  SplitPreTokenizer split(pattern, behavior, invert);
  Pieces pieces;
  pieces.reset(text);
  PreTokenizeScratch scratch;
  split.pre_tokenize(pieces, scratch);
  std::vector<std::string> out;
  for (size_t i = 0; i < pieces.spans.size(); ++i) out.emplace_back(pieces.at(i));
  return out;
}

}  // namespace kiln::tokenizer::hf
