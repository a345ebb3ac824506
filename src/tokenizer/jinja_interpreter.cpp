#include "tokenizer/jinja_interpreter.h"

#include <algorithm>
#include <cmath>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_unicode.h"

namespace kiln::jinja {

const Value* Arguments::keyword(std::string_view name) const {
  for (const auto& [k, v] : keywords)
    if (k == name) return &v;
  return nullptr;
}

const Value* Arguments::get(size_t i, std::string_view name) const {
  if (i < positional.size()) return &positional[i];
  return keyword(name);
}

void Interpreter::check_size(size_t bytes, size_t copied) {
  heap_.charge(int64_t(copied >> 10));  // copying a kilobyte costs a step
  if (bytes > options_.max_output_bytes)
    fail("String of " + std::to_string(bytes) + " bytes exceeds the limit of " +
             std::to_string(options_.max_output_bytes),
         ErrorKind::kLimit);
}

std::string Interpreter::run(const Node& program, Env* global) { return evaluate(&program, global).text(); }

Value Interpreter::evaluate(const Node* node, Env* env) {
  if (node == nullptr) return Value::undefined();
  if (depth_ >= options_.max_depth)
    throw JinjaError(ErrorKind::kLimit, "Template recursion exceeds depth " + std::to_string(options_.max_depth),
                     node->offset);
  struct DepthGuard {
    int& depth;
    explicit DepthGuard(int& d) : depth(++d) {}
    ~DepthGuard() { --depth; }
  } guard(depth_);
  try {
    heap_.charge(1);
    return dispatch(*node, env);
  } catch (JinjaError& e) {
    if (e.offset() < 0) e.set_offset(node->offset);  // the innermost node names the position
    throw;
  }
}

std::string Interpreter::evaluate_block(const std::vector<NodePtr>& statements, Env* env) {
  std::string out;
  for (const NodePtr& statement : statements) {
    const Value v = evaluate(statement.get(), env);
    if (v.is_null() || v.is_undefined()) continue;
    const size_t before = out.size();
    if (v.is_string()) {
      out += v.text();
    } else {
      out += to_display_string(v);
    }
    check_size(out.size(), out.size() - before);
  }
  return out;
}

Value Interpreter::dispatch(const Node& node, Env* env) {
  switch (node.type) {
    case NodeType::kProgram: return Value::str(evaluate_block(node.body, env));
    case NodeType::kSet: return evaluate_set(node, env);
    case NodeType::kIf: {
      const Value test = evaluate(node.a.get(), env);
      return Value::str(evaluate_block(truthy(test) ? node.body : node.alternate, env));
    }
    case NodeType::kFor: return evaluate_for(node, env);
    case NodeType::kMacro: return evaluate_macro(node, env);
    case NodeType::kCallStatement: return evaluate_call_statement(node, env);
    case NodeType::kBreak: throw BreakSignal{node.offset};
    case NodeType::kContinue: throw ContinueSignal{node.offset};
    case NodeType::kIntegerLiteral: return Value::integer(node.number);
    case NodeType::kFloatLiteral: return Value::floating(node.number);
    case NodeType::kStringLiteral: return Value::str(node.name);
    case NodeType::kArrayLiteral:
    case NodeType::kTupleLiteral: {
      std::vector<Value> items;
      for (const NodePtr& item : node.items) items.push_back(evaluate(item.get(), env));
      return heap_.array(std::move(items),
                         node.type == NodeType::kTupleLiteral ? ValueType::kTuple : ValueType::kArray);
    }
    case NodeType::kObjectLiteral: return evaluate_object_literal(node, env);
    case NodeType::kIdentifier: return env->lookup(node.name);
    case NodeType::kCall: return evaluate_call(node, env);
    case NodeType::kMember: return evaluate_member(node, env);
    case NodeType::kUnary: return evaluate_unary(node, env);
    case NodeType::kBinary: return evaluate_binary(node, env);
    case NodeType::kFilter: return apply_filter(evaluate(node.a.get(), env), *node.b, env);
    case NodeType::kFilterStatement: return apply_filter(Value::str(evaluate_block(node.body, env)), *node.b, env);
    case NodeType::kTest: return evaluate_test(node, env);
    case NodeType::kSelect: {
      const Value predicate = evaluate(node.b.get(), env);
      if (!truthy(predicate)) return Value::undefined();
      return evaluate(node.a.get(), env);
    }
    case NodeType::kTernary: {
      const Value cond = evaluate(node.a.get(), env);
      return truthy(cond) ? evaluate(node.b.get(), env) : evaluate(node.c.get(), env);
    }
    case NodeType::kComment: return Value::null();
    default: fail(std::string("Unknown node type: ") + node_type_name(node.type), ErrorKind::kSyntax);
  }
}

Value Interpreter::evaluate_object_literal(const Node& node, Env* env) {
  Value object = heap_.object();
  for (size_t i = 0; i < node.items.size(); ++i) {
    const Value key = evaluate(node.items[i].get(), env);
    if (!key.is_string()) fail(std::string("Object keys must be strings: got ") + type_name(key.type));
    object.object->set(key.text(), evaluate(node.alternate[i].get(), env));
  }
  return object;
}

namespace {

Value arithmetic_result(double v, bool is_float) { return is_float ? Value::floating(v) : Value::integer(v); }

// JavaScript's ** where it differs from std::pow.
double js_pow(double a, double b) {
  if (std::isnan(b)) return NAN;
  if (std::fabs(a) == 1 && std::isinf(b)) return NAN;
  return std::pow(a, b);
}

}  // namespace

Value Interpreter::evaluate_binary(const Node& node, Env* env) {
  const std::string& op = node.name;
  const Value left = evaluate(node.a.get(), env);
  if (op == "and") return truthy(left) ? evaluate(node.b.get(), env) : left;
  if (op == "or") return truthy(left) ? left : evaluate(node.b.get(), env);
  const Value right = evaluate(node.b.get(), env);
  if (op == "==") return Value::boolean_value(loose_equals(left, right));
  if (op == "!=") return Value::boolean_value(!loose_equals(left, right));
  const bool membership = op == "in" || op == "not in";
  if (left.is_undefined() || right.is_undefined()) {
    if (right.is_undefined() && membership) return Value::boolean_value(op == "not in");
    fail("Cannot perform operation " + op + " on undefined values");
  }
  if (left.is_null() || right.is_null()) fail("Cannot perform operation on null values");
  if (op == "~") {
    std::string s = to_raw_string(left) + to_raw_string(right);
    check_size(s.size());
    return Value::str(std::move(s));
  }
  if (op == "**" && left.is_numeric_like() && right.is_numeric_like()) {
    const double a = left.numeric(), b = right.numeric();
    if (a == 0 && b < 0) fail("0.0 cannot be raised to a negative power");
    const double result = js_pow(a, b);
    if (!std::isfinite(result)) fail("Exponentiation result is not a finite real number");
    return arithmetic_result(result, left.type == ValueType::kFloat || right.type == ValueType::kFloat || b < 0);
  } else if (left.is_number() && right.is_number()) {
    const double a = left.number, b = right.number;
    const bool is_float = left.type == ValueType::kFloat || right.type == ValueType::kFloat;
    if (op == "+") return arithmetic_result(a + b, is_float);
    if (op == "-") return arithmetic_result(a - b, is_float);
    if (op == "*") return arithmetic_result(a * b, is_float);
    if (op == "/") return Value::floating(a / b);
    if (op == "//") return arithmetic_result(std::floor(a / b), is_float);
    if (op == "%") return arithmetic_result(std::fmod(a, b), is_float);
    if (op == "<") return Value::boolean_value(a < b);
    if (op == ">") return Value::boolean_value(a > b);
    if (op == ">=") return Value::boolean_value(a >= b);
    if (op == "<=") return Value::boolean_value(a <= b);
  } else if (left.is_array() && right.is_array()) {
    if (op == "+") {
      if (left.array->items.size() + right.array->items.size() > kMaxListItems)
        fail("A list of " + std::to_string(left.array->items.size() + right.array->items.size()) +
                 " items exceeds the limit of " + std::to_string(kMaxListItems),
             ErrorKind::kLimit);
      std::vector<Value> items = left.array->items;
      items.insert(items.end(), right.array->items.begin(), right.array->items.end());
      return heap_.array(std::move(items));
    }
  } else if (right.is_array()) {
    if (membership) {
      const auto& items = right.array->items;
      const bool member =
          std::any_of(items.begin(), items.end(), [&](const Value& x) { return strict_equals(x, left); });
      return Value::boolean_value(op == "in" ? member : !member);
    }
  }
  if ((left.is_string() || right.is_string()) && op == "+") {
    std::string s = to_raw_string(left) + to_raw_string(right);
    check_size(s.size());
    return Value::str(std::move(s));
  }
  if (left.is_string() && right.is_string() && membership) {
    const bool found = right.text().find(left.text()) != std::string::npos;
    return Value::boolean_value(op == "in" ? found : !found);
  }
  if (left.is_string() && right.is_object() && membership) {
    const bool found = right.object->find(left.text()) != nullptr;
    return Value::boolean_value(op == "in" ? found : !found);
  }
  fail("Unknown operator \"" + op + "\" between " + type_name(left.type) + " and " + type_name(right.type));
}

Value Interpreter::evaluate_unary(const Node& node, Env* env) {
  const Value argument = evaluate(node.a.get(), env);
  if (node.name == "not") return Value::boolean_value(!truthy(argument));
  if (node.name == "+" || node.name == "-") {
    const double sign = node.name == "-" ? -1 : 1;
    if (argument.is_numeric_like())
      return arithmetic_result(sign * argument.numeric(), argument.type == ValueType::kFloat);
    fail("Unknown operator \"" + node.name + "\" for " + type_name(argument.type));
  }
  fail("Unknown operator: " + node.name);
}

Value Interpreter::evaluate_test(const Node& node, Env* env) {
  const Value operand = evaluate(node.a.get(), env);
  const std::optional<bool> result = run_test(node.name, operand, nullptr);
  if (!result) fail("Unknown test: " + node.name, ErrorKind::kUnsupported);
  return Value::boolean_value(node.flag ? !*result : *result);
}

Arguments Interpreter::evaluate_arguments(const std::vector<NodePtr>& args, Env* env) {
  Arguments out;
  for (const NodePtr& arg : args) {
    if (arg->type == NodeType::kSpread) {
      const Value v = evaluate(arg->a.get(), env);
      if (!v.is_array()) fail(std::string("Cannot unpack non-iterable type: ") + type_name(v.type));
      out.positional.insert(out.positional.end(), v.array->items.begin(), v.array->items.end());
    } else if (arg->type != NodeType::kKeywordArgument && arg->type != NodeType::kKeywordSpread) {
      out.positional.push_back(evaluate(arg.get(), env));
    }
  }
  const auto add = [&](const std::string& key, Value value) {
    if (out.keyword(key) != nullptr) fail("Got multiple values for keyword argument '" + key + "'");
    out.keywords.emplace_back(key, std::move(value));
  };
  for (const NodePtr& arg : args) {
    if (arg->type == NodeType::kKeywordArgument) {
      add(arg->name, evaluate(arg->a.get(), env));
    } else if (arg->type == NodeType::kKeywordSpread) {
      const Value v = evaluate(arg->a.get(), env);
      if (!v.is_object()) fail(std::string("Argument after ** must be a mapping, not ") + type_name(v.type));
      for (const auto& [key, value] : v.object->entries) add(key, value);
    }
  }
  return out;
}

namespace {

Value keyword_arguments(const Arguments& args, Heap& heap) {
  Value kwargs = heap.object(ValueType::kKeywordArguments);
  for (const auto& [key, value] : args.keywords) kwargs.object->set(key, value);
  return kwargs;
}

}  // namespace

Value Interpreter::evaluate_call(const Node& node, Env* env) {
  const Arguments args = evaluate_arguments(node.items, env);
  std::vector<Value> list = args.positional;
  if (!args.keywords.empty()) list.push_back(keyword_arguments(args, heap_));
  const Value fn = evaluate(node.a.get(), env);
  if (fn.type != ValueType::kFunction)
    fail(std::string("Cannot call something that is not a function: got ") + type_name(fn.type));
  return fn.function->call(*this, fn, list, env);
}

namespace {

// utils.ts slice(): Python slicing with the reference's clamping. n: the length.
std::vector<int64_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  const auto clamp = [&](double x) { return int64_t(std::clamp(x, double(-n - 2), double(n + 2))); };
  const int64_t step = step_v.is_undefined() ? 1 : clamp(step_v.number);
  const int direction = step > 0 ? 1 : step < 0 ? -1 : 0;
  int64_t start = 0, stop = 0;
  if (direction >= 0) {
    start = start_v.is_undefined() ? 0 : clamp(start_v.number);
    start = start < 0 ? std::max(n + start, int64_t(0)) : std::min(start, n);
    stop = stop_v.is_undefined() ? n : clamp(stop_v.number);
    stop = stop < 0 ? std::max(n + stop, int64_t(0)) : std::min(stop, n);
  } else {
    start = start_v.is_undefined() ? n - 1 : clamp(start_v.number);
    start = start < 0 ? std::max(n + start, int64_t(-1)) : std::min(start, n - 1);
    stop = stop_v.is_undefined() ? -1 : clamp(stop_v.number);
    stop = stop < -1 ? std::max(n + stop, int64_t(-1)) : std::min(stop, n - 1);
  }
  std::vector<int64_t> out;
  for (int64_t i = start; direction * i < direction * stop; i += step) out.push_back(i);
  return out;
}

}  // namespace

