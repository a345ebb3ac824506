// Filters of @huggingface/jinja 0.5.11 (Interpreter.applyFilter), and the scan that
// finds which macros read `kwargs` / `varargs`.
#include <algorithm>
#include <cmath>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_unicode.h"

namespace kiln::jinja {

namespace {

[[noreturn]] void cannot_apply(const std::string& filter, const Value& operand) {
  fail("Cannot apply filter \"" + filter + "\" to type: " + type_name(operand.type));
}

// The `indent` filter: width spaces before every line but the first (unless `first`)
// and the empty ones (unless `blank`).
std::string indent_lines(const std::string& s, size_t width, bool first, bool blank) {
  const std::string pad(width, ' ');
  std::string out;
  size_t start = 0, line = 0;
  while (true) {
    const size_t nl = s.find('\n', start);
    const std::string_view text =
        std::string_view(s).substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (line > 0) out += '\n';
    if (!((!first && line == 0) || (!blank && text.empty()))) out += pad;
    out += text;
    if (nl == std::string::npos) break;
    start = nl + 1;
    ++line;
  }
  return out;
}

// Array.prototype.join over raw values: null and undefined join as "".
std::string join_raw(const std::vector<Value>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    if (!items[i].is_null() && !items[i].is_undefined()) out += to_raw_string(items[i]);
  }
  return out;
}

}  // namespace

Value Interpreter::apply_filter(const Value& operand, const Node& filter, Env* env) {
  Value out;
  if (filter.type == NodeType::kIdentifier) {
    out = apply_identifier_filter(operand, filter.name, env);
  } else if (filter.type == NodeType::kCall) {
    out = apply_call_filter(operand, filter, env);
  } else {
    fail(std::string("Unknown filter: ") + node_type_name(filter.type));
  }
  if (out.is_string()) check_size(out.text().size());
  return out;
}

Value Interpreter::apply_identifier_filter(const Value& operand, const std::string& name, Env* env) {
  if (name == "safe") return operand;
  if (name == "tojson") return Value::str(to_json(operand, {}));
  if (operand.is_array()) {
    const auto& items = operand.array->items;
    if (name == "list") return operand;
    // On an empty list the reference yields a bare JavaScript undefined, which is undefined
    // once stored ({% set %}) and crashes most other uses (a TypeError); kiln: undefined.
    if (name == "first") return items.empty() ? Value::undefined() : items.front();
    if (name == "last") return items.empty() ? Value::undefined() : items.back();
    if (name == "length") return Value::integer(double(items.size()));
    if (name == "reverse") return heap_.array(std::vector<Value>(items.rbegin(), items.rend()));
    if (name == "sort") {
      std::vector<Value> sorted = items;
      std::stable_sort(sorted.begin(), sorted.end(),
                       [](const Value& a, const Value& b) { return compare_values(a, b, false) < 0; });
      return heap_.array(std::move(sorted));
    }
    if (name == "join") return Value::str(join_raw(items, ""));
    if (name == "string") return Value::str(to_json(operand, {}, 0, false));
    if (name == "unique") {
      std::vector<Value> unique;
      for (const Value& item : items)
        if (std::none_of(unique.begin(), unique.end(), [&](const Value& u) { return same_value_zero(u, item); }))
          unique.push_back(item);
      return heap_.array(std::move(unique));
    }
    fail("Unknown ArrayValue filter: " + name, ErrorKind::kUnsupported);
  }
  if (operand.is_string()) {
    const std::string& s = operand.text();
    if (name == "length" || name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      const Value builtin = member_builtin(operand, name);
      if (builtin.type != ValueType::kFunction) return builtin;
      std::vector<Value> no_args;
      return builtin.function->call(*this, builtin, no_args, env);
    }
    if (name == "trim") return Value::str(std::string(js_trim(s)));
    if (name == "indent") return Value::str(indent_lines(s, 4, false, false));
    if (name == "join" || name == "string") return operand;
    if (name == "int") {
      const double v = js_parse_int(s);
      return Value::integer(std::isnan(v) ? 0 : v);
    }
    if (name == "float") {
      const double v = js_parse_float(s);
      return Value::floating(std::isnan(v) ? 0 : v);
    }
    fail("Unknown StringValue filter: " + name, ErrorKind::kUnsupported);
  }
  if (operand.is_number()) {
    if (name == "abs")
      return operand.type == ValueType::kInteger ? Value::integer(std::fabs(operand.number))
                                                 : Value::floating(std::fabs(operand.number));
    if (name == "int") return Value::integer(std::floor(operand.number));
    if (name == "float") return Value::floating(operand.number);
    if (name == "string") return Value::str(to_display_string(operand));
    fail("Unknown NumericValue filter: " + name, ErrorKind::kUnsupported);
  }
  if (operand.is_object()) {
    if (name == "items") return object_items(operand, heap_);
    if (name == "length") return Value::integer(double(operand.object->entries.size()));
    const Value builtin = member_builtin(operand, name);
    if (builtin.type == ValueType::kFunction) {
      std::vector<Value> no_args;
      return builtin.function->call(*this, builtin, no_args, env);
    }
    if (!builtin.is_undefined()) return builtin;
    fail("Unknown ObjectValue filter: " + name, ErrorKind::kUnsupported);
  }
  if (operand.type == ValueType::kBoolean) {
    if (name == "bool") return operand;
    if (name == "int") return Value::integer(operand.boolean ? 1 : 0);
    if (name == "float") return Value::floating(operand.boolean ? 1 : 0);
    if (name == "string") return Value::str(operand.boolean ? "true" : "false");
    fail("Unknown BooleanValue filter: " + name, ErrorKind::kUnsupported);
  }
  cannot_apply(name, operand);
}

