#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_unicode.h"

namespace kiln::jinja {

const char* type_name(ValueType t) {
  switch (t) {
    case ValueType::kUndefined: return "UndefinedValue";
    case ValueType::kNull: return "NullValue";
    case ValueType::kBoolean: return "BooleanValue";
    case ValueType::kInteger: return "IntegerValue";
    case ValueType::kFloat: return "FloatValue";
    case ValueType::kString: return "StringValue";
    case ValueType::kArray: return "ArrayValue";
    case ValueType::kTuple: return "TupleValue";
    case ValueType::kObject: return "ObjectValue";
    case ValueType::kKeywordArguments: return "KeywordArgumentsValue";
    case ValueType::kNamespace: return "NamespaceValue";
    case ValueType::kFunction: return "FunctionValue";
  }
  return "?";
}

Value Value::number_value(double n) { return std::isfinite(n) && std::trunc(n) == n ? integer(n) : floating(n); }

const Value* ObjectData::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void ObjectData::set(const std::string& key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

void ObjectData::erase(std::string_view key) {
  std::erase_if(entries, [&](const auto& e) { return e.first == key; });
}

void Env::set(const std::string& name, Value value) {
  for (auto& [k, v] : variables) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  variables.emplace_back(name, std::move(value));
}

bool Env::has_local(std::string_view name) const {
  return std::any_of(variables.begin(), variables.end(), [&](const auto& e) { return e.first == name; });
}

Value Env::lookup(std::string_view name) const {
  for (const Env* e = this; e != nullptr; e = e->parent)
    for (const auto& [k, v] : e->variables)
      if (k == name) return v;
  return Value::undefined();
}

Heap::~Heap() {
  // Break the cycles a namespace may close (`{% set ns.self = ns %}`) so that all is freed.
  for (const std::weak_ptr<ObjectData>& weak : namespaces_)
    if (std::shared_ptr<ObjectData> ns = weak.lock())
      std::vector<std::pair<std::string, Value>>().swap(ns->entries);
}

void Heap::charge(int64_t steps) {
  steps_ += steps;
  if (steps_ > max_steps_)
    fail("Template exceeded " + std::to_string(max_steps_) + " evaluation steps", ErrorKind::kLimit);
}

Value Heap::array(std::vector<Value> items, ValueType type) {
  if (items.size() > kMaxListItems)
    fail("A list of " + std::to_string(items.size()) + " items exceeds the limit of " +
             std::to_string(kMaxListItems),
         ErrorKind::kLimit);
  charge(int64_t(items.size()));
  Value v;
  v.type = type;
  v.array = std::make_shared<ArrayData>(ArrayData{std::move(items)});
  return v;
}

Value Heap::object(ValueType type) {
  Value v;
  v.type = type;
  v.object = std::make_shared<ObjectData>();
  if (type == ValueType::kNamespace) namespaces_.push_back(v.object);
  return v;
}

Value Heap::function(NativeFunction fn) {
  Value v;
  v.type = ValueType::kFunction;
  v.function = std::make_shared<const FunctionData>(FunctionData{std::move(fn)});
  return v;
}

Env* Heap::env(Env* parent) {
  charge(1);
  Env* e = &envs_.emplace_back();
  e->parent = parent;
  return e;
}

std::string js_number_to_string(double v) {
  if (std::isnan(v)) return "NaN";
  if (v == 0) return "0";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  std::string out = v < 0 ? "-" : "";
  // Shortest round-trip digits, as ECMAScript requires: "d.ddde+XX".
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), std::fabs(v), std::chars_format::scientific);
  const std::string_view s(buf, size_t(res.ptr - buf));
  const size_t e_pos = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e_pos))
    if (c != '.') digits += c;
  const int n = std::atoi(std::string(s.substr(e_pos + 1)).c_str()) + 1;  // decimal point position
  const int k = int(digits.size());
  if (k <= n && n <= 21) {
    out += digits + std::string(size_t(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, size_t(n)) + "." + digits.substr(size_t(n));
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(size_t(-n), '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += (n - 1 >= 0 ? "e+" : "e-") + std::to_string(std::abs(n - 1));
  }
  return out;
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == 0xed && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0xa0) {
      size_t j = i;  // a lone surrogate: JSON.stringify escapes it
      char buf[16];
      std::snprintf(buf, sizeof(buf), "\\u%04x", next_code_point(s, j));
      out += buf;
      i = j - 1;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

namespace {

// makeAsciiSafe: every UTF-16 code unit in [0x7f, 0xffff] becomes \uXXXX.
std::string ascii_safe(std::string_view s) {
  std::string out;
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x7f) {
      out += s[i++];
      continue;
    }
    const uint32_t cp = next_code_point(s, i);
    if (cp < 0x10000) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      out += buf;
    } else {
      std::snprintf(buf, sizeof(buf), "\\u%04x", 0xd800 + ((cp - 0x10000) >> 10));
      out += buf;
      std::snprintf(buf, sizeof(buf), "\\u%04x", 0xdc00 + ((cp - 0x10000) & 0x3ff));
      out += buf;
    }
  }
  return out;
}

