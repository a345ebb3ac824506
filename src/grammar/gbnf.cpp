#include "grammar/gbnf.h"

#include <map>
#include <string>

#include "core/utf8.h"
#include "grammar/regex.h"

namespace kiln::grammar {
namespace {

constexpr uint32_t kMaxCount = 10000;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view text) : t_(text) {}

  Result<Grammar> run() {
    for (;;) {
      skip(/*newlines=*/true);
      if (at_end()) break;
      const size_t at = i_;
      const std::string name = read_name();
      if (name.empty()) return error("expected a rule name");
      skip(false);
      if (!eat("::=")) return error("expected '::=' after the rule name '" + name + "'");
      skip(/*newlines=*/true);  // the body may start on the next line
      const uint32_t rule = rule_id(name, at);
      if (!defined_.emplace(name, at).second) return error_at(at, "rule '" + name + "' is defined twice");
      KILN_ASSIGN_OR_RETURN(std::vector<Sequence> alts, alternatives(/*depth=*/0));
      g_.set_alternatives(rule, std::move(alts));
      skip(false);
      if (!at_end() && peek() != '\n') return error("unexpected character");
    }
    for (const auto& [name, at] : used_)
      if (!defined_.count(name)) return error_at(at, "rule '" + name + "' is used but never defined");
    auto root = ids_.find("root");
    if (root == ids_.end() || !defined_.count("root")) return invalid_argument("GBNF grammar: no 'root' rule");
    g_.set_start(root->second);
    KILN_RETURN_IF_ERROR(g_.validate());
    return std::move(g_);
  }

 private:
  bool at_end() const { return i_ >= t_.size(); }
  char peek(size_t k = 0) const { return i_ + k < t_.size() ? t_[i_ + k] : '\0'; }
  bool eat(std::string_view s) {
    if (t_.substr(i_, s.size()) != s) return false;
    i_ += s.size();
    return true;
  }

  // Spaces, tabs and comments; newlines too where `newlines`.
  void skip(bool newlines) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++i_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  // At a newline that ends a rule unless the next non-blank line starts with '|': consumes
  // up to that '|' (not included) and returns true when it does.
  bool continues_on_next_line() {
    const size_t save = i_;
    skip(true);
    if (peek() == '|') return true;
    i_ = save;
    return false;
  }

  std::string read_name() {
    const size_t b = i_;
    while (!at_end() && is_name_char(peek())) ++i_;
    return std::string(t_.substr(b, i_ - b));
  }

