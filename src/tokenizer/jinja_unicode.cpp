#include "tokenizer/jinja_unicode.h"

#include <algorithm>

namespace kiln::jinja {

size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xe) return 3;
  return 4;
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return uint32_t(static_cast<unsigned char>(s[k])); };
  const uint32_t lead = b(i);
  const size_t n = std::min(utf8_sequence_length(static_cast<unsigned char>(lead)), s.size() - i);
  uint32_t cp = 0;
  switch (n) {
    case 1: cp = lead; break;
    case 2: cp = ((lead & 0x1f) << 6) | (b(i + 1) & 0x3f); break;
    case 3: cp = ((lead & 0x0f) << 12) | ((b(i + 1) & 0x3f) << 6) | (b(i + 2) & 0x3f); break;
    default: cp = ((lead & 0x07) << 18) | ((b(i + 1) & 0x3f) << 12) | ((b(i + 2) & 0x3f) << 6) | (b(i + 3) & 0x3f);
  }
  i += n;
  return cp;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t n = 0;
    uint32_t min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c >> 5) == 0x6) {
      n = 2, min = 0x80;
    } else if ((c >> 4) == 0xe) {
      n = 3, min = 0x800;
    } else if ((c >> 3) == 0x1e) {
      n = 4, min = 0x10000;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    size_t j = i;
    const uint32_t cp = next_code_point(s, j);
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

namespace {

// A WTF-8 surrogate at s[i]: 0 if none, 1 for high (D800-DBFF), 2 for low (DC00-DFFF).
int surrogate_at(std::string_view s, size_t i) {
  if (i + 3 > s.size()) return 0;
  if (static_cast<unsigned char>(s[i]) != 0xed) return 0;
  const unsigned char b = s[i + 1];
  if (b >= 0xa0 && b <= 0xaf) return 1;
  if (b >= 0xb0 && b <= 0xbf) return 2;
  return 0;
}

}  // namespace

void merge_surrogate_pairs(std::string& s) {
  if (s.find('\xED') == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (surrogate_at(s, i) == 1 && surrogate_at(s, i + 3) == 2) {
      size_t j = i;
      const uint32_t high = next_code_point(s, j);
      const uint32_t low = next_code_point(s, j);
      utf8_append(out, 0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00));
      i = j;
      continue;
    }
    out += s[i++];
  }
  s = std::move(out);
}

std::string to_well_formed(std::string s) {
  if (s.find('\xED') == std::string::npos) return s;
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (surrogate_at(s, i) != 0) {
      out += "\xEF\xBF\xBD";
      i += 3;
      continue;
    }
    out += s[i++];
  }
  return out;
}

bool is_js_whitespace(uint32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0a:
    case 0x0b:
    case 0x0c:
    case 0x0d:
    case 0x20:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
    case 0xfeff: return true;
    default: return cp >= 0x2000 && cp <= 0x200a;
  }
}

size_t js_whitespace_run(std::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size()) {
    size_t k = j;
    if (!is_js_whitespace(next_code_point(s, k))) break;
    j = k;
  }
  return j - i;
}

std::string_view js_trim_start(std::string_view s) { return s.substr(js_whitespace_run(s, 0)); }

std::string_view js_trim_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) >> 6) == 0x2) --start;
    size_t k = start;
    if (!is_js_whitespace(next_code_point(s, k))) break;
    end = start;
  }
  return s.substr(0, end);
}

std::string_view js_trim(std::string_view s) { return js_trim_end(js_trim_start(s)); }

size_t utf16_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    if ((c >> 6) == 0x2) continue;  // continuation byte
    n += (c >> 3) == 0x1e ? 2 : 1;
  }
  return n;
}

std::optional<std::string> utf16_at(std::string_view s, int64_t index) {
  const int64_t n = int64_t(utf16_length(s));
  if (index < 0) index += n;
  if (index < 0 || index >= n) return std::nullopt;
  int64_t unit = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = next_code_point(s, i);
    const int64_t width = cp >= 0x10000 ? 2 : 1;
    if (index < unit + width) {
      if (width == 1) return std::string(s.substr(start, i - start));
      std::string half;  // one half of a supplementary character: a lone surrogate
      utf8_append(half, index == unit ? 0xd800 + ((cp - 0x10000) >> 10) : 0xdc00 + ((cp - 0x10000) & 0x3ff));
      return half;
    }
    unit += width;
  }
  return std::nullopt;
}