Value Interpreter::evaluate_slice(const Value& object, const Node& slice, Env* env) {
  if (!object.is_array() && !object.is_string()) fail("Slice object must be an array or string");
  const Value start = evaluate(slice.a.get(), env);
  const Value stop = evaluate(slice.b.get(), env);
  const Value step = evaluate(slice.c.get(), env);
  const auto check = [](const Value& v, const char* what) {
    if (v.type != ValueType::kInteger && !v.is_undefined())
      fail(std::string("Slice ") + what + " must be numeric or undefined");
  };
  check(start, "start");
  check(stop, "stop");
  check(step, "step");
  if (object.is_array()) {
    const auto& items = object.array->items;
    std::vector<Value> out;
    for (int64_t i : slice_indices(int64_t(items.size()), start, stop, step)) out.push_back(items[size_t(i)]);
    return heap_.array(std::move(out));
  }
  const std::vector<std::string_view> chars = code_points(object.text());
  std::string out;
  for (int64_t i : slice_indices(int64_t(chars.size()), start, stop, step)) out += chars[size_t(i)];
  return Value::str(std::move(out));
}

Value Interpreter::evaluate_member(const Node& node, Env* env) {
  const Value object = evaluate(node.a.get(), env);
  Value property;
  if (node.flag) {
    if (node.b->type == NodeType::kSlice) return evaluate_slice(object, *node.b, env);
    property = evaluate(node.b.get(), env);
  } else if (node.b->type == NodeType::kIntegerLiteral) {
    property = Value::integer(node.b->number);
  } else {
    property = Value::str(node.b->name);
  }
  if (object.is_attribute_container()) {
    if (!property.is_string())
      fail(std::string("Cannot access property with non-string: got ") + type_name(property.type));
    if (const Value* v = object.object->find(property.text())) return *v;
    if (object.is_object()) return member_builtin(object, property.text());
    return Value::undefined();
  }
  if (object.is_array() || object.is_string()) {
    if (property.type == ValueType::kInteger) {
      const double index = std::isnan(property.number) ? 0 : std::trunc(property.number);
      if (std::fabs(index) > 9e15) return Value::undefined();
      if (object.is_string()) {
        std::optional<std::string> ch = utf16_at(object.text(), int64_t(index));
        return ch ? Value::str(std::move(*ch)) : Value::undefined();
      }
      const auto& items = object.array->items;
      int64_t i = int64_t(index);
      if (i < 0) i += int64_t(items.size());
      if (i < 0 || i >= int64_t(items.size())) return Value::undefined();
      return items[size_t(i)];
    }
    if (property.is_string()) return member_builtin(object, property.text());
    fail(std::string("Cannot access property with non-string/non-number: got ") + type_name(property.type));
  }
  if (!property.is_string())
    fail(std::string("Cannot access property with non-string: got ") + type_name(property.type));
  return member_builtin(object, property.text());
}

