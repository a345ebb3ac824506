#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <utility>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_unicode.h"

namespace kiln::jinja {

const char* token_type_name(TokenType t) {
  switch (t) {
    case TokenType::kText: return "Text";
    case TokenType::kNumericLiteral: return "NumericLiteral";
    case TokenType::kStringLiteral: return "StringLiteral";
    case TokenType::kIdentifier: return "Identifier";
    case TokenType::kEquals: return "Equals";
    case TokenType::kOpenParen: return "OpenParen";
    case TokenType::kCloseParen: return "CloseParen";
    case TokenType::kOpenStatement: return "OpenStatement";
    case TokenType::kCloseStatement: return "CloseStatement";
    case TokenType::kOpenExpression: return "OpenExpression";
    case TokenType::kCloseExpression: return "CloseExpression";
    case TokenType::kOpenSquareBracket: return "OpenSquareBracket";
    case TokenType::kCloseSquareBracket: return "CloseSquareBracket";
    case TokenType::kOpenCurlyBracket: return "OpenCurlyBracket";
    case TokenType::kCloseCurlyBracket: return "CloseCurlyBracket";
    case TokenType::kComma: return "Comma";
    case TokenType::kDot: return "Dot";
    case TokenType::kColon: return "Colon";
    case TokenType::kPipe: return "Pipe";
    case TokenType::kCallOperator: return "CallOperator";
    case TokenType::kAdditiveBinaryOperator: return "AdditiveBinaryOperator";
    case TokenType::kMultiplicativeBinaryOperator: return "MultiplicativeBinaryOperator";
    case TokenType::kExponentiationBinaryOperator: return "ExponentiationBinaryOperator";
    case TokenType::kComparisonBinaryOperator: return "ComparisonBinaryOperator";
    case TokenType::kUnaryOperator: return "UnaryOperator";
    case TokenType::kComment: return "Comment";
  }
  return "?";
}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A JavaScript line terminator ends at text[i - 1] (what `^` matches after in /m mode).
bool after_line_terminator(std::string_view t, size_t i) {
  if (i == 0) return true;
  if (t[i - 1] == '\n' || t[i - 1] == '\r') return true;
  return i >= 3 && t.substr(i - 3, 2) == "\xE2\x80" && (t[i - 1] == '\xA8' || t[i - 1] == '\xA9');
}

// /^[ \t]*({[#%-])/gm -> "$1"
Preprocessed lstrip_blocks(const Preprocessed& in) {
  Preprocessed out;
  const std::string_view t = in.text;
  for (size_t i = 0; i < t.size();) {
    if (after_line_terminator(t, i)) {
      size_t j = i;
      while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
      if (j + 1 < t.size() && t[j] == '{' && (t[j + 1] == '#' || t[j + 1] == '%' || t[j + 1] == '-')) i = j;
    }
    out.text += t[i];
    out.origin.push_back(in.origin[i]);
    ++i;
  }
  out.origin.push_back(in.origin.back());
  return out;
}

// /([#%-]})\n/g -> "$1"
Preprocessed trim_blocks(const Preprocessed& in) {
  Preprocessed out;
  const std::string_view t = in.text;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '\n' && i >= 2 && t[i - 1] == '}' && (t[i - 2] == '#' || t[i - 2] == '%' || t[i - 2] == '-'))
      continue;
    out.text += t[i];
    out.origin.push_back(in.origin[i]);
  }
  out.origin.push_back(in.origin.back());
  return out;
}