int compare_utf16(std::string_view a, std::string_view b) {
  // UTF-8 byte order equals code point order; it differs from UTF-16 order only where a
  // supplementary code point (surrogates D800-DFFF) meets one in E000-FFFF.
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t x = next_code_point(a, i);
    const uint32_t y = next_code_point(b, j);
    if (x == y) continue;
    const auto unit = [](uint32_t cp) { return cp >= 0x10000 ? 0xd800 + ((cp - 0x10000) >> 10) : cp; };
    const uint32_t ux = unit(x), uy = unit(y);
    if (ux != uy) return ux < uy ? -1 : 1;
    return x < y ? -1 : 1;  // same high surrogate: the low surrogates order like the code points
  }
  if (i < a.size()) return 1;
  if (j < b.size()) return -1;
  return 0;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    next_code_point(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

namespace {

bool in_ranges(const tables::CodePointRange* ranges, size_t n, uint32_t cp) {
  const auto* end = ranges + n;
  const auto* it =
      std::upper_bound(ranges, end, cp, [](uint32_t v, const tables::CodePointRange& r) { return v < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

// Appends the case mapping of cp (itself when it has none).
void map_case(std::string& out, uint32_t cp, const tables::CaseRun* runs, size_t n_runs,
              const tables::CaseSpecial* special, size_t n_special) {
  const auto* send = special + n_special;
  const auto* sp =
      std::lower_bound(special, send, cp, [](const tables::CaseSpecial& e, uint32_t v) { return e.cp < v; });
  if (sp != send && sp->cp == cp) {
    for (uint32_t m : sp->mapped)
      if (m != 0) utf8_append(out, m);
    return;
  }
  const auto* rend = runs + n_runs;
  const auto* it =
      std::upper_bound(runs, rend, cp, [](uint32_t v, const tables::CaseRun& r) { return v < r.first; });
  if (it != runs) {
    const tables::CaseRun& r = *(it - 1);
    if (cp <= r.last && (cp - r.first) % r.stride == 0) {
      utf8_append(out, uint32_t(int64_t(cp) + r.delta));
      return;
    }
  }
  utf8_append(out, cp);
}

bool is_cased(uint32_t cp) { return in_ranges(tables::kCased, tables::kCased_size, cp); }
bool is_case_ignorable(uint32_t cp) { return in_ranges(tables::kCaseIgnorable, tables::kCaseIgnorable_size, cp); }

// Unicode Final_Sigma: preceded by a cased letter (skipping case-ignorables) and not
// followed by one.
bool is_final_sigma(const std::vector<uint32_t>& cps, size_t k) {
  bool before = false;
  for (size_t j = k; j-- > 0;) {
    if (is_case_ignorable(cps[j])) continue;
    before = is_cased(cps[j]);
    break;
  }
  if (!before) return false;
  for (size_t j = k + 1; j < cps.size(); ++j) {
    if (is_case_ignorable(cps[j])) continue;
    return !is_cased(cps[j]);
  }
  return true;
}

}  // namespace

std::string js_to_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      out += (c >= 'a' && c <= 'z') ? char(c - 32) : char(c);
      ++i;
      continue;
    }
    map_case(out, next_code_point(s, i), tables::kUpperRuns, tables::kUpperRuns_size, tables::kUpperSpecial,
             tables::kUpperSpecial_size);
  }
  return out;
}

std::string js_to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool ascii = true;
  for (unsigned char c : s) ascii = ascii && c < 0x80;
  if (ascii) {
    for (unsigned char c : s) out += (c >= 'A' && c <= 'Z') ? char(c + 32) : char(c);
    return out;
  }
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) cps.push_back(next_code_point(s, i));
  for (size_t k = 0; k < cps.size(); ++k) {
    if (cps[k] == 0x3a3 && is_final_sigma(cps, k)) {
      utf8_append(out, 0x3c2);
      continue;
    }
    map_case(out, cps[k], tables::kLowerRuns, tables::kLowerRuns_size, tables::kLowerSpecial,
             tables::kLowerSpecial_size);
  }
  return out;
}

int locale_compare(std::string_view a, std::string_view b) {
  const auto ascii = [](std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  };
  if (!ascii(a) || !ascii(b)) return compare_utf16(a, b);
  for (const uint8_t* level : {tables::kAsciiPrimary, tables::kAsciiTertiary}) {
    size_t i = 0, j = 0;
    while (true) {
      // Characters without a primary weight are ignorable at every level.
      while (i < a.size() && tables::kAsciiPrimary[uint8_t(a[i])] == 0) ++i;
      while (j < b.size() && tables::kAsciiPrimary[uint8_t(b[j])] == 0) ++j;
      if (i == a.size() || j == b.size()) {
        if (i != a.size()) return 1;
        if (j != b.size()) return -1;
        break;
      }
      const uint8_t x = level[uint8_t(a[i++])], y = level[uint8_t(b[j++])];
      if (x != y) return x < y ? -1 : 1;
    }
  }
  return 0;
}

}  // namespace kiln::jinja
