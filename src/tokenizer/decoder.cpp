#include "tokenizer/decoder.h"

#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace kiln::tokenizer::hf {
namespace {

// Byte-level tokens -> bytes -> one lossy UTF-8 string. A token with a character outside the
// byte-level alphabet (an added token such as "<｜User｜>") contributes its own UTF-8 bytes.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      size_t i = 0;
      bool mapped = true;
      while (i < t.size()) {
        const int b = alphabet.byte_of(utf8_next(t, i));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(char(b));
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
  void token_bytes(std::string& token, bool* joined) const override {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
    std::string bytes;
    size_t i = 0;
    while (i < token.size()) {
      const int b = alphabet.byte_of(utf8_next(token, i));
      if (b < 0) {  // not byte-level: its own UTF-8, as decode_chain keeps it
        *joined = true;
        return;
      }
      bytes.push_back(char(b));
    }
    token = std::move(bytes);
    *joined = true;
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    MatchScratch scratch;
    for (std::string& t : tokens) {
      std::string out;
      size_t prev = 0;
      pattern_.for_each_match(t, scratch, [&](size_t b, size_t e) {
        out.append(t, prev, b - prev);
        out += content_;
        prev = e;
      });
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }
  void token_bytes(std::string& token, bool*) const override {
    std::vector<std::string> one{std::move(token)};
    decode_chain(one);
    token = std::move(one[0]);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Runs of <0xNN> tokens become the string they encode; a run that is not valid UTF-8
// becomes one U+FFFD per byte (Rust: String::from_utf8 failed -> "�" for each byte).
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      if (utf8_valid(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run_len; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_len = 0;
    };
    for (std::string& t : tokens) {
      if (auto b = parse_byte_token(t)) {
        run.push_back(char(*b));
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
  bool has_byte_fallback() const override { return true; }
  void token_bytes(std::string& token, bool*) const override {
    if (auto b = parse_byte_token(token)) token.assign(1, char(*b));
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
  void token_bytes(std::string&, bool* joined) const override { *joined = true; }
};

// Removes up to `start` leading and `stop` trailing occurrences of one character per token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<size_t> starts;  // byte offset of each character
      for (size_t i = 0; i < t.size(); utf8_next(t, i)) starts.push_back(i);
      auto char_at = [&](size_t k) {
        size_t i = starts[k];
        return utf8_next(t, i);
      };
      size_t begin = 0;
      while (begin < start_ && begin < starts.size() && char_at(begin) == content_) ++begin;
      size_t end = starts.size();
      for (size_t k = 0; k < stop_ && end > begin && char_at(end - 1) == content_; ++k) --end;
      const size_t b = begin < starts.size() ? starts[begin] : t.size();
      const size_t e = end < starts.size() ? starts[end] : t.size();
      t = t.substr(b, e - b);
    }
  }
  void token_bytes(std::string& token, bool* joined) const override {
    if (*joined) return;  // strips the whole text's ends, not a token's in the middle
    std::vector<std::string> one{std::move(token)};
    decode_chain(one);
    token = std::move(one[0]);
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }
  void token_bytes(std::string& token, bool* joined) const override {
    for (const auto& p : parts_) p->token_bytes(token, joined);
  }
  bool has_byte_fallback() const override {
    for (const auto& p : parts_) {
      if (p->has_byte_fallback()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// Adds fixed ids before and after the sequence when special tokens are requested.
class AffixPostProcessor final : public PostProcessor {
 public:
  AffixPostProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_, after_;
};

class NoopPostProcessor final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&, bool) const override {}
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& p : parts_) p->process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

// TemplateProcessing "single": [{"SpecialToken": {"id": "<bos>"}}, {"Sequence": {"id": "A"}}]
// (or the string form "<bos> $A"), with "special_tokens": {"<bos>": {"ids": [2], ...}}.
Result<std::unique_ptr<PostProcessor>> make_template(const json& j) {
  constexpr std::string_view kWhat = "post_processor TemplateProcessing";
  auto single = j.find("single");
  if (single == j.end() || !single->is_array()) {
    return corrupt(std::string(kWhat) + ": \"single\" must be an array");
  }
  auto specials = j.find("special_tokens");
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (const json& piece : *single) {
    std::string special;
    if (piece.is_string()) {  // "$A", "$A:0", "<bos>", "<bos>:1"
      std::string s = piece.get<std::string>();
      const size_t colon = s.rfind(':');
      if (colon != std::string::npos && colon > 0 && colon + 1 < s.size() &&
          s.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
        s.resize(colon);  // drop the type id
      }
      if (s.size() >= 2 && s[0] == '$') {
        seen_sequence = true;
        continue;
      }
      special = s;
    } else if (piece.contains("Sequence")) {
      seen_sequence = true;
      continue;
    } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
               piece["SpecialToken"]["id"].is_string()) {
      special = piece["SpecialToken"]["id"].get<std::string>();
    } else {
      return corrupt(std::string(kWhat) + ": unknown template piece " + piece.dump());
    }
    if (specials == j.end() || !specials->contains(special) ||
        !(*specials)[special].contains("ids") || !(*specials)[special]["ids"].is_array()) {
      return corrupt(std::string(kWhat) + ": special token \"" + special +
                     "\" is missing from \"special_tokens\"");
    }
    for (const json& id : (*specials)[special]["ids"]) {
      if (!id.is_number_integer()) return corrupt(std::string(kWhat) + ": ids must be integers");
      (seen_sequence ? after : before).push_back(id.get<int32_t>());
    }
  }
  return std::unique_ptr<PostProcessor>(new AffixPostProcessor(std::move(before), std::move(after)));
}

// BertProcessing / RobertaProcessing: "cls": ["<s>", 0], "sep": ["</s>", 2].
Result<std::unique_ptr<PostProcessor>> make_cls_sep(const json& j, const std::string& type) {
  auto id_of = [&](const char* key) -> Result<int32_t> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
      return corrupt("post_processor " + type + ": \"" + key + "\" must be [token, id]");
    }
    return (*it)[1].get<int32_t>();
  };
  KILN_ASSIGN_OR_RETURN(int32_t cls, id_of("cls"));
  KILN_ASSIGN_OR_RETURN(int32_t sep, id_of("sep"));
  return std::unique_ptr<PostProcessor>(new AffixPostProcessor({cls}, {sep}));
}

}  // namespace

std::optional<uint8_t> parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return std::nullopt;
  int v = 0;
  for (char c : t.substr(3, 2)) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0) return std::nullopt;
    v = v * 16 + d;
  }
  return uint8_t(v);
}

