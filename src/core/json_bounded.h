// JSON that a client or a model wrote, parsed without ever building a deeply nested value
// and without a step that grows with the square of its size.
//
// nlohmann's parser does not recurse, but copying, dumping and rendering a value do, once
// a level: a request of 100 KB whose "seed" held 50,000 nested arrays, followed by one
// more key, overflowed a server thread's 8 MiB stack while the parser copied the object's
// members (as did a tool call's `arguments` string nested as deep), and one request took
// the whole server down. No API needs more than a few dozen levels.
//
// And its ordered_json looks every new key up in the object's members one by one: an
// object of 50,000 keys took 3.3 s to parse, a 32 MB body of them would take hours of a
// server thread. Here an object's keys are found through an ordered index once it has more
// than a few, so n members cost O(n log n) string compares.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_error.h"

namespace kiln {

// How deep a request's or a model output's JSON may nest (the top-level value's members
// are at level 1).
inline constexpr int kMaxJsonDepth = 128;

namespace json_detail {

// nlohmann's SAX events built into a Json: a value deeper than max_depth is skipped with
// everything in it, and deepest() is the deepest level any event of the text reached (a
// container's own level for its start; its members one below). A skipped container costs a
// count, not a frame: 32 MB of '[' is a counter, not 32 million frames.
template <class Json>
class BoundedBuilder {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  explicit BoundedBuilder(int max_depth) : max_depth_(max_depth) {}

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(number_integer_t v) { return put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) { return put(Json(v)); }
  bool number_float(number_float_t v, const string_t&) { return put(Json(v)); }
  bool string(string_t& v) { return put(Json(std::move(v))); }
  bool binary(binary_t& v) { return put(Json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(Json(Json::value_t::object)); }
  bool start_array(std::size_t) { return open(Json(Json::value_t::array)); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(string_t& k) {
    note(level());
    if (skipped_ == 0 && !stack_.empty()) stack_.back().key = std::move(k);
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception&) {
    return false;
  }

  Json& result() { return root_; }
  int deepest() const { return deepest_; }

 private:
  struct Frame {
    Json* value;
    string_t key;
    // An ordered object's keys once it has more than kLinear members: an ordered map, so
    // that keys crafted to collide in a hash cannot make it quadratic again.
    std::unique_ptr<std::map<string_t, std::size_t, std::less<>>> index;
  };
  static constexpr std::size_t kLinear = 16;

  // Open containers: the kept ones on the stack, the skipped ones counted.
  int level() const { return int(stack_.size()) + skipped_; }
  void note(int d) { deepest_ = std::max(deepest_, d); }

  // v at the current level: the root, an array's next element or the pending key's value
  // (a repeated key keeps its first place and takes the last value, as nlohmann's parse).
  // Only the innermost open container gets members, so pointers to the open ones hold.
  Json* insert(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& f = stack_.back();
    Json& c = *f.value;
    if (c.is_array()) {
      c.push_back(std::move(v));
      return &c.back();
    }
    auto& members = *c.template get_ptr<typename Json::object_t*>();
    if constexpr (requires { typename Json::object_t::Container; }) {
      // nlohmann::ordered_map: a vector of members, whose own lookups are linear.
      auto& vec = static_cast<typename Json::object_t::Container&>(members);
      std::size_t at = vec.size();
      if (f.index) {
        if (auto it = f.index->find(f.key); it != f.index->end()) at = it->second;
      } else {
        for (std::size_t i = 0; i < vec.size(); ++i)
          if (vec[i].first == f.key) at = i;
      }
      if (at < vec.size()) {
        vec[at].second = std::move(v);
        return &vec[at].second;
      }
      if (vec.size() == kLinear) {
        f.index = std::make_unique<std::map<string_t, std::size_t, std::less<>>>();
        for (std::size_t i = 0; i < vec.size(); ++i) f.index->emplace(vec[i].first, i);
      }
      if (f.index) f.index->emplace(f.key, vec.size());
      vec.emplace_back(std::move(f.key), std::move(v));
      return &vec.back().second;
    } else {
      return &members.insert_or_assign(std::move(f.key), std::move(v)).first->second;
    }
  }

  bool put(Json&& v) {
    note(level());
    if (skipped_ == 0 && level() <= max_depth_) insert(std::move(v));
    return true;
  }

  bool open(Json&& empty) {
    note(level());
    if (skipped_ > 0 || level() > max_depth_) {
      ++skipped_;
    } else {
      Json* at = insert(std::move(empty));
      stack_.push_back({.value = at, .key = {}, .index = nullptr});
    }
    return true;
  }

  bool close() {
    if (skipped_ > 0) --skipped_;
    else stack_.pop_back();
    return true;
  }

  int max_depth_;
  int deepest_ = 0;
  int skipped_ = 0;  // skipped containers open (inside the innermost kept one)
  Json root_;
  std::vector<Frame> stack_;
};

}  // namespace json_detail

// `text` as nlohmann's parse(text, nullptr, allow_exceptions = false) gives it (discarded
// where it is not JSON), except that no value nested deeper than max_depth is kept: the
// parser skips them as it reads, so nothing deeper is ever built. Without `depth`, a text
// that nests deeper is discarded as well, like one that does not parse. With it, *depth is
// the text's deepest level and the value comes back with the deeper parts left out, for a
// caller that says why it refuses.
template <class Json>
Json parse_json_bounded(std::string_view text, int max_depth = kMaxJsonDepth, int* depth = nullptr) {
  json_detail::BoundedBuilder<Json> b(max_depth);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &b);
  const int deepest = b.deepest();
  Json j = ok ? std::move(b.result()) : Json(Json::value_t::discarded);
  if (depth != nullptr) {
    *depth = deepest;
  } else if (deepest > max_depth) {
    j = Json(Json::value_t::discarded);
  }
  return j;
}

// JSON whose refusal is explained (a model's files: config.json, a safetensors header,
// tokenizer.json, ...; a JSON schema given as text), bounded as a request body is: a
// corrupt file nested deep would otherwise take kiln down as it is read (a 200,000-level
// safetensors header, tokenizer.json's added_tokens or generation_config.json's
// eos_token_id all did). *why is empty for a good value, else the problem: "not valid
// JSON at line L, column C: reason", or how deep it nests. Nothing in a model's files
// nests more than a few levels.
template <class Json>
Json parse_json_explained(std::string_view text, std::string* why) {
  int depth = 0;
  Json j = parse_json_bounded<Json>(text, kMaxJsonDepth, &depth);
  if (j.is_discarded()) {
    *why = "not valid JSON at " + json_error(text);
  } else if (depth > kMaxJsonDepth) {
    *why = "JSON nested " + std::to_string(depth) + " levels deep (kiln reads at most " +
           std::to_string(kMaxJsonDepth) + ")";
    j = Json(Json::value_t::discarded);
  } else {
    why->clear();
  }
  return j;
}

}  // namespace kiln