Value Interpreter::evaluate_set(const Node& node, Env* env) {
  const Value rhs = node.b ? evaluate(node.b.get(), env) : Value::str(evaluate_block(node.body, env));
  const Node& assignee = *node.a;
  if (assignee.type == NodeType::kIdentifier) {
    env->set(assignee.name, rhs);
  } else if (assignee.type == NodeType::kTupleLiteral) {
    if (!rhs.is_array()) fail(std::string("Cannot unpack non-iterable type in set: ") + type_name(rhs.type));
    const auto& values = rhs.array->items;
    if (values.size() != assignee.items.size())
      fail(std::string("Too ") + (assignee.items.size() > values.size() ? "few" : "many") +
           " items to unpack in set");
    for (size_t i = 0; i < assignee.items.size(); ++i) {
      const Node& element = *assignee.items[i];
      if (element.type != NodeType::kIdentifier)
        fail(std::string("Cannot unpack to non-identifier in set: ") + node_type_name(element.type));
      env->set(element.name, values[i]);
    }
  } else if (assignee.type == NodeType::kMember) {
    const Value object = evaluate(assignee.a.get(), env);
    if (object.type != ValueType::kNamespace) fail("cannot assign attribute on non-namespace object");
    if (assignee.b->type != NodeType::kIdentifier) fail("Cannot assign to member with non-identifier property");
    object.object->set(assignee.b->name, rhs);
  } else {
    fail(std::string("Invalid LHS inside assignment expression: ") + node_type_name(assignee.type));
  }
  return Value::null();
}

