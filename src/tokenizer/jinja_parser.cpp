#include "tokenizer/jinja_parser.h"

#include <cstdlib>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>

#include "tokenizer/jinja_error.h"

namespace kiln::jinja {

const char* node_type_name(NodeType t) {
  switch (t) {
    case NodeType::kProgram: return "Program";
    case NodeType::kIf: return "If";
    case NodeType::kFor: return "For";
    case NodeType::kBreak: return "Break";
    case NodeType::kContinue: return "Continue";
    case NodeType::kSet: return "Set";
    case NodeType::kMacro: return "Macro";
    case NodeType::kComment: return "Comment";
    case NodeType::kCallStatement: return "CallStatement";
    case NodeType::kFilterStatement: return "FilterStatement";
    case NodeType::kMember: return "MemberExpression";
    case NodeType::kCall: return "CallExpression";
    case NodeType::kIdentifier: return "Identifier";
    case NodeType::kIntegerLiteral: return "IntegerLiteral";
    case NodeType::kFloatLiteral: return "FloatLiteral";
    case NodeType::kStringLiteral: return "StringLiteral";
    case NodeType::kArrayLiteral: return "ArrayLiteral";
    case NodeType::kTupleLiteral: return "TupleLiteral";
    case NodeType::kObjectLiteral: return "ObjectLiteral";
    case NodeType::kBinary: return "BinaryExpression";
    case NodeType::kFilter: return "FilterExpression";
    case NodeType::kSelect: return "SelectExpression";
    case NodeType::kTest: return "TestExpression";
    case NodeType::kUnary: return "UnaryExpression";
    case NodeType::kSlice: return "SliceExpression";
    case NodeType::kKeywordArgument: return "KeywordArgumentExpression";
    case NodeType::kSpread: return "SpreadExpression";
    case NodeType::kKeywordSpread: return "KeywordSpreadExpression";
    case NodeType::kTernary: return "Ternary";
  }
  return "?";
}

namespace {

enum class ArgsMode { kCall, kParameters };

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, uint32_t source_size) : t_(tokens), source_size_(source_size) {}

  NodePtr program() {
    auto program = make(NodeType::kProgram, 0);
    while (cur_ < t_.size()) program->body.push_back(parse_any());
    return program;
  }

