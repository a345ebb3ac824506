// UTF-8 encoding of one code point: the tokenizer's decoders and Jinja strings, the grammar
// front ends' escapes.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

// Appends the UTF-8 encoding of `cp` (at most U+10FFFF; a surrogate is encoded as it is,
// WTF-8, which the Jinja strings rely on).
inline void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace kiln