std::string json_number(double v) { return std::isfinite(v) ? js_number_to_string(v) : "null"; }

// Deeper than this is a cycle (a namespace holding itself) or a hostile input.
constexpr int kMaxJsonDepth = 512;

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options, int depth, bool undefined_to_null) {
  if (depth > kMaxJsonDepth) fail("Maximum call stack size exceeded", ErrorKind::kLimit);
  std::string item_sep = ", ", key_sep = ": ";
  if (options.has_separators) {
    item_sep = options.item_separator;
    key_sep = options.key_separator;
  } else if (options.indent != 0) {
    item_sep = ",";
  }
  switch (v.type) {
    case ValueType::kNull: return "null";
    case ValueType::kUndefined: return undefined_to_null ? "null" : "undefined";
    case ValueType::kInteger:
    case ValueType::kFloat: return json_number(v.number);
    case ValueType::kBoolean: return v.boolean ? "true" : "false";
    case ValueType::kString: {
      std::string s = json_quote(v.text());
      return options.ensure_ascii ? ascii_safe(s) : s;
    }
    case ValueType::kArray:
    case ValueType::kObject:
    case ValueType::kNamespace: {
      if (options.indent < 0) fail("Invalid count value: " + std::to_string(options.indent));
      if (options.indent > 1024)
        fail("tojson indent " + std::to_string(options.indent) + " is too large", ErrorKind::kLimit);
      const std::string indent_value(size_t(options.indent), ' ');
      std::string base_padding = "\n";
      for (int i = 0; i < depth; ++i) base_padding += indent_value;
      const std::string children_padding = base_padding + indent_value;
      const bool indented = options.indent != 0;
      std::string out;
      if (v.type == ValueType::kArray) {
        const auto& items = v.array->items;
        out = "[";
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_sep;
          if (indented) out += children_padding;
          out += to_json(items[i], options, depth + 1, undefined_to_null);
        }
        if (indented && !items.empty()) out += base_padding;
        return out + "]";
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.object->entries) entries.push_back(&e);
      if (options.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return locale_compare(a->first, b->first) < 0; });
      out = "{";
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_sep;
        if (indented) out += children_padding;
        std::string key = json_quote(entries[i]->first);
        out += options.ensure_ascii ? ascii_safe(key) : key;
        out += key_sep;
        out += to_json(entries[i]->second, options, depth + 1, undefined_to_null);
      }
      if (indented && !entries.empty()) out += base_padding;
      return out + "}";
    }
    default: fail(std::string("Cannot convert to JSON: ") + type_name(v.type));
  }
}

std::string to_display_string(const Value& v) {
  switch (v.type) {
    case ValueType::kFloat: {
      const double x = v.number;
      if (x == 0 && std::signbit(x)) return "-0.0";
      if (std::isfinite(x) && std::trunc(x) == x) {
        if (std::fabs(x) >= 1e21) return js_number_to_string(x);  // toFixed defers to ToString
        char buf[400];
        std::snprintf(buf, sizeof(buf), "%.1f", x);
        return buf;
      }
      return js_number_to_string(x);
    }
    case ValueType::kArray:
    case ValueType::kTuple:
    case ValueType::kObject:
    case ValueType::kKeywordArguments:
    case ValueType::kNamespace: return to_json(v, {}, 0, false);
    default: return to_raw_string(v);
  }
}

