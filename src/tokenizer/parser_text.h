// Building blocks shared by the output parsers: marker search over a buffer that may end
// in the middle of a marker, and TextStream, which turns text into content / reasoning
// events while holding back what the next delta may still change.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/parser_output.h"

namespace kiln::tokenizer::detail {

inline constexpr std::string_view kWhitespace = " \t\r\n";
inline constexpr std::string_view kNewlines = "\r\n";

bool is_space(char c);
bool all_space(std::string_view s);
std::string_view trim_space(std::string_view s);
bool starts_with_at(std::string_view s, size_t pos, std::string_view prefix);

// A set of markers searched together ("<tool_call>" or "<|tool_calls_section_begin|>").
using Markers = std::vector<std::string>;

struct MarkerHit {
  size_t pos = std::string_view::npos;  // npos: none
  size_t index = 0;                     // which marker
  size_t length = 0;
  bool found() const { return pos != std::string_view::npos; }
};

// The earliest full marker in `text` (the longest one on a tie).
MarkerHit find_marker(std::string_view text, const Markers& markers);
MarkerHit find_marker(std::string_view text, std::initializer_list<const Markers*> marker_sets);

// Length of the longest suffix of `text` that is a proper prefix of some marker: the
// bytes that must wait for the next delta before they can be called plain text.
size_t partial_marker_length(std::string_view text, const Markers& markers);
size_t partial_marker_length(std::string_view text, std::initializer_list<const Markers*> sets);

// Length of an incomplete UTF-8 sequence at the end of `text` (0 if it ends on a
// character boundary, or if the tail is not a valid sequence start at all).
size_t incomplete_utf8_length(std::string_view text);

// Parses a JSON object; nullopt when `text` is not exactly one JSON object.
std::optional<nlohmann::ordered_json> parse_json_object(std::string_view text);
// Compact JSON, invalid UTF-8 replaced (never throws).
std::string dump_compact(const nlohmann::ordered_json& value);

// Streams one kind of text (content or reasoning) as events. Characters of `edge_chars`
// at the edges of a segment can be dropped: leading ones when `strip_leading`, trailing
// ones are held while `hold_trailing` (released when more text follows, dropped or
// released when the segment ends). An incomplete UTF-8 sequence at the end is always
// held, so event text never splits a character.
class TextStream {
 public:
  TextStream(ParseEventKind kind, std::string_view edge_chars, bool strip_leading,
             bool hold_trailing);

  void append(std::string_view text, std::vector<ParseEvent>& out);
  // Ends the segment: held edge characters are dropped (`drop_edges`) or emitted, an
  // incomplete UTF-8 tail is emitted as is; the next append starts a new segment.
  void end_segment(bool drop_edges, std::vector<ParseEvent>& out);
  // Removes and returns the held trailing edge characters (emitting an incomplete UTF-8
  // tail first), so a caller can decide later whether they are content.
  std::string take_held_edges(std::vector<ParseEvent>& out);
  bool at_segment_start() const { return at_start_; }

 private:
  void emit(std::string_view text, std::vector<ParseEvent>& out);

  ParseEventKind kind_;
  std::string edge_chars_;
  bool strip_leading_;
  bool hold_trailing_;
  bool at_start_ = true;
  std::string held_;  // trailing edge characters, or an incomplete UTF-8 sequence
};

}  // namespace kiln::tokenizer::detail
