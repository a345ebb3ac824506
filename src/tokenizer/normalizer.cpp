#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace kiln::tokenizer::hf {
namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = unicode_normalize(text, form_); }

 private:
  NormForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = unicode_lowercase(text); }
};

// Rust: prepends only to a non-empty string.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

// Strips Unicode White_Space on either side.
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      size_t i = 0;
      while (i < end) {
        size_t next = i;
        if (!is_white_space(utf8_next(text, next))) break;
        i = next;
      }
      begin = i;
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!is_white_space(utf8_next(text, next))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// Replaces every match of the pattern (non-overlapping, left to right) with `content`.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    MatchScratch scratch;
    std::string out;
    size_t prev = 0;
    bool any = false;
    pattern_.for_each_match(text, scratch, [&](size_t b, size_t e) {
      any = true;
      out.append(text, prev, b - prev);
      out += content_;
      prev = e;
    });
    if (!any) return;
    out.append(text, prev, std::string::npos);
    text = std::move(out);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

}  // namespace

Result<std::unique_ptr<Normalizer>> make_normalizer(const json& j) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  KILN_ASSIGN_OR_RETURN(const std::string type, component_type(j, "normalizer"));
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return corrupt("normalizer Sequence: \"normalizers\" must be an array");
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const json& item : *it) {
      KILN_ASSIGN_OR_RETURN(auto part, make_normalizer(item));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormForm::kNFC));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormForm::kNFD));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormForm::kNFKC));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormForm::kNFKD));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Prepend") {
    KILN_ASSIGN_OR_RETURN(std::string prefix, get_string(j, "prepend", "normalizer Prepend"));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(new StripNormalizer(get_bool_or(j, "strip_left", true),
                                                           get_bool_or(j, "strip_right", true)));
  }
  if (type == "Replace") {
    if (!j.contains("pattern")) return corrupt("normalizer Replace: missing \"pattern\"");
    KILN_ASSIGN_OR_RETURN(Pattern pattern, parse_pattern(j["pattern"], "normalizer Replace"));
    KILN_ASSIGN_OR_RETURN(std::string content, get_string(j, "content", "normalizer Replace"));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), std::move(content)));
  }
  return unsupported("normalizer type \"" + type +
                     "\" is not supported (kiln supports Sequence, NFC, NFD, NFKC, NFKD, Replace, "
                     "Lowercase, Prepend, Strip)");
}

}  // namespace kiln::tokenizer::hf
