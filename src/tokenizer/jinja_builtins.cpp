// Methods of strings, lists and dicts, the tests, and the global functions of
// @huggingface/jinja 0.5.11 (src/runtime.ts, src/utils.ts).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_unicode.h"

namespace kiln::jinja {

namespace {

using Args = std::vector<Value>;

const Value* arg_at(const Args& args, size_t i) { return i < args.size() ? &args[i] : nullptr; }

// String.prototype.split over UTF-8 (the same as over UTF-16 for a non-empty separator).
std::vector<std::string> split_all(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    if (at == std::string::npos) break;
    out.push_back(s.substr(start, at - start));
    start = at + sep.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::string join(const std::vector<std::string>& parts, size_t from, const std::string& sep) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) {
    if (i > from) out += sep;
    out += parts[i];
  }
  return out;
}

// str.split(sep=None, maxsplit=-1) as the reference implements it.
Value string_split(const std::string& s, const Args& args, Heap& heap) {
  const Value sep = args.size() > 0 ? args[0] : Value::null();
  if (!sep.is_string() && !sep.is_null()) fail("sep argument must be a string or null");
  const Value maxsplit = args.size() > 1 ? args[1] : Value::integer(-1);
  if (maxsplit.type != ValueType::kInteger) fail("maxsplit argument must be a number");
  const double max = maxsplit.number;
  std::vector<std::string> parts;
  if (sep.is_null()) {
    const std::string_view text = js_trim_start(s);
    size_t i = 0;
    while (i < text.size()) {
      i += js_whitespace_run(text, i);
      if (i >= text.size()) break;
      size_t end = i;
      while (end < text.size() && js_whitespace_run(text, end) == 0) {
        next_code_point(text, end);
      }
      if (max != -1 && double(parts.size()) >= max) {
        parts.emplace_back(text.substr(i));
        break;
      }
      parts.emplace_back(text.substr(i, end - i));
      i = end;
    }
  } else {
    if (sep.text().empty()) fail("empty separator");
    parts = split_all(s, sep.text());
    if (max != -1 && double(parts.size()) > max) {
      // result.push(result.splice(maxsplit).join(sep))
      const double n = double(parts.size());
      const size_t from = size_t(max < 0 ? std::max(n + max, 0.0) : std::min(max, n));
      std::string rest = join(parts, from, sep.text());
      parts.resize(from);
      parts.push_back(std::move(rest));
    }
  }
  std::vector<Value> items;
  for (std::string& p : parts) items.push_back(Value::str(std::move(p)));
  return heap.array(std::move(items));
}

// utils.ts replace(): replaceAll with a count limit; an empty pattern matches at every
// code point boundary.
std::string replace_count(const std::string& s, const std::string& from, const std::string& to,
                          const Value& count) {
  if (count.type == ValueType::kInteger && count.number == 0) return s;
  double remaining = count.is_null() || count.number < 0 ? std::numeric_limits<double>::infinity() : count.number;
  std::string out;
  if (from.empty()) {
    for (size_t i = 0;;) {
      if (remaining > 0) {
        out += to;
        --remaining;
      }
      if (i >= s.size()) break;
      const size_t start = i;
      next_code_point(s, i);
      out.append(s, start, i - start);
    }
    return out;
  }
  size_t start = 0;
  while (true) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    if (remaining > 0) {
      out += to;
      --remaining;
    } else {
      out += from;
    }
    start = at + from.size();
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Python-style title(): the reference upper-cases every \b\w (ASCII word characters).
std::string title_case(const std::string& s) {
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i) {
    const unsigned char c = out[i];
    const bool word_start = is_ascii_word(c) && (i == 0 || !is_ascii_word(static_cast<unsigned char>(out[i - 1])));
    if (word_start && c >= 'a' && c <= 'z') out[i] = char(c - 32);
  }
  return out;
}

// charAt(0).toUpperCase() + slice(1): only a first character inside the BMP changes.
std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t i = 0;
  const uint32_t first = next_code_point(s, i);
  if (first >= 0x10000) return s;
  return js_to_upper(s.substr(0, i)) + s.substr(i);
}

