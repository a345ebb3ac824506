// kiln::tokenizer::Tokenizer: a Hugging Face tokenizer.json (BPE models) in C++, giving the
// same ids as the Rust `tokenizers` library.
//
//   encode: text -> added tokens split out (leftmost-longest, flags) -> normalizer per piece
//           -> pre-tokenizer -> BPE per word (cached) -> post-processor (special tokens)
//   decode: ids -> token strings (unknown ids skipped, specials optionally) -> decoder chain
//
// Thread safety: a loaded Tokenizer is immutable except for an internal word cache guarded
// by a mutex; encode/decode may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln::tokenizer {

// What tokenizer_config.json adds (all optional; absent file -> all empty).
struct TokenizerConfig {
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

class Tokenizer {
 public:
  // dir/tokenizer.json and, if present, dir/tokenizer_config.json.
  static Result<Tokenizer> load(const std::string& dir);
  // The same from JSON text; config_json may be empty.
  static Result<Tokenizer> load_from_json(std::string_view tokenizer_json,
                                          std::string_view config_json = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special_tokens applies the tokenizer.json post-processor (e.g. Gemma's <bos>), as
  // the Rust library does. tokenizer_config.json's add_bos_token is reported by config()
  // but not applied (transformers' LlamaTokenizerFast would add BOS for DeepSeek-V3; the
  // Rust library and the JS port do not). Invalid UTF-8 input is first decoded lossily.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes token `id` adds in the middle of a decoded text, raw (a piece of a UTF-8
  // character stays a piece; a SentencePiece word keeps its leading space, which decode
  // strips only at the text's start): what structured output's grammar matches tokens by.
  // nullopt for special tokens and unknown ids. Without a decoder, the token's string.
  std::optional<std::string> token_bytes(int32_t id) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  int32_t vocab_size() const;  // largest id + 1 over the model and the added tokens
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  const TokenizerConfig& config() const;

  // For streaming: false if a decoded stream must not be cut right after this token,
  // because its text depends on the following ids (a <0xNN> token under ByteFallback).
  bool stream_can_cut_after(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::tokenizer
