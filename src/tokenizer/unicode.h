// UTF-8 and Unicode helpers shared by the tokenizer components: code point iteration,
// Rust-compatible lossy decoding, the GPT-2 byte-level alphabet, whitespace and word
// predicates with the Rust `regex` crate's meaning, and normalization through utf8proc.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/utf8.h"

namespace kiln::tokenizer::hf {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Byte length of the UTF-8 sequence that `lead` starts (1 for a stray byte). Assumes
// valid UTF-8, which the tokenizer guarantees at its entry points.
inline size_t utf8_seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the code point at s[i] and advances i. Assumes valid UTF-8.
inline uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const size_t n = utf8_seq_len(b0);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return b0;
  }
  uint32_t cp = b0 & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

using kiln::utf8_append;  // core/utf8.h

// True if `s` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool utf8_valid(std::string_view s);

// Rust's String::from_utf8_lossy: every maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// The GPT-2 byte-level alphabet: each byte maps to one printable code point
// (33..126, 161..172, 174..255 map to themselves, the rest to 256 + n in byte order).
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_utf8;  // UTF-8 of the code point standing for a byte
  std::array<int16_t, 324> cp_to_byte;        // code point (< 324) -> byte, -1 if none
  static const ByteLevelAlphabet& get();
  int byte_of(uint32_t cp) const { return cp < cp_to_byte.size() ? cp_to_byte[cp] : -1; }
};

// Unicode White_Space: Rust char::is_whitespace and `\s` of the regex crate and Oniguruma.
bool is_white_space(uint32_t cp);

// `\w` of the Rust regex crate (Alphabetic, marks, decimal digits, connector punctuation,
// joiners), used by the single_word rule of added tokens.
bool is_word_char(uint32_t cp);

enum class NormForm { kNFC, kNFD, kNFKC, kNFKD };
// Normalizes piecewise: cuts before characters that cannot interact with what precedes
// them and sends only the pieces that may change to utf8proc.
std::string unicode_normalize(std::string_view s, NormForm form);
// The whole string through utf8proc at once (the reference for tests).
std::string unicode_normalize_whole(std::string_view s, NormForm form);

// Lowercase mapping for the Lowercase normalizer: Rust str::to_lowercase except the
// context-dependent Greek final sigma, which maps to σ here.
std::string unicode_lowercase(std::string_view s);

}  // namespace kiln::tokenizer::hf