Value starts_or_ends_with(const std::string& s, const Args& args, bool starts, const char* name) {
  const auto matches = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return starts ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (args.empty()) fail(std::string(name) + "() requires at least one argument");
  const Value& pattern = args[0];
  if (pattern.is_string()) return Value::boolean_value(matches(pattern.text()));
  if (pattern.is_array()) {
    for (const Value& item : pattern.array->items) {
      if (!item.is_string()) fail(std::string(name) + "() tuple elements must be strings");
      if (matches(item.text())) return Value::boolean_value(true);
    }
    return Value::boolean_value(false);
  }
  fail(std::string(name) + "() argument must be a string or tuple of strings");
}

using Method = Value (*)(const std::string&, const Args&, Heap&);

Value string_replace(const std::string& s, const Args& args, Heap&) {
  if (args.size() < 2) fail("replace() requires at least two arguments");
  if (!args[0].is_string() || !args[1].is_string()) fail("replace() arguments must be strings");
  Value count = Value::null();
  if (args.size() > 2) {
    if (args[2].type == ValueType::kKeywordArguments) {
      const Value* c = args[2].object->find("count");
      count = c ? *c : Value::null();
    } else {
      count = args[2];
    }
  }
  if (count.type != ValueType::kInteger && !count.is_null())
    fail("replace() count argument must be a number or null");
  return Value::str(replace_count(s, args[0].text(), args[1].text(), count));
}

// String methods. A method value carries its receiver (Value::string) instead of being
// allocated per access, so `message.content.strip()` in a loop costs no memory.
const std::map<std::string, std::shared_ptr<const FunctionData>, std::less<>>& string_methods() {
  const auto wrap = [](Method method) {
    return std::make_shared<const FunctionData>(
        FunctionData{[method](Interpreter& in, const Value& self, Args& args, Env*) {
          Value out = method(*self.string, args, in.heap());
          if (out.is_string()) in.check_size(out.text().size());
          return out;
        }});
  };
  static const std::map<std::string, std::shared_ptr<const FunctionData>, std::less<>> methods = {
      {"upper", wrap([](const std::string& s, const Args&, Heap&) { return Value::str(js_to_upper(s)); })},
      {"lower", wrap([](const std::string& s, const Args&, Heap&) { return Value::str(js_to_lower(s)); })},
      {"strip",
       wrap([](const std::string& s, const Args&, Heap&) { return Value::str(std::string(js_trim(s))); })},
      {"rstrip",
       wrap([](const std::string& s, const Args&, Heap&) { return Value::str(std::string(js_trim_end(s))); })},
      {"lstrip",
       wrap([](const std::string& s, const Args&, Heap&) { return Value::str(std::string(js_trim_start(s))); })},
      {"title", wrap([](const std::string& s, const Args&, Heap&) { return Value::str(title_case(s)); })},
      {"capitalize", wrap([](const std::string& s, const Args&, Heap&) { return Value::str(capitalize(s)); })},
      {"startswith", wrap([](const std::string& s, const Args& a, Heap&) {
         return starts_or_ends_with(s, a, true, "startswith");
       })},
      {"endswith", wrap([](const std::string& s, const Args& a, Heap&) {
         return starts_or_ends_with(s, a, false, "endswith");
       })},
      {"split", wrap(string_split)},
      {"replace", wrap(string_replace)},
  };
  return methods;
}

Value string_builtin(const Value& self, const std::string& name) {
  if (name == "length") return Value::integer(double(utf16_length(self.text())));
  const auto& methods = string_methods();
  const auto it = methods.find(name);
  if (it == methods.end()) return Value::undefined();
  Value bound;
  bound.type = ValueType::kFunction;
  bound.function = it->second;
  bound.string = self.string;
  return bound;
}

Value dictsort(const Value& self, const Args& args, Heap& heap) {
  const Value* kwargs = nullptr;
  std::vector<const Value*> positional;
  for (const Value& a : args) {
    if (a.type == ValueType::kKeywordArguments) {
      kwargs = &a;
    } else {
      positional.push_back(&a);
    }
  }
  const auto option = [&](size_t i, const char* key, Value fallback) {
    if (i < positional.size()) return *positional[i];
    if (kwargs)
      if (const Value* v = kwargs->object->find(key)) return *v;
    return fallback;
  };
  const Value case_sensitive = option(0, "case_sensitive", Value::boolean_value(false));
  if (case_sensitive.type != ValueType::kBoolean) fail("case_sensitive must be a boolean");
  const Value by = option(1, "by", Value::str("key"));
  if (!by.is_string()) fail("by must be a string");
  if (by.text() != "key" && by.text() != "value") fail("by must be either 'key' or 'value'");
  const Value reverse = option(2, "reverse", Value::boolean_value(false));
  if (reverse.type != ValueType::kBoolean) fail("reverse must be a boolean");
  std::vector<Value> items = object_items(self, heap).array->items;
  const size_t index = by.text() == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int r = compare_values(a.array->items[index], b.array->items[index], case_sensitive.boolean);
    return (reverse.boolean ? -r : r) < 0;
  });
  return heap.array(std::move(items));
}

