// Test helpers for the JSON schema grammars: a seeded random instance generator from a
// schema, a serializer in the grammar's output form (random single spaces after ':' and
// ','), and a small validator for the keywords the tests use.
#pragma once

#include <nlohmann/json.hpp>

#include <random>
#include <string>

namespace kiln::grammar::testing {

using ojson = nlohmann::ordered_json;

class InstanceGenerator {
 public:
  InstanceGenerator(const ojson& root, uint64_t seed) : root_(root), rng_(seed) {}

  ojson generate(const ojson& s, int depth = 0) {
    if (s.is_boolean()) return any_value(depth);
    if (s.contains("$ref")) return generate(resolve(s["$ref"].get<std::string>()), depth + 1);
    if (s.contains("const")) return s["const"];
    if (s.contains("enum")) return s["enum"][pick(s["enum"].size())];
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      // Deep in recursion, prefer the last branch (tests put the terminal one last).
      const size_t n = s[k].size();
      return generate(s[k][depth > 4 ? n - 1 : pick(n)], depth + 1);
    }
    if (s.contains("allOf")) {  // objects: the parts' members in order
      ojson out = ojson::object();
      for (const ojson& part : s["allOf"]) out.update(generate(part, depth + 1));
      return out;
    }
    std::string type;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      type = t.is_string() ? t.get<std::string>() : t[pick(t.size())].get<std::string>();
    } else if (s.contains("properties")) {
      type = "object";
    } else {
      return any_value(depth);
    }
    if (type == "object") return object(s, depth);
    if (type == "array") return array(s, depth);
    if (type == "string") return string(s);
    if (type == "integer") return integer(s);
    if (type == "number") return number(s);
    if (type == "boolean") return ojson(coin());
    return nullptr;
  }

  // Compact JSON with a random single space (or none) after each ':' and ','.
  std::string serialize(const ojson& v) {
    if (v.is_object()) {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) out += coin() ? ", " : ",";
        first = false;
        out += ojson(k).dump() + (coin() ? ": " : ":") + serialize(x);
      }
      return out + "}";
    }
    if (v.is_array()) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? (coin() ? ", " : ",") : "") + serialize(v[i]);
      return out + "]";
    }
    return v.dump();
  }

  const ojson& resolve(const std::string& ref) { return root_.at(ojson::json_pointer(ref.substr(1))); }
  size_t pick(size_t n) { return n ? rng_() % n : 0; }
  bool coin() { return rng_() & 1; }
  std::mt19937_64& rng() { return rng_; }

 private:
  ojson any_value(int depth) {
    switch (pick(depth > 2 ? 4 : 6)) {
      case 0: return nullptr;
      case 1: return ojson(coin());
      case 2: return ojson(static_cast<int64_t>(rng_() % 2001) - 1000);
      case 3: return random_text(pick(6));
      case 4: {
        ojson a = ojson::array();
        for (size_t i = pick(3); i-- > 0;) a.push_back(any_value(depth + 1));
        return a;
      }
      default: {
        ojson o = ojson::object();
        for (size_t i = pick(3); i-- > 0;) o[random_text(1 + pick(4))] = any_value(depth + 1);
        return o;
      }
    }
  }
  ojson object(const ojson& s, int depth) {
    ojson out = ojson::object();
    std::vector<std::string> required;
    if (s.contains("required")) required = s["required"].get<std::vector<std::string>>();
    if (s.contains("properties")) {
      for (const auto& [name, ps] : s["properties"].items()) {
        const bool req = std::find(required.begin(), required.end(), name) != required.end();
        if (req || (depth < 6 && coin())) out[name] = generate(ps, depth + 1);
      }
    }
    const bool extra = s.contains("additionalProperties") ? s["additionalProperties"] != false : !s.contains("properties");
    if (extra && depth < 6) {
      const ojson ap = s.contains("additionalProperties") ? s["additionalProperties"] : ojson(true);
      for (size_t i = pick(3); i-- > 0;) {
        std::string key = "x_" + random_text(pick(4)).get<std::string>();
        if (!out.contains(key)) out[key] = generate(ap, depth + 1);
      }
    }
    return out;
  }
  ojson array(const ojson& s, int depth) {
    const size_t lo = s.value("minItems", 0), hi = s.value("maxItems", lo + 3);
    size_t n = lo + pick(std::min<size_t>(hi, lo + 3) - lo + 1);
    const ojson prefix = s.value("prefixItems", ojson::array());
    if (!s.contains("items") && !prefix.empty()) n = std::min(n, prefix.size());
    if (depth > 6) n = lo;
    ojson out = ojson::array();
    for (size_t i = 0; i < n; ++i)
      out.push_back(generate(i < prefix.size() ? prefix[i] : s.value("items", ojson(true)), depth + 1));
    return out;
  }
  ojson string(const ojson& s) {
    if (s.contains("format")) {
      const std::string f = s["format"];
      char buf[64];
      const int y = 1900 + pick(200), mo = 1 + pick(12), d = 1 + pick(28), h = pick(24), mi = pick(60), se = pick(60);
      if (f == "date") std::snprintf(buf, sizeof buf, "%04d-%02d-%02d", y, mo, d);
      if (f == "time") std::snprintf(buf, sizeof buf, "%02d:%02d:%02d%s", h, mi, se, coin() ? "Z" : "+05:30");
      if (f == "date-time") std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", y, mo, d, h, mi, se, int(pick(1000)));
      if (f == "uuid") std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", unsigned(rng_()), unsigned(pick(65536)),
                                     unsigned(pick(65536)), unsigned(pick(65536)), (unsigned long long)(rng_() & 0xFFFFFFFFFFFFull));
      if (f == "email") std::snprintf(buf, sizeof buf, "user%d.x@mail%d.example.org", int(pick(100)), int(pick(10)));
      return std::string(buf);
    }
    const size_t lo = s.value("minLength", 0), hi = s.value("maxLength", lo + 8);
    return random_text(lo + pick(std::min<size_t>(hi, lo + 12) - lo + 1));
  }
  ojson integer(const ojson& s) {
    int64_t lo = -100000, hi = 100000;
    if (s.contains("minimum")) lo = static_cast<int64_t>(std::ceil(s["minimum"].get<double>()));
    if (s.contains("exclusiveMinimum")) lo = static_cast<int64_t>(std::floor(s["exclusiveMinimum"].get<double>())) + 1;
    if (s.contains("maximum")) hi = static_cast<int64_t>(std::floor(s["maximum"].get<double>()));
    if (s.contains("exclusiveMaximum")) hi = static_cast<int64_t>(std::ceil(s["exclusiveMaximum"].get<double>())) - 1;
    if (!s.contains("maximum") && !s.contains("exclusiveMaximum")) hi = lo + 100000;
    if (!s.contains("minimum") && !s.contains("exclusiveMinimum")) lo = hi - 100000;
    // Favour the edges: they are where range grammars go wrong.
    switch (pick(4)) {
      case 0: return lo;
      case 1: return hi;
      default: return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
    }
  }
  ojson number(const ojson& s) {
    double lo = s.value("minimum", s.value("exclusiveMinimum", -1e6)), hi = s.value("maximum", s.value("exclusiveMaximum", 1e6));
    double v = lo + (hi - lo) * ((rng_() % 1000) + 1) / 1002.0;
    return coin() ? ojson(v) : ojson(static_cast<int64_t>(v));
  }
  ojson random_text(size_t n_chars) {
    static const char* kPieces[] = {"a", "b", "Z", "0", " ", "\"", "\\", "/", "\n", "\t", "é", "日本", "😀", "\x01", "{", "}", ":", ","};
    std::string out;
    for (size_t i = 0; i < n_chars; ++i) {
      const char* p = kPieces[pick(sizeof kPieces / sizeof *kPieces)];
      if (std::string(p) == "日本") p = "日";
      out += p;
    }
    return out;
  }

  const ojson& root_;
  std::mt19937_64 rng_;
};