 private:
  // Tracks nesting so that a hostile template cannot overflow the stack.
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxParseDepth)
        p.error("Template nesting exceeds " + std::to_string(kMaxParseDepth) + " levels", ErrorKind::kLimit);
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  [[noreturn]] void error(const std::string& message, ErrorKind kind = ErrorKind::kSyntax) const {
    throw JinjaError(kind, message, cur_ < t_.size() ? t_[cur_].offset : source_size_);
  }
  [[noreturn]] void error_at(size_t index, const std::string& message) const {
    throw JinjaError(ErrorKind::kSyntax, message, index < t_.size() ? t_[index].offset : source_size_);
  }
  const Token& peek() const {
    if (cur_ >= t_.size()) error("Unexpected end of template");
    return t_[cur_];
  }
  NodePtr make(NodeType type, uint32_t offset) const { return std::make_unique<Node>(type, offset); }
  uint32_t here() const { return cur_ < t_.size() ? t_[cur_].offset : source_size_; }

  bool is(std::initializer_list<TokenType> types) const {
    if (cur_ + types.size() > t_.size()) return false;
    size_t i = cur_;
    for (TokenType type : types)
      if (t_[i++].type != type) return false;
    return true;
  }
  bool is(TokenType type) const { return is({type}); }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (cur_ + 1 >= t_.size()) return false;
    if (t_[cur_].type != TokenType::kOpenStatement || t_[cur_ + 1].type != TokenType::kIdentifier) return false;
    for (std::string_view n : names)
      if (t_[cur_ + 1].value == n) return true;
    return false;
  }
  bool is_identifier(std::initializer_list<std::string_view> names) const {
    if (cur_ + names.size() > t_.size()) return false;
    size_t i = cur_;
    for (std::string_view n : names) {
      if (t_[i].type != TokenType::kIdentifier || t_[i].value != n) return false;
      ++i;
    }
    return true;
  }
  bool is_identifier(std::string_view name) const { return is_identifier({name}); }

  const Token& expect(TokenType type, std::string_view what) {
    if (cur_ >= t_.size()) error("Unexpected end of template: " + std::string(what));
    const Token& prev = t_[cur_++];
    if (prev.type != type)
      error_at(cur_ - 1, "Parser Error: " + std::string(what) + ". " + token_type_name(prev.type) +
                             " !== " + token_type_name(type) + ".");
    return prev;
  }
  void expect_identifier(std::string_view name) {
    if (!is_identifier(name)) error("Expected " + std::string(name));
    ++cur_;
  }

  // Parses statements until {% <one of names> %}; the end of the template is an error.
  void parse_until(std::vector<NodePtr>& out, std::initializer_list<std::string_view> names,
                   std::string_view closer) {
    while (!is_statement(names)) {
      if (cur_ >= t_.size()) error("Unexpected end of template: missing {% " + std::string(closer) + " %}");
      out.push_back(parse_any());
    }
  }

  NodePtr parse_any() {
    DepthGuard guard(*this);
    const Token& tok = peek();
    switch (tok.type) {
      case TokenType::kComment: {
        auto node = make(NodeType::kComment, tok.offset);
        node->name = tok.value;
        ++cur_;
        return node;
      }
      case TokenType::kText: {
        auto node = make(NodeType::kStringLiteral, tok.offset);
        node->name = tok.value;
        ++cur_;
        return node;
      }
      case TokenType::kOpenStatement: return parse_statement();
      case TokenType::kOpenExpression: {
        expect(TokenType::kOpenExpression, "Expected opening expression token");
        NodePtr result = parse_expression();
        expect(TokenType::kCloseExpression, "Expected closing expression token");
        return result;
      }
      default: error(std::string("Unexpected token type: ") + token_type_name(tok.type));
    }
  }

  NodePtr parse_statement() {
    expect(TokenType::kOpenStatement, "Expected opening statement token");
    const Token& tok = peek();
    if (tok.type != TokenType::kIdentifier)
      error(std::string("Unknown statement, got ") + token_type_name(tok.type));
    const std::string& name = tok.value;
    const uint32_t offset = tok.offset;
    NodePtr result;
    if (name == "set") {
      ++cur_;
      result = parse_set(offset);
    } else if (name == "if") {
      ++cur_;
      result = parse_if(offset);
      expect(TokenType::kOpenStatement, "Expected {% token");
      expect_identifier("endif");
      expect(TokenType::kCloseStatement, "Expected %} token");
    } else if (name == "macro") {
      ++cur_;
      result = parse_macro(offset);
      expect(TokenType::kOpenStatement, "Expected {% token");
      expect_identifier("endmacro");
      expect(TokenType::kCloseStatement, "Expected %} token");
    } else if (name == "for") {
      ++cur_;
      result = parse_for(offset);
      expect(TokenType::kOpenStatement, "Expected {% token");
      expect_identifier("endfor");
      expect(TokenType::kCloseStatement, "Expected %} token");
    } else if (name == "call") {
      ++cur_;
      result = make(NodeType::kCallStatement, offset);
      if (is(TokenType::kOpenParen)) parse_args(ArgsMode::kParameters, result->items);
      NodePtr callee = parse_primary();
      if (callee->type != NodeType::kIdentifier) error("Expected identifier following call statement");
      auto call = make(NodeType::kCall, callee->offset);
      call->a = std::move(callee);
      parse_args(ArgsMode::kCall, call->items);
      result->a = std::move(call);
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      parse_until(result->body, {"endcall"}, "endcall");
      expect(TokenType::kOpenStatement, "Expected '{%'");
      expect_identifier("endcall");
      expect(TokenType::kCloseStatement, "Expected closing statement token");
    } else if (name == "break" || name == "continue") {
      ++cur_;
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      result = make(name == "break" ? NodeType::kBreak : NodeType::kContinue, offset);
    } else if (name == "filter") {
      ++cur_;
      result = make(NodeType::kFilterStatement, offset);
      NodePtr filter = parse_primary();
      if (filter->type == NodeType::kIdentifier && is(TokenType::kOpenParen))
        filter = parse_call(std::move(filter));
      result->b = std::move(filter);
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      parse_until(result->body, {"endfilter"}, "endfilter");
      expect(TokenType::kOpenStatement, "Expected '{%'");
      expect_identifier("endfilter");
      expect(TokenType::kCloseStatement, "Expected '%}'");
    } else {
      error("Unknown statement type: " + name, ErrorKind::kUnsupported);
    }
    return result;
  }

  NodePtr parse_set(uint32_t offset) {
    auto node = make(NodeType::kSet, offset);
    node->a = parse_expression_sequence(false);
    if (is(TokenType::kEquals)) {
      ++cur_;
      node->b = parse_expression_sequence(false);
    } else {
      expect(TokenType::kCloseStatement, "Expected %} token");
      parse_until(node->body, {"endset"}, "endset");
      expect(TokenType::kOpenStatement, "Expected {% token");
      expect_identifier("endset");
    }
    expect(TokenType::kCloseStatement, "Expected closing statement token");
    return node;
  }

  NodePtr parse_if(uint32_t offset) {
    auto node = make(NodeType::kIf, offset);
    node->a = parse_expression();
    expect(TokenType::kCloseStatement, "Expected closing statement token");
    parse_until(node->body, {"elif", "else", "endif"}, "endif");
    if (is_statement({"elif"})) {
      const uint32_t elif_offset = t_[cur_ + 1].offset;
      cur_ += 2;
      node->alternate.push_back(parse_if(elif_offset));
    } else if (is_statement({"else"})) {
      cur_ += 2;
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      parse_until(node->alternate, {"endif"}, "endif");
    }
    return node;
  }

  NodePtr parse_macro(uint32_t offset) {
    auto node = make(NodeType::kMacro, offset);
    NodePtr name = parse_primary();
    if (name->type != NodeType::kIdentifier) error("Expected identifier following macro statement");
    node->name = name->name;
    parse_args(ArgsMode::kParameters, node->items);
    expect(TokenType::kCloseStatement, "Expected closing statement token");
    parse_until(node->body, {"endmacro"}, "endmacro");
    return node;
  }

  NodePtr parse_for(uint32_t offset) {
    auto node = make(NodeType::kFor, offset);
    node->a = parse_expression_sequence(true);
    if (node->a->type != NodeType::kIdentifier && node->a->type != NodeType::kTupleLiteral)
      error(std::string("Expected identifier/tuple for the loop variable, got ") + node_type_name(node->a->type) +
            " instead");
    if (!is_identifier("in")) error("Expected `in` keyword following loop variable");
    ++cur_;
    node->b = parse_expression();
    expect(TokenType::kCloseStatement, "Expected closing statement token");
    parse_until(node->body, {"endfor", "else"}, "endfor");
    if (is_statement({"else"})) {
      cur_ += 2;
      expect(TokenType::kCloseStatement, "Expected closing statement token");
      parse_until(node->alternate, {"endfor"}, "endfor");
    }
    return node;
  }

  NodePtr parse_expression_sequence(bool primary) {
    const uint32_t offset = here();
    std::vector<NodePtr> expressions;
    expressions.push_back(primary ? parse_primary() : parse_expression());
    const bool is_tuple = is(TokenType::kComma);
    while (is_tuple) {
      ++cur_;
      expressions.push_back(primary ? parse_primary() : parse_expression());
      if (!is(TokenType::kComma)) break;
    }
    if (!is_tuple) return std::move(expressions[0]);
    auto tuple = make(NodeType::kTupleLiteral, offset);
    tuple->items = std::move(expressions);
    return tuple;
  }

  NodePtr parse_expression() {
    DepthGuard guard(*this);
    return parse_if_expression();
  }

  NodePtr parse_if_expression() {
    NodePtr a = parse_logical_or();
    if (!is_identifier("if")) return a;
    const uint32_t offset = t_[cur_].offset;
    ++cur_;
    NodePtr test = parse_logical_or();
    if (is_identifier("else")) {
      ++cur_;
      auto node = make(NodeType::kTernary, offset);
      node->a = std::move(test);
      node->b = std::move(a);
      node->c = parse_if_expression();
      return node;
    }
    auto node = make(NodeType::kSelect, offset);
    node->a = std::move(a);
    node->b = std::move(test);
    return node;
  }

  NodePtr binary(std::string op, uint32_t offset, NodePtr left, NodePtr right) {
    auto node = make(NodeType::kBinary, offset);
    node->name = std::move(op);
    node->a = std::move(left);
    node->b = std::move(right);
    return node;
  }

  NodePtr parse_logical_or() {
    NodePtr left = parse_logical_and();
    while (is_identifier("or")) {
      const uint32_t offset = t_[cur_++].offset;
      left = binary("or", offset, std::move(left), parse_logical_and());
    }
    return left;
  }

  NodePtr parse_logical_and() {
    NodePtr left = parse_logical_not();
    while (is_identifier("and")) {
      const uint32_t offset = t_[cur_++].offset;
      left = binary("and", offset, std::move(left), parse_logical_not());
    }
    return left;
  }

  NodePtr parse_logical_not() {
    NodePtr right;
    while (is_identifier("not")) {
      DepthGuard guard(*this);
      const uint32_t offset = t_[cur_++].offset;
      auto node = make(NodeType::kUnary, offset);
      node->name = "not";
      node->a = parse_logical_not();
      right = std::move(node);
    }
    return right ? std::move(right) : parse_comparison();
  }

  NodePtr parse_comparison() {
    NodePtr left = parse_additive();
    while (true) {
      std::string op;
      const uint32_t offset = here();
      if (is_identifier({"not", "in"})) {
        op = "not in";
        cur_ += 2;
      } else if (is_identifier("in") || is(TokenType::kComparisonBinaryOperator)) {
        op = t_[cur_++].value;
      } else {
        break;
      }
      left = binary(std::move(op), offset, std::move(left), parse_additive());
    }
    return left;
  }

  NodePtr parse_additive() {
    NodePtr left = parse_multiplicative();
    while (is(TokenType::kAdditiveBinaryOperator)) {
      const Token& op = t_[cur_++];
      left = binary(op.value, op.offset, std::move(left), parse_multiplicative());
    }
    return left;
  }

  NodePtr parse_multiplicative() {
    NodePtr left = parse_power();
    while (is(TokenType::kMultiplicativeBinaryOperator)) {
      const Token& op = t_[cur_++];
      left = binary(op.value, op.offset, std::move(left), parse_power());
    }
    return left;
  }

  NodePtr parse_power() {
    NodePtr left = parse_test();
    while (is(TokenType::kExponentiationBinaryOperator)) {
      const Token& op = t_[cur_++];
      left = binary(op.value, op.offset, std::move(left), parse_test());
    }
    return left;
  }

  NodePtr parse_test() {
    NodePtr operand = parse_filter();
    while (is_identifier("is")) {
      const uint32_t offset = t_[cur_++].offset;
      const bool negate = is_identifier("not");
      if (negate) ++cur_;
      NodePtr test = parse_primary();
      if (test->type != NodeType::kIdentifier) error("Expected identifier for the test");
      auto node = make(NodeType::kTest, offset);
      node->a = std::move(operand);
      node->flag = negate;
      node->name = test->name;
      operand = std::move(node);
    }
    return operand;
  }

  NodePtr parse_filter() {
    NodePtr operand = parse_unary_sign();
    while (is(TokenType::kPipe)) {
      const uint32_t offset = t_[cur_++].offset;
      NodePtr filter = parse_primary();
      if (filter->type != NodeType::kIdentifier) error("Expected identifier for the filter");
      if (is(TokenType::kOpenParen)) filter = parse_call(std::move(filter));
      auto node = make(NodeType::kFilter, offset);
      node->a = std::move(operand);
      node->b = std::move(filter);
      operand = std::move(node);
    }
    return operand;
  }

  NodePtr parse_unary_sign() {
    if (cur_ < t_.size()) {
      const Token& tok = t_[cur_];
      if ((tok.type == TokenType::kUnaryOperator || tok.type == TokenType::kAdditiveBinaryOperator) &&
          (tok.value == "-" || tok.value == "+")) {
        DepthGuard guard(*this);
        ++cur_;
        auto node = make(NodeType::kUnary, tok.offset);
        node->name = tok.value;
        node->a = parse_unary_sign();
        return node;
      }
    }
    NodePtr member = parse_member(parse_primary());
    if (is(TokenType::kOpenParen)) return parse_call(std::move(member));
    return member;
  }

  NodePtr parse_call(NodePtr callee) {
    DepthGuard guard(*this);
    auto call = make(NodeType::kCall, callee->offset);
    call->a = std::move(callee);
    parse_args(ArgsMode::kCall, call->items);
    NodePtr expression = parse_member(std::move(call));
    if (is(TokenType::kOpenParen)) expression = parse_call(std::move(expression));
    return expression;
  }

  void parse_args(ArgsMode mode, std::vector<NodePtr>& args) {
    expect(TokenType::kOpenParen, "Expected opening parenthesis for arguments list");
    std::set<std::string> parameter_names;
    bool saw_keyword_or_default = false;
    bool saw_spread = false;
    while (!is(TokenType::kCloseParen)) {
      if (cur_ >= t_.size()) error("Unexpected end of template: missing )");
      const bool keyword_spread = is(TokenType::kExponentiationBinaryOperator);
      const bool positional_spread = is(TokenType::kMultiplicativeBinaryOperator) && t_[cur_].value == "*";
      if (mode == ArgsMode::kParameters && (keyword_spread || positional_spread))
        error("Argument unpacking is not allowed in parameter declarations");
      if (keyword_spread) {
        auto node = make(NodeType::kKeywordSpread, t_[cur_++].offset);
        node->a = parse_expression();
        args.push_back(std::move(node));
        if (is(TokenType::kComma)) ++cur_;
        if (!is(TokenType::kCloseParen))
          error("Expected closing parenthesis: `**` must be applied to the final argument");
        break;
      }
      NodePtr argument;
      if (positional_spread) {
        if (saw_spread) error("Only one `*` argument unpacking is allowed");
        saw_spread = true;
        argument = make(NodeType::kSpread, t_[cur_++].offset);
        argument->a = parse_expression();
      } else {
        argument = parse_expression();
        if (is(TokenType::kEquals)) {
          ++cur_;
          if (argument->type != NodeType::kIdentifier)
            error(mode == ArgsMode::kParameters ? "Expected identifier for parameter declaration"
                                                : "Expected identifier for keyword argument");
          auto kw = make(NodeType::kKeywordArgument, argument->offset);
          kw->name = argument->name;
          kw->a = parse_expression();
          argument = std::move(kw);
        }
        if (mode == ArgsMode::kParameters) {
          if (argument->type != NodeType::kIdentifier && argument->type != NodeType::kKeywordArgument)
            error("Expected identifier for parameter declaration");
          if (!parameter_names.insert(argument->name).second) error("Duplicate parameter name: " + argument->name);
        }
        if (argument->type == NodeType::kKeywordArgument) {
          saw_keyword_or_default = true;
        } else if (saw_keyword_or_default) {
          error(mode == ArgsMode::kCall ? "Positional arguments must come before keyword arguments"
                                        : "Non-default argument follows default argument");
        } else if (saw_spread) {
          error("Positional arguments must not follow `*` argument unpacking");
        }
      }
      args.push_back(std::move(argument));
      if (is(TokenType::kComma)) ++cur_;
    }
    expect(TokenType::kCloseParen, "Expected closing parenthesis for arguments list");
  }

  NodePtr parse_subscript() {
    const uint32_t offset = here();
    std::vector<NodePtr> slices;
    bool is_slice = false;
    while (!is(TokenType::kCloseSquareBracket)) {
      if (cur_ >= t_.size()) error("Unexpected end of template: missing ]");
      if (is(TokenType::kColon)) {
        slices.push_back(nullptr);
        ++cur_;
        is_slice = true;
      } else {
        slices.push_back(parse_expression());
        if (is(TokenType::kColon)) {
          ++cur_;
          is_slice = true;
        }
      }
    }
    if (slices.empty()) error("Expected at least one argument for member/slice expression");
    if (!is_slice) return std::move(slices[0]);
    if (slices.size() > 3) error("Expected 0-3 arguments for slice expression");
    auto node = make(NodeType::kSlice, offset);
    node->a = std::move(slices[0]);
    if (slices.size() > 1) node->b = std::move(slices[1]);
    if (slices.size() > 2) node->c = std::move(slices[2]);
    return node;
  }

  NodePtr parse_member(NodePtr object) {
    while (is(TokenType::kDot) || is(TokenType::kOpenSquareBracket)) {
      const Token& op = t_[cur_++];
      auto node = make(NodeType::kMember, object->offset);  // errors point at the whole expression
      node->flag = op.type == TokenType::kOpenSquareBracket;
      if (node->flag) {
        node->b = parse_subscript();
        expect(TokenType::kCloseSquareBracket, "Expected closing square bracket");
      } else {
        node->b = parse_primary();
        if (node->b->type != NodeType::kIdentifier && node->b->type != NodeType::kIntegerLiteral)
          error("Expected identifier or integer following dot operator");
      }
      node->a = std::move(object);
      object = std::move(node);
    }
    return object;
  }

  NodePtr parse_primary() {
    DepthGuard guard(*this);
    if (cur_ >= t_.size()) error("Unexpected end of template");
    const Token& tok = t_[cur_++];
    switch (tok.type) {
      case TokenType::kNumericLiteral: {
        const bool is_float = tok.value.find('.') != std::string::npos;
        auto node = make(is_float ? NodeType::kFloatLiteral : NodeType::kIntegerLiteral, tok.offset);
        node->number = std::strtod(tok.value.c_str(), nullptr);
        return node;
      }
      case TokenType::kStringLiteral: {
        auto node = make(NodeType::kStringLiteral, tok.offset);
        node->name = tok.value;
        while (is(TokenType::kStringLiteral)) node->name += t_[cur_++].value;
        return node;
      }
      case TokenType::kIdentifier: {
        auto node = make(NodeType::kIdentifier, tok.offset);
        node->name = tok.value;
        return node;
      }
      case TokenType::kOpenParen: {
        NodePtr expression = parse_expression_sequence(false);
        // The reference's message is a plain string, placeholder included.
        expect(TokenType::kCloseParen, "Expected closing parenthesis, got ${tokens[current].type} instead.");
        return expression;
      }
      case TokenType::kOpenSquareBracket: {
        auto node = make(NodeType::kArrayLiteral, tok.offset);
        while (!is(TokenType::kCloseSquareBracket)) {
          if (cur_ >= t_.size()) error("Unexpected end of template: missing ]");
          node->items.push_back(parse_expression());
          if (is(TokenType::kComma)) ++cur_;
        }
        ++cur_;
        return node;
      }
      case TokenType::kOpenCurlyBracket: {
        auto node = make(NodeType::kObjectLiteral, tok.offset);
        while (!is(TokenType::kCloseCurlyBracket)) {
          if (cur_ >= t_.size()) error("Unexpected end of template: missing }");
          node->items.push_back(parse_expression());
          expect(TokenType::kColon, "Expected colon between key and value in object literal");
          node->alternate.push_back(parse_expression());
          if (is(TokenType::kComma)) ++cur_;
        }
        ++cur_;
        return node;
      }
      default: error_at(cur_ - 1, std::string("Unexpected token: ") + token_type_name(tok.type));
    }
  }

  const std::vector<Token>& t_;
  uint32_t source_size_;
  size_t cur_ = 0;
  int depth_ = 0;
};

}  // namespace

NodePtr parse(const std::vector<Token>& tokens, uint32_t source_size) {
  return Parser(tokens, source_size).program();
}

}  // namespace kiln::jinja