Result<std::unique_ptr<Decoder>> make_decoder(const json& j) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  KILN_ASSIGN_OR_RETURN(const std::string type, component_type(j, "decoder"));
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) {
      return corrupt("decoder Sequence: \"decoders\" must be an array");
    }
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const json& item : *it) {
      KILN_ASSIGN_OR_RETURN(auto part, make_decoder(item));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Replace") {
    if (!j.contains("pattern")) return corrupt("decoder Replace: missing \"pattern\"");
    KILN_ASSIGN_OR_RETURN(Pattern pattern, parse_pattern(j["pattern"], "decoder Replace"));
    KILN_ASSIGN_OR_RETURN(std::string content, get_string(j, "content", "decoder Replace"));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), std::move(content)));
  }
  if (type == "Strip") {
    KILN_ASSIGN_OR_RETURN(std::string content, get_string(j, "content", "decoder Strip"));
    size_t i = 0;
    if (content.empty() || (utf8_next(content, i), i != content.size())) {
      return corrupt("decoder Strip: \"content\" must be one character");
    }
    i = 0;
    const uint32_t cp = utf8_next(content, i);
    const auto start = j.value("start", 0), stop = j.value("stop", 0);
    if (start < 0 || stop < 0) return corrupt("decoder Strip: start/stop must be >= 0");
    return std::unique_ptr<Decoder>(new StripDecoder(cp, size_t(start), size_t(stop)));
  }
  return unsupported("decoder type \"" + type +
                     "\" is not supported (kiln supports Sequence, ByteLevel, Replace, "
                     "ByteFallback, Fuse, Strip)");
}

Result<std::unique_ptr<PostProcessor>> make_post_processor(const json& j) {
  if (j.is_null()) return std::unique_ptr<PostProcessor>();
  KILN_ASSIGN_OR_RETURN(const std::string type, component_type(j, "post_processor"));
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new NoopPostProcessor());
  if (type == "TemplateProcessing") return make_template(j);
  if (type == "BertProcessing" || type == "RobertaProcessing") return make_cls_sep(j, type);
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) {
      return corrupt("post_processor Sequence: \"processors\" must be an array");
    }
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (const json& item : *it) {
      KILN_ASSIGN_OR_RETURN(auto part, make_post_processor(item));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<PostProcessor>(new SequencePostProcessor(std::move(parts)));
  }
  return unsupported("post_processor type \"" + type +
                     "\" is not supported (kiln supports ByteLevel, TemplateProcessing, "
                     "BertProcessing, RobertaProcessing, Sequence)");
}

}  // namespace kiln::tokenizer::hf