  uint32_t rule_id(const std::string& name, size_t at) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    used_.emplace(name, at);
    const uint32_t id = g_.add_rule(name);
    ids_.emplace(name, id);
    return id;
  }

  std::string position(size_t at) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < t_.size(); ++k) {
      if (t_[k] == '\n') ++line, col = 1;
      else ++col;
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
  }
  Status error_at(size_t at, const std::string& what) const {
    return invalid_argument("GBNF grammar at " + position(at) + ": " + what);
  }
  Status error(const std::string& what) const { return error_at(i_, what); }

  Result<std::vector<Sequence>> alternatives(int depth) {
    std::vector<Sequence> alts;
    for (;;) {
      KILN_ASSIGN_OR_RETURN(Sequence seq, sequence(depth));
      alts.push_back(std::move(seq));
      skip(depth > 0);
      if (peek() == '\n' && depth == 0 && continues_on_next_line()) {}
      if (!eat("|")) break;
      skip(true);  // an alternative may start on the next line
    }
    return alts;
  }

  Result<Sequence> sequence(int depth) {
    Sequence seq;
    for (;;) {
      skip(depth > 0);
      const char c = peek();
      if (at_end() || c == '|' || c == ')' || c == '\n') break;
      if (g_.too_large()) return error(too_large_message());
      KILN_ASSIGN_OR_RETURN(Sequence item, primary(depth));
      KILN_ASSIGN_OR_RETURN(item, postfix(std::move(item)));
      seq.insert(seq.end(), item.begin(), item.end());
    }
    return seq;
  }

  Result<Sequence> primary(int depth) {
    const size_t at = i_;
    const char c = peek();
    if (c == '"') {
      ++i_;
      std::string bytes;
      for (;;) {
        if (at_end() || peek() == '\n') return error_at(at, "unterminated string");
        char d = t_[i_++];
        if (d == '"') break;
        if (d != '\\') {
          bytes += d;
          continue;
        }
        KILN_RETURN_IF_ERROR(escape(bytes));
      }
      return Grammar::literal(bytes);
    }
    if (c == '[') {
      size_t e = i_ + 1;
      if (e < t_.size() && t_[e] == '^') ++e;
      if (e < t_.size() && t_[e] == ']') ++e;  // a leading ']' is a member
      while (e < t_.size() && t_[e] != ']' && t_[e] != '\n') e += t_[e] == '\\' ? 2 : 1;
      if (e >= t_.size() || t_[e] != ']') return error("unterminated character class");
      const std::string_view cls = t_.substr(i_, e + 1 - i_);
      i_ = e + 1;
      Result<Sequence> s = regex_to_sequence(g_, cls, RegexMode::kFullMatch);
      if (!s.ok()) return error_at(at, "character class " + std::string(cls) + ": " + s.status().message());
      return s;
    }
    if (c == '.') {
      ++i_;
      return regex_to_sequence(g_, "(?:.|\\n)", RegexMode::kFullMatch);
    }
    if (c == '(') {
      if (depth == kMaxGroupDepth) return error("groups nested deeper than " + std::to_string(kMaxGroupDepth));
      ++i_;
      KILN_ASSIGN_OR_RETURN(std::vector<Sequence> alts, alternatives(depth + 1));
      skip(true);
      if (!eat(")")) return error_at(at, "unbalanced '('");
      if (alts.size() == 1) return std::move(alts[0]);
      return Sequence{g_.alternation("group", std::move(alts))};
    }
    if (is_name_char(c)) {
      const std::string name = read_name();
      return Sequence{Element::ref(rule_id(name, at))};
    }
    return error(std::string("unexpected character '") + c + "'");
  }

  Status escape(std::string& out) {
    if (at_end()) return error("unterminated escape");
    const char e = t_[i_++];
    switch (e) {
      case 'n': out += '\n'; return Status::Ok();
      case 'r': out += '\r'; return Status::Ok();
      case 't': out += '\t'; return Status::Ok();
      case '\\': case '"': case '[': case ']': case '\'': out += e; return Status::Ok();
      case 'x': case 'u': case 'U': {
        const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          const char h = peek();
          const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (v < 0) return error("bad \\" + std::string(1, e) + " escape");
          cp = cp * 16 + uint32_t(v);
          ++i_;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return error("escape outside Unicode scalar values");
        if (e == 'x') out += char(cp);  // a byte
        else utf8_append(out, cp);
        return Status::Ok();
      }
      default: return error(std::string("unknown escape \\") + e);
    }
  }

  Result<Sequence> postfix(Sequence item) {
    for (;;) {
      const char c = peek();
      if (c == '*') {
        ++i_;
        item = {g_.star("star", std::move(item))};
      } else if (c == '+') {
        ++i_;
        item = {g_.plus("plus", std::move(item))};
      } else if (c == '?') {
        ++i_;
        item = {g_.optional("opt", std::move(item))};
      } else if (c == '{') {
        const size_t at = i_++;
        KILN_ASSIGN_OR_RETURN(uint32_t lo, number());
        std::optional<uint32_t> hi = lo;
        if (eat(",")) {
          hi.reset();
          if (peek() != '}') {
            KILN_ASSIGN_OR_RETURN(uint32_t h, number());
            hi = h;
          }
        }
        if (!eat("}")) return error_at(at, "expected '}'");
        if (hi && *hi < lo) return error_at(at, "{m,n} with n < m");
        item = {g_.repeat("count", std::move(item), lo, hi)};
      } else {
        return item;
      }
    }
  }

  Result<uint32_t> number() {
    skip(false);
    const size_t b = i_;
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9' && v <= kMaxCount) v = v * 10 + uint64_t(t_[i_++] - '0');
    if (i_ == b) return error("expected a number");
    if (v > kMaxCount) return error("a count above " + std::to_string(kMaxCount));
    skip(false);
    return uint32_t(v);
  }

  std::string_view t_;
  size_t i_ = 0;
  Grammar g_;
  std::map<std::string, uint32_t> ids_;
  std::map<std::string, size_t> used_, defined_;  // name -> where first used / defined
};

}  // namespace

Result<Grammar> gbnf_to_grammar(std::string_view text) { return Parser(text).run(); }

}  // namespace kiln::grammar