// The receiver of a bound dict method.
Value receiver(const Value& self) {
  Value v;
  v.type = ValueType::kObject;
  v.object = self.object;
  return v;
}

const std::map<std::string, std::shared_ptr<const FunctionData>, std::less<>>& object_methods() {
  const auto fn = [](NativeFunction f) {
    return std::make_shared<const FunctionData>(FunctionData{std::move(f)});
  };
  static const std::map<std::string, std::shared_ptr<const FunctionData>, std::less<>> methods = {
      {"get", fn([](Interpreter&, const Value& self, Args& args, Env*) {
         const Value* key = arg_at(args, 0);
         if (key == nullptr || !key->is_string())
           fail(std::string("Object key must be a string: got ") + (key ? type_name(key->type) : "undefined"));
         if (const Value* v = self.object->find(key->text())) return *v;
         if (const Value* d = arg_at(args, 1)) return *d;
         return Value::null();
       })},
      {"items", fn([](Interpreter& in, const Value& self, Args&, Env*) {
         return object_items(receiver(self), in.heap());
       })},
      {"keys",
       fn([](Interpreter& in, const Value& self, Args&, Env*) { return object_keys(receiver(self), in.heap()); })},
      {"values", fn([](Interpreter& in, const Value& self, Args&, Env*) {
         std::vector<Value> values;
         for (const auto& [k, v] : self.object->entries) values.push_back(v);
         return in.heap().array(std::move(values));
       })},
      {"dictsort", fn([](Interpreter& in, const Value& self, Args& args, Env*) {
         return dictsort(receiver(self), args, in.heap());
       })},
  };
  return methods;
}

Value object_builtin(const Value& self, const std::string& name) {
  const auto& methods = object_methods();
  const auto it = methods.find(name);
  if (it == methods.end()) return Value::undefined();
  Value bound;
  bound.type = ValueType::kFunction;
  bound.function = it->second;
  bound.object = self.object;
  return bound;
}

}  // namespace

Value member_builtin(const Value& object, const std::string& name) {
  if (object.is_string()) return string_builtin(object, name);
  if (object.is_array())
    return name == "length" ? Value::integer(double(object.array->items.size())) : Value::undefined();
  if (object.is_object()) return object_builtin(object, name);
  return Value::undefined();
}

Value object_items(const Value& object, Heap& heap) {
  std::vector<Value> items;
  for (const auto& [k, v] : object.object->entries) items.push_back(heap.array({Value::str(k), v}));
  return heap.array(std::move(items));
}

Value object_keys(const Value& object, Heap& heap) {
  std::vector<Value> keys;
  for (const auto& [k, v] : object.object->entries) keys.push_back(Value::str(k));
  return heap.array(std::move(keys));
}

std::optional<bool> run_test(const std::string& name, const Value& operand, const Value* arg) {
  const ValueType t = operand.type;
  if (name == "boolean") return t == ValueType::kBoolean;
  if (name == "callable") return t == ValueType::kFunction;
  if (name == "odd" || name == "even") {
    if (t != ValueType::kInteger) fail("cannot " + name + " on " + type_name(t));
    const bool odd = std::fmod(operand.number, 2) != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "false") return t == ValueType::kBoolean && !operand.boolean;
  if (name == "true") return t == ValueType::kBoolean && operand.boolean;
  if (name == "none") return t == ValueType::kNull;
  if (name == "string") return t == ValueType::kString;
  if (name == "number") return operand.is_number();
  if (name == "integer") return t == ValueType::kInteger;
  if (name == "iterable") return t == ValueType::kArray || t == ValueType::kString;
  if (name == "mapping") return operand.is_object();
  if (name == "sequence") return operand.is_array() || operand.is_object() || operand.is_string();
  if (name == "lower") return operand.is_string() && operand.text() == js_to_lower(operand.text());
  if (name == "upper") return operand.is_string() && operand.text() == js_to_upper(operand.text());
  if (name == "defined") return t != ValueType::kUndefined;
  if (name == "undefined") return t == ValueType::kUndefined;
  if (name == "equalto" || name == "eq") {
    if (arg == nullptr) fail("Cannot read properties of undefined (reading 'value')");
    return strict_equals(operand, *arg);
  }
  return std::nullopt;
}

