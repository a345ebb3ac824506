// Runtime values of the Jinja engine: the RuntimeValue classes of @huggingface/jinja
// (src/runtime.ts) and the JavaScript conversions they lean on (String(x), ==, ===,
// JSON.stringify, Number::toString).
//
// Numbers are JavaScript numbers: a double, tagged integer or float the way the
// reference tags them (an IntegerValue prints as "1", a FloatValue as "1.0").
// Strings, lists, dicts and functions are shared (reference counted), so identity
// (`a == b` on two lists) is pointer identity as in JavaScript. Scopes live in the
// render's Heap. Only a namespace is ever mutated after creation, so only a namespace
// can close a reference cycle; the Heap empties every namespace when the render ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja_unicode.h"

namespace kiln::jinja {

enum class ValueType : uint8_t {
  kUndefined,
  kNull,
  kBoolean,
  kInteger,
  kFloat,
  kString,
  kArray,
  kTuple,  // an ArrayValue subclass in the reference
  kObject,
  kKeywordArguments,  // an ObjectValue subclass: the kwargs passed to a call
  kNamespace,
  kFunction,
};

// The reference's class name ("IntegerValue"), used in error messages.
const char* type_name(ValueType t);

struct ArrayData;
struct ObjectData;
struct FunctionData;
struct Env;
class Heap;

struct Value {
  ValueType type = ValueType::kUndefined;
  bool boolean = false;
  double number = 0;
  std::shared_ptr<const std::string> string;
  std::shared_ptr<ArrayData> array;
  std::shared_ptr<ObjectData> object;
  // With `string` or `object` set, a bound method and its receiver.
  std::shared_ptr<const FunctionData> function;

  static Value undefined() { return {}; }
  static Value null() { return make(ValueType::kNull); }
  static Value boolean_value(bool b) {
    Value v = make(ValueType::kBoolean);
    v.boolean = b;
    return v;
  }
  static Value integer(double n) {
    Value v = make(ValueType::kInteger);
    v.number = n;
    return v;
  }
  static Value floating(double n) {
    Value v = make(ValueType::kFloat);
    v.number = n;
    return v;
  }
  static Value str(std::string s) {
    merge_surrogate_pairs(s);  // JavaScript joins two halves into one character
    Value v = make(ValueType::kString);
    v.string = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  // A JS number from a computation: integer when it is one (convertToRuntimeValues).
  static Value number_value(double n);

  const std::string& text() const { return *string; }
  bool is_undefined() const { return type == ValueType::kUndefined; }
  bool is_null() const { return type == ValueType::kNull; }
  bool is_string() const { return type == ValueType::kString; }
  bool is_number() const { return type == ValueType::kInteger || type == ValueType::kFloat; }
  // instanceof ArrayValue (tuples included)
  bool is_array() const { return type == ValueType::kArray || type == ValueType::kTuple; }
  // instanceof ObjectValue (keyword arguments included, namespaces not)
  bool is_object() const { return type == ValueType::kObject || type == ValueType::kKeywordArguments; }
  // ObjectValue or NamespaceValue: what `.attr` and map(attribute=) look into.
  bool is_attribute_container() const { return is_object() || type == ValueType::kNamespace; }
  // Integer, float or boolean (isNumericLikeValue).
  bool is_numeric_like() const { return is_number() || type == ValueType::kBoolean; }
  double numeric() const { return type == ValueType::kBoolean ? (boolean ? 1 : 0) : number; }

 private:
  static Value make(ValueType t) {
    Value v;
    v.type = t;
    return v;
  }
};

struct ArrayData {
  std::vector<Value> items;
};

// A JavaScript Map<string, RuntimeValue>: insertion ordered, set() on an existing key
// keeps its position.
struct ObjectData {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
  void erase(std::string_view key);
};

class Interpreter;
// self: the function value (a bound method finds its receiver there); args: positional
// values, then a kKeywordArguments value when keywords were passed; env: the caller's
// scope (macros are dynamically scoped in the reference).
using NativeFunction = std::function<Value(Interpreter&, const Value& self, std::vector<Value>& args, Env* env)>;
struct FunctionData {
  NativeFunction call;
};

// A variable scope (the reference's Environment).
struct Env {
  Env* parent = nullptr;
  std::vector<std::pair<std::string, Value>> variables;

  // setVariable: define or overwrite in this scope.
  void set(const std::string& name, Value value);
  // lookupVariable: the innermost definition, undefined when there is none.
  Value lookup(std::string_view name) const;
  bool has_local(std::string_view name) const;
};

// A list longer than this is an error (a template doubling a list in a loop).
inline constexpr size_t kMaxListItems = size_t(1) << 20;

// Creates the values of one render and keeps its budget of work: every evaluated node,
// loop iteration, list item and kilobyte of string produced costs steps, so no template
// runs for long however it loops or copies. Scopes live here until the render ends
// (closures such as `caller` refer to them); addresses are stable.
class Heap {
 public:
  explicit Heap(int64_t max_steps) : max_steps_(max_steps) {}
  ~Heap();
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  Value array(std::vector<Value> items = {}, ValueType type = ValueType::kArray);
  Value object(ValueType type = ValueType::kObject);
  Value function(NativeFunction fn);
  Env* env(Env* parent);
  // Adds `steps` of work; a JinjaError (kLimit) once the budget is spent.
  void charge(int64_t steps);

 private:
  int64_t max_steps_;
  int64_t steps_ = 0;
  std::deque<Env> envs_;
  std::vector<std::weak_ptr<ObjectData>> namespaces_;
};

// JavaScript Number::toString(10): "1", "0.1", "1e+21", "1.5e-7", "NaN", "Infinity".
std::string js_number_to_string(double v);
// JSON.stringify of a string (only ", \ and control characters are escaped).
std::string json_quote(std::string_view s);

// RuntimeValue.toString(): how `{{ value }}` prints.
std::string to_display_string(const Value& v);
// String(value.value): how `~`, `+` with a string and `join` see a value (none is
// "undefined" here: the reference's NullValue carries no value).
std::string to_raw_string(const Value& v);
// __bool__(): Jinja truthiness (empty lists and dicts are false).
bool truthy(const Value& v);
// !!value.value: JavaScript truthiness of the underlying value (any list is true).
bool raw_truthy(const Value& v);
// left.value == right.value (JavaScript loose equality).
bool loose_equals(const Value& a, const Value& b);
// left.value === right.value.
bool strict_equals(const Value& a, const Value& b);
// SameValueZero (Set membership, the `unique` filter).
bool same_value_zero(const Value& a, const Value& b);

struct JsonOptions {
  int64_t indent = 0;  // 0: single line
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_separators = false;
  std::string item_separator, key_separator;
};
// The reference's toJSON(); `undefined_to_null` false prints undefined as `undefined`.
std::string to_json(const Value& v, const JsonOptions& options, int depth = 0, bool undefined_to_null = true);

// convertToRuntimeValues(JSON.parse(text)): objects get JavaScript's key order
// (integer-like keys first, ascending), integral floats become integers.
Value from_json(const nlohmann::ordered_json& j, Heap& heap);

}  // namespace kiln::jinja
