// Jinja interpreter: a port of the Interpreter of @huggingface/jinja 0.5.11
// (src/runtime.ts). jinja_interpreter.cpp evaluates statements and expressions,
// jinja_filters.cpp holds the filters and tests, jinja_builtins.cpp the methods of
// strings and dicts and the global functions.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_template.h"
#include "tokenizer/jinja_value.h"

namespace kiln::jinja {

// {% break %} / {% continue %}: thrown like the reference's BreakControl and
// ContinueControl, so the output of the interrupted iteration is dropped as it is there.
struct BreakSignal {
  uint32_t offset;
};
struct ContinueSignal {
  uint32_t offset;
};

struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;

  const Value* keyword(std::string_view name) const;
  // args.at(i) ?? kwargs.get(name): the positional value if given, else the keyword.
  const Value* get(size_t i, std::string_view name) const;
};

class Interpreter {
 public:
  Interpreter(Heap& heap, const RenderOptions& options) : heap_(heap), options_(options) {}

  std::string run(const Node& program, Env* global);
  Value evaluate(const Node* node, Env* env);
  std::string evaluate_block(const std::vector<NodePtr>& statements, Env* env);
  Arguments evaluate_arguments(const std::vector<NodePtr>& args, Env* env);
  Value apply_filter(const Value& operand, const Node& filter, Env* env);

  Heap& heap() { return heap_; }
  const RenderOptions& options() const { return options_; }
  // Accounts for a string of this many bytes just produced: an error past
  // RenderOptions::max_output_bytes, and a step per kilobyte copied.
  // `copied`: the bytes actually written when a string grew by appending.
  void check_size(size_t bytes, size_t copied);
  void check_size(size_t bytes) { check_size(bytes, bytes); }

 private:
  Value dispatch(const Node& node, Env* env);
  Value evaluate_binary(const Node& node, Env* env);
  Value evaluate_unary(const Node& node, Env* env);
  Value evaluate_member(const Node& node, Env* env);
  Value evaluate_slice(const Value& object, const Node& slice, Env* env);
  Value evaluate_call(const Node& node, Env* env);
  Value evaluate_test(const Node& node, Env* env);
  Value evaluate_object_literal(const Node& node, Env* env);
  Value evaluate_set(const Node& node, Env* env);
  Value evaluate_for(const Node& node, Env* env);
  Value evaluate_macro(const Node& node, Env* env);
  Value evaluate_call_statement(const Node& node, Env* env);
  void bind_macro_arguments(const std::string& display_name, const std::vector<NodePtr>& parameters,
                            const std::set<std::string>& special, const std::vector<Value>& args, Env* scope);

  Value apply_identifier_filter(const Value& operand, const std::string& name, Env* env);
  Value apply_call_filter(const Value& operand, const Node& call, Env* env);
  Value filter_tojson(const Value& operand, const Arguments& args);
  Value filter_sort(const Value& operand, const Arguments& args);
  Value filter_select(const Value& operand, const Node& call, bool select, Env* env);
  Value filter_map(const Value& operand, const Arguments& args);

  Heap& heap_;
  const RenderOptions& options_;
  int depth_ = 0;
};

// Builtins (jinja_builtins.cpp).

// Names the template sees before the context: namespace, true/false/none (and the
// capitalised forms), raise_exception, range, strftime_now.
void install_globals(Env* env, Heap& heap);
// `object.name` for names the object does not hold itself: string methods and
// `length`, list `length`, dict get/items/keys/values/dictsort. Undefined if none.
Value member_builtin(const Value& object, const std::string& name);
// The reference's Environment.TESTS; nullopt for an unknown test. `arg` is the second
// operand of equalto / eq (null when the test is used as `x is equalto`).
std::optional<bool> run_test(const std::string& name, const Value& operand, const Value* arg);
bool is_test(const std::string& name);
// compareRuntimeValues: numbers (and booleans) by value, strings by code unit.
int compare_values(const Value& a, const Value& b, bool case_sensitive);
// getAttributeValue: "a.b.0" through dicts, namespaces and lists.
Value attribute_value(const Value& item, const std::string& path);
// Items of a dict as [key, value] lists.
Value object_items(const Value& object, Heap& heap);
Value object_keys(const Value& object, Heap& heap);
// JavaScript parseInt(s, 10) / parseFloat(s); NaN when nothing parses.
double js_parse_int(std::string_view s);
double js_parse_float(std::string_view s);

// The kwargs / varargs a macro body reads (findAccessedSpecialMacroArguments).
std::set<std::string> find_special_macro_arguments(const std::vector<NodePtr>& parameters,
                                                   const std::vector<NodePtr>& body);

}  // namespace kiln::jinja
