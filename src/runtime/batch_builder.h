// From a schedule to the step's flattened batch (ops::BatchMeta): each scheduled
// sequence contributes its next n_new tokens as consecutive rows, their KV slots found
// through its block table. Sequences that reach the end of their known tokens ask for the
// logits of their last row: those are sampled. Sequences with speculative drafts come
// last, with a logit row for each of their rows.
//
// Decode-only steps (one token per sequence) are padded to decode_bucket(n) rows with
// padding rows (ops::kPadSlot: nothing stored, logits ignored), verify steps in which
// every sequence verifies the same number of drafts k to decode_bucket(n) sequences of
// k + 1 padding rows (within max_rows; with pad_any_verify, below, those whose draft
// counts differ too), and every step's block tables to one power-of-two width: few
// distinct batch shapes, so a GPU backend replays a recorded step (Backend::run_step)
// for most decode and verify steps. (Unpadded, the verify steps of 100-128 streams, whose
// count drifts, met a new shape nearly every time and ran eagerly or were recorded; and
// most verify steps there hold a sequence with fewer drafts, one near its max_tokens or
// just out of its prefill: docs/perf/speculative.md.)
#pragma once

#include <cstdint>
#include <vector>

#include "ops/batch.h"
#include "runtime/scheduler.h"

namespace kiln::runtime {

// Rows of a decode step holding n sequences: 1, 2, 4, 8, then multiples of 8 (each
// distinct size is one recorded CUDA graph per context width).
int32_t decode_bucket(int32_t n);

struct StepBatch {
  ops::BatchMeta meta;
  // The sequences whose next token this step samples, in logit-row order: the logits'
  // first sampled.size() rows belong to them (padding rows follow).
  std::vector<Sequence*> sampled;
  // Sequences verifying speculative drafts (ScheduledSeq::n_draft > 0), after the sampled
  // ones in the batch: each has n_draft + 1 consecutive logit rows, [last, d1 .. dk],
  // from row sampled.size() on, in this order.
  struct Verify {
    Sequence* seq = nullptr;
    int32_t n_draft = 0;
    int32_t first_row = 0;  // its row of [last], then one per draft
  };
  std::vector<Verify> verify;
  // Every scheduled sequence's rows, in batch order: its first row, the position of that
  // row (its n_computed before the step) and how many rows it has (MTP drafts read them;
  // the padding rows a padded verify step adds after them are not counted).
  struct Rows {
    Sequence* seq = nullptr;
    int32_t first_row = 0, first_pos = 0, n_rows = 0;
  };
  std::vector<Rows> rows;
};

// The drafts k a verify step is padded for (k + 1 rows a sequence): where every scheduled
// sequence decodes (n_new = its drafts + 1, reaching its end), the most any verifies, if
// they all verify as many or `any`; else 0 (also for a decode step: k = 0).
int32_t verify_padding_drafts(const Schedule& schedule, bool any);

// pad_state_slot >= 0: the model has recurrent layers; each row gets its sequence's
// Sequence::state_slot, a padding row this scratch slot (so it never touches a real state).
// max_rows > 0: the step's row budget, within which a uniform verify step is padded.
// pad_any_verify: a verify step whose sequences all decode but verify different numbers
// of drafts k_s (some none) is padded too, each sequence to max k_s + 1 rows (its padding
// rows repeat its last row: same token and position, nothing stored, attending to what
// that row attends to), so its shape is one a GPU backend replays. Its logit rows are
// then out of row order (sampled, verified, padding: the contract above); pipeline
// parallelism's micro-batches need them in order, so it passes false.
StepBatch build_step_batch(const Schedule& schedule, int32_t block_size, int32_t pad_state_slot = -1,
                           int32_t max_rows = 0, bool pad_any_verify = false);

}  // namespace kiln::runtime
