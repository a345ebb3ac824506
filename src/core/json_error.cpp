#include "core/json_error.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace kiln {

std::string text_position(std::string_view text, size_t byte) {
  // The error is at the byte read last: index byte - 1, or the end of the input.
  const size_t at = std::min(byte == 0 ? 0 : byte - 1, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < at; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(at - line_start + 1);
}

std::string json_error(std::string_view text) {
  try {
    [[maybe_unused]] const nlohmann::json parsed = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // what(): "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
    std::string reason = e.what();
    if (const size_t colon = reason.find(": "); colon != std::string::npos) reason = reason.substr(colon + 2);
    if (reason.size() > 120) reason = reason.substr(0, 117) + "...";
    return text_position(text, e.byte) + ": " + reason;
  } catch (const nlohmann::json::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace kiln
