// Small helpers for reading tokenizer.json objects: typed field access that turns a
// missing or mistyped field into a Status naming the component and the field.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/regex.h"

namespace kiln::tokenizer::hf {

using json = nlohmann::json;

// `what` names the component in messages, e.g. "pre_tokenizer Split".
inline Result<std::string> get_string(const json& j, const char* key, std::string_view what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return corrupt(std::string(what) + ": field \"" + key + "\" must be a string");
  }
  return it->get<std::string>();
}

inline bool get_bool_or(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// The "type" of a component object, or a Status if it has none.
inline Result<std::string> component_type(const json& j, std::string_view what) {
  if (!j.is_object()) return corrupt(std::string(what) + " must be a JSON object");
  return get_string(j, "type", what);
}

// {"String": "..."} or {"Regex": "..."} as used by Split, Replace (normalizer and decoder).
inline Result<Pattern> parse_pattern(const json& j, std::string_view what) {
  if (j.is_object()) {
    if (auto it = j.find("String"); it != j.end() && it->is_string()) {
      return Pattern::literal(it->get<std::string>());
    }
    if (auto it = j.find("Regex"); it != j.end() && it->is_string()) {
      Result<Pattern> p = Pattern::regex(it->get<std::string>());
      if (!p.ok()) return p.status().with_context(std::string(what));
      return p;
    }
  }
  return corrupt(std::string(what) + ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace kiln::tokenizer::hf
