// Decoders and post-processors of tokenizer.json, with the Rust tokenizers' semantics.
// A decoder rewrites the list of token strings (decode_chain); the result is joined.
// A post-processor adds the special tokens of a template around the encoded ids.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace kiln::tokenizer::hf {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // The bytes one token contributes in the middle of a decoded text (structured output's
  // vocabulary): this step applied to the token alone, raw (no lossy UTF-8; a <0xNN> token
  // is its byte). A step that joins the tokens (Fuse, ByteLevel) sets *joined; a later step
  // then acts on the whole text, so one that touches only its ends (Strip) leaves a token
  // in the middle alone.
  virtual void token_bytes(std::string& token, bool* joined) const = 0;
  // True if the chain contains ByteFallback: a run of <0xNN> tokens then decodes as a
  // whole (all U+FFFD if any byte of it is invalid), so a stream must not cut inside it.
  virtual bool has_byte_fallback() const { return false; }
};

// Builds the decoder of a tokenizer.json "decoder" value (null -> nullptr).
// Supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip.
Result<std::unique_ptr<Decoder>> make_decoder(const nlohmann::json& j);

// "<0xNN>" -> NN, as the ByteFallback decoder reads it.
std::optional<uint8_t> parse_byte_token(std::string_view token);

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // ids of one sequence -> the final ids (adds special tokens if add_special_tokens).
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

// Builds the post-processor of a tokenizer.json "post_processor" value (null -> nullptr).
// Supported: ByteLevel (no change to ids), TemplateProcessing, Sequence of these.
Result<std::unique_ptr<PostProcessor>> make_post_processor(const nlohmann::json& j);

}  // namespace kiln::tokenizer::hf
