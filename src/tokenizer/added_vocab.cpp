#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kiln::tokenizer::hf {
namespace {

uint32_t first_char(std::string_view s) {
  size_t i = 0;
  return utf8_next(s, i);
}

uint32_t last_char(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return utf8_next(s, i);
}

// Start of the run of White_Space that ends `s` (Rust: LEFTMOST_SPACE_AT_END, \s*$).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!is_white_space(utf8_next(s, i))) break;
    end = start;
  }
  return end;
}

// Length of the run of White_Space that starts `s` (Rust: RIGHTMOST_SPACE_AT_START, ^\s*).
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!is_white_space(utf8_next(s, next))) break;
    i = next;
  }
  return i;
}

}  // namespace

void AddedVocab::Trie::insert(std::string_view s, int32_t token) {
  if (nodes.empty()) {
    nodes.emplace_back();
    root.fill(-1);
  }
  int32_t node = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    const auto b = static_cast<uint8_t>(s[k]);
    int32_t child = -1;
    if (k == 0) {
      child = root[b];
    } else {
      auto& ch = nodes[size_t(node)].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, INT32_MIN));
      if (it != ch.end() && it->first == b) child = it->second;
    }
    if (child < 0) {
      child = int32_t(nodes.size());
      nodes.emplace_back();
      if (k == 0) {
        root[b] = child;
      } else {
        auto& ch = nodes[size_t(node)].children;
        ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, INT32_MIN)), {b, child});
      }
    }
    node = child;
  }
  if (nodes[size_t(node)].token < 0) nodes[size_t(node)].token = token;  // first one wins
}

int32_t AddedVocab::Trie::longest_at(std::string_view text, size_t i, size_t* len) const {
  int32_t node = root[static_cast<uint8_t>(text[i])];
  int32_t best = -1;
  size_t j = i + 1;
  while (node >= 0) {
    if (nodes[size_t(node)].token >= 0) {
      best = nodes[size_t(node)].token;
      *len = j - i;
    }
    if (j >= text.size()) break;
    const auto b = static_cast<uint8_t>(text[j]);
    const auto& ch = nodes[size_t(node)].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, INT32_MIN));
    node = it != ch.end() && it->first == b ? it->second : -1;
    ++j;
  }
  return best;
}

AddedVocab::AddedVocab(std::vector<AddedToken> tokens,
                       const std::function<std::string(std::string)>& normalize)
    : tokens_(std::move(tokens)) {
  // Rust matches special tokens first, then the others, each in file order.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t t = 0; t < tokens_.size(); ++t) {
      const AddedToken& tok = tokens_[t];
      if (tok.content.empty() || tok.special != (pass == 0)) continue;
      if (tok.normalized) {
        const std::string pattern = normalize(tok.content);
        if (!pattern.empty()) tries_[1].insert(pattern, int32_t(t));
      } else {
        tries_[0].insert(tok.content, int32_t(t));
      }
    }
  }
}

void AddedVocab::split(std::string_view text, bool normalized_set,
                       std::vector<Segment>& out) const {
  out.clear();
  const Trie& trie = tries_[normalized_set ? 1 : 0];
  if (trie.nodes.empty() || text.empty()) {
    out.push_back(Segment{-1, 0, text.size()});
    return;
  }
  size_t start_offset = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t len = 0;
    const int32_t t = trie.longest_at(text, i, &len);
    if (t < 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;  // the automaton resumes after the match, even if the flags reject it
    const AddedToken& tok = tokens_[size_t(t)];
    if (tok.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      const bool stop_space = stop == text.size() || !is_word_char(first_char(text.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (tok.rstrip) stop += leading_space_len(text.substr(stop));
    if (start_offset < start) out.push_back(Segment{-1, start_offset, start});
    out.push_back(Segment{tok.id, start, stop});
    start_offset = stop;
  }
  if (start_offset != text.size()) out.push_back(Segment{-1, start_offset, text.size()});
}

}  // namespace kiln::tokenizer::hf
