// Why a text is not JSON, and where: "line 3, column 14: syntax error while parsing object
// - unexpected '}'; expected string literal". For messages about a file (config.json) or a
// request body that does not parse; the parsers themselves run without exceptions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kiln {

// "line L, column C" of a 1-based byte index into `text` (nlohmann's parse_error::byte:
// the last byte read; one past the end at the end of the input). Columns count bytes.
std::string text_position(std::string_view text, size_t byte);

// `text` read again to find the first error: "line L, column C: reason"
// (the reason at most about 120 bytes). "" when `text` is valid JSON after all. Builds no
// value (a SAX pass), so a text of any depth is safe to explain.
std::string json_error(std::string_view text);

}  // namespace kiln
