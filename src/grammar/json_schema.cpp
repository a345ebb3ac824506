#include "grammar/json_schema.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "core/json_bounded.h"
#include "grammar/regex.h"

namespace kiln::grammar {
namespace {

using json = nlohmann::ordered_json;

// Repetition bounds above this are not enforced (the bound becomes unbounded): a counted
// repetition costs one rule per count. Documented in README.md.
constexpr uint64_t kMaxCountedRepeat = 10000;
// Integer bounds beyond +-1e17 are not enforced (the range grammar works on int64 digits).
constexpr double kMaxIntBound = 1e17;
constexpr int kMaxSchemaDepth = 64;

const std::set<std::string> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "discriminator"};
const std::set<std::string> kKeywords = {
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
    "additionalProperties", "items", "prefixItems", "minItems", "maxItems", "uniqueItems", "pattern",
    "minLength", "maxLength", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

std::string pointer_token(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}
std::string child(const std::string& path, const std::string& key) { return path + "/" + pointer_token(key); }
std::string shown(const std::string& path) { return path.empty() ? "/" : path; }

Status invalid_at(const std::string& path, const std::string& msg) {
  return invalid_argument("invalid JSON schema at " + shown(path) + ": " + msg);
}
Status unsupported_at(const std::string& path, const std::string& key, const std::string& why = "") {
  return invalid_argument("unsupported JSON schema keyword '" + key + "' at " + child(path, key) +
                          (why.empty() ? "" : " (" + why + ")"));
}

Sequence lit(std::string_view s) { return Grammar::literal(s); }
Element digit_set(char lo, char hi) { return Element::byte_set(ByteSet::range(lo, hi)); }

// Alternatives matching the decimal strings from lo to hi, both of the same length.
void same_length_range(const std::string& lo, const std::string& hi, Sequence prefix, std::vector<Sequence>& out) {
  if (lo.empty()) {
    out.push_back(std::move(prefix));
    return;
  }
  if (lo[0] == hi[0]) {
    prefix.push_back(Element::byte(lo[0]));
    same_length_range(lo.substr(1), hi.substr(1), std::move(prefix), out);
    return;
  }
  const size_t rest = lo.size() - 1;
  const bool lo_rest_zero = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool hi_rest_nine = hi.find_first_not_of('9', 1) == std::string::npos;
  if (!lo_rest_zero) {
    Sequence p = prefix;
    p.push_back(Element::byte(lo[0]));
    same_length_range(lo.substr(1), std::string(rest, '9'), std::move(p), out);
  }
  const char mid_lo = lo_rest_zero ? lo[0] : lo[0] + 1, mid_hi = hi_rest_nine ? hi[0] : hi[0] - 1;
  if (mid_lo <= mid_hi) {
    Sequence p = prefix;
    p.push_back(digit_set(mid_lo, mid_hi));
    for (size_t i = 0; i < rest; ++i) p.push_back(digit_set('0', '9'));
    out.push_back(std::move(p));
  }
  if (!hi_rest_nine) {
    Sequence p = prefix;
    p.push_back(Element::byte(hi[0]));
    same_length_range(std::string(rest, '0'), hi.substr(1), std::move(p), out);
  }
}

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {}

  Result<Grammar> run() {
    KILN_ASSIGN_OR_RETURN(Sequence top, compile(root_, "", 0));
    g_.set_start(g_.add_rule("root", {std::move(top)}));
    if (g_.too_large()) return invalid_argument("JSON schema: " + too_large_message());
    return std::move(g_);
  }
  Grammar any_object() {
    g_.set_start(g_.add_rule("root", {{generic_object()}}));
    return std::move(g_);
  }
  Grammar any_value() {
    g_.set_start(g_.add_rule("root", {{value()}}));
    return std::move(g_);
  }

 private:
  // ---- shared rules, built on first use ----
  Element colon() { return cached(colon_, [&] { return g_.alternation("colon", {lit(":"), lit(": ")}); }); }
  Element comma() { return cached(comma_, [&] { return g_.alternation("comma", {lit(","), lit(", ")}); }); }

  // One JSON string character: unescaped UTF-8 (no '"', '\\', controls) or an escape.
  Element string_char() {
    return cached(char_, [&] {
      auto r = [](unsigned lo, unsigned hi) { return Element::byte_set(ByteSet::range(lo, hi)); };
      ByteSet ascii = ByteSet::range(0x20, 0x7F);
      ascii.remove('"').remove('\\');
      ByteSet hex = ByteSet::range('0', '9').add('a', 'f').add('A', 'F');
      ByteSet hex_not_d = ByteSet::range('0', '9').add('a', 'c').add('A', 'C').add('e', 'f').add('E', 'F');
      const Element h = Element::byte_set(hex);
      ByteSet d = ByteSet::of('d').add('D', 'D');
      // \uXXXX: a non-surrogate, or a high surrogate followed by a low one.
      Element u_escape = g_.alternation(
          "unicode_escape",
          {{Element::byte_set(hex_not_d), h, h, h},
           {Element::byte_set(d), r('0', '7'), h, h},
           {Element::byte_set(d), Element::byte_set(ByteSet::range('8', '9').add('a', 'b').add('A', 'B')), h, h,
            Element::byte('\\'), Element::byte('u'), Element::byte_set(d),
            Element::byte_set(ByteSet::range('c', 'f').add('C', 'F')), h, h}});
      ByteSet simple;
      for (char c : std::string("\"\\/bfnrt")) simple.add(c, c);
      std::vector<Sequence> alts{{Element::byte_set(ascii)}};
      for (Sequence& mb : Grammar::utf8_multibyte()) alts.push_back(std::move(mb));
      alts.push_back({Element::byte('\\'), Element::byte_set(simple)});
      alts.push_back({Element::byte('\\'), Element::byte('u'), u_escape});
      return g_.alternation("char", std::move(alts));
    });
  }
  Element generic_string() {
    return cached(string_, [&] {
      return g_.alternation("string", {{Element::byte('"'), g_.star("chars", {string_char()}), Element::byte('"')}});
    });
  }
  Element digits() { return cached(digits_, [&] { return g_.plus("digits", {digit_set('0', '9')}); }); }
  Element nonneg_int() {  // 0 | [1-9][0-9]*
    return cached(nonneg_int_, [&] {
      return g_.alternation("uint", {lit("0"), {digit_set('1', '9'), g_.star("digits0", {digit_set('0', '9')})}});
    });
  }
  Element frac_exp() {  // ("." digits)? ([eE] [+-]? digits)?
    return cached(frac_exp_, [&] {
      Element frac = g_.optional("frac", {Element::byte('.'), digits()});
      Element exp = g_.optional("exp", {Element::byte_set(ByteSet::of('e').add('E', 'E')),
                                        g_.optional("sign", {Element::byte_set(ByteSet::of('+').add('-', '-'))}),
                                        digits()});
      return g_.alternation("frac_exp", {{frac, exp}});
    });
  }
  Element generic_number() {
    return cached(number_, [&] {
      return g_.alternation("number", {{g_.optional("minus", lit("-")), nonneg_int(), frac_exp()}});
    });
  }
  // value ::= object | array | string | number | true | false | null (recursive).
  Element value() {
    if (value_) return *value_;
    const uint32_t v = g_.add_rule("value");
    value_ = Element::ref(v);
    Element arr_items = g_.star("array_rest", {comma(), *value_});
    Element arr = g_.alternation("array", {lit("[]"), {Element::byte('['), *value_, arr_items, Element::byte(']')}});
    g_.set_alternatives(v, {{generic_object()}, {arr}, {generic_string()}, {generic_number()}, lit("true"),
                            lit("false"), lit("null")});
    return *value_;
  }
  Element generic_object() {
    if (object_) return *object_;
    const uint32_t o = g_.add_rule("object");
    object_ = Element::ref(o);
    Element member = g_.alternation("member", {{generic_string(), colon(), value()}});
    Element rest = g_.star("object_rest", {comma(), member});
    g_.set_alternatives(o, {lit("{}"), {Element::byte('{'), member, rest, Element::byte('}')}});
    return *object_;
  }
  template <typename F>
  Element cached(std::optional<Element>& slot, F make) {
    if (!slot) slot = make();
    return *slot;
  }

  // ---- schemas ----
  // The schema at `path`; the innermost one that takes the grammar past its rule budget is
  // the one the error names.
  Result<Sequence> compile(const json& s, const std::string& path, int depth) {
    Result<Sequence> seq = compile_node(s, path, depth);
    if (seq.ok() && g_.too_large()) return invalid_at(path, too_large_message());
    return seq;
  }

  Result<Sequence> compile_node(const json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) return invalid_at(path, "nested deeper than " + std::to_string(kMaxSchemaDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return Sequence{value()};
      return invalid_at(path, "the schema false matches no value");
    }
    if (!s.is_object()) return invalid_at(path, "a schema must be an object or a boolean");
    for (const auto& [key, v] : s.items()) {
      if (!kAnnotations.count(key) && !kKeywords.count(key)) return unsupported_at(path, key);
    }
    auto constraining = [&](const std::set<std::string>& allowed) -> std::optional<std::string> {
      for (const auto& [key, v] : s.items())
        if (!kAnnotations.count(key) && !allowed.count(key)) return key;
      return std::nullopt;
    };
    if (s.contains("$ref")) {
      if (auto other = constraining({"$ref"})) return unsupported_at(path, *other, "beside $ref");
      return compile_ref(s["$ref"], child(path, "$ref"), depth);
    }
    if (s.contains("const")) return literal_value(s["const"]);
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) return invalid_at(child(path, "enum"), "must be a non-empty array");
      std::vector<Sequence> alts;
      for (const json& v : e) alts.push_back(literal_value(v));
      return Sequence{g_.alternation("enum", std::move(alts))};
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      if (auto other = constraining({key})) return unsupported_at(path, *other, std::string("beside ") + key);
      const json& list = s[key];
      const std::string p = child(path, key);
      if (!list.is_array() || list.empty()) return invalid_at(p, "must be a non-empty array");
      std::vector<Sequence> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        KILN_ASSIGN_OR_RETURN(Sequence alt, compile(list[i], p + "/" + std::to_string(i), depth + 1));
        alts.push_back(std::move(alt));
      }
      return Sequence{g_.alternation(key, std::move(alts))};
    }
    if (s.contains("allOf")) {
      KILN_ASSIGN_OR_RETURN(json merged, merge_all_of(s, path));
      return compile(merged, path, depth + 1);
    }
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) return compile_type(t.get<std::string>(), s, path, depth);
      if (!t.is_array() || t.empty()) return invalid_at(child(path, "type"), "must be a string or a non-empty array");
      std::vector<Sequence> alts;
      for (const json& one : t) {
        if (!one.is_string()) return invalid_at(child(path, "type"), "every type must be a string");
        KILN_ASSIGN_OR_RETURN(Sequence alt, compile_type(one.get<std::string>(), s, path, depth));
        alts.push_back(std::move(alt));
      }
      return Sequence{g_.alternation("types", std::move(alts))};
    }
    // No type: infer it from the keywords, else any value.
    auto has_any = [&](std::initializer_list<const char*> keys) {
      for (const char* k : keys)
        if (s.contains(k)) return true;
      return false;
    };
    if (has_any({"properties", "required", "additionalProperties"})) return compile_type("object", s, path, depth);
    if (has_any({"items", "prefixItems", "minItems", "maxItems"})) return compile_type("array", s, path, depth);
    if (has_any({"pattern", "format", "minLength", "maxLength"})) return compile_type("string", s, path, depth);
    if (has_any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}))
      return compile_type("number", s, path, depth);
    return Sequence{value()};
  }

  // An enum / const value: compact, with the same optional space after ':' and ','.
  Sequence literal_value(const json& v) {
    if (!v.is_object() && !v.is_array()) return lit(v.dump());
    Sequence out{Element::byte(v.is_object() ? '{' : '[')};
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      if (!first) out.push_back(comma());
      first = false;
      if (v.is_object()) {
        Sequence key = lit(json(k).dump());
        out.insert(out.end(), key.begin(), key.end());
        out.push_back(colon());
      }
      Sequence value_seq = literal_value(x);
      out.insert(out.end(), value_seq.begin(), value_seq.end());
    }
    out.push_back(Element::byte(v.is_object() ? '}' : ']'));
    return out;
  }

  // A reference's target nests one level below the reference: a chain of definitions, each
  // a reference to the next, recursed once a link (100,000 of them overflowed the stack).
  Result<Sequence> compile_ref(const json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return invalid_at(path, "$ref must be a string");
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return Sequence{Element::ref(it->second)};
    if (r.empty() || r[0] != '#') return invalid_at(path, "only local references ('#/...') are supported: '" + r + "'");
    // Decode the JSON pointer after '#'.
    const json* target = &root_;
    std::string name = "ref";
    for (size_t i = 1; i < r.size();) {
      if (r[i] != '/') return invalid_at(path, "bad JSON pointer '" + r + "'");
      size_t end = r.find('/', i + 1);
      if (end == std::string::npos) end = r.size();
      std::string token;
      for (size_t j = i + 1; j < end; ++j) {
        if (r[j] == '~' && j + 1 < end) token += r[++j] == '1' ? '/' : '~';
        else token += r[j];
      }
      if (target->is_object() && target->contains(token)) target = &(*target)[token];
      else if (target->is_array() && !token.empty() && token.find_first_not_of("0123456789") == std::string::npos &&
               std::stoul(token) < target->size())
        target = &(*target)[std::stoul(token)];
      else return invalid_at(path, "$ref '" + r + "' does not resolve");
      name = token;
      i = end;
    }
    // The rule exists before its body is compiled, so recursion refers to it.
    const uint32_t rule = g_.add_rule(name);
    refs_[r] = rule;
    KILN_ASSIGN_OR_RETURN(Sequence body, compile(*target, r.substr(1), depth + 1));
    g_.set_alternatives(rule, {std::move(body)});
    return Sequence{Element::ref(rule)};
  }

  // allOf: the subschemas (refs resolved) and the siblings must all be object schemas;
  // properties concatenate in order, required is the union.
  Result<json> merge_all_of(const json& s, const std::string& path) {
    const json& list = s["allOf"];
    const std::string p = child(path, "allOf");
    if (!list.is_array() || list.empty()) return invalid_at(p, "must be a non-empty array");
    std::vector<std::pair<json, std::string>> parts;
    json siblings = s;
    siblings.erase("allOf");
    for (size_t i = 0; i < list.size(); ++i) {
      json sub = list[i];
      std::string sub_path = p + "/" + std::to_string(i);
      for (int hops = 0; sub.is_object() && sub.contains("$ref"); ++hops) {  // follow refs
        if (hops > 32) return invalid_at(sub_path, "$ref chain too long");
        const std::string r = sub["$ref"].is_string() ? sub["$ref"].get<std::string>() : "";
        json ptr_target;
        try {
          ptr_target = root_.at(json::json_pointer(r.size() > 0 && r[0] == '#' ? r.substr(1) : "?"));
        } catch (const std::exception&) {
          return invalid_at(sub_path + "/$ref", "$ref '" + r + "' does not resolve");
        }
        sub = ptr_target;
        sub_path = r.substr(1);
      }
      parts.emplace_back(std::move(sub), sub_path);
    }
    bool only_annotations = true;
    for (const auto& [k, v] : siblings.items()) only_annotations &= kAnnotations.count(k) > 0;
    if (parts.size() == 1 && only_annotations) return parts[0].first;
    parts.emplace_back(siblings, path);
    json merged = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
    for (const auto& [sub, sub_path] : parts) {
      if (!sub.is_object()) return invalid_at(sub_path, "allOf is supported for object schemas only");
      for (const auto& [k, v] : sub.items()) {
        if (kAnnotations.count(k)) continue;
        if (k == "type") {
          if (v != "object") return unsupported_at(sub_path, k, "allOf is supported for object schemas only");
        } else if (k == "properties") {
          if (!v.is_object()) return invalid_at(child(sub_path, k), "must be an object");
          for (const auto& [name, ps] : v.items()) merged["properties"][name] = ps;
        } else if (k == "required") {
          if (!v.is_array()) return invalid_at(child(sub_path, k), "must be an array");
          for (const json& n : v) merged["required"].push_back(n);
        } else if (k == "additionalProperties") {
          merged[k] = v;
        } else {
          return unsupported_at(sub_path, k, "inside allOf, only object keywords are merged");
        }
      }
    }
    return merged;
  }

  Result<Sequence> compile_type(const std::string& type, const json& s, const std::string& path, int depth) {
    if (type == "object") return compile_object(s, path, depth);
    if (type == "array") return compile_array(s, path, depth);
    if (type == "string") return compile_string(s, path);
    if (type == "integer") return compile_integer(s, path);
    if (type == "number") return compile_number(s, path);
    if (type == "boolean") return Sequence{g_.alternation("boolean", {lit("true"), lit("false")})};
    if (type == "null") return lit("null");
    return invalid_at(child(path, "type"), "unknown type '" + type + "'");
  }

  Result<std::optional<uint64_t>> count(const json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::optional<uint64_t>{};
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return invalid_at(child(path, key), "must be a non-negative integer");
    return std::optional<uint64_t>{v.get<uint64_t>()};
  }

  Result<Sequence> compile_object(const json& s, const std::string& path, int depth) {
    const bool has_props = s.contains("properties");
    if (has_props && !s["properties"].is_object()) return invalid_at(child(path, "properties"), "must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return invalid_at(child(path, "required"), "must be an array of strings");
      for (const json& r : s["required"]) {
        if (!r.is_string()) return invalid_at(child(path, "required"), "must be an array of strings");
        if (!has_props || !s["properties"].contains(r.get<std::string>()))
          return unsupported_at(path, "required", "'" + r.get<std::string>() + "' is not in properties");
        required.insert(r.get<std::string>());
      }
    }
    // Extra members: additionalProperties true / a schema, or no properties declared.
    std::optional<Element> extra;
    const std::string ap_path = child(path, "additionalProperties");
    const json ap = s.contains("additionalProperties") ? s["additionalProperties"] : json(!has_props);
    if (!ap.is_boolean() || ap.get<bool>()) {
      KILN_ASSIGN_OR_RETURN(Sequence value_seq, compile(ap, ap_path, depth + 1));
      Sequence m{generic_string(), colon()};
      m.insert(m.end(), value_seq.begin(), value_seq.end());
      extra = g_.alternation("extra_member", {std::move(m)});
    }
    struct Prop {
      Element member;
      bool required;
    };
    std::vector<Prop> props;
    if (has_props) {
      for (const auto& [name, ps] : s["properties"].items()) {
        KILN_ASSIGN_OR_RETURN(Sequence v, compile(ps, child(child(path, "properties"), name), depth + 1));
        Sequence m = lit(json(name).dump());
        m.push_back(colon());
        m.insert(m.end(), v.begin(), v.end());
        props.push_back({g_.alternation("prop_" + name, {std::move(m)}), required.count(name) > 0});
      }
    }
    // Built from the back: after[i] = members i.. given one was written (each starts with a
    // comma); first[i] = members i.. given none was written yet.
    const size_t n = props.size();
    std::vector<Sequence> after_end{{}}, first_end{{}};
    if (extra) {
      after_end = {{g_.star("extras", {comma(), *extra})}};
      first_end = {{}, {*extra, g_.star("extras", {comma(), *extra})}};
    }
    Element after = g_.alternation("after", std::move(after_end));
    Element first = g_.alternation("first", std::move(first_end));
    for (size_t i = n; i-- > 0;) {
      const Prop& p = props[i];
      std::vector<Sequence> a{{comma(), p.member, after}};
      std::vector<Sequence> f{{p.member, after}};
      if (!p.required) {
        a.push_back({after});
        f.push_back({first});
      }
      after = g_.alternation("after", std::move(a));
      first = g_.alternation("first", std::move(f));
    }
    return Sequence{Element::byte('{'), first, Element::byte('}')};
  }

  Result<Sequence> compile_array(const json& s, const std::string& path, int depth) {
    KILN_ASSIGN_OR_RETURN(std::optional<uint64_t> min_items, count(s, "minItems", path));
    KILN_ASSIGN_OR_RETURN(std::optional<uint64_t> max_items, count(s, "maxItems", path));
    if (s.contains("uniqueItems") && s["uniqueItems"] != false) return unsupported_at(path, "uniqueItems");
    std::vector<Sequence> prefix;
    std::string prefix_key = "prefixItems";
    const json* prefix_list = s.contains("prefixItems") ? &s["prefixItems"] : nullptr;
    if (!prefix_list && s.contains("items") && s["items"].is_array()) {  // draft-7 tuple form
      prefix_list = &s["items"];
      prefix_key = "items";
    }
    if (prefix_list) {
      if (!prefix_list->is_array()) return invalid_at(child(path, prefix_key), "must be an array");
      for (size_t i = 0; i < prefix_list->size(); ++i) {
        KILN_ASSIGN_OR_RETURN(Sequence e, compile((*prefix_list)[i], child(path, prefix_key) + "/" + std::to_string(i),
                                                  depth + 1));
        prefix.push_back(std::move(e));
      }
    }
    // Items after the prefix: the items schema; with a prefix and no items, none (strict).
    std::optional<Sequence> rest;
    if (s.contains("items") && !s["items"].is_array()) {
      if (s["items"] != false) {
        KILN_ASSIGN_OR_RETURN(Sequence r, compile(s["items"], child(path, "items"), depth + 1));
        rest = std::move(r);
      }
    } else if (!prefix_list) {
      rest = Sequence{value()};
    }
    uint64_t k = prefix.size();
    const uint64_t lo = min_items.value_or(0);
    constexpr uint64_t kUnbounded = UINT64_MAX;
    uint64_t hi = max_items.value_or(kUnbounded);
    if (!rest) hi = std::min(hi, k);
    if (hi < k) {  // a maxItems below the prefix cuts it
      prefix.resize(hi);
      k = hi;
    }
    if (hi < lo) return invalid_at(path, "no array length satisfies minItems and maxItems (and prefixItems)");
    if (hi == 0) return lit("[]");
    if (hi != kUnbounded && hi > kMaxCountedRepeat + k) hi = kUnbounded;  // not enforced (README.md)
    auto item = [&](uint64_t i) { return i < k ? prefix[i] : *rest; };
    // The tail after the prefix: (comma rest){max(lo - k, 0), hi - k}, or nothing.
    Sequence tail;
    if (rest && hi > k) {
      Sequence body{comma()};
      body.insert(body.end(), rest->begin(), rest->end());
      const uint64_t first_index = std::max<uint64_t>(k, 1);  // item 0 is written without a comma
      const uint64_t tmin = lo > first_index ? lo - first_index : 0;
      std::optional<uint32_t> tmax;
      if (hi != kUnbounded) tmax = static_cast<uint32_t>(hi - first_index);
      if (tmin > kMaxCountedRepeat) return unsupported_at(path, "minItems", "above " + std::to_string(kMaxCountedRepeat));
      tail = {g_.repeat("items", std::move(body), static_cast<uint32_t>(tmin), tmax)};
    }
    // Prefix items 1..k-1 nest: each may end the array once lo items are written.
    Element nested = g_.alternation("array_tail", {tail});
    for (uint64_t i = k; i-- > 1;) {
      Sequence more{comma()};
      Sequence it = item(i);
      more.insert(more.end(), it.begin(), it.end());
      more.push_back(nested);
      std::vector<Sequence> alts{std::move(more)};
      if (i >= lo) alts.push_back({});
      nested = g_.alternation("prefix_" + std::to_string(i), std::move(alts));
    }
    Sequence non_empty{Element::byte('[')};
    Sequence first = item(0);
    non_empty.insert(non_empty.end(), first.begin(), first.end());
    non_empty.push_back(nested);
    non_empty.push_back(Element::byte(']'));
    std::vector<Sequence> alts{std::move(non_empty)};
    if (lo == 0) alts.push_back(lit("[]"));
    return Sequence{g_.alternation("array", std::move(alts))};
  }

  Result<Sequence> compile_string(const json& s, const std::string& path) {
    KILN_ASSIGN_OR_RETURN(std::optional<uint64_t> min_len, count(s, "minLength", path));
    KILN_ASSIGN_OR_RETURN(std::optional<uint64_t> max_len, count(s, "maxLength", path));
    const bool has_len = min_len || max_len;
    if (s.contains("pattern")) {
      if (has_len) return unsupported_at(path, min_len ? "minLength" : "maxLength", "together with pattern");
      if (!s["pattern"].is_string()) return invalid_at(child(path, "pattern"), "must be a string");
      auto body = regex_to_sequence(g_, s["pattern"].get<std::string>(), RegexMode::kJsonStringSearch);
      if (!body.ok()) return invalid_at(child(path, "pattern"), body.status().message());
      Sequence out{Element::byte('"')};
      out.insert(out.end(), body->begin(), body->end());
      out.push_back(Element::byte('"'));
      return out;
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) return invalid_at(child(path, "format"), "must be a string");
      std::optional<Sequence> f = format(s["format"].get<std::string>());
      if (f) {
        if (has_len) return unsupported_at(path, min_len ? "minLength" : "maxLength", "together with format");
        Sequence out{Element::byte('"')};
        out.insert(out.end(), f->begin(), f->end());
        out.push_back(Element::byte('"'));
        return out;
      }
      // Other formats are annotations: any string (README.md).
    }
    if (!has_len) return Sequence{generic_string()};
    const uint64_t lo = min_len.value_or(0);
    std::optional<uint64_t> hi = max_len;
    if (hi && *hi < lo) return invalid_at(path, "minLength is above maxLength");
    if (hi && *hi > kMaxCountedRepeat) hi.reset();
    if (lo > kMaxCountedRepeat) return unsupported_at(path, "minLength", "above " + std::to_string(kMaxCountedRepeat));
    std::optional<uint32_t> hi32;
    if (hi) hi32 = static_cast<uint32_t>(*hi);
    // One set of counting rules for each length range, shared by every string that has it
    // (a form's 25 fields of maxLength 10,000 are 10,002 rules, not 250,000).
    auto [it, fresh] = chars_.try_emplace({lo, hi}, Element{});
    if (fresh) it->second = g_.repeat("chars", {string_char()}, static_cast<uint32_t>(lo), hi32);
    return Sequence{Element::byte('"'), it->second, Element::byte('"')};
  }

  // The string formats with a grammar (without the quotes); nullopt for other formats.
  std::optional<Sequence> format(const std::string& f) {
    const Element d = digit_set('0', '9');
    auto alt = [&](const char* name, std::vector<Sequence> alts) { return g_.alternation(name, std::move(alts)); };
    auto date = [&] {
      Element month = alt("month", {{Element::byte('0'), digit_set('1', '9')}, {Element::byte('1'), digit_set('0', '2')}});
      Element day = alt("day", {{Element::byte('0'), digit_set('1', '9')}, {digit_set('1', '2'), d},
                                {Element::byte('3'), digit_set('0', '1')}});
      return Sequence{d, d, d, d, Element::byte('-'), month, Element::byte('-'), day};
    };
    auto time = [&] {
      Element hour = alt("hour", {{digit_set('0', '1'), d}, {Element::byte('2'), digit_set('0', '3')}});
      Element min_sec = alt("min_sec", {{digit_set('0', '5'), d}});
      Element frac = g_.optional("second_frac", {Element::byte('.'), digits()});
      Element offset = alt("offset", {lit("Z"), lit("z"),
                                      {Element::byte_set(ByteSet::of('+').add('-', '-')), hour, Element::byte(':'), min_sec}});
      return Sequence{hour, Element::byte(':'), min_sec, Element::byte(':'), min_sec, frac, offset};
    };
    if (f == "date") return date();
    if (f == "time") return time();
    if (f == "date-time") {
      Sequence s = date();
      s.push_back(Element::byte_set(ByteSet::of('T').add('t', 't')));
      Sequence t = time();
      s.insert(s.end(), t.begin(), t.end());
      return s;
    }
    if (f == "uuid") {
      const Element h = Element::byte_set(ByteSet::range('0', '9').add('a', 'f').add('A', 'F'));
      Sequence s;
      for (int group : {8, 4, 4, 4, 12}) {
        if (!s.empty()) s.push_back(Element::byte('-'));
        for (int i = 0; i < group; ++i) s.push_back(h);
      }
      return s;
    }
    if (f == "email") {  // a practical subset of RFC 5322: dot-atoms without quoting
      const ByteSet alnum = ByteSet::range('a', 'z').add('A', 'Z').add('0', '9');
      ByteSet local = alnum;
      for (char c : std::string("!#$%&'*+-=?^_`{|}~")) local.add(c, c);
      Element atom = g_.plus("local_atom", {Element::byte_set(local)});
      Element label = g_.plus("domain_label", {Element::byte_set(ByteSet(alnum).add('-', '-'))});
      return Sequence{atom, g_.star("local_more", {Element::byte('.'), atom}), Element::byte('@'), label,
                      g_.plus("domain_more", {Element::byte('.'), label})};
    }
    if (f == "ipv4") {
      Element octet = alt("octet", {{d}, {digit_set('1', '9'), d}, {Element::byte('1'), d, d},
                                    {Element::byte('2'), digit_set('0', '4'), d},
                                    {Element::byte('2'), Element::byte('5'), digit_set('0', '5')}});
      return Sequence{octet, Element::byte('.'), octet, Element::byte('.'), octet, Element::byte('.'), octet};
    }
    return std::nullopt;
  }

  // The numeric bound keywords, as (lower, lower exclusive, upper, upper exclusive).
  struct Bounds {
    std::optional<double> lo, hi;
    bool lo_exclusive = false, hi_exclusive = false;
  };
  Result<Bounds> bounds(const json& s, const std::string& path) {
    Bounds b;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      if (!s[key].is_number()) return invalid_at(child(path, key), "must be a number");
      const double v = s[key].get<double>();
      const std::string k = key;
      const bool exclusive = k.rfind("exclusive", 0) == 0;
      if (k == "minimum" || k == "exclusiveMinimum") {
        if (!b.lo || v > *b.lo || (v == *b.lo && exclusive)) b.lo = v, b.lo_exclusive = exclusive;
      } else if (!b.hi || v < *b.hi || (v == *b.hi && exclusive)) {
        b.hi = v, b.hi_exclusive = exclusive;
      }
    }
    return b;
  }

  Result<Sequence> compile_integer(const json& s, const std::string& path) {
    KILN_ASSIGN_OR_RETURN(Bounds b, bounds(s, path));
    std::optional<int64_t> lo, hi;
    if (b.lo && std::fabs(*b.lo) <= kMaxIntBound)
      lo = static_cast<int64_t>(b.lo_exclusive ? std::floor(*b.lo) + 1 : std::ceil(*b.lo));
    if (b.hi && std::fabs(*b.hi) <= kMaxIntBound)
      hi = static_cast<int64_t>(b.hi_exclusive ? std::ceil(*b.hi) - 1 : std::floor(*b.hi));
    if (!lo && !hi) return Sequence{g_.optional("minus", lit("-")), nonneg_int()};
    if (lo && hi && *lo > *hi) return invalid_at(path, "no integer satisfies the bounds");
    std::vector<Sequence> alts;
    if (!hi || *hi >= 0) nonneg_range(lo ? std::max<int64_t>(*lo, 0) : 0, hi, {}, alts);
    if (!lo || *lo < 0) {  // negatives: "-" then the magnitudes [max(1, -hi), -lo]
      const int64_t mag_lo = hi && *hi < 0 ? -*hi : 1;
      std::optional<int64_t> mag_hi;
      if (lo) mag_hi = -*lo;
      nonneg_range(mag_lo, mag_hi, lit("-"), alts);
    }
    return Sequence{g_.alternation("int_range", std::move(alts))};
  }

  // Decimal integers (no leading zeros) in [a, b], b nullopt = unbounded, each prefixed.
  void nonneg_range(int64_t a, std::optional<int64_t> b, const Sequence& prefix, std::vector<Sequence>& out) {
    const size_t da = std::to_string(a).size();
    const size_t db = b ? std::to_string(*b).size() : da;
    int64_t pow = 1;
    for (size_t i = 1; i < da; ++i) pow *= 10;
    for (size_t d = da; d <= db; ++d, pow *= 10) {
      const int64_t lo_d = std::max(a, d == 1 ? int64_t{0} : pow);
      const int64_t hi_d = b ? std::min(*b, pow * 10 - 1) : pow * 10 - 1;
      if (lo_d <= hi_d) same_length_range(std::to_string(lo_d), std::to_string(hi_d), prefix, out);
    }
    if (!b) {  // more digits than a: [1-9][0-9]{da,}
      Sequence s = prefix;
      s.push_back(digit_set('1', '9'));
      s.push_back(g_.repeat("digits", {digit_set('0', '9')}, static_cast<uint32_t>(da), std::nullopt));
      out.push_back(std::move(s));
    }
  }

  // Numbers: the sign follows from the bounds (minimum >= 0: no '-'; maximum < 0 or
  // exclusiveMaximum <= 0: a '-'); the magnitude is not checked (README.md).
  Result<Sequence> compile_number(const json& s, const std::string& path) {
    KILN_ASSIGN_OR_RETURN(Bounds b, bounds(s, path));
    if (b.lo && b.hi && (*b.lo > *b.hi || (*b.lo == *b.hi && (b.lo_exclusive || b.hi_exclusive))))
      return invalid_at(path, "no number satisfies the bounds");
    const bool non_negative = b.lo && *b.lo >= 0;
    const bool negative = b.hi && (*b.hi < 0 || (*b.hi == 0 && b.hi_exclusive));
    if (non_negative) return Sequence{nonneg_int(), frac_exp()};
    if (negative) return Sequence{Element::byte('-'), nonneg_int(), frac_exp()};
    return Sequence{generic_number()};
  }

  Grammar g_;
  const json& root_;
  std::map<std::string, uint32_t> refs_;
  std::map<std::pair<uint64_t, std::optional<uint64_t>>, Element> chars_;  // a string's length range -> its counting rules
  std::optional<Element> colon_, comma_, char_, string_, digits_, nonneg_int_, frac_exp_, number_, value_, object_;
};

}  // namespace

Result<Grammar> json_schema_to_grammar(const nlohmann::ordered_json& schema) { return Compiler(schema).run(); }

Result<Grammar> json_schema_text_to_grammar(std::string_view schema_text) {
  std::string why;
  const nlohmann::ordered_json schema = parse_json_explained<nlohmann::ordered_json>(schema_text, &why);
  if (!why.empty()) return invalid_argument("JSON schema: " + why);
  return json_schema_to_grammar(schema);
}

Grammar json_object_grammar() {
  static const nlohmann::ordered_json kEmpty = nlohmann::ordered_json::object();
  return Compiler(kEmpty).any_object();
}

Grammar json_value_grammar() {
  static const nlohmann::ordered_json kEmpty = nlohmann::ordered_json::object();
  return Compiler(kEmpty).any_value();
}

}  // namespace kiln::grammar
