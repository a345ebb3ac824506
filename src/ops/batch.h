// BatchMeta: a step's tokens as one flattened list with per-sequence metadata.
// Prefill and decode mix in one step: sequence s contributes n_query(s) tokens
// (its newest ones) at rows [q_start[s], q_start[s+1]) of every activation.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln::ops {

// slot_mapping value of a padding row (a batch padded to a recorded shape):
// kv_store / mla_store write nothing for it.
constexpr int32_t kPadSlot = -1;

struct BatchMeta {
  // per token, n_tokens entries
  std::vector<int32_t> token_ids;     // the input token ids
  std::vector<int32_t> positions;     // absolute position of the token in its sequence
  std::vector<int32_t> slot_mapping;  // KV cache slot: block * block_size + offset, or kPadSlot
  // per sequence, n_seqs entries (q_start has n_seqs + 1)
  std::vector<int32_t> q_start;       // first row of the sequence in the flattened batch
  std::vector<int32_t> context_len;   // tokens in the KV cache after this step (incl. new ones)
  std::vector<int32_t> block_table;   // [n_seqs, max_blocks_per_seq] physical block ids, row-major
  int32_t max_blocks_per_seq = 0;
  int32_t block_size = 16;            // tokens per KV block
  // Models with recurrent layers (Gated DeltaNet), else empty: sequence s's row in every
  // recurrent layer's state (model::LayerKv::conv_state / recurrent_state). The row holds
  // the state after the sequence's tokens before this step; a sequence whose first new
  // token is at position 0 starts from a zero state (the layer clears the row).
  std::vector<int32_t> state_slots;
  // Speculative verification of such models, else empty: per token row, the state row
  // that also receives the sequence's state right after this row (so the state after the
  // last accepted draft can be restored), or -1 (ops::OptionalOp::kStateSnapshots).
  std::vector<int32_t> state_snapshots;
  // rows of the batch whose logits the step returns (e.g. each sequence's last token)
  std::vector<int32_t> logit_rows;
  // MTP passes (model::CausalLM::mtp_forward), else empty: per token row, the row of the
  // hidden state it reads (BatchIds::kInputRows), so the gather is part of the step.
  std::vector<int32_t> input_rows;
  // Speculative verification of drafts still in the backend's memory (MTP drafts chained
  // there), else empty: per token row, the index in device_tokens (i32, the backend's) of
  // the row's token id, which replaces token_ids[r] (a placeholder), or -1.
  std::vector<int32_t> device_token_rows;
  Tensor device_tokens;

  int32_t n_tokens() const { return int32_t(positions.size()); }
  int32_t n_seqs() const { return int32_t(context_len.size()); }
  int32_t n_query(int32_t s) const { return q_start[s + 1] - q_start[s]; }
  // Physical cache slot of token `pos` of sequence s.
  int64_t slot(int32_t s, int32_t pos) const {
    const int32_t block = block_table[int64_t(s) * max_blocks_per_seq + pos / block_size];
    return int64_t(block) * block_size + pos % block_size;
  }
};

// The batch's rows [0, cut) and [cut, n_tokens) as two batches (a tensor-parallel step's
// micro-batches: model::CausalLM::micro_batch_rows). A sequence with rows on both sides
// is in both: its first part as a chunk whose context ends at its last row before `cut`,
// its second as the next chunk (whose earlier keys the first part's layer stored). Rows
// past the last sequence (padding) go with their side. Only what a layer reads is kept:
// positions, slots, sequences, block tables (no token ids, logit rows or speculative
// state: the step embeds and picks its logits over the whole batch). 0 < cut < n_tokens.
std::pair<BatchMeta, BatchMeta> split_rows(const BatchMeta& b, int32_t cut);

}  // namespace kiln::ops