Value Interpreter::evaluate_for(const Node& node, Env* env) {
  Env* scope = heap_.env(env);
  const Node* test = nullptr;
  Value iterable;
  if (node.b->type == NodeType::kSelect) {
    iterable = evaluate(node.b->a.get(), scope);
    test = node.b->b.get();
  } else {
    iterable = evaluate(node.b.get(), scope);
  }
  if (!iterable.is_array() && !iterable.is_object())
    fail(std::string("Expected iterable or object type in for loop: got ") + type_name(iterable.type));
  if (iterable.is_object()) iterable = object_keys(iterable, heap_);

  const Node& loopvar = *node.a;
  const auto bind = [&](Env* target, const Value& current) {
    if (loopvar.type == NodeType::kIdentifier) {
      target->set(loopvar.name, current);
      return;
    }
    for (size_t j = 0; j < loopvar.items.size(); ++j) {
      if (loopvar.items[j]->type != NodeType::kIdentifier)
        fail(std::string("Cannot unpack non-identifier type: ") + node_type_name(loopvar.items[j]->type));
      target->set(loopvar.items[j]->name, current.array->items[j]);
    }
  };
  std::vector<Value> items;
  for (const Value& current : iterable.array->items) {
    if (loopvar.type == NodeType::kTupleLiteral) {
      if (current.type != ValueType::kArray)
        fail(std::string("Cannot unpack non-iterable type: ") + type_name(current.type));
      if (loopvar.items.size() != current.array->items.size())
        fail(std::string("Too ") + (loopvar.items.size() > current.array->items.size() ? "few" : "many") +
             " items to unpack");
    }
    if (test != nullptr) {
      Env* loop_scope = heap_.env(scope);
      bind(loop_scope, current);
      if (!truthy(evaluate(test, loop_scope))) continue;
    }
    items.push_back(current);
  }

  std::string result;
  bool no_iteration = true;
  const double n = double(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    heap_.charge(1);  // an empty body evaluates nothing: count the iteration
    Value loop = heap_.object();
    ObjectData& l = *loop.object;
    l.entries.reserve(9);
    l.set("index", Value::integer(double(i) + 1));
    l.set("index0", Value::integer(double(i)));
    l.set("revindex", Value::integer(n - double(i)));
    l.set("revindex0", Value::integer(n - double(i) - 1));
    l.set("first", Value::boolean_value(i == 0));
    l.set("last", Value::boolean_value(i + 1 == items.size()));
    l.set("length", Value::integer(n));
    l.set("previtem", i > 0 ? items[i - 1] : Value::undefined());
    l.set("nextitem", i + 1 < items.size() ? items[i + 1] : Value::undefined());
    scope->set("loop", loop);
    bind(scope, items[i]);
    try {
      const std::string body = evaluate_block(node.body, scope);
      result += body;
      check_size(result.size(), body.size());
    } catch (const ContinueSignal&) {
      continue;
    } catch (const BreakSignal&) {
      break;
    }
    no_iteration = false;
  }
  if (no_iteration) result += evaluate_block(node.alternate, scope);
  return Value::str(std::move(result));
}

