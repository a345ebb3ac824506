// Normalizers of tokenizer.json: rewrite a piece of text (between added tokens) before
// pre-tokenization. Semantics follow the Rust tokenizers crate.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace kiln::tokenizer::hf {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// Builds the normalizer of a tokenizer.json "normalizer" value. A JSON null gives nullptr.
// Supported: Sequence, NFC, NFD, NFKC, NFKD, Replace, Lowercase, Prepend, Strip.
Result<std::unique_ptr<Normalizer>> make_normalizer(const nlohmann::json& j);

}  // namespace kiln::tokenizer::hf
