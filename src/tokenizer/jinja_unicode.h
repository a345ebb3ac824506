// The JavaScript string semantics @huggingface/jinja inherits, over kiln's UTF-8 strings.
// JS strings are UTF-16: `length` and `at(i)` count code units, `Array.from(s)` (used by
// slicing and `join`) yields code points, `<` compares code units, `trim` and `\s` use the
// ECMAScript whitespace set, and toUpperCase / toLowerCase apply full Unicode case mapping
// (ß -> SS, final sigma).
//
// Strings are UTF-8, extended as WTF-8 where JavaScript would hold a lone surrogate ("😀"[0],
// "\ud83d"): the surrogate is encoded like any other code point (ED A0 80 .. ED BF BF).
// merge_surrogate_pairs() joins a high and a low surrogate that meet; to_well_formed()
// turns the rest into U+FFFD for output, as Node's UTF-8 encoder does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8.h"

namespace kiln::jinja {

// Decodes the code point at s[i] and advances i past it. s must be valid UTF-8.
uint32_t next_code_point(std::string_view s, size_t& i);
// Byte length of the UTF-8 sequence that starts with `lead`.
size_t utf8_sequence_length(unsigned char lead);
bool is_valid_utf8(std::string_view s);
// A high surrogate directly followed by a low one becomes the code point they encode.
void merge_surrogate_pairs(std::string& s);
// Lone surrogates become U+FFFD.
std::string to_well_formed(std::string s);

// ECMAScript WhiteSpace + LineTerminator (what `\s` and String.prototype.trim use).
bool is_js_whitespace(uint32_t cp);
// Length in bytes of the JS whitespace run starting at s[i] (0 if none).
size_t js_whitespace_run(std::string_view s, size_t i);
std::string_view js_trim(std::string_view s);
std::string_view js_trim_start(std::string_view s);
std::string_view js_trim_end(std::string_view s);

// [A-Za-z0-9_]: JavaScript's `\w` without the u flag.
inline bool is_ascii_word(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// s.length: UTF-16 code units.
size_t utf16_length(std::string_view s);
// s.at(index): the code unit at index (negative counts from the end), nullopt when out
// of range. Half of a supplementary character comes back as a lone surrogate.
std::optional<std::string> utf16_at(std::string_view s, int64_t index);
// a < b as JavaScript compares strings (by UTF-16 code units): -1, 0 or 1.
int compare_utf16(std::string_view a, std::string_view b);
// Array.from(s): one string per code point.
std::vector<std::string_view> code_points(std::string_view s);

// String.prototype.toUpperCase / toLowerCase (locale-independent, full mappings).
std::string js_to_upper(std::string_view s);
std::string js_to_lower(std::string_view s);

// a.localeCompare(b) under ICU root collation, exact for ASCII strings (primary level,
// then case: lowercase first). Non-ASCII strings fall back to code-unit order.
int locale_compare(std::string_view a, std::string_view b);

namespace tables {
struct CaseRun {
  uint32_t first, last;
  uint32_t stride;  // 1: every code point in [first, last]; 2: every other one
  int32_t delta;    // mapped = cp + delta
};
struct CaseSpecial {
  uint32_t cp;
  uint32_t mapped[3];  // zero-terminated when shorter
};
struct CodePointRange {
  uint32_t first, last;
};
extern const CaseRun kUpperRuns[];
extern const size_t kUpperRuns_size;
extern const CaseSpecial kUpperSpecial[];
extern const size_t kUpperSpecial_size;
extern const CaseRun kLowerRuns[];
extern const size_t kLowerRuns_size;
extern const CaseSpecial kLowerSpecial[];
extern const size_t kLowerSpecial_size;
extern const CodePointRange kCased[];
extern const size_t kCased_size;
extern const CodePointRange kCaseIgnorable[];
extern const size_t kCaseIgnorable_size;
extern const uint8_t kAsciiPrimary[128];
extern const uint8_t kAsciiTertiary[128];
}  // namespace tables

}  // namespace kiln::jinja