bool is_test(const std::string& name) {
  static const char* const kTests[] = {
      "boolean",  "callable", "odd",      "even",  "false", "true",    "none",      "string",  "number", "integer",
      "iterable", "mapping",  "sequence", "lower", "upper", "defined", "undefined", "equalto", "eq"};
  return std::any_of(std::begin(kTests), std::end(kTests), [&](const char* t) { return name == t; });
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  const auto cannot = [&]() {
    fail(std::string("Cannot compare ") + type_name(a.type) + " with " + type_name(b.type));
  };
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_null() || b.is_null()) cannot();
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined()) cannot();
  if (a.is_numeric_like() && b.is_numeric_like()) {
    const double x = a.numeric(), y = b.numeric();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.type != b.type)
    fail(std::string("Cannot compare different types: ") + type_name(a.type) + " and " + type_name(b.type));
  if (a.is_string()) {
    if (case_sensitive) return compare_utf16(a.text(), b.text());
    return compare_utf16(js_to_lower(a.text()), js_to_lower(b.text()));
  }
  fail(std::string("Cannot compare type: ") + type_name(a.type));
}

double js_parse_int(std::string_view s) {
  s = js_trim_start(s);
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  const size_t digits = i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == digits) return NAN;
  return std::strtod(std::string(s.substr(0, i)).c_str(), nullptr);
}

double js_parse_float(std::string_view s) {
  s = js_trim_start(s);
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  if (s.substr(i, 8) == "Infinity") return s[0] == '-' ? -INFINITY : INFINITY;
  const auto digits = [&]() {
    const size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - from;
  };
  size_t mantissa = digits();
  if (i < s.size() && s[i] == '.') {
    const size_t dot = i++;
    const size_t frac = digits();
    if (mantissa == 0 && frac == 0) i = dot;
    mantissa += frac;
  }
  if (mantissa == 0) return NAN;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    const size_t e = i++;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) i = e;
  }
  return std::strtod(std::string(s.substr(0, i)).c_str(), nullptr);
}

Value attribute_value(const Value& item, const std::string& path) {
  Value value = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (value.is_attribute_container()) {
      const Value* v = value.object->find(part);
      value = v ? *v : Value::undefined();
    } else if (value.is_array()) {
      const double index = js_parse_int(part);
      if (std::isnan(index) || index < 0 || index >= double(value.array->items.size())) return Value::undefined();
      value = value.array->items[size_t(index)];
    } else {
      return Value::undefined();
    }
    if (dot == std::string::npos) return value;
    start = dot + 1;
  }
}

namespace {

const char* const kMonthsLong[] = {"January", "February", "March",     "April",   "May",      "June",
                                   "July",    "August",   "September", "October", "November", "December"};
const char* const kMonthsShort[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

// utils.ts strftime(): only %Y %m %d %b %B %H %M %% are replaced (English month names).
std::string strftime(const DateTime& t, const std::string& format) {
  const auto pad2 = [](int n) { return (n < 10 ? "0" : "") + std::to_string(n); };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out += format[i];
      continue;
    }
    const int month = std::clamp(t.month, 1, 12) - 1;
    switch (format[i + 1]) {
      case 'Y': out += std::to_string(t.year); break;
      case 'm': out += pad2(t.month); break;
      case 'd': out += pad2(t.day); break;
      case 'b': out += kMonthsShort[month]; break;
      case 'B': out += kMonthsLong[month]; break;
      case 'H': out += pad2(t.hour); break;
      case 'M': out += pad2(t.minute); break;
      case '%': out += '%'; break;
      default: out += '%'; continue;
    }
    ++i;
  }
  return out;
}

DateTime local_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  return {.year = tm.tm_year + 1900,
          .month = tm.tm_mon + 1,
          .day = tm.tm_mday,
          .hour = tm.tm_hour,
          .minute = tm.tm_min};
}

