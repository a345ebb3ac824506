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

namespace {

// Reads and keeps nothing (no value is built, however deep the text nests): the first
// error's position and nlohmann's message for it.
struct FirstError final : nlohmann::json_sax<nlohmann::json> {
  size_t byte = 0;
  std::string what;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    byte = position;
    what = e.what();
    return false;
  }
};

}  // namespace

std::string json_error(std::string_view text) {
  FirstError sax;
  if (nlohmann::json::sax_parse(text.begin(), text.end(), &sax)) return {};
  // what(): "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
  std::string reason = sax.what;
  if (const size_t colon = reason.find(": "); colon != std::string::npos) reason = reason.substr(colon + 2);
  if (reason.size() > 120) reason = reason.substr(0, 117) + "...";
  return text_position(text, sax.byte) + ": " + reason;
}

}  // namespace kiln