// Matches {%-?\s*(?:end)?generation\s*-?%} at t[i]; returns its end, or 0.
size_t match_generation_tag(std::string_view t, size_t i, bool& lstrip, bool& rstrip) {
  if (t.substr(i, 2) != "{%") return 0;
  size_t j = i + 2;
  lstrip = j < t.size() && t[j] == '-';
  if (lstrip) ++j;
  j += js_whitespace_run(t, j);
  if (t.substr(j, 3) == "end" && t.substr(j + 3, 10) == "generation") j += 3;
  if (t.substr(j, 10) != "generation") return 0;
  j += 10;
  j += js_whitespace_run(t, j);
  rstrip = j < t.size() && t[j] == '-';
  if (rstrip) ++j;
  if (t.substr(j, 2) != "%}") return 0;
  return j + 2;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> (lstrip ? "" : before) + (rstrip ? "" : after)
Preprocessed strip_generation(const Preprocessed& in) {
  const std::string_view t = in.text;
  if (t.find("generation") == std::string_view::npos) return in;
  Preprocessed out;
  size_t copied = 0;  // t[0, copied) is in `out`; a match may not start before it
  const auto copy = [&](size_t from, size_t to) {
    out.text.append(t.substr(from, to - from));
    out.origin.insert(out.origin.end(), in.origin.begin() + from, in.origin.begin() + to);
  };
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '{') continue;
    bool lstrip = false, rstrip = false;
    const size_t tag_end = match_generation_tag(t, i, lstrip, rstrip);
    if (tag_end == 0) continue;
    // The leading whitespace run, back to the end of the previous match at most.
    size_t before = i;
    while (before > copied) {
      size_t start = before - 1;
      while (start > copied && (static_cast<unsigned char>(t[start]) >> 6) == 0x2) --start;
      size_t k = start;
      if (!is_js_whitespace(next_code_point(t, k))) break;
      before = start;
    }
    const size_t after_end = tag_end + js_whitespace_run(t, tag_end);
    copy(copied, before);
    if (!lstrip) copy(before, i);
    if (!rstrip) copy(tag_end, after_end);
    copied = after_end;
    i = after_end - 1;
  }
  copy(copied, t.size());
  out.origin.push_back(in.origin.back());
  return out;
}

const std::array<std::pair<std::string_view, TokenType>, 29> kOrderedMappingTable = {{
    {"{%", TokenType::kOpenStatement},
    {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression},
    {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},
    {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurlyBracket},
    {"}", TokenType::kCloseCurlyBracket},
    {"[", TokenType::kOpenSquareBracket},
    {"]", TokenType::kCloseSquareBracket},
    {",", TokenType::kComma},
    {".", TokenType::kDot},
    {":", TokenType::kColon},
    {"|", TokenType::kPipe},
    {"<=", TokenType::kComparisonBinaryOperator},
    {">=", TokenType::kComparisonBinaryOperator},
    {"==", TokenType::kComparisonBinaryOperator},
    {"!=", TokenType::kComparisonBinaryOperator},
    {"<", TokenType::kComparisonBinaryOperator},
    {">", TokenType::kComparisonBinaryOperator},
    {"+", TokenType::kAdditiveBinaryOperator},
    {"-", TokenType::kAdditiveBinaryOperator},
    {"~", TokenType::kAdditiveBinaryOperator},
    {"**", TokenType::kExponentiationBinaryOperator},  // before "*"
    {"*", TokenType::kMultiplicativeBinaryOperator},
    {"//", TokenType::kMultiplicativeBinaryOperator},  // before "/"
    {"/", TokenType::kMultiplicativeBinaryOperator},
    {"%", TokenType::kMultiplicativeBinaryOperator},
    {"=", TokenType::kEquals},
}};

char escape_character(char c, bool& ok) {
  ok = true;
  switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'v': return '\v';
    case '\'': return '\'';
    case '"': return '"';
    case '\\': return '\\';
    default: ok = false; return 0;
  }
}