void Interpreter::bind_macro_arguments(const std::string& display_name, const std::vector<NodePtr>& parameters,
                                       const std::set<std::string>& special, const std::vector<Value>& args,
                                       Env* scope) {
  std::vector<Value> positional = args;
  std::vector<std::pair<std::string, Value>> keywords;
  if (!positional.empty() && positional.back().type == ValueType::kKeywordArguments) {
    keywords = positional.back().object->entries;
    positional.pop_back();
  }
  std::vector<const Node*> pending_defaults;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Node& parameter = *parameters[i];
    std::optional<Value> value;
    if (i < positional.size()) value = positional[i];
    if (!value) {
      const auto it =
          std::find_if(keywords.begin(), keywords.end(), [&](const auto& e) { return e.first == parameter.name; });
      if (it != keywords.end()) {
        value = it->second;
        keywords.erase(it);
      }
    }
    if (!value && parameter.type == NodeType::kKeywordArgument) pending_defaults.push_back(&parameter);
    scope->set(parameter.name, value ? *value : Value::undefined());
  }
  if (special.count("kwargs")) {
    Value kwargs = heap_.object();
    kwargs.object->entries = keywords;
    scope->set("kwargs", kwargs);
  } else if (!keywords.empty()) {
    fail("macro " + display_name + " takes no keyword argument '" + keywords.front().first + "'");
  }
  if (special.count("varargs")) {
    std::vector<Value> rest;
    if (positional.size() > parameters.size())
      rest.assign(positional.begin() + long(parameters.size()), positional.end());
    scope->set("varargs", heap_.array(std::move(rest)));
  } else if (positional.size() > parameters.size()) {
    fail("macro " + display_name + " takes not more than " + std::to_string(parameters.size()) + " argument(s)");
  }
  for (const Node* parameter : pending_defaults) scope->set(parameter->name, evaluate(parameter->a.get(), scope));
}

