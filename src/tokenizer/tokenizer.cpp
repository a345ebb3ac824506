#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/json_bounded.h"
#include "core/log.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln::tokenizer {

using namespace hf;  // the tokenizer.json components (internal)

namespace {

using json = nlohmann::json;

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return internal_error(path + ": read failed");
  return ss.str();
}

// "bos_token": "<s>" or {"content": "<s>", ...} (or null).
std::optional<std::string> token_field(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

Result<TokenizerConfig> parse_config(std::string_view text) {
  TokenizerConfig c;
  if (text.empty()) return c;
  std::string why;
  json j = parse_json_explained<json>(text, &why);
  if (!why.empty()) return corrupt("tokenizer_config.json: " + why);
  if (!j.is_object()) return corrupt("tokenizer_config.json is not a JSON object");
  if (auto it = j.find("add_bos_token"); it != j.end() && it->is_boolean()) {
    c.add_bos_token = it->get<bool>();
  }
  if (auto it = j.find("add_eos_token"); it != j.end() && it->is_boolean()) {
    c.add_eos_token = it->get<bool>();
  }
  c.bos_token = token_field(j, "bos_token");
  c.eos_token = token_field(j, "eos_token");
  return c;
}

Result<AddedToken> parse_added_token(const json& a) {
  if (!a.is_object() || !a.contains("content") || !a["content"].is_string() ||
      !a.contains("id") || !a["id"].is_number_integer()) {
    return corrupt("added_tokens: each entry needs a string \"content\" and an integer \"id\"");
  }
  AddedToken t;
  t.content = a["content"].get<std::string>();
  t.id = a["id"].get<int32_t>();
  t.single_word = a.value("single_word", false);
  t.lstrip = a.value("lstrip", false);
  t.rstrip = a.value("rstrip", false);
  t.special = a.value("special", false);
  t.normalized = a.value("normalized", !t.special);
  return t;
}

// Reusable buffers of one encode call.
struct EncodeScratch {
  std::vector<Segment> raw_segments, norm_segments;
  std::string normalized;
  Pieces pieces;
  PreTokenizeScratch pre;
};

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocab added;
  std::vector<int32_t> added_index;  // id -> index into added.tokens(), -1 if not added
  TokenMap added_ids;                // content -> id
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_contents;
  TokenizerConfig config;
  std::optional<int32_t> bos, eos;
  int32_t vocab_size = 0;

  const std::string* token_of(int32_t id) const {
    if (id >= 0 && size_t(id) < added_index.size() && added_index[size_t(id)] >= 0) {
      return &added.tokens()[size_t(added_index[size_t(id)])].content;
    }
    return model->id_to_token(id);
  }
  std::optional<int32_t> id_of(std::string_view token) const {
    if (auto it = added_ids.find(token); it != added_ids.end()) return it->second;
    return model->token_to_id(token);
  }
  // A normalized piece without added tokens: pre-tokenize, then BPE per word.
  void encode_piece(std::string_view piece, EncodeScratch& s, std::vector<int32_t>& ids) const {
    if (piece.empty()) return;
    s.pieces.reset(piece);
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(s.pieces, s.pre);
    for (size_t i = 0; i < s.pieces.spans.size(); ++i) model->encode_word(s.pieces.at(i), ids);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::string config_text;
  const std::string config_path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  if (std::filesystem::exists(config_path)) {
    KILN_ASSIGN_OR_RETURN(config_text, read_file(config_path));
  }
  Result<Tokenizer> t = load_from_json(text, config_text);
  if (!t.ok()) return t.status().with_context(dir);
  return t;
}

Result<Tokenizer> Tokenizer::load_from_json(std::string_view tokenizer_json,
                                            std::string_view config_json) {
  std::string why;
  json j = parse_json_explained<json>(tokenizer_json, &why);
  if (!why.empty()) return corrupt("tokenizer.json: " + why);
  if (!j.is_object()) return corrupt("tokenizer.json must be a JSON object");
  auto impl = std::make_unique<Impl>();
  try {
    auto field = [&](const char* key) -> const json& {
      static const json kNull;
      auto it = j.find(key);
      return it == j.end() ? kNull : *it;
    };
    if (!field("model").is_object()) return corrupt("tokenizer.json has no \"model\" object");
    KILN_ASSIGN_OR_RETURN(impl->model, Bpe::from_json(field("model")));
    KILN_ASSIGN_OR_RETURN(impl->normalizer, make_normalizer(field("normalizer")));
    KILN_ASSIGN_OR_RETURN(impl->pre_tokenizer, make_pre_tokenizer(field("pre_tokenizer")));
    KILN_ASSIGN_OR_RETURN(impl->post_processor, make_post_processor(field("post_processor")));
    KILN_ASSIGN_OR_RETURN(impl->decoder, make_decoder(field("decoder")));
    if (!field("truncation").is_null() || !field("padding").is_null()) {
      KILN_LOG(kWarn, "tokenizer.json truncation/padding settings are ignored");
    }

    // Added tokens keep the id Rust gives them: the model's id for a token already in the
    // vocabulary, else the next id past the model (Rust re-derives ids when loading).
    std::vector<AddedToken> added;
    const json& list = field("added_tokens");
    if (!list.is_null() && !list.is_array()) return corrupt("\"added_tokens\" must be an array");
    int32_t next_id = impl->model->vocab_size();
    for (const json& a : list.is_array() ? list : json::array()) {
      KILN_ASSIGN_OR_RETURN(AddedToken t, parse_added_token(a));
      if (t.content.empty()) continue;
      std::optional<int32_t> id;
      if (auto it = impl->added_ids.find(t.content); it != impl->added_ids.end()) id = it->second;
      if (!id) id = impl->model->token_to_id(t.content);
      if (!id) id = next_id++;
      if (*id != t.id) {
        KILN_LOG(kWarn, "added token \"" << t.content << "\" has id " << t.id
                                          << " in tokenizer.json; using " << *id << " as Rust does");
      }
      t.id = *id;
      impl->added_ids.emplace(t.content, t.id);
      if (t.special) impl->special_contents.insert(t.content);
      added.push_back(std::move(t));
    }
    impl->vocab_size = std::max(impl->model->vocab_size(), next_id);
    for (const AddedToken& t : added) impl->vocab_size = std::max(impl->vocab_size, t.id + 1);
    impl->added_index.assign(size_t(impl->vocab_size), -1);
    for (size_t i = 0; i < added.size(); ++i) {
      int32_t& index = impl->added_index[size_t(added[i].id)];
      if (index < 0) index = int32_t(i);
    }
    const Normalizer* normalizer = impl->normalizer.get();
    impl->added = AddedVocab(std::move(added), [normalizer](std::string s) {
      if (normalizer != nullptr) normalizer->normalize(s);
      return s;
    });
  } catch (const json::exception& e) {
    return corrupt(std::string("tokenizer.json: ") + e.what());
  }

  KILN_ASSIGN_OR_RETURN(impl->config, parse_config(config_json));
  if (impl->config.bos_token) impl->bos = impl->id_of(*impl->config.bos_token);
  if (impl->config.eos_token) impl->eos = impl->id_of(*impl->config.eos_token);
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!utf8_valid(text)) {
    repaired = utf8_lossy(text);
    text = repaired;
  }
  // Buffers reused across calls on this thread (released after a very long text).
  thread_local EncodeScratch s;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  m.added.split(text, /*normalized_set=*/false, s.raw_segments);
  for (const Segment& seg : s.raw_segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    if (m.normalizer) {
      s.normalized.assign(piece);
      m.normalizer->normalize(s.normalized);
      piece = s.normalized;
    }
    if (!m.added.has_normalized()) {
      m.encode_piece(piece, s, ids);
      continue;
    }
    m.added.split(piece, /*normalized_set=*/true, s.norm_segments);
    for (const Segment& sub : s.norm_segments) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
      } else {
        m.encode_piece(piece.substr(sub.begin, sub.end - sub.begin), s, ids);
      }
    }
  }
  if (m.post_processor) m.post_processor->process(ids, add_special_tokens);
  // After a very long text every buffer goes: each of the server's hundreds of worker
  // threads would otherwise keep the size of the longest prompt it ever tokenized.
  constexpr size_t kKeepBytes = size_t(1) << 20;
  if (text.size() > kKeepBytes || s.pieces.text.capacity() > kKeepBytes || s.normalized.capacity() > kKeepBytes) {
    s.raw_segments = std::vector<Segment>();
    s.norm_segments = std::vector<Segment>();
    s.normalized = std::string();
    s.pieces = Pieces();
    s.pre.tmp = Pieces();
    s.pre.spans = decltype(s.pre.spans)();
    s.pre.matches = decltype(s.pre.matches)();
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* t = m.token_of(id);
    if (t == nullptr) continue;  // Rust skips ids it does not know
    if (skip_special_tokens && m.special_contents.count(*t) > 0) continue;
    tokens.push_back(*t);
  }
  std::string out;
  if (m.decoder) {
    m.decoder->decode_chain(tokens);
    for (const std::string& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
  }
  return out;
}

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  const Impl& m = *impl_;
  const std::string* t = m.token_of(id);
  if (t == nullptr || m.special_contents.count(*t) > 0) return std::nullopt;
  std::string bytes = *t;
  bool joined = false;
  if (m.decoder) m.decoder->token_bytes(bytes, &joined);
  return bytes;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* t = impl_->token_of(id);
  return t ? std::optional<std::string>(*t) : std::nullopt;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->id_of(token);
}

bool Tokenizer::is_special(int32_t id) const {
  const std::string* t = impl_->token_of(id);
  return t != nullptr && impl_->special_contents.count(*t) > 0;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
const TokenizerConfig& Tokenizer::config() const { return impl_->config; }

bool Tokenizer::stream_can_cut_after(int32_t id) const {
  if (!impl_->decoder || !impl_->decoder->has_byte_fallback()) return true;
  const std::string* t = impl_->token_of(id);
  return t == nullptr || !parse_byte_token(*t).has_value();
}

}  // namespace kiln::tokenizer
