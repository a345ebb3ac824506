// Jinja syntax tree: the node types of @huggingface/jinja (src/ast.ts) as one plain
// struct whose fields each node type uses as listed below.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::jinja {

enum class NodeType : uint8_t {
  // Statements
  kProgram,  // body
  kIf,       // a: test, body, alternate
  kFor,      // a: loop variable (Identifier or TupleLiteral), b: iterable, body, alternate: else block
  kBreak,
  kContinue,
  kSet,              // a: assignee, b: value (null for a block set), body
  kMacro,            // name, items: parameters (Identifier or KeywordArgument), body
  kComment,          // name: the comment text
  kCallStatement,    // a: the Call, items: caller parameters, body
  kFilterStatement,  // b: filter (Identifier or Call), body
  // Expressions
  kMember,           // a: object, b: property, flag: computed (obj[prop] rather than obj.prop)
  kCall,             // a: callee, items: arguments
  kIdentifier,       // name
  kIntegerLiteral,   // number
  kFloatLiteral,     // number
  kStringLiteral,    // name: the value (also template text)
  kArrayLiteral,     // items
  kTupleLiteral,     // items
  kObjectLiteral,    // items: keys, alternate: values (parallel)
  kBinary,           // name: operator, a: left, b: right
  kFilter,           // a: operand, b: filter (Identifier or Call)
  kSelect,           // a: value, b: test ("a if b" without else)
  kTest,             // a: operand, name: test, flag: negated ("is not")
  kUnary,            // name: operator, a: argument
  kSlice,            // a: start, b: stop, c: step (each may be null)
  kKeywordArgument,  // name: key, a: value
  kSpread,           // a: argument (*args)
  kKeywordSpread,    // a: argument (**kwargs)
  kTernary,          // a: condition, b: value if true, c: value if false
};

// The reference's node type name ("MemberExpression"), used in error messages.
const char* node_type_name(NodeType t);

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeType type;
  uint32_t offset = 0;  // byte offset in the template source of the node's first token
  std::string name;
  double number = 0;
  bool flag = false;
  NodePtr a, b, c;
  std::vector<NodePtr> items, body, alternate;

  Node(NodeType t, uint32_t off) : type(t), offset(off) {}
};

}  // namespace kiln::jinja
