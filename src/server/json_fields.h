// Typed reads of a request body's fields, each failure an ApiError that names the field
// and says what it should be ("'temperature' must be a number between 0 and 100").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace kiln::server {

using ordered_json = nlohmann::ordered_json;

class Fields {
 public:
  Fields(const ordered_json& obj, std::string prefix = {}) : obj_(obj), prefix_(std::move(prefix)) {}

  // A field given and not null.
  bool has(const char* key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  const ordered_json& at(const char* key) const { return obj_[key]; }
  std::string name(const char* key) const { return prefix_ + key; }

  // Each returns std::nullopt when the field is absent or null, and sets error() when it
  // is present with the wrong type or out of range (then the rest may be skipped).
  std::optional<double> number(const char* key, double lo, double hi);
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi);
  std::optional<bool> boolean(const char* key);
  std::optional<std::string> string(const char* key, bool allow_empty = true);
  // A string or an array of strings (stop sequences): at most max_items, none empty.
  std::optional<std::vector<std::string>> strings(const char* key, size_t max_items);
  std::optional<std::vector<int32_t>> int_list(const char* key, size_t max_items, int64_t lo, int64_t hi);
  // An object (any content), or an array.
  const ordered_json* object(const char* key);
  const ordered_json* array(const char* key);

  bool failed() const { return error_.has_value(); }
  const ApiError& error() const { return *error_; }
  void fail(std::string message, const char* key) {
    if (!error_) error_ = bad_request(std::move(message), name(key));
  }

 private:
  const ordered_json& obj_;
  std::string prefix_;
  std::optional<ApiError> error_;
};

// A short, printable rendering of a JSON value for error messages (at most ~60 bytes).
std::string json_excerpt(const ordered_json& v);

}  // namespace kiln::server