Value Interpreter::evaluate_macro(const Node& node, Env* env) {
  const std::set<std::string> special = find_special_macro_arguments(node.items, node.body);
  const Node* macro = &node;
  env->set(node.name,
           heap_.function([macro, special](Interpreter& in, const Value&, std::vector<Value>& args, Env* scope) {
             Env* macro_scope = in.heap().env(scope);
             in.bind_macro_arguments("'" + macro->name + "'", macro->items, special, args, macro_scope);
             return Value::str(in.evaluate_block(macro->body, macro_scope));
           }));
  return Value::null();
}

Value Interpreter::evaluate_call_statement(const Node& node, Env* env) {
  const std::set<std::string> special = find_special_macro_arguments(node.items, node.body);
  const Node* statement = &node;
  const Value caller =
      heap_.function([statement, special, env](Interpreter& in, const Value&, std::vector<Value>& args, Env*) {
        Env* block_env = in.heap().env(env);
        in.bind_macro_arguments("None", statement->items, special, args, block_env);
        return Value::str(in.evaluate_block(statement->body, block_env));
      });
  const Node& call = *node.a;
  const Arguments args = evaluate_arguments(call.items, env);
  std::vector<Value> list = args.positional;
  list.push_back(keyword_arguments(args, heap_));
  const Value fn = evaluate(call.a.get(), env);
  if (fn.type != ValueType::kFunction)
    fail(std::string("Cannot call something that is not a function: got ") + type_name(fn.type));
  Env* call_env = heap_.env(env);
  call_env->set("caller", caller);
  return fn.function->call(*this, fn, list, call_env);
}

}  // namespace kiln::jinja
