#include "tokenizer/parser_text.h"

#include <algorithm>

#include "core/json_bounded.h"

namespace kiln::tokenizer::detail {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return is_space(c); });
}

std::string_view trim_space(std::string_view s) {
  size_t b = s.find_first_not_of(kWhitespace);
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(kWhitespace);
  return s.substr(b, e + 1 - b);
}

bool starts_with_at(std::string_view s, size_t pos, std::string_view prefix) {
  return pos <= s.size() && s.substr(pos).starts_with(prefix);
}

MarkerHit find_marker(std::string_view text, const Markers& markers) {
  MarkerHit best;
  for (size_t i = 0; i < markers.size(); ++i) {
    size_t p = text.find(markers[i]);
    if (p == std::string_view::npos) continue;
    if (p < best.pos || (p == best.pos && markers[i].size() > best.length))
      best = {.pos = p, .index = i, .length = markers[i].size()};
  }
  return best;
}

MarkerHit find_marker(std::string_view text, std::initializer_list<const Markers*> marker_sets) {
  MarkerHit best;
  size_t base = 0;  // index of a marker counts across the sets, in order
  for (const Markers* set : marker_sets) {
    MarkerHit hit = find_marker(text, *set);
    if (hit.found() && (hit.pos < best.pos || (hit.pos == best.pos && hit.length > best.length))) {
      best = hit;
      best.index += base;
    }
    base += set->size();
  }
  return best;
}

size_t partial_marker_length(std::string_view text, const Markers& markers) {
  size_t best = 0;
  for (const std::string& m : markers) {
    size_t max_len = std::min(m.size() - 1, text.size());
    for (size_t len = max_len; len > best; --len) {
      if (text.substr(text.size() - len) == std::string_view(m).substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

size_t partial_marker_length(std::string_view text, std::initializer_list<const Markers*> sets) {
  size_t best = 0;
  for (const Markers* set : sets) best = std::max(best, partial_marker_length(text, *set));
  return best;
}

size_t incomplete_utf8_length(std::string_view text) {
  size_t n = text.size();
  for (size_t k = 1; k <= std::min<size_t>(4, n); ++k) {
    auto c = static_cast<unsigned char>(text[n - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = c < 0x80           ? 1
                  : (c >> 5) == 0x6  ? 2
                  : (c >> 4) == 0xE  ? 3
                  : (c >> 3) == 0x1E ? 4
                                     : 0;
    return need > k ? k : 0;
  }
  return 0;
}

std::optional<nlohmann::ordered_json> parse_json_object(std::string_view text) {
  auto value = parse_json_bounded<nlohmann::ordered_json>(text);
  if (value.is_discarded() || !value.is_object()) return std::nullopt;
  return value;
}

std::string dump_compact(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

TextStream::TextStream(ParseEventKind kind, std::string_view edge_chars, bool strip_leading,
                       bool hold_trailing)
    : kind_(kind),
      edge_chars_(edge_chars),
      strip_leading_(strip_leading),
      hold_trailing_(hold_trailing) {}

void TextStream::append(std::string_view text, std::vector<ParseEvent>& out) {
  if (text.empty()) return;
  std::string s = std::move(held_);
  held_.clear();
  s.append(text);
  size_t begin = 0;
  if (at_start_ && strip_leading_) {
    begin = s.find_first_not_of(edge_chars_);
    if (begin == std::string::npos) return;  // only edge characters so far: dropped
  }
  at_start_ = false;
  size_t cut = s.size();
  if (hold_trailing_ && !edge_chars_.empty()) {
    size_t last = s.find_last_not_of(edge_chars_);
    cut = last == std::string::npos ? begin : std::max(begin, last + 1);
  }
  cut -= incomplete_utf8_length(std::string_view(s).substr(begin, cut - begin));
  emit(std::string_view(s).substr(begin, cut - begin), out);
  held_ = s.substr(cut);
}

void TextStream::end_segment(bool drop_edges, std::vector<ParseEvent>& out) {
  bool only_edges = held_.find_first_not_of(edge_chars_) == std::string::npos;
  if (!(drop_edges && only_edges)) emit(held_, out);
  held_.clear();
  at_start_ = true;
}

std::string TextStream::take_held_edges(std::vector<ParseEvent>& out) {
  std::string held = std::move(held_);
  held_.clear();
  if (held.find_first_not_of(edge_chars_) == std::string::npos) return held;
  emit(held, out);
  return {};
}

void TextStream::emit(std::string_view text, std::vector<ParseEvent>& out) {
  if (text.empty()) return;
  out.push_back({.kind = kind_, .text = std::string(text)});
}

}  // namespace kiln::tokenizer::detail
