// Streaming detokenization: text for one id at a time, never a broken UTF-8 sequence, and
// the concatenation of every push() plus flush() equals Tokenizer::decode(all ids).
//
// Prefix-offset technique (text-generation-inference, vLLM, tokenizers' DecodeStream):
// decode a window that starts one emission back, and emit only what extends the window's
// previous text. Context-dependent decoders (ByteLevel bytes, leading-space rules) see the
// same left context as in a full decode. Output is held back while
//   - the window text ends in U+FFFD (an incomplete UTF-8 sequence may still complete), or
//   - the last id is a <0xNN> token under ByteFallback (the whole byte run decodes as one,
//     and turns into U+FFFDs if a later byte makes it invalid).
// So every emission point is a place where decode(all) can be cut without changing the text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kiln::tokenizer {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);

  // The new text made final by `id` (often empty while bytes are held back).
  std::string push(int32_t id);
  // Everything still held back (e.g. U+FFFD for an unfinished byte sequence). The stream
  // may continue afterwards.
  std::string flush();

 private:
  std::string emit_window(bool force);

  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> window_;  // ids from the start of the previous emission
  size_t read_offset_ = 0;       // window_[0, read_offset_) decodes to prefix_
  std::string prefix_;
};

}  // namespace kiln::tokenizer
