#include "grammar/regex.h"

#include <algorithm>
#include <cstdio>

#include "core/utf8.h"

namespace kiln::grammar {
namespace {

constexpr uint32_t kMaxCount = 10000;

// A set of characters: ASCII ones as bytes, plus (optionally) every non-ASCII character.
struct CharSet {
  ByteSet ascii;  // bytes < 0x80 only
  bool non_ascii = false;
};

ByteSet ascii_only(const ByteSet& s) {
  ByteSet r = s;
  r.bits[2] = r.bits[3] = 0;
  return r;
}

class Parser {
 public:
  Parser(Grammar& g, std::string_view p, RegexMode mode) : g_(g), p_(p), mode_(mode) {}

  Result<Sequence> run() {
    std::vector<Sequence> branches;
    for (;;) {
      // Anchors: only at the start / end of a top-level branch.
      const bool anchored_start = eat('^');
      KILN_ASSIGN_OR_RETURN(Sequence seq, concat(/*top=*/true));
      const bool anchored_end = eat('$');
      if (mode_ == RegexMode::kJsonStringSearch) {
        if (!anchored_start) seq.insert(seq.begin(), any_chars());
        if (!anchored_end) seq.push_back(any_chars());
      }
      branches.push_back(std::move(seq));
      if (at_end()) break;
      if (!eat('|')) return error(peek() == ')' ? "unbalanced ')'" : "unexpected character");
    }
    if (g_.too_large()) return too_large();
    if (branches.size() == 1) return std::move(branches[0]);
    return Sequence{g_.alternation("regex_alt", std::move(branches))};
  }

