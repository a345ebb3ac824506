#include "tokenizer/unicode.h"

#include <cstdlib>

#include <utf8proc.h>

namespace kiln::tokenizer::hf {
namespace {

// Length of the valid prefix of the UTF-8 sequence starting at s[i] (Unicode table 3-7),
// and whether it is a complete character. A result of {0, false} means a bad lead byte.
struct SeqCheck {
  size_t valid_len;
  bool complete;
};

SeqCheck check_sequence(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {1, true};
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0, false};
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return {k, false};
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {k, false};
  }
  return {n, true};
}

}  // namespace

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const SeqCheck c = check_sequence(s, i);
    if (!c.complete) return false;
    i += c.valid_len;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const SeqCheck c = check_sequence(s, i);
    if (c.complete) {
      out.append(s.substr(i, c.valid_len));
      i += c.valid_len;
    } else {
      utf8_append(out, kReplacementChar);
      i += c.valid_len == 0 ? 1 : c.valid_len;
    }
  }
  return out;
}

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet table = [] {
    ByteLevelAlphabet t;
    t.cp_to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
      utf8_append(t.byte_to_utf8[b], cp);
      t.cp_to_byte[cp] = int16_t(b);
    }
    return t;
  }();
  return table;
}

bool is_white_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

namespace {

// A starter (ccc 0) with quick-check Yes for `form` can neither compose with nor reorder
// around what precedes it, so the text may be normalized piecewise, cutting before each one
// (UAX #15). Only blocks whose every character qualifies are listed; the rest goes to
// utf8proc, a segment at a time.
bool is_safe_starter(uint32_t cp, NormForm form) {
  if (cp < 0x80) return true;
  if ((cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF)) return true;  // CJK
  if ((cp >= 0x1F300 && cp <= 0x1F64F) || (cp >= 0x1F680 && cp <= 0x1F6FF) ||
      (cp >= 0x1F900 && cp <= 0x1F9FF)) {
    return true;  // emoji: no decompositions
  }
  if (form == NormForm::kNFD || form == NormForm::kNFKD) return false;
  if (cp >= 0xAC00 && cp <= 0xD7A3) return true;  // Hangul syllables (recomposed)
  if ((cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA)) return true;  // kana
  if (form != NormForm::kNFC) return false;
  return (cp >= 0xA0 && cp <= 0x17F) ||     // Latin-1, Latin Extended-A
         (cp >= 0x400 && cp <= 0x45F) ||    // Cyrillic letters
         (cp >= 0x621 && cp <= 0x64A) ||    // Arabic letters
         (cp >= 0x904 && cp <= 0x939) ||    // Devanagari letters
         (cp >= 0x2010 && cp <= 0x2027);    // dashes, quotes, bullets
}

int options_of(NormForm form) {
  switch (form) {
    case NormForm::kNFC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    case NormForm::kNFD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    case NormForm::kNFKC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    case NormForm::kNFKD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  }
  return UTF8PROC_STABLE;
}

void normalize_segment(std::string_view s, int options, std::string& out) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                   &dst, utf8proc_option_t(options));
  if (n < 0) {
    out.append(s);  // only on invalid UTF-8, which callers rule out
    return;
  }
  out.append(reinterpret_cast<const char*>(dst), size_t(n));
  std::free(dst);
}

}  // namespace

std::string unicode_normalize(std::string_view s, NormForm form) {
  const int options = options_of(form);
  std::string out;
  out.reserve(s.size());
  size_t segment = 0;     // start of the current segment
  bool unsafe = false;    // the segment holds a character that may change
  size_t i = 0;
  while (i < s.size()) {
    const size_t at = i;
    if (is_safe_starter(utf8_next(s, i), form)) {
      if (unsafe) {
        normalize_segment(s.substr(segment, at - segment), options, out);
      } else {
        out.append(s.substr(segment, at - segment));
      }
      segment = at;
      unsafe = false;
    } else {
      unsafe = true;
    }
  }
  if (unsafe) {
    normalize_segment(s.substr(segment), options, out);
  } else {
    out.append(s.substr(segment));
  }
  return out;
}

std::string unicode_normalize_whole(std::string_view s, NormForm form) {
  std::string out;
  normalize_segment(s, options_of(form), out);
  return out;
}

std::string unicode_lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const uint32_t cp = utf8_next(s, i);
    if (cp < 0x80) {
      out.push_back(char(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    } else if (cp == 0x130) {  // the one full (multi-char) lowercase mapping outside Lithuanian
      out += "i\xCC\x87";
    } else {
      utf8_append(out, uint32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
    }
  }
  return out;
}

}  // namespace kiln::tokenizer::hf
