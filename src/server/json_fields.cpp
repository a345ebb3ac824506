#include "server/json_fields.h"

#include <cmath>
#include <sstream>

namespace kiln::server {
namespace {

std::string range(double lo, double hi) {
  std::ostringstream s;
  s << lo << " and " << hi;
  return s.str();
}

}  // namespace

std::string json_excerpt(const ordered_json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::optional<double> Fields::number(const char* key, double lo, double hi) {
  if (!has(key)) return std::nullopt;
  const ordered_json& v = obj_[key];
  if (!v.is_number()) {
    fail("'" + name(key) + "' must be a number, got " + json_excerpt(v), key);
    return std::nullopt;
  }
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    fail("'" + name(key) + "' must be a number between " + range(lo, hi) + ", got " + json_excerpt(v), key);
    return std::nullopt;
  }
  return d;
}

std::optional<int64_t> Fields::integer(const char* key, int64_t lo, int64_t hi) {
  if (!has(key)) return std::nullopt;
  const ordered_json& v = obj_[key];
  // 3.0 is an integer to JSON; 3.5 and 1e300 are not.
  bool ok = v.is_number_integer();
  int64_t x = 0;
  if (ok) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ok = false;
    else x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    ok = std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e15;
    x = ok ? int64_t(d) : 0;
  }
  if (!ok) {
    fail("'" + name(key) + "' must be an integer, got " + json_excerpt(v), key);
    return std::nullopt;
  }
  if (x < lo || x > hi) {
    fail("'" + name(key) + "' must be an integer between " + std::to_string(lo) + " and " + std::to_string(hi) +
             ", got " + json_excerpt(v),
         key);
    return std::nullopt;
  }
  return x;
}

std::optional<bool> Fields::boolean(const char* key) {
  if (!has(key)) return std::nullopt;
  const ordered_json& v = obj_[key];
  if (!v.is_boolean()) {
    fail("'" + name(key) + "' must be true or false, got " + json_excerpt(v), key);
    return std::nullopt;
  }
  return v.get<bool>();
}

std::optional<std::string> Fields::string(const char* key, bool allow_empty) {
  if (!has(key)) return std::nullopt;
  const ordered_json& v = obj_[key];
  if (!v.is_string()) {
    fail("'" + name(key) + "' must be a string, got " + json_excerpt(v), key);
    return std::nullopt;
  }
  if (!allow_empty && v.get_ref<const std::string&>().empty()) {
    fail("'" + name(key) + "' must not be empty", key);
    return std::nullopt;
  }
  return v.get<std::string>();
}

std::optional<std::vector<std::string>> Fields::strings(const char* key, size_t max_items) {
  if (!has(key)) return std::nullopt;
  const ordered_json& v = obj_[key];
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const ordered_json& e : v) {
      if (!e.is_string()) {
        fail("'" + name(key) + "' must be a string or a list of strings, got an item " + json_excerpt(e), key);
        return std::nullopt;
      }
      out.push_back(e.get<std::string>());
    }
  } else {
    fail("'" + name(key) + "' must be a string or a list of strings, got " + json_excerpt(v), key);
    return std::nullopt;
  }
  if (out.size() > max_items) {
    fail("'" + name(key) + "' has " + std::to_string(out.size()) + " items; at most " + std::to_string(max_items) +
             " are allowed",
         key);
    return std::nullopt;
  }
  for (const std::string& s : out) {
    if (s.empty()) {
      fail("'" + name(key) + "' must not contain an empty string", key);
      return std::nullopt;
    }
  }
  return out;
}

std::optional<std::vector<int32_t>> Fields::int_list(const char* key, size_t max_items, int64_t lo, int64_t hi) {
  if (!has(key)) return std::nullopt;
  const ordered_json& v = obj_[key];
  if (!v.is_array()) {
    fail("'" + name(key) + "' must be a list of integers, got " + json_excerpt(v), key);
    return std::nullopt;
  }
  if (v.size() > max_items) {
    fail("'" + name(key) + "' has " + std::to_string(v.size()) + " items; at most " + std::to_string(max_items) +
             " are allowed",
         key);
    return std::nullopt;
  }
  std::vector<int32_t> out;
  for (const ordered_json& e : v) {
    if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > uint64_t(hi)) ||
        e.get<int64_t>() < lo || e.get<int64_t>() > hi) {
      fail("'" + name(key) + "' must hold integers between " + std::to_string(lo) + " and " + std::to_string(hi) +
               ", got " + json_excerpt(e),
           key);
      return std::nullopt;
    }
    out.push_back(int32_t(e.get<int64_t>()));
  }
  return out;
}

const ordered_json* Fields::object(const char* key) {
  if (!has(key)) return nullptr;
  if (!obj_[key].is_object()) {
    fail("'" + name(key) + "' must be an object, got " + json_excerpt(obj_[key]), key);
    return nullptr;
  }
  return &obj_[key];
}

const ordered_json* Fields::array(const char* key) {
  if (!has(key)) return nullptr;
  if (!obj_[key].is_array()) {
    fail("'" + name(key) + "' must be a list, got " + json_excerpt(obj_[key]), key);
    return nullptr;
  }
  return &obj_[key];
}

}  // namespace kiln::server
