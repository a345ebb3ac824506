// A request as the engine sees it, and one sequence (one of its n samples).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/block_manager.h"
#include "runtime/sampler.h"

namespace kiln::runtime {

// What a caller asks the engine for: token ids in, token ids out.
struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;                // sample i of n seeds its generator with sampling.seed + i
  int32_t max_tokens = 16;                // generated tokens at most (0: none)
  std::vector<int32_t> stop_token_ids;    // end the sequence (the id is its last token)
  bool ignore_eos = false;                // do not stop at the model's end-of-sequence ids
  int32_t n = 1;                          // parallel samples; they share the prompt's KV blocks
  std::shared_ptr<const OutputConstraint> constraint;  // structured output; null: free text
  // Tests only (the server's test hook): the tokens each sample emits in place of what
  // it samples, one per step, while they last. The model still runs every step.
  std::vector<int32_t> forced_output;
};

enum class FinishReason {
  kNone,       // still running
  kEos,        // a model end-of-sequence id
  kStopToken,  // one of Request::stop_token_ids
  kLength,     // max_tokens, or the model's maximum length
  kCancelled,  // Engine::cancel (client gone, stop string matched, server stopping)
  kGrammar,    // the constrained output is complete and nothing may follow (the token is text)
};
inline constexpr int kFinishReasons = 6;  // FinishReason's values, for tables indexed by it
const char* finish_reason_name(FinishReason r);

enum class SeqState { kWaiting, kRunning, kFinished };

struct Sequence {
  uint64_t request_id = 0;
  int32_t sample_index = 0;                  // 0 .. n-1 within its request
  std::shared_ptr<const Request> request;
  std::vector<int32_t> tokens;               // prompt, then generated
  int32_t n_prompt = 0;
  int32_t n_computed = 0;                    // leading tokens whose KV is in the cache
  BlockTable table;
  Sampler sampler;
  SeqState state = SeqState::kWaiting;
  FinishReason finish = FinishReason::kNone;
  // Sample i > 0 of a request waits until sample 0 has prefilled the prompt, so that it
  // takes the prompt's blocks from the prefix cache instead of computing them again.
  const Sequence* wait_for = nullptr;
  // Models with recurrent layers: its row of their state while it runs (-1: none).
  int32_t state_slot = -1;
  // Speculative decoding: tokens proposed to follow tokens.back(), verified by the next
  // step (runtime/speculative.h); set by the engine before each step, never part of tokens.
  std::vector<int32_t> draft;
  // --speculative-method mtp: the MTP layer's drafts after tokens[0, mtp_draft_at) (made
  // after the step that computed them; stale once tokens grow or the sequence restarts).
  std::vector<int32_t> mtp_draft;
  int32_t mtp_draft_at = -1;
  // >= 0: mtp_draft holds placeholders, its ids are still in the backend's memory (slot
  // of the last MTP drafts: Engine::mtp_fetch), where the next verify step reads them.
  int32_t mtp_device_slot = -1;

  Sequence(uint64_t id, int32_t index, std::shared_ptr<const Request> r, const SamplingParams& params)
      : request_id(id), sample_index(index), request(std::move(r)), sampler(params) {}

  int32_t n_tokens() const { return int32_t(tokens.size()); }
  int32_t n_generated() const { return n_tokens() - n_prompt; }
  // Tokens whose KV is still to compute (1 when decoding).
  int32_t n_uncomputed() const { return n_tokens() - n_computed; }
  bool prefilled() const { return n_computed >= n_prompt; }
};

}  // namespace kiln::runtime
