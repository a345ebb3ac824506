#include "tokenizer/regex.h"

#include <atomic>

#include "core/log.h"
#include "tokenizer/unicode.h"

namespace kiln::tokenizer::hf {
namespace {

// White_Space without the class brackets: usable inside or outside a character class.
constexpr std::string_view kSpaceSet = "\\t-\\r\\x{85}\\p{Z}";
constexpr std::string_view kWordSet = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr std::string_view kHexSet = "0-9a-fA-F";

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      std::string_view set;
      bool negated = false;
      switch (e) {
        case 's': set = kSpaceSet; break;
        case 'S': set = kSpaceSet; negated = true; break;
        case 'w': set = kWordSet; break;
        case 'W': set = kWordSet; negated = true; break;
        case 'h': set = kHexSet; break;
        case 'H': set = kHexSet; negated = true; break;
        default: break;
      }
      if (set.empty()) {
        out.push_back('\\');
        out.push_back(e);
      } else if (!in_class) {
        out += negated ? "[^" : "[";
        out += set;
        out.push_back(']');
      } else if (!negated) {
        out += set;
      } else {
        // A negated set inside a class has no plain PCRE2 spelling: keep PCRE2's own
        // escape (differs from Oniguruma only for U+180E in \S).
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);  // a literal ]
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

MatchScratch::~MatchScratch() {
  if (md_ != nullptr) pcre2_match_data_free(md_);
}

Result<Pattern> Pattern::regex(std::string_view onig_pattern) {
  const std::string translated = onig_to_pcre2(onig_pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(error, buf, sizeof(buf));
    return unsupported("regex \"" + std::string(onig_pattern) + "\" does not compile in PCRE2 (" +
                       reinterpret_cast<const char*>(buf) + " at offset " + std::to_string(offset) +
                       ")");
  }
  Pattern p;
  p.code_ = std::shared_ptr<pcre2_code>(code, pcre2_code_free);
  p.jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  p.source_ = std::string(onig_pattern);
  return p;
}

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.source_ = std::move(text);
  return p;
}

size_t Pattern::char_len_at(std::string_view s, size_t i) {
  return utf8_seq_len(static_cast<unsigned char>(s[i]));
}

bool Pattern::find(std::string_view subject, size_t from, MatchScratch& scratch, size_t* begin,
                   size_t* end) const {
  if (code_ == nullptr) {
    if (source_.empty() || from > subject.size()) return false;
    const size_t at = subject.find(source_, from);
    if (at == std::string_view::npos) return false;
    *begin = at;
    *end = at + source_.size();
    return true;
  }
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = jit_ ? pcre2_jit_match(code_.get(), s, subject.size(), from, 0, scratch.data(), nullptr)
                : PCRE2_ERROR_JIT_STACKLIMIT;
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code_.get(), s, subject.size(), from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                     scratch.data(), nullptr);
  }
  if (rc < 0) {
    if (rc != PCRE2_ERROR_NOMATCH) {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true)) {
        KILN_LOG(kWarn, "tokenizer regex \"" << source_ << "\" failed with PCRE2 error " << rc
                                             << "; treating the rest of the text as unmatched");
      }
    }
    return false;
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data());
  *begin = ov[0];
  *end = ov[1];
  return true;
}

}  // namespace kiln::tokenizer::hf