std::string to_raw_string(const Value& v) {
  switch (v.type) {
    // The reference builds NullValue without a value: its raw value is undefined too.
    case ValueType::kUndefined:
    case ValueType::kNull: return "undefined";
    case ValueType::kBoolean: return v.boolean ? "true" : "false";
    case ValueType::kInteger:
    case ValueType::kFloat: return js_number_to_string(v.number);
    case ValueType::kString: return v.text();
    case ValueType::kArray:
    case ValueType::kTuple: {
      std::string out;
      for (size_t i = 0; i < v.array->items.size(); ++i) {
        if (i > 0) out += ',';
        out += to_display_string(v.array->items[i]);
      }
      return out;
    }
    case ValueType::kObject:
    case ValueType::kKeywordArguments:
    case ValueType::kNamespace: return "[object Map]";
    case ValueType::kFunction:
      // The reference prints the JavaScript source of the function here.
      fail("Cannot convert a function to a string", ErrorKind::kUnsupported);
  }
  return "";
}

bool truthy(const Value& v) {
  switch (v.type) {
    case ValueType::kUndefined:
    case ValueType::kNull: return false;
    case ValueType::kBoolean: return v.boolean;
    case ValueType::kInteger:
    case ValueType::kFloat: return v.number != 0 && !std::isnan(v.number);
    case ValueType::kString: return !v.text().empty();
    case ValueType::kArray:
    case ValueType::kTuple: return !v.array->items.empty();
    case ValueType::kObject:
    case ValueType::kKeywordArguments: return !v.object->entries.empty();
    case ValueType::kNamespace:
    case ValueType::kFunction: return true;
  }
  return false;
}

bool raw_truthy(const Value& v) {
  if (v.is_array() || v.is_object()) return true;
  return truthy(v);
}

namespace {

enum class Raw { kUndefined, kBoolean, kNumber, kString, kReference };

// The JavaScript type of value.value. `new NullValue()` holds undefined, so none and an
// undefined variable are the same underneath (`===` says equal).
Raw raw_kind(const Value& v) {
  switch (v.type) {
    case ValueType::kUndefined:
    case ValueType::kNull: return Raw::kUndefined;
    case ValueType::kBoolean: return Raw::kBoolean;
    case ValueType::kInteger:
    case ValueType::kFloat: return Raw::kNumber;
    case ValueType::kString: return Raw::kString;
    default: return Raw::kReference;
  }
}

// The identity of a list, dict or function. A bound method is one per receiver.
std::pair<const void*, const void*> reference(const Value& v) {
  if (v.type == ValueType::kFunction)
    return {v.function.get(), v.string ? static_cast<const void*>(v.string.get()) : v.object.get()};
  if (v.array) return {v.array.get(), nullptr};
  return {v.object.get(), nullptr};
}

// ECMAScript StringToNumber.
double string_to_number(std::string_view s) {
  s = js_trim(s);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0') {
    const char p = char(s[1] | 0x20);
    const int base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (base != 0) {
      double r = 0;
      for (char c : s.substr(2)) {
        const int d = std::isdigit(static_cast<unsigned char>(c))   ? c - '0'
                      : std::isalpha(static_cast<unsigned char>(c)) ? (c | 0x20) - 'a' + 10
                                                                    : 99;
        if (d >= base) return NAN;
        r = r * base + d;
      }
      return r;
    }
  }
  std::string_view body = s;
  if (body[0] == '+' || body[0] == '-') body.remove_prefix(1);
  if (body == "Infinity") return s[0] == '-' ? -INFINITY : INFINITY;
  size_t i = 0, digits = 0;
  while (i < body.size() && std::isdigit(static_cast<unsigned char>(body[i]))) ++i, ++digits;
  if (i < body.size() && body[i] == '.') {
    ++i;
    while (i < body.size() && std::isdigit(static_cast<unsigned char>(body[i]))) ++i, ++digits;
  }
  if (digits == 0) return NAN;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    size_t j = i + 1;
    if (j < body.size() && (body[j] == '+' || body[j] == '-')) ++j;
    const size_t exp_start = j;
    while (j < body.size() && std::isdigit(static_cast<unsigned char>(body[j]))) ++j;
    if (j == exp_start) return NAN;
    i = j;
  }
  if (i != body.size()) return NAN;
  return std::strtod(std::string(s).c_str(), nullptr);
}

bool loose_equals_depth(const Value& a, const Value& b, int depth);