 private:
  bool at_end() const { return i_ >= p_.size(); }
  char peek() const { return at_end() ? '\0' : p_[i_]; }
  bool eat(char c) {
    if (peek() != c || at_end()) return false;
    ++i_;
    return true;
  }
  Status error(const std::string& what) const {
    // A long pattern is quoted by its first 80 bytes (the error goes back in a response).
    size_t cut = std::min<size_t>(p_.size(), 80);
    while (cut < p_.size() && cut > 0 && (uint8_t(p_[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    const std::string quoted = cut == p_.size() ? std::string(p_) : std::string(p_.substr(0, cut)) + "...";
    return invalid_argument("regex '" + quoted + "' at offset " + std::to_string(i_) + ": " + what);
  }
  Status too_large() const { return error(too_large_message()); }

  Result<Sequence> alternation() {
    std::vector<Sequence> branches;
    for (;;) {
      KILN_ASSIGN_OR_RETURN(Sequence seq, concat(false));
      branches.push_back(std::move(seq));
      if (!eat('|')) break;
    }
    if (branches.size() == 1) return std::move(branches[0]);
    return Sequence{g_.alternation("regex_alt", std::move(branches))};
  }

  Result<Sequence> concat(bool top) {
    Sequence out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && top && (i_ + 1 == p_.size() || p_[i_ + 1] == '|')) break;
      if (g_.too_large()) return too_large();
      KILN_ASSIGN_OR_RETURN(Sequence atom_seq, atom());
      KILN_ASSIGN_OR_RETURN(Sequence q, quantified(std::move(atom_seq)));
      out.insert(out.end(), q.begin(), q.end());
    }
    return out;
  }

  Result<Sequence> quantified(Sequence a) {
    for (;;) {
      uint32_t lo = 0;
      std::optional<uint32_t> hi;
      if (eat('*')) {
      } else if (eat('+')) {
        lo = 1;
      } else if (eat('?')) {
        hi = 1;
      } else if (peek() == '{' && parse_count(lo, hi)) {
        if (bad_count_) return error("bad or too large repetition count (at most 10000)");
      } else {
        return a;
      }
      if (eat('+')) return error("possessive quantifiers are not supported");
      eat('?');  // lazy: same language
      a = {g_.repeat("regex_rep", std::move(a), lo, hi)};
    }
  }

  // {m} {m,} {m,n}; false (nothing consumed) if the brace does not start a count.
  bool parse_count(uint32_t& lo, std::optional<uint32_t>& hi) {
    size_t j = i_ + 1;
    auto number = [&](uint64_t& v) {
      size_t start = j;
      v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9' && v <= kMaxCount * 10) v = v * 10 + (p_[j++] - '0');
      return j > start;
    };
    uint64_t a = 0, b = 0;
    if (!number(a)) return false;
    bool has_b = false, comma = false;
    if (j < p_.size() && p_[j] == ',') {
      comma = true;
      ++j;
      has_b = number(b);
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    i_ = j + 1;
    // Over-large or reversed counts: bad_count_, reported by the caller.
    lo = static_cast<uint32_t>(std::min<uint64_t>(a, kMaxCount + 1));
    if (!comma) hi = lo;
    else if (has_b) hi = static_cast<uint32_t>(std::min<uint64_t>(b, kMaxCount + 1));
    bad_count_ = lo > kMaxCount || (hi && (*hi > kMaxCount || *hi < lo));
    return true;
  }

  Result<Sequence> atom() {
    const char c = p_[i_];
    if (c == '(') {
      if (depth_ == kMaxGroupDepth) return error("groups nested deeper than " + std::to_string(kMaxGroupDepth));
      ++i_;
      if (eat('?')) {
        if (eat(':')) {
        } else if (peek() == '=' || peek() == '!' ||
                   (peek() == '<' && i_ + 1 < p_.size() && (p_[i_ + 1] == '=' || p_[i_ + 1] == '!'))) {
          return error("lookaround is not supported");
        } else if (eat('<') || (eat('P') && eat('<'))) {
          while (!at_end() && peek() != '>') ++i_;
          if (!eat('>')) return error("unterminated group name");
        } else {
          return error("unsupported group syntax '(?'");
        }
      }
      ++depth_;
      KILN_ASSIGN_OR_RETURN(Sequence inner, alternation());
      --depth_;
      if (!eat(')')) return error("missing ')'");
      return Sequence{g_.alternation("regex_group", {std::move(inner)})};
    }
    if (c == '^' || c == '$') return error("anchors are supported only at the ends of the pattern");
    if (c == '*' || c == '+' || c == '?') return error("quantifier without anything to repeat");
    if (c == '.') {
      ++i_;
      CharSet s{.ascii = ByteSet::range(0, 0x7F).remove('\n'), .non_ascii = true};
      return chars(s);
    }
    if (c == '[') return char_class();
    if (c == '\\') {
      ++i_;
      KILN_ASSIGN_OR_RETURN(std::optional<CharSet> s, escape());
      if (s) return chars(*s);
      return utf8_literal(code_point_);
    }
    // A literal: one ASCII byte, or a whole UTF-8 sequence.
    const unsigned char b = static_cast<unsigned char>(c);
    if (b < 0x80) {
      ++i_;
      return chars(CharSet{.ascii = ByteSet::of(b)});
    }
    size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    if (i_ + len > p_.size()) return error("truncated UTF-8");
    Sequence seq = Grammar::literal(p_.substr(i_, len));
    i_ += len;
    return seq;
  }

  // After a backslash. A character-set escape returns the set; a single code point
  // (\uHHHH above ASCII) is left in code_point_ and returns nullopt.
  Result<std::optional<CharSet>> escape() {
    if (at_end()) return error("trailing backslash");
    const char c = p_[i_++];
    const ByteSet digit = ByteSet::range('0', '9');
    const ByteSet word = ByteSet::range('a', 'z').add('A', 'Z').add('0', '9').add('_', '_');
    const ByteSet space = ByteSet::of(' ').add('\t', '\r');  // \t \n \v \f \r
    auto negate = [](const ByteSet& s) { return CharSet{.ascii = ascii_only(s.complement()), .non_ascii = true}; };
    switch (c) {
      case 'd': return std::optional<CharSet>(CharSet{.ascii = digit});
      case 'D': return std::optional<CharSet>(negate(digit));
      case 'w': return std::optional<CharSet>(CharSet{.ascii = word});
      case 'W': return std::optional<CharSet>(negate(word));
      case 's': return std::optional<CharSet>(CharSet{.ascii = space});
      case 'S': return std::optional<CharSet>(negate(space));
      case 'n': return one('\n');
      case 't': return one('\t');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case '0': return one('\0');
      case 'b': case 'B': return error("word boundaries (\\b, \\B) are not supported");
      case 'k': return error("backreferences are not supported");
      case 'x': case 'u': {
        const size_t n = c == 'x' ? 2 : 4;
        if (i_ + n > p_.size()) return error("truncated \\" + std::string(1, c) + " escape");
        unsigned v = 0;
        for (size_t j = 0; j < n; ++j) {
          const char h = p_[i_++];
          const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (d < 0) return error("bad hex digit");
          v = v * 16 + d;
        }
        if (v < 0x80) return one(static_cast<char>(v));
        if (v >= 0xD800 && v <= 0xDFFF) return error("surrogate code point");
        code_point_ = v;
        return std::optional<CharSet>{};
      }
      default: break;
    }
    if (c >= '1' && c <= '9') return error("backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return error(std::string("unknown escape \\") + c);
    if (static_cast<unsigned char>(c) >= 0x80) return error("escaped non-ASCII character");
    return one(c);  // escaped punctuation is itself
  }
  static Result<std::optional<CharSet>> one(char c) {
    return std::optional<CharSet>(CharSet{.ascii = ByteSet::of(static_cast<uint8_t>(c))});
  }

  Result<Sequence> char_class() {
    ++i_;  // '['
    const bool negated = eat('^');
    CharSet s;
    bool first = true;
    while (!at_end() && (peek() != ']' || first)) {
      first = false;
      KILN_ASSIGN_OR_RETURN(std::optional<CharSet> lo, class_char());
      if (!lo) continue;
      // A range a-b: both ends single ASCII characters.
      if (peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        KILN_ASSIGN_OR_RETURN(std::optional<CharSet> hi, class_char());
        if (!hi || lo->ascii.single() < 0 || hi->ascii.single() < 0 || lo->non_ascii || hi->non_ascii)
          return error("bad range in class");
        const int a = lo->ascii.single(), b = hi->ascii.single();
        if (a > b) return error("reversed range in class");
        s.ascii.add(a, b);
        continue;
      }
      s.ascii.add(lo->ascii);
      s.non_ascii |= lo->non_ascii;
    }
    if (!eat(']')) return error("missing ']'");
    if (negated) s = CharSet{.ascii = ascii_only(s.ascii.complement()), .non_ascii = !s.non_ascii};
    return chars(s);
  }

  Result<std::optional<CharSet>> class_char() {
    const unsigned char c = static_cast<unsigned char>(p_[i_]);
    if (c >= 0x80) return error("non-ASCII characters in classes are not supported");
    ++i_;
    if (c == '[' && peek() == ':') return error("POSIX classes are not supported");
    if (c != '\\') return std::optional<CharSet>(CharSet{.ascii = ByteSet::of(c)});
    if (peek() == 'b') {  // backspace inside a class
      ++i_;
      return one('\b');
    }
    KILN_ASSIGN_OR_RETURN(std::optional<CharSet> e, escape());
    if (!e) return error("non-ASCII characters in classes are not supported");
    return e;
  }

  Result<Sequence> utf8_literal(uint32_t cp) {
    std::string bytes;
    utf8_append(bytes, cp);
    return Grammar::literal(bytes);
  }

  // A character set as grammar: raw bytes, escaped forms in JSON mode, and the UTF-8
  // multi-byte encodings when non-ASCII characters are in the set.
  Result<Sequence> chars(const CharSet& s) {
    std::vector<Sequence> alts;
    ByteSet raw = s.ascii;
    if (mode_ == RegexMode::kJsonStringSearch) {
      raw = ByteSet{};
      for (unsigned b = 0; b < 0x80; ++b) {
        if (!s.ascii.has(b)) continue;
        if (b >= 0x20 && b != '"' && b != '\\') {
          raw.add(b, b);
          continue;
        }
        alts.push_back(Grammar::literal(json_escape(b)));
      }
    }
    if (!raw.empty()) alts.insert(alts.begin(), Sequence{Element::byte_set(raw)});
    if (s.non_ascii)
      for (Sequence& mb : Grammar::utf8_multibyte()) alts.push_back(std::move(mb));
    if (alts.empty()) return error("empty character class");
    if (alts.size() == 1) return std::move(alts[0]);
    return Sequence{g_.alternation("regex_chars", std::move(alts))};
  }

  static std::string json_escape(unsigned b) {
    switch (b) {
      case '"': return "\\\"";
      case '\\': return "\\\\";
      case '\n': return "\\n";
      case '\t': return "\\t";
      case '\r': return "\\r";
      case '\b': return "\\b";
      case '\f': return "\\f";
      default: break;
    }
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", b);
    return buf;
  }

  // Any JSON string content (the unanchored ends of a search pattern).
  Element any_chars() {
    if (!any_) {
      Sequence s = chars(CharSet{.ascii = ByteSet::range(0, 0x7F), .non_ascii = true}).value();
      any_ = g_.star("regex_any", std::move(s));
    }
    return *any_;
  }

  Grammar& g_;
  std::string_view p_;
  RegexMode mode_;
  size_t i_ = 0;
  uint32_t code_point_ = 0;
  bool bad_count_ = false;
  int depth_ = 0;  // groups open at i_
  std::optional<Element> any_;
};

}  // namespace

Result<Sequence> regex_to_sequence(Grammar& g, std::string_view pattern, RegexMode mode) {
  return Parser(g, pattern, mode).run();
}

Result<Grammar> regex_to_grammar(std::string_view pattern) {
  Grammar g;
  KILN_ASSIGN_OR_RETURN(Sequence s, regex_to_sequence(g, pattern, RegexMode::kFullMatch));
  g.set_start(g.add_rule("regex", {std::move(s)}));
  return g;
}

}  // namespace kiln::grammar