// Code points in a UTF-8 string.
inline size_t n_chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The keywords the tests use; formats and patterns are not checked here.
inline bool validate(const ojson& v, const ojson& s, const ojson& root, int depth = 0) {
  if (depth > 64) return false;
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) return validate(v, root.at(ojson::json_pointer(s["$ref"].get<std::string>().substr(1))), root, depth + 1);
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s.contains(k)) continue;
    bool any = false;
    for (const ojson& sub : s[k]) any |= validate(v, sub, root, depth + 1);
    if (!any) return false;
  }
  if (s.contains("allOf")) {
    // The tests' allOf parts are objects: each part sees only its own members.
    for (const ojson& sub : s["allOf"]) {
      const ojson& part = sub.contains("$ref") ? root.at(ojson::json_pointer(sub["$ref"].get<std::string>().substr(1))) : sub;
      ojson mine = ojson::object();
      for (const auto& [k, x] : v.items())
        if (part.contains("properties") && part["properties"].contains(k)) mine[k] = x;
      if (!v.is_object() || !validate(mine, part, root, depth + 1)) return false;
    }
  }
  if (s.contains("type")) {
    auto is = [&](const std::string& t) {
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      if (t == "string") return v.is_string();
      if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      return v.is_null();
    };
    bool ok = false;
    if (s["type"].is_string()) ok = is(s["type"]);
    else
      for (const ojson& t : s["type"]) ok |= is(t);
    if (!ok) return false;
  }
  if (v.is_object() && (s.contains("properties") || s.contains("additionalProperties"))) {
    const ojson props = s.value("properties", ojson::object());
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!validate(x, props[k], root, depth + 1)) return false;
      } else {
        const ojson ap = s.value("additionalProperties", ojson(!s.contains("properties")));
        if (!validate(x, ap, root, depth + 1)) return false;
      }
    }
    for (const ojson& r : s.value("required", ojson::array()))
      if (!v.contains(r.get<std::string>())) return false;
  }
  if (v.is_array()) {
    const ojson prefix = s.value("prefixItems", ojson::array());
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    for (size_t i = 0; i < v.size(); ++i) {
      const ojson sub = i < prefix.size() ? prefix[i] : s.value("items", ojson(true));
      if (!validate(v[i], sub, root, depth + 1)) return false;
    }
  }
  if (v.is_string()) {
    const size_t n = n_chars(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return false;
  }
  return true;
}

}  // namespace kiln::grammar::testing