Value Interpreter::filter_tojson(const Value& operand, const Arguments& args) {
  JsonOptions options;
  const Value* indent = args.keyword("indent");
  if (indent && indent->type != ValueType::kInteger && !indent->is_null()) fail("If set, indent must be a number");
  if (indent && indent->type == ValueType::kInteger) options.indent = int64_t(indent->number);
  const Value* ensure_ascii = args.keyword("ensure_ascii");
  if (ensure_ascii && ensure_ascii->type != ValueType::kBoolean) fail("If set, ensure_ascii must be a boolean");
  options.ensure_ascii = ensure_ascii && ensure_ascii->boolean;
  const Value* sort_keys = args.keyword("sort_keys");
  if (sort_keys && sort_keys->type != ValueType::kBoolean) fail("If set, sort_keys must be a boolean");
  options.sort_keys = sort_keys && sort_keys->boolean;
  const Value* separators = args.keyword("separators");
  if (separators && separators->is_array()) {
    const auto& items = separators->array->items;
    if (items.size() != 2 || !items[0].is_string() || !items[1].is_string())
      fail("separators must be a tuple of two strings");
    options.has_separators = true;
    options.item_separator = items[0].text();
    options.key_separator = items[1].text();
  } else if (separators && !separators->is_null()) {
    fail("If set, separators must be a tuple of two strings");
  }
  return Value::str(to_json(operand, options));
}

Value Interpreter::filter_sort(const Value& operand, const Arguments& args) {
  const Value* reverse = args.get(0, "reverse");
  if (reverse && reverse->type != ValueType::kBoolean) fail("reverse must be a boolean");
  const Value* case_sensitive = args.get(1, "case_sensitive");
  if (case_sensitive && case_sensitive->type != ValueType::kBoolean) fail("case_sensitive must be a boolean");
  const Value* attribute = args.get(2, "attribute");
  if (attribute && !attribute->is_string() && attribute->type != ValueType::kInteger && !attribute->is_null())
    fail("attribute must be a string, integer, or null");
  const bool rev = reverse && reverse->boolean;
  const bool cs = case_sensitive && case_sensitive->boolean;
  std::string path;
  const bool by_attribute = attribute && !attribute->is_null();
  if (by_attribute) path = attribute->is_string() ? attribute->text() : js_number_to_string(attribute->number);
  std::vector<Value> sorted = operand.array->items;
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Value& a, const Value& b) {
    const int r = by_attribute ? compare_values(attribute_value(a, path), attribute_value(b, path), cs)
                               : compare_values(a, b, cs);
    return (rev ? -r : r) < 0;
  });
  return heap_.array(std::move(sorted));
}

Value Interpreter::filter_select(const Value& operand, const Node& call, bool select, Env* env) {
  const std::string& name = call.a->name;
  const auto& items = operand.array->items;
  if (std::any_of(items.begin(), items.end(), [](const Value& v) { return !v.is_attribute_container(); }))
    fail("`" + name + "` can only be applied to array of objects");
  if (std::any_of(call.items.begin(), call.items.end(),
                  [](const NodePtr& a) { return a->type != NodeType::kStringLiteral; }))
    fail("arguments of `" + name + "` must be strings");
  std::vector<Value> args;
  for (const NodePtr& a : call.items) args.push_back(evaluate(a.get(), env));
  std::string test;
  if (args.size() > 1) {
    test = args[1].text();
    if (!is_test(test)) fail("Unknown test: " + test, ErrorKind::kUnsupported);
  }
  std::vector<Value> out;
  for (const Value& item : items) {
    const Value* a = args.empty() ? nullptr : item.object->find(args[0].text());
    bool result = false;
    if (a != nullptr)
      result = test.empty() ? truthy(*a) : *run_test(test, *a, args.size() > 2 ? &args[2] : nullptr);
    if (result == select) out.push_back(item);
  }
  return heap_.array(std::move(out));
}

