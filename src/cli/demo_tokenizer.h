// A generated tokenizer: a byte-level BPE in the GPT-2 / Qwen layout with Qwen3's ChatML
// added tokens and the ChatML chat template the built-in demo model was trained with
// (scripts/demo/train_demo.py takes its template from here). It lets a random-weight test
// fixture be served through the chat API (`kiln demo-model --tokenizer-only N --out DIR`,
// then `kiln serve FIXTURE --tokenizer DIR`).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace kiln::cli {

// ids 0..255 are the byte alphabet, the last kDemoAddedTokens ids the added tokens, the ids in
// between merges. kDemoMinMerges keeps the most common English pieces (Ġt, Ġthe, in, ...)
// in even the smallest vocabulary; kDemoMaxVocab bounds the time spent generating one.
inline constexpr int64_t kDemoAddedTokens = 9;
inline constexpr int64_t kDemoMinMerges = 16;
inline constexpr int64_t kDemoMinVocab = 256 + kDemoAddedTokens + kDemoMinMerges;
inline constexpr int64_t kDemoMaxVocab = 262144;

// The ids of the added tokens the config files name, for a vocabulary of vocab_size ids.
struct DemoSpecialIds {
  int32_t endoftext = 0;  // <|endoftext|>: the pad token, and an end of sequence
  int32_t im_start = 0;   // <|im_start|>
  int32_t im_end = 0;     // <|im_end|>: the end of an assistant turn (eos_token)
};
DemoSpecialIds demo_special_ids(int64_t vocab_size);

// Writes dir/tokenizer.json and dir/tokenizer_config.json (with the chat template) for a
// tokenizer whose ids are exactly 0 .. vocab_size-1, every one a real token. Deterministic:
// the same vocab_size always writes the same bytes. dir must exist.
// Errors: kInvalidArgument when vocab_size is outside [kDemoMinVocab, kDemoMaxVocab];
// kInternal when a file cannot be written.
Status write_demo_tokenizer(const std::string& dir, int64_t vocab_size);

}  // namespace kiln::cli
