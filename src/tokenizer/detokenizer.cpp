#include "tokenizer/detokenizer.h"

#include "core/log.h"

namespace kiln::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  // decode() drops unknown ids and (optionally) special ones; dropping them here keeps the
  // window free of ids that would hide the token before them from the rules below.
  if (!tokenizer_->id_to_token(id)) return {};
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return {};
  window_.push_back(id);
  if (!tokenizer_->stream_can_cut_after(id)) return {};
  return emit_window(/*force=*/false);
}

std::string IncrementalDetokenizer::flush() {
  if (window_.size() == read_offset_) return {};
  return emit_window(/*force=*/true);
}

std::string IncrementalDetokenizer::emit_window(bool force) {
  const std::string text = tokenizer_->decode(window_, skip_special_tokens_);
  if (!force && (text.size() <= prefix_.size() || ends_with(text, kReplacement))) return {};
  std::string fresh;
  if (text.compare(0, prefix_.size(), prefix_) == 0) {
    fresh = text.substr(prefix_.size());
  } else {
    // Not reachable with the decoders kiln supports (each emission point is a clean cut).
    KILN_LOG(kWarn, "detokenizer: window text no longer starts with its prefix");
    size_t common = 0;
    while (common < text.size() && common < prefix_.size() && text[common] == prefix_[common]) {
      ++common;
    }
    // Never start inside a character.
    while (common > 0 && common < text.size() &&
           (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) {
      --common;
    }
    fresh = text.substr(common);
  }
  // The ids of this emission become the left context of the next window.
  window_.erase(window_.begin(), window_.begin() + long(read_offset_));
  prefix_ = tokenizer_->decode(window_, skip_special_tokens_);
  read_offset_ = window_.size();
  return fresh;
}

}  // namespace kiln::tokenizer