Value Interpreter::filter_map(const Value& operand, const Arguments& args) {
  const Value* attribute = args.keyword("attribute");
  if (attribute == nullptr)
    fail("`map` expressions without `attribute` set are not currently supported.", ErrorKind::kUnsupported);
  if (!attribute->is_string()) fail("attribute must be a string");
  const Value* fallback = args.keyword("default");
  std::vector<Value> out;
  for (const Value& item : operand.array->items) {
    if (!item.is_attribute_container()) fail("items in map must be an object");
    const Value v = attribute_value(item, attribute->text());
    out.push_back(v.is_undefined() && fallback ? *fallback : v);
  }
  return heap_.array(std::move(out));
}

Value Interpreter::apply_call_filter(const Value& operand, const Node& call, Env* env) {
  if (call.a->type != NodeType::kIdentifier) fail(std::string("Unknown filter: ") + node_type_name(call.a->type));
  const std::string& name = call.a->name;
  if (name == "tojson") return filter_tojson(operand, evaluate_arguments(call.items, env));
  if (name == "join") {
    std::vector<Value> values;
    if (operand.is_string()) {
      for (std::string_view c : code_points(operand.text())) values.push_back(Value::str(std::string(c)));
    } else if (operand.is_array()) {
      values = operand.array->items;
    } else {
      cannot_apply(name, operand);
    }
    const Arguments args = evaluate_arguments(call.items, env);
    const Value* sep = args.get(0, "separator");
    if (sep && !sep->is_string()) fail("separator must be a string");
    return Value::str(join_raw(values, sep ? sep->text() : ""));
  }
  if (name == "int" || name == "float") {
    const Arguments args = evaluate_arguments(call.items, env);
    const Value* given = args.get(0, "default");
    const Value fallback = given ? *given : name == "int" ? Value::integer(0) : Value::floating(0);
    if (operand.is_string()) {
      const double v = name == "int" ? js_parse_int(operand.text()) : js_parse_float(operand.text());
      if (std::isnan(v)) return fallback;
      return name == "int" ? Value::integer(v) : Value::floating(v);
    }
    if (operand.is_number()) return operand;
    if (operand.type == ValueType::kBoolean)
      return name == "int" ? Value::integer(operand.boolean ? 1 : 0) : Value::floating(operand.boolean ? 1 : 0);
    cannot_apply(name, operand);
  }
  if (name == "default") {
    const Arguments args = evaluate_arguments(call.items, env);
    const Value fallback = args.positional.empty() ? Value::str("") : args.positional[0];
    const Value* boolean = args.get(1, "boolean");
    if (boolean && boolean->type != ValueType::kBoolean) fail("`default` filter flag must be a boolean");
    if (operand.is_undefined() || (boolean && boolean->boolean && !truthy(operand))) return fallback;
    return operand;
  }
  if (operand.is_array()) {
    if (name == "sort") return filter_sort(operand, evaluate_arguments(call.items, env));
    if (name == "selectattr" || name == "rejectattr")
      return filter_select(operand, call, name == "selectattr", env);
    if (name == "map") return filter_map(operand, evaluate_arguments(call.items, env));
    fail("Unknown ArrayValue filter: " + name, ErrorKind::kUnsupported);
  }
  if (operand.is_string()) {
    if (name == "indent") {
      const Arguments args = evaluate_arguments(call.items, env);
      const Value* width = args.get(0, "width");
      if (width && width->type != ValueType::kInteger) fail("width must be a number");
      const double w = width ? width->number : 4;
      if (w > 1024) fail("indent width " + js_number_to_string(w) + " is too large", ErrorKind::kLimit);
      const Value* first = args.get(1, "first");
      const Value* blank = args.get(2, "blank");
      return Value::str(indent_lines(operand.text(), size_t(std::max(w, 0.0)), first && raw_truthy(*first),
                                     blank && raw_truthy(*blank)));
    }
    if (name == "replace") {
      const Arguments args = evaluate_arguments(call.items, env);
      std::vector<Value> list = args.positional;
      Value kwargs = heap_.object(ValueType::kKeywordArguments);
      for (const auto& [k, v] : args.keywords) kwargs.object->set(k, v);
      list.push_back(kwargs);
      const Value replace = member_builtin(operand, "replace");
      return replace.function->call(*this, replace, list, env);
    }
    fail("Unknown StringValue filter: " + name, ErrorKind::kUnsupported);
  }
  if (operand.is_object()) {
    const Value builtin = member_builtin(operand, name);
    if (builtin.type == ValueType::kFunction) {
      const Arguments args = evaluate_arguments(call.items, env);
      std::vector<Value> list = args.positional;
      if (!args.keywords.empty()) {
        Value kwargs = heap_.object(ValueType::kKeywordArguments);
        for (const auto& [k, v] : args.keywords) kwargs.object->set(k, v);
        list.push_back(kwargs);
      }
      return builtin.function->call(*this, builtin, list, env);
    }
    fail("Unknown ObjectValue filter: " + name, ErrorKind::kUnsupported);
  }
  cannot_apply(name, operand);
}