class Lexer {
 public:
  explicit Lexer(const Preprocessed& src) : src_(src.text), origin_(src.origin) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) step();
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& message) const {
    throw JinjaError(ErrorKind::kSyntax, message, origin_[std::min(pos_, src_.size())]);
  }
  char at(size_t i) const { return i < src_.size() ? src_[i] : '\0'; }
  bool starts(std::string_view s) const { return src_.substr(pos_, s.size()) == s; }
  void push(TokenType type, std::string value, size_t start) {
    tokens_.push_back({type, std::move(value), origin_[start]});
  }
  bool last_is(TokenType t) const { return !tokens_.empty() && tokens_.back().type == t; }

  // The reference's consumeWhile: string escapes are decoded, and reaching the end of
  // the source inside the run is an error.
  template <typename Pred>
  std::string consume_while(Pred pred) {
    std::string out;
    while (pos_ < src_.size() && pred(pos_)) {
      if (src_[pos_] == '\\') {
        ++pos_;
        if (pos_ >= src_.size()) error("Unexpected end of input");
        const char escaped = src_[pos_++];
        if (escaped == 'x' || escaped == 'u') {
          const size_t length = escaped == 'x' ? 2 : 4;
          const std::string_view hex = src_.substr(pos_, length);
          bool valid = hex.size() == length;
          for (char h : hex) valid = valid && std::isxdigit(static_cast<unsigned char>(h));
          if (!valid)
            error("Invalid hexadecimal escape sequence: \\" + std::string(1, escaped) + std::string(hex));
          uint32_t unit = uint32_t(std::stoul(std::string(hex), nullptr, 16));
          pos_ += length;
          // A \uD8xx\uDCxx pair is one code point.
          if (unit >= 0xd800 && unit <= 0xdbff && src_.substr(pos_, 2) == "\\u") {
            const std::string_view low_hex = src_.substr(pos_ + 2, 4);
            bool low_ok = low_hex.size() == 4;
            for (char h : low_hex) low_ok = low_ok && std::isxdigit(static_cast<unsigned char>(h));
            const uint32_t low = low_ok ? uint32_t(std::stoul(std::string(low_hex), nullptr, 16)) : 0;
            if (low >= 0xdc00 && low <= 0xdfff) {
              unit = 0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00);
              pos_ += 6;
            }
          }
          utf8_append(out, unit);  // a lone surrogate stays one (WTF-8, see jinja_unicode.h)
          continue;
        }
        bool ok = false;
        const char unescaped = escape_character(escaped, ok);
        if (!ok) error(std::string("Unexpected escaped character: ") + escaped);
        out += unescaped;
        continue;
      }
      size_t next = pos_;
      next_code_point(src_, next);
      out.append(src_.substr(pos_, next - pos_));
      pos_ = next;
      if (pos_ >= src_.size()) error("Unexpected end of input");
    }
    if (pos_ >= src_.size() && !out.empty()) error("Unexpected end of input");
    return out;
  }

  bool whitespace_at(size_t i) const {
    size_t k = i;
    return is_js_whitespace(next_code_point(src_, k));
  }

  void strip_trailing_whitespace() {
    if (!last_is(TokenType::kText)) return;
    Token& last = tokens_.back();
    last.value = std::string(js_trim_end(last.value));
    if (last.value.empty()) tokens_.pop_back();
  }

  void skip_leading_whitespace() { pos_ += js_whitespace_run(src_, pos_); }

  void step() {
    const bool after_tag = tokens_.empty() || last_is(TokenType::kCloseStatement) ||
                           last_is(TokenType::kCloseExpression) || last_is(TokenType::kComment);
    if (after_tag) {
      const size_t start = pos_;
      while (pos_ < src_.size() &&
             !(src_[pos_] == '{' && (at(pos_ + 1) == '%' || at(pos_ + 1) == '{' || at(pos_ + 1) == '#')))
        ++pos_;
      if (pos_ > start) {
        push(TokenType::kText, std::string(src_.substr(start, pos_ - start)), start);
        return;
      }
    }
    if (starts("{#")) return comment();
    if (starts("{%-")) {
      strip_trailing_whitespace();
      push(TokenType::kOpenStatement, "{%", pos_);
      pos_ += 3;
      return;
    }
    if (starts("{{-")) {
      strip_trailing_whitespace();
      push(TokenType::kOpenExpression, "{{", pos_);
      curly_depth_ = 0;
      pos_ += 3;
      return;
    }
    consume_while([&](size_t i) { return whitespace_at(i); });
    if (starts("-%}")) {
      push(TokenType::kCloseStatement, "%}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      return;
    }
    if (starts("-}}")) {
      push(TokenType::kCloseExpression, "}}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      return;
    }
    const char c = src_[pos_];
    if (c == '-' || c == '+') {
      if (tokens_.empty() || last_is(TokenType::kText)) error(std::string("Unexpected character: ") + c);
      switch (tokens_.back().type) {
        case TokenType::kIdentifier:
        case TokenType::kNumericLiteral:
        case TokenType::kStringLiteral:
        case TokenType::kCloseParen:
        case TokenType::kCloseSquareBracket: break;  // a binary operator
        default: {
          const size_t start = pos_++;
          std::string num = consume_while([&](size_t i) { return is_digit(src_[i]); });
          if (!num.empty() && at(pos_) == '.' && is_digit(at(pos_ + 1))) {
            ++pos_;
            num += "." + consume_while([&](size_t i) { return is_digit(src_[i]); });
          }
          push(num.empty() ? TokenType::kUnaryOperator : TokenType::kNumericLiteral, c + num, start);
          return;
        }
      }
    }
    for (const auto& [seq, type] : kOrderedMappingTable) {
      if (seq == "}}" && curly_depth_ > 0) continue;
      if (!starts(seq)) continue;
      push(type, std::string(seq), pos_);
      if (type == TokenType::kOpenExpression) curly_depth_ = 0;
      if (type == TokenType::kOpenCurlyBracket) ++curly_depth_;
      if (type == TokenType::kCloseCurlyBracket) --curly_depth_;
      pos_ += seq.size();
      return;
    }
    if (c == '\'' || c == '"') {
      const size_t start = pos_++;
      std::string str = consume_while([&](size_t i) { return src_[i] != c; });
      if (pos_ >= src_.size()) error("Unexpected end of input");
      push(TokenType::kStringLiteral, std::move(str), start);
      ++pos_;
      return;
    }
    if (is_digit(c)) {
      const size_t start = pos_;
      std::string num = consume_while([&](size_t i) { return is_digit(src_[i]); });
      if (!last_is(TokenType::kDot) && at(pos_) == '.' && is_digit(at(pos_ + 1))) {
        ++pos_;
        num += "." + consume_while([&](size_t i) { return is_digit(src_[i]); });
      }
      push(TokenType::kNumericLiteral, std::move(num), start);
      return;
    }
    if (is_ascii_word(static_cast<unsigned char>(c))) {
      const size_t start = pos_;
      std::string word =
          consume_while([&](size_t i) { return is_ascii_word(static_cast<unsigned char>(src_[i])); });
      push(TokenType::kIdentifier, std::move(word), start);
      return;
    }
    size_t next = pos_;
    next_code_point(src_, next);
    error("Unexpected character: " + std::string(src_.substr(pos_, next - pos_)));
  }

  void comment() {
    const size_t start = pos_;
    pos_ += 2;
    const bool strip_before = at(pos_) == '-';
    if (strip_before) ++pos_;
    std::string text;
    while (at(pos_) != '#' || at(pos_ + 1) != '}') {
      if (pos_ + 2 >= src_.size()) error("Missing end of comment tag");
      text += src_[pos_++];
    }
    const bool strip_after = !text.empty() && text.back() == '-';
    if (strip_after) text.pop_back();
    if (strip_before) strip_trailing_whitespace();
    push(TokenType::kComment, std::move(text), start);
    pos_ += 2;
    if (strip_after) skip_leading_whitespace();
  }

  std::string_view src_;
  const std::vector<uint32_t>& origin_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

Preprocessed preprocess(std::string_view source) {
  Preprocessed p;
  p.text = std::string(source);
  if (!p.text.empty() && p.text.back() == '\n') p.text.pop_back();
  p.origin.resize(p.text.size() + 1);
  for (size_t i = 0; i <= p.text.size(); ++i) p.origin[i] = uint32_t(i);
  return strip_generation(trim_blocks(lstrip_blocks(p)));
}

std::vector<Token> tokenize(std::string_view source) {
  const Preprocessed p = preprocess(source);
  return Lexer(p).run();
}

}  // namespace kiln::jinja
