#include "runtime/batch_builder.h"

#include <algorithm>

#include "core/check.h"

namespace kiln::runtime {

int32_t decode_bucket(int32_t n) {
  if (n <= 8) {
    int32_t b = 1;
    while (b < n) b *= 2;
    return b;
  }
  return (n + 7) / 8 * 8;
}

int32_t verify_padding_drafts(const Schedule& schedule, bool any) {
  if (schedule.seqs.empty()) return 0;
  int32_t k = 0;
  for (const ScheduledSeq& s : schedule.seqs) {
    const bool decoding = s.n_new == s.n_draft + 1 && s.seq->n_computed + 1 == s.seq->n_tokens();
    if (!decoding || (!any && s.n_draft != schedule.seqs[0].n_draft)) return 0;
    k = std::max(k, s.n_draft);
  }
  return k;
}

StepBatch build_step_batch(const Schedule& schedule, int32_t block_size, int32_t pad_state_slot, int32_t max_rows,
                           bool pad_any_verify) {
  StepBatch out;
  ops::BatchMeta& b = out.meta;
  b.block_size = block_size;
  size_t width = 1;
  for (const ScheduledSeq& s : schedule.seqs)
    while (width < s.seq->table.blocks.size()) width *= 2;
  b.max_blocks_per_seq = int32_t(width);

  const bool decode = schedule.decode_only();
  // Sequences without drafts first, so that the sampled rows lead the logits.
  std::vector<const ScheduledSeq*> order;
  for (const ScheduledSeq& s : schedule.seqs)
    if (s.n_draft == 0) order.push_back(&s);
  for (const ScheduledSeq& s : schedule.seqs)
    if (s.n_draft > 0) order.push_back(&s);
  const int32_t n_seqs = int32_t(schedule.seqs.size());
  // A verify step is padded like a decode step, to decode_bucket(n) sequences of k + 1
  // rows each (k: the most drafts a sequence verifies), every row a logit row, within
  // the step's row budget: where every sequence verifies k drafts, or with pad_any_verify
  // where every sequence decodes (a sequence with fewer drafts, or none, gets padding rows
  // that repeat its last row). Recurrent models' verify steps (state snapshots per row)
  // are not padded.
  const int32_t k = pad_state_slot < 0 && max_rows > 0 ? verify_padding_drafts(schedule, pad_any_verify) : 0;
  const int32_t stride = k > 0 && int64_t(decode_bucket(n_seqs)) * (k + 1) <= max_rows ? k + 1 : 0;
  const int32_t n_rows_seqs = decode || stride > 0 ? decode_bucket(n_seqs) : n_seqs;
  // The logit rows: the sampled sequences' first, then the verified rows, then padding
  // (in row order except in a padded step whose draft counts differ).
  std::vector<int32_t> sampled_rows, verified_rows, padding_rows;
  for (int32_t r = 0; r < n_rows_seqs; ++r) {
    // A padding sequence repeats the first sequence's rows with padding slots.
    const bool pad = r >= n_seqs;
    const ScheduledSeq& s = *order[size_t(pad ? 0 : r)];
    const Sequence& seq = *s.seq;
    const std::vector<int32_t>& blocks = seq.table.blocks;
    KILN_CHECK(!blocks.empty()) << "scheduled sequence without blocks";
    const int32_t seq_index = b.n_seqs();
    b.q_start.push_back(b.n_tokens());
    b.context_len.push_back(seq.n_computed + s.n_new);
    if (pad_state_slot >= 0) {
      KILN_CHECK(pad || seq.state_slot >= 0) << "a scheduled sequence without a state slot";
      b.state_slots.push_back(pad ? pad_state_slot : seq.state_slot);
    }
    if (!pad) out.rows.push_back({.seq = s.seq, .first_row = b.n_tokens(), .first_pos = seq.n_computed, .n_rows = s.n_new});
    b.block_table.insert(b.block_table.end(), blocks.begin(), blocks.end());
    b.block_table.resize(size_t(r + 1) * width, blocks.back());
    KILN_CHECK(s.n_draft == 0 || (s.n_draft <= int32_t(seq.draft.size()) && seq.n_uncomputed() == 1))
        << "drafts of a sequence that is not decoding";
    const bool samples = !pad && s.n_draft == 0 && seq.n_computed + s.n_new == seq.n_tokens();
    if (!pad && s.n_draft > 0) out.verify.push_back({.seq = s.seq, .n_draft = s.n_draft, .first_row = b.n_tokens()});
    if (samples) out.sampled.push_back(s.seq);
    for (int32_t j = 0; j < std::max(stride, s.n_new); ++j) {
      const bool real = !pad && j < s.n_new;
      const int32_t p = seq.n_computed + std::min(j, s.n_new - 1);  // a padding row repeats the last row
      b.token_ids.push_back(p < seq.n_tokens() ? seq.tokens[size_t(p)] : seq.draft[size_t(p - seq.n_tokens())]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(real ? int32_t(b.slot(seq_index, p)) : ops::kPadSlot);
      const int32_t row = b.n_tokens() - 1;
      if (!real) {
        if (stride > 0 || s.n_draft > 0 || j + 1 == s.n_new) padding_rows.push_back(row);
      } else if (s.n_draft > 0) {
        verified_rows.push_back(row);
      } else if (samples && j + 1 == s.n_new) {
        sampled_rows.push_back(row);
      }
    }
  }
  b.logit_rows = std::move(sampled_rows);
  b.logit_rows.insert(b.logit_rows.end(), verified_rows.begin(), verified_rows.end());
  b.logit_rows.insert(b.logit_rows.end(), padding_rows.begin(), padding_rows.end());
  b.q_start.push_back(b.n_tokens());
  return out;
}

}  // namespace kiln::runtime