namespace {

// findAccessedSpecialMacroArguments: a walk over the body in the reference's order;
// a name counts as read if it is used before anything declares it.
class SpecialArgumentScan {
 public:
  std::set<std::string> declared, accessed;

  static bool special(const std::string& name) { return name == "kwargs" || name == "varargs"; }
  void declare_name(const std::string& name) {
    if (special(name)) declared.insert(name);
  }
  void declare_target(const Node* target) {
    if (target == nullptr) return;
    if (target->type == NodeType::kIdentifier) declare_name(target->name);
    if (target->type == NodeType::kTupleLiteral)
      for (const NodePtr& item : target->items) declare_target(item.get());
  }
  void declare_arguments(const std::vector<NodePtr>& args) {
    for (const NodePtr& a : args) declare_name(a->name);
  }
  void visit_defaults(const std::vector<NodePtr>& args) {
    for (const NodePtr& a : args)
      if (a->type == NodeType::kKeywordArgument) visit(a->a.get());
  }
  void visit_filter(const Node* filter) {
    if (filter && filter->type == NodeType::kCall) visit(filter->items);
  }
  void visit(const std::vector<NodePtr>& nodes) {
    for (const NodePtr& n : nodes) visit(n.get());
  }
  void visit(const Node* node) {
    if (node == nullptr) return;
    switch (node->type) {
      case NodeType::kFor:
        declare_target(node->a.get());
        if (node->b->type == NodeType::kSelect) {
          visit(node->b->a.get());
          visit(node->body);
          visit(node->alternate);
          visit(node->b->b.get());
          return;
        }
        visit(node->b.get());
        visit(node->body);
        visit(node->alternate);
        return;
      case NodeType::kSet:
        declare_target(node->a.get());
        visit(node->b.get());
        visit(node->body);
        return;
      case NodeType::kMacro:
        declare_arguments(node->items);
        visit_defaults(node->items);
        visit(node->body);
        return;
      case NodeType::kCallStatement:
        visit(node->a.get());
        declare_arguments(node->items);
        visit_defaults(node->items);
        visit(node->body);
        return;
      case NodeType::kFilterStatement:
        visit(node->body);
        visit_filter(node->b.get());
        return;
      case NodeType::kIdentifier:
        if (special(node->name) && !declared.count(node->name)) accessed.insert(node->name);
        return;
      case NodeType::kMember:
        visit(node->a.get());
        if (node->flag) visit(node->b.get());
        return;
      case NodeType::kFilter:
        visit(node->a.get());
        visit_filter(node->b.get());
        return;
      case NodeType::kTest: visit(node->a.get()); return;
      case NodeType::kSelect:
        visit(node->b.get());
        visit(node->a.get());
        return;
      case NodeType::kKeywordArgument: visit(node->a.get()); return;
      case NodeType::kObjectLiteral:
        for (size_t i = 0; i < node->items.size(); ++i) {
          visit(node->items[i].get());
          visit(node->alternate[i].get());
        }
        return;
      default:  // every child, in the order of the reference's fields
        visit(node->a.get());
        visit(node->b.get());
        visit(node->c.get());
        visit(node->items);
        visit(node->body);
        visit(node->alternate);
    }
  }
};

}  // namespace

std::set<std::string> find_special_macro_arguments(const std::vector<NodePtr>& parameters,
                                                   const std::vector<NodePtr>& body) {
  SpecialArgumentScan scan;
  scan.declare_arguments(parameters);
  scan.visit(body);
  return scan.accessed;
}

}  // namespace kiln::jinja
