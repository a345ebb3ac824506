// JSON that a client or a model wrote, parsed without ever building a deeply nested value.
//
// nlohmann's parser does not recurse, but copying, dumping and rendering a value do, once
// a level: a request of 100 KB whose "seed" held 50,000 nested arrays, followed by one
// more key, overflowed a server thread's 8 MiB stack while the parser copied the object's
// members (as did a tool call's `arguments` string nested as deep), and one request took
// the whole server down. No API needs more than a few dozen levels.
#pragma once

#include <algorithm>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kiln {

// How deep a request's or a model output's JSON may nest (the top-level value's members
// are at level 1).
inline constexpr int kMaxJsonDepth = 128;

// `text` as nlohmann's parse(text, callback, allow_exceptions = false) gives it (discarded
// where it is not JSON), except that no value nested deeper than max_depth is kept: the
// parser skips them as it reads, so nothing deeper is ever built. Without `depth`, a text
// that nests deeper is discarded as well, like one that does not parse. With it, *depth is
// the text's deepest level and the value comes back with the deeper parts left out, for a
// caller that says why it refuses.
template <class Json>
Json parse_json_bounded(std::string_view text, int max_depth = kMaxJsonDepth, int* depth = nullptr) {
  int deepest = 0;
  Json j = Json::parse(
      text.begin(), text.end(),
      [&](int d, typename Json::parse_event_t, Json&) {
        deepest = std::max(deepest, d);
        return d <= max_depth;
      },
      /*allow_exceptions=*/false);
  if (depth != nullptr) {
    *depth = deepest;
  } else if (deepest > max_depth) {
    j = Json(Json::value_t::discarded);
  }
  return j;
}

}  // namespace kiln
