// Patterns of tokenizer.json ("Regex" or "String") compiled to PCRE2 (UTF + UCP, JIT).
// The Rust tokenizers run Regex patterns on Oniguruma; onig_to_pcre2 rewrites the few
// escapes whose meaning differs (per Oniguruma's doc/RE) so both accept the same characters.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln::tokenizer::hf {

// Per-call PCRE2 match state. Not shared between threads; create one per encode call.
class MatchScratch {
 public:
  MatchScratch() = default;
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
  pcre2_match_data* data() {  // allocated on first use: literal patterns never need it
    if (md_ == nullptr) md_ = pcre2_match_data_create(1, nullptr);
    return md_;
  }

 private:
  pcre2_match_data* md_ = nullptr;
};

// Oniguruma (Ruby syntax, as the Rust tokenizers compile it) -> PCRE2:
//   \s, \S  -> Unicode White_Space (PCRE2's UCP \s also takes U+180E, Oniguruma does not)
//   \h, \H  -> hex digit (PCRE2's \h is horizontal space)
//   \w, \W  -> Letter|Mark|Number|Connector_Punctuation (PCRE2: L, N and _ only)
// Everything else (\p{..}, (?i:..), lookaround, {m,n}) means the same in both.
std::string onig_to_pcre2(std::string_view pattern);

class Pattern {
 public:
  // An Oniguruma regex from tokenizer.json; a clear Status if PCRE2 cannot compile it.
  static Result<Pattern> regex(std::string_view onig_pattern);
  // A literal string (an empty literal never matches, as in the Rust tokenizers).
  static Pattern literal(std::string text);

  // The first match at or after `from`: sets [*begin, *end) and returns true.
  bool find(std::string_view subject, size_t from, MatchScratch& scratch, size_t* begin,
            size_t* end) const;

  // Calls f(begin, end) for each match left to right with Oniguruma's find_iter rule:
  // an empty match right where the previous match ended is skipped by one character.
  template <typename F>
  void for_each_match(std::string_view subject, MatchScratch& scratch, F&& f) const {
    size_t from = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (from <= subject.size()) {
      size_t b = 0, e = 0;
      if (!find(subject, from, scratch, &b, &e)) return;
      if (b == e && have_last && last_match_end == e) {
        from += from < subject.size() ? char_len_at(subject, from) : 1;
        continue;
      }
      from = e;
      have_last = true;
      last_match_end = e;
      f(b, e);
    }
  }

  bool is_literal() const { return code_ == nullptr; }
  const std::string& source() const { return source_; }

 private:
  static size_t char_len_at(std::string_view s, size_t i);

  std::shared_ptr<pcre2_code> code_;  // null for a literal
  bool jit_ = false;
  std::string source_;  // the literal, or the original regex (for messages)
};

}  // namespace kiln::tokenizer::hf