// a == b where a is a string, number or boolean taken from ToPrimitive.
bool loose_primitive(const Value& a, const Value& b, int depth) { return loose_equals_depth(a, b, depth + 1); }

bool loose_equals_depth(const Value& a, const Value& b, int depth) {
  if (depth > 4) return false;
  const Raw ka = raw_kind(a), kb = raw_kind(b);
  const bool a_nullish = ka == Raw::kUndefined;
  const bool b_nullish = kb == Raw::kUndefined;
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (ka == kb) {
    switch (ka) {
      case Raw::kBoolean: return a.boolean == b.boolean;
      case Raw::kNumber: return a.number == b.number;
      case Raw::kString: return a.text() == b.text();
      default: return reference(a) == reference(b);
    }
  }
  if (ka == Raw::kNumber && kb == Raw::kString) return a.number == string_to_number(b.text());
  if (ka == Raw::kString && kb == Raw::kNumber) return string_to_number(a.text()) == b.number;
  // A function's primitive is its JavaScript source text, which equals no number and no
  // string a template would hold.
  if (a.type == ValueType::kFunction || b.type == ValueType::kFunction) return false;
  if (ka == Raw::kBoolean) return loose_primitive(Value::integer(a.boolean ? 1 : 0), b, depth);
  if (kb == Raw::kBoolean) return loose_primitive(a, Value::integer(b.boolean ? 1 : 0), depth);
  // A list, dict or function against a string or number: compare its string form.
  if (ka == Raw::kReference) return loose_primitive(Value::str(to_raw_string(a)), b, depth);
  return loose_primitive(a, Value::str(to_raw_string(b)), depth);
}

}  // namespace

bool loose_equals(const Value& a, const Value& b) { return loose_equals_depth(a, b, 0); }

bool strict_equals(const Value& a, const Value& b) {
  const Raw ka = raw_kind(a), kb = raw_kind(b);
  if (ka != kb) return false;
  switch (ka) {
    case Raw::kUndefined: return true;
    case Raw::kBoolean: return a.boolean == b.boolean;
    case Raw::kNumber: return a.number == b.number;
    case Raw::kString: return a.text() == b.text();
    case Raw::kReference: return reference(a) == reference(b);
  }
  return false;
}

bool same_value_zero(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number() && std::isnan(a.number) && std::isnan(b.number)) return true;
  return strict_equals(a, b);
}

namespace {

// An array index key ("0" .. "4294967294"), which JavaScript objects list first.
bool is_array_index(const std::string& key, uint64_t& index) {
  if (key.empty() || key.size() > 10 || (key.size() > 1 && key[0] == '0')) return false;
  index = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    index = index * 10 + uint64_t(c - '0');
  }
  return index < 4294967295ull;
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j, Heap& heap) {
  using Type = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case Type::null: return Value::null();
    case Type::boolean: return Value::boolean_value(j.get<bool>());
    case Type::number_integer: return Value::integer(double(j.get<int64_t>()));
    case Type::number_unsigned: return Value::integer(double(j.get<uint64_t>()));
    case Type::number_float: return Value::number_value(j.get<double>());
    case Type::string: return Value::str(j.get<std::string>());
    case Type::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, heap));
      return heap.array(std::move(items));
    }
    case Type::object: {
      // A JSON object's keys are distinct, so its members are appended as they are (set()
      // looks each key up among the ones before: 100,000 tool parameters took 20 s).
      Value obj = heap.object();
      std::vector<std::pair<std::string, Value>>& entries = obj.object->entries;
      entries.reserve(j.size());
      std::vector<std::pair<uint64_t, const nlohmann::ordered_json::object_t::value_type*>> indices;
      for (const auto& member : *j.get_ptr<const nlohmann::ordered_json::object_t*>()) {
        uint64_t index = 0;
        if (is_array_index(member.first, index)) indices.emplace_back(index, &member);
      }
      std::stable_sort(indices.begin(), indices.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [index, member] : indices) entries.emplace_back(member->first, from_json(member->second, heap));
      for (const auto& [key, value] : j.items()) {
        uint64_t index = 0;
        if (!is_array_index(key, index)) entries.emplace_back(key, from_json(value, heap));
      }
      return obj;
    }
    default: fail("unsupported JSON value in the template context");
  }
}

}  // namespace kiln::jinja