// A value as a JavaScript number argument (range() receives raw values).
std::optional<double> number_argument(const Value* v) {
  if (v == nullptr || v->is_undefined()) return std::nullopt;
  if (v->is_numeric_like()) return v->numeric();
  if (v->is_null()) return 0;
  fail(std::string("range() arguments must be numbers, got ") + type_name(v->type));
}

Value range(Interpreter& in, Args& args) {
  std::optional<double> start = number_argument(arg_at(args, 0));
  std::optional<double> stop = number_argument(arg_at(args, 1));
  const double step = number_argument(arg_at(args, 2)).value_or(1);
  if (!stop) {
    stop = start;
    start = 0;
  }
  if (step == 0) fail("range() step must not be zero");
  std::vector<Value> out;
  // `i < undefined` is false in JavaScript: range() with no arguments is empty.
  if (start && stop) {
    const double n = std::ceil((*stop - *start) / step);
    if (n > double(kMaxListItems))
      fail("range() of more than " + std::to_string(kMaxListItems) + " items", ErrorKind::kLimit);
    if (n > 0) out.reserve(size_t(n));
    if (step > 0) {
      for (double i = *start; i < *stop; i += step) out.push_back(Value::number_value(i));
    } else {
      for (double i = *start; i > *stop; i += step) out.push_back(Value::number_value(i));
    }
  }
  return in.heap().array(std::move(out));
}

// normalizeNamespaceEntry
std::pair<std::string, Value> namespace_entry(const Value& pair) {
  std::vector<Value> values;
  if (pair.is_array()) {
    values = pair.array->items;
  } else if (pair.is_string()) {
    for (std::string_view c : code_points(pair.text())) values.push_back(Value::str(std::string(c)));
  }
  if (values.size() != 2) fail("namespace expected an object or an iterable of [key, value] pairs");
  if (!values[0].is_string()) fail("namespace keys must be strings");
  return {values[0].text(), values[1]};
}

Value make_namespace(Interpreter& in, Args& args) {
  Args positional = args;
  std::optional<Value> kwargs;
  if (!positional.empty() && positional.back().type == ValueType::kKeywordArguments) {
    kwargs = positional.back();
    positional.pop_back();
  }
  if (positional.size() > 1)
    fail("namespace expected at most 1 argument, got " + std::to_string(positional.size()));
  Value ns = in.heap().object(ValueType::kNamespace);
  if (positional.size() == 1) {
    const Value& source = positional[0];
    if (source.is_object()) {
      for (const auto& [k, v] : source.object->entries) ns.object->set(k, v);
    } else if (source.is_array()) {
      for (const Value& pair : source.array->items) {
        auto [k, v] = namespace_entry(pair);
        ns.object->set(k, v);
      }
    } else {
      fail(std::string("'") + type_name(source.type) + "' object is not iterable");
    }
  }
  if (kwargs)
    for (const auto& [k, v] : kwargs->object->entries) ns.object->set(k, v);
  return ns;
}

}  // namespace

void install_globals(Env* env, Heap& heap) {
  env->set("namespace", heap.function([](Interpreter& in, const Value&, Args& args, Env*) {
    return make_namespace(in, args);
  }));
  env->set("false", Value::boolean_value(false));
  env->set("true", Value::boolean_value(true));
  env->set("none", Value::null());
  env->set("raise_exception", heap.function([](Interpreter&, const Value&, Args& args, Env*) -> Value {
    // new Error(message): an undefined message (none's raw value too) is the empty string.
    const Value* message = arg_at(args, 0);
    const bool empty = message == nullptr || message->is_undefined() || message->is_null();
    throw JinjaError(ErrorKind::kRaised, empty ? "" : to_raw_string(*message));
  }));
  env->set("range",
           heap.function([](Interpreter& in, const Value&, Args& args, Env*) { return range(in, args); }));
  env->set("strftime_now", heap.function([](Interpreter& in, const Value&, Args& args, Env*) {
    const Value* format = arg_at(args, 0);
    if (format == nullptr || !format->is_string()) fail("strftime_now() needs a format string");
    return Value::str(strftime(in.options().now.value_or(local_now()), format->text()));
  }));
  env->set("True", Value::boolean_value(true));
  env->set("False", Value::boolean_value(false));
  env->set("None", Value::null());
}

}  // namespace kiln::jinja
