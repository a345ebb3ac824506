// Multi-token prediction drafts (--speculative-method mtp): after each step, the
// checkpoint's MTP layer (model::MtpLayer) runs over what the step committed, then
// chains for the next step's drafts.
//
//   catch-up: for every running sequence, one row per position t the step computed and
//     kept (its prompt chunk, or its last token and accepted drafts): the next token
//     x_{t+1} (known by now) and the target's final hidden state at t. This writes the MTP
//     layer's KV cache at t, and the last row of a decoding sequence predicts d1 (the
//     token after the one it just emitted). A uniform step (decode, or verify with the
//     same rows for every sequence) runs in its own shape, the rows it did not keep as
//     padding, so a GPU backend replays it.
//   chain: d_j (j >= 2) from a row at the next position with d_{j-1} as the token and the
//     MTP layer's own output as the hidden state (vLLM's deepseek_mtp chains the same
//     way); its KV is written where the next step's verification will overwrite it.
//   deferred: while the depth policy plans no drafts for the next step
//     (AdaptiveDepth::plan_drafts), a decode step only copies its hidden rows aside; the
//     MTP layer runs over all kept rows at once before its next pass (or when they fill
//     up: EngineOptions::mtp_deferred_steps), so a batch where speculation does not pay
//     costs one copy a step instead of an MTP pass. Rows of a sequence that ended or was
//     preempted are dropped (its blocks went back). Where the policy's governor has found
//     speculation losing at the batch size, the MTP layer does not run at all: its KV has
//     holes at those positions, which later drafts read (their quality, never the output).
//
// Drafts are the MTP logits' argmax (a point mass: runtime/speculative.h verifies them
// exactly, greedy or sampled). Positions the step computed but rejected are not stored:
// the MTP cache holds only kept positions, rewritten by the next catch-up where the target
// recomputes them. A prefix taken from the cache comes with the MTP layer's KV the
// sequence that computed it wrote (its last position's used that sequence's next token,
// and positions still deferred there are missing: only the drafts' quality can differ,
// never the output).
#include <algorithm>
#include <unordered_map>

#include "core/check.h"
#include "core/log.h"
#include "runtime/engine.h"

namespace kiln::runtime {
namespace {

// Greedy ids of the rows of `logits` (host).
std::vector<int32_t> argmax_rows(ops::Backend& be, const Tensor& logits) {
  const size_t n = size_t(logits.dim(0));
  std::vector<int32_t> ids(n);
  if (n == 0) return ids;
  const std::vector<ops::SamplingParams> params(n);  // temperature 0: argmax, lowest id on ties
  const std::vector<float> uniform(n, 0.0f);
  be.sample({.logits = logits, .params = params, .uniform = uniform, .tokens = ids});
  return ids;
}


// A batch's block table from its sequences' tables, `width` entries each (a power of two,
// as build_step_batch's: a recording per width), wide enough for every row's context (a
// padding row's may reach past the blocks its sequence kept: those entries repeat its
// last block).
void fill_block_table(ops::BatchMeta& b, const std::vector<const std::vector<int32_t>*>& tables) {
  size_t width = 1;
  for (size_t i = 0; i < tables.size(); ++i)
    while (width < std::max(tables[i]->size(), size_t((b.context_len[i] + b.block_size - 1) / b.block_size))) width *= 2;
  b.max_blocks_per_seq = int32_t(width);
  b.block_table.clear();
  for (const auto* t : tables) {
    b.block_table.insert(b.block_table.end(), t->begin(), t->end());
    b.block_table.resize(b.block_table.size() + width - t->size(), t->empty() ? 0 : t->back());
  }
}

}  // namespace

void Engine::mtp_forget(const Sequence& seq) {
  for (MtpKept& k : mtp_kept_)
    if (k.seq == &seq) k.seq = nullptr;
}

void Engine::mtp_flush() {
  if (mtp_kept_.empty()) return;
  ops::BatchMeta& b = mtp_batch_;
  b = ops::BatchMeta{};
  b.block_size = blocks_->block_size();
  std::vector<int32_t> h_rows;
  std::vector<const std::vector<int32_t>*> tables;
  // Each sequence's kept rows (consecutive positions, one a decode step) as one chunk, in
  // the order the sequences first appear; a gap (none is expected) would start another.
  std::unordered_map<const Sequence*, size_t> group_of;
  std::vector<std::vector<int32_t>> groups;  // indices into mtp_kept_
  for (size_t i = 0; i < mtp_kept_.size(); ++i) {
    if (mtp_kept_[i].seq == nullptr) continue;
    const auto [it, added] = group_of.try_emplace(mtp_kept_[i].seq, groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(int32_t(i));
  }
  for (const std::vector<int32_t>& group : groups) {
    int32_t last = -2;
    for (int32_t i : group) {
      const MtpKept& k = mtp_kept_[size_t(i)];
      if (k.pos != last + 1) {
        if (last >= 0) b.context_len.push_back(last + 1);
        b.q_start.push_back(b.n_tokens());
        tables.push_back(&k.seq->table.blocks);
      }
      last = k.pos;
      b.token_ids.push_back(k.token);
      b.positions.push_back(k.pos);
      b.slot_mapping.push_back(k.slot);
      h_rows.push_back(i);
    }
    b.context_len.push_back(last + 1);
  }
  stats_.mtp_deferred_rows += int64_t(mtp_kept_.size());
  mtp_kept_.clear();
  if (b.n_tokens() == 0) return;
  ++stats_.mtp_flushes;
  b.logit_rows.push_back(b.n_tokens() - 1);  // (one: nothing is drafted from these rows)
  fill_block_table(b, tables);
  b.q_start.push_back(b.n_tokens());
  Result<Tensor> logits = runner_->mtp_forward(b, h_rows, ModelRunner::MtpInput::kKept, kv_);
  if (!logits.ok()) {
    KILN_LOG(kError, "MTP step failed: " << logits.status().to_string());
    throw EngineFailure(logits.status().to_string());
  }
}

void Engine::mtp_drafts(const std::vector<StepBatch::Rows>& rows) {
  const int32_t bs = blocks_->block_size();
  // The sequences that decode next, and how deep the depth policy may draft for them
  // (runtime/adaptive_depth.h).
  const int32_t n_decoding = int32_t(std::count_if(rows.begin(), rows.end(), [](const StepBatch::Rows& r) {
    return r.seq->state == SeqState::kRunning && r.seq->n_uncomputed() == 1;
  }));
  const int32_t k = n_decoding > 0 ? depth_->plan_drafts(n_decoding) : 0;
  // Speculation off at this batch size, where the depth policy's governor found it losing
  // (not its trial windows: holes there would cost where speculation wins), above
  // kMtpSkipAbove sequences: the MTP layer does not run at all (its KV gets holes at these
  // positions: drafts read them later, outputs never do), since even deferred passes cost
  // several percent of a small model's steps there. At fewer sequences the passes stay
  // deferred (one pass over the kept rows whenever the pending buffer, sized for
  // max_num_seqs x mtp_deferred_steps rows, fills; its cost there was not measured apart):
  // with holes, the governor's refresh windows saw drafts of a damaged cache lose, and one
  // stream, turned off by a slow first window, never turned back on (H200, 2026-11-29).
  // 8: the MTP demo model's K = 3 still pays at one stream and is near even at 8; the
  // threshold was not tuned further.
  constexpr int32_t kMtpSkipAbove = 8;
  if (k == 0 && n_decoding > kMtpSkipAbove && depth_->speculation_off(n_decoding)) {
    mtp_flush();  // what earlier steps kept (once, as speculation turns off)
    for (const StepBatch::Rows& r : rows) {
      r.seq->mtp_draft.clear();
      r.seq->mtp_draft_at = -1;
    }
    return;
  }
  // No drafts wanted after a decode step (every sequence one row, row i its i-th): its
  // hidden rows are kept for later (one copy), each sequence's next MTP pass runs them.
  const bool decode_shaped = std::all_of(rows.begin(), rows.end(), [&](const StepBatch::Rows& r) {
    return r.n_rows == 1 && r.first_row == int32_t(&r - rows.data());
  });
  const int32_t n_seqs = int32_t(rows.size());
  if (k == 0 && decode_shaped && n_seqs > 0 && n_seqs <= runner_->mtp_pending_rows()) {
    if (int32_t(mtp_kept_.size()) + n_seqs > runner_->mtp_pending_rows()) mtp_flush();
    const Status kept = runner_->mtp_keep(n_seqs, int32_t(mtp_kept_.size()));
    if (!kept.ok()) {
      KILN_LOG(kError, "MTP step failed: " << kept.to_string());
      throw EngineFailure(kept.to_string());
    }
    for (const StepBatch::Rows& r : rows) {
      Sequence& seq = *r.seq;
      seq.mtp_draft.clear();
      seq.mtp_draft_at = -1;
      const bool stands = seq.state == SeqState::kRunning && seq.n_computed > r.first_pos;
      const int32_t p = r.first_pos;
      mtp_kept_.push_back(stands ? MtpKept{.seq = &seq, .pos = p, .token = seq.tokens[size_t(p + 1)],
                                           .slot = seq.table.blocks[size_t(p / bs)] * bs + p % bs}
                                 : MtpKept{});
    }
    return;
  }
  mtp_flush();
  ops::BatchMeta& b = mtp_batch_;
  b = ops::BatchMeta{};
  b.block_size = bs;
  std::vector<int32_t> h_rows;
  std::vector<const std::vector<int32_t>*> tables;
  // A uniform step (every sequence R <= 8 rows in order: decode steps, R = 1, and uniform
  // verify steps) runs as it was: all its rows, row r reading hidden row r, every row a logit
  // row; the rows it did not keep (rejected drafts) and those of a sequence that ended in
  // it are padding (nothing stored, their logits unused). So the MTP step has the step's
  // shape and a GPU backend replays a recording of it. Other steps run the kept rows only.
  const int32_t R = rows.empty() ? 0 : rows[0].n_rows;
  bool uniform = R >= 1 && R <= 8;  // (a prefill chunk's rows would all be logit rows)
  for (size_t i = 0; i < rows.size() && uniform; ++i)
    uniform = rows[i].n_rows == R && rows[i].first_row == int32_t(i) * R;
  // A running sequence's rows, the padding rows' model (none: nothing to run).
  const auto it = std::find_if(rows.begin(), rows.end(), [](const StepBatch::Rows& r) {
    return r.seq->state == SeqState::kRunning && r.seq->n_computed > r.first_pos;
  });
  if (it == rows.end()) return;
  const StepBatch::Rows* live = &*it;
  struct Drafter {
    Sequence* seq;
    int32_t row;    // its batch row (the MTP output's row, which chains on)
    int32_t logit;  // its index in the logits
  };
  std::vector<Drafter> drafters;
  for (const StepBatch::Rows& r : rows) {
    Sequence& seq = *r.seq;
    // The step's rows of this sequence that stand: those now below n_computed.
    const int32_t kept = seq.state == SeqState::kRunning ? std::min(r.n_rows, seq.n_computed - r.first_pos) : 0;
    if (kept <= 0 && !uniform) continue;
    KILN_CHECK_LT(r.first_pos + kept, seq.n_tokens()) << "mtp: a kept position without its next token";
    const StepBatch::Rows& at = kept > 0 ? r : *live;  // a sequence that ended: padding like the live one's rows
    const int32_t n = uniform ? R : kept;
    b.q_start.push_back(b.n_tokens());
    b.context_len.push_back(at.first_pos + n);
    tables.push_back(&at.seq->table.blocks);
    for (int32_t j = 0; j < n; ++j) {
      const int32_t p = at.first_pos + j;
      const bool keep = j < kept;
      // Row p's token is x_{p+1}; a padding row's any token of the sequence.
      b.token_ids.push_back(at.seq->tokens[size_t(keep ? p + 1 : at.first_pos + 1)]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(keep ? seq.table.blocks[size_t(p / bs)] * bs + p % bs : ops::kPadSlot);
      h_rows.push_back(r.first_row + j);
      if (uniform) b.logit_rows.push_back(b.n_tokens() - 1);
    }
    if (kept <= 0) continue;
    seq.mtp_draft.clear();
    seq.mtp_draft_at = -1;
    if (seq.n_uncomputed() == 1) {  // decoding: its last kept row drafts
      const int32_t row = b.n_tokens() - n + kept - 1;
      if (!uniform) b.logit_rows.push_back(row);
      drafters.push_back({.seq = &seq, .row = row, .logit = uniform ? row : int32_t(b.logit_rows.size()) - 1});
    }
  }
  if (b.n_tokens() == 0) return;
  // A decode-shaped batch (one row per sequence, each drafting) is padded as decode steps
  // are (build_step_batch): few shapes, so a GPU backend replays recordings of them
  // (model::CausalLM::mtp_forward).
  const auto pad_decode_shape = [&] {
    const int32_t n = b.n_tokens();
    if (n != b.n_seqs() || int32_t(b.logit_rows.size()) != n) return;
    bool identity = true;
    for (int32_t r = 0; r < n; ++r) identity = identity && h_rows[size_t(r)] == r;
    for (int32_t r = n; r < decode_bucket(n); ++r) {  // padding rows: the first row again, nothing stored
      b.q_start.push_back(r);
      b.context_len.push_back(b.context_len[0]);
      tables.push_back(tables[0]);
      b.token_ids.push_back(b.token_ids[0]);
      b.positions.push_back(b.positions[0]);
      b.slot_mapping.push_back(ops::kPadSlot);
      b.logit_rows.push_back(r);
      h_rows.push_back(identity ? r : h_rows[0]);
    }
  };
  pad_decode_shape();
  fill_block_table(b, tables);
  b.q_start.push_back(b.n_tokens());
  const auto run = [&](ModelRunner::MtpInput from, bool drafts) {
    Result<Tensor> logits = runner_->mtp_forward(b, h_rows, from, kv_);
    if (!logits.ok()) {
      KILN_LOG(kError, "MTP step failed: " << logits.status().to_string());
      throw EngineFailure(logits.status().to_string());
    }
    return drafts ? argmax_rows(*backend_, *logits) : std::vector<int32_t>{};
  };
  if (k == 0) {  // the KV of the kept positions only
    run(ModelRunner::MtpInput::kStep, false);
    return;
  }
  std::vector<int32_t> ids = run(ModelRunner::MtpInput::kStep, true);
  std::vector<Sequence*> decoding;  // the drafting sequences, and their rows of the last MTP step
  std::vector<int32_t> prev_rows;
  for (const Drafter& d : drafters) {
    d.seq->mtp_draft = {ids[size_t(d.logit)]};
    d.seq->mtp_draft_at = d.seq->n_tokens();
    decoding.push_back(d.seq);
    prev_rows.push_back(d.row);
  }
  // Chained drafts: one row per decoding sequence that may use another, at its next
  // position (its block allocated now if need be; none free: its drafts stop here).
  for (int32_t depth = 2; depth <= k && !decoding.empty(); ++depth) {
    b = ops::BatchMeta{};
    b.block_size = bs;
    h_rows.clear();
    tables.clear();
    std::vector<Sequence*> next;
    for (size_t i = 0; i < decoding.size(); ++i) {
      Sequence& seq = *decoding[i];
      const Request& r = *seq.request;
      const int64_t can_emit = std::min<int64_t>(r.max_tokens - seq.n_generated(), max_model_len_ - seq.n_tokens());
      if (depth > can_emit - 1) continue;
      const int32_t p = seq.n_computed + depth - 2;  // the position of d_{depth - 1}
      const int32_t need = blocks_->blocks_needed(seq.table, p + 1);
      if (need > 0) {
        if (!blocks_->can_allocate(need)) continue;
        blocks_->allocate(seq.table, {}, p + 1);
      }
      b.q_start.push_back(b.n_tokens());
      b.context_len.push_back(p + 1);
      tables.push_back(&seq.table.blocks);
      b.token_ids.push_back(seq.mtp_draft.back());
      b.positions.push_back(p);
      b.slot_mapping.push_back(seq.table.blocks[size_t(p / bs)] * bs + p % bs);
      b.logit_rows.push_back(b.n_tokens() - 1);
      h_rows.push_back(prev_rows[i]);
      next.push_back(&seq);
    }
    if (next.empty()) break;
    pad_decode_shape();
    fill_block_table(b, tables);
    b.q_start.push_back(b.n_tokens());
    ids = run(ModelRunner::MtpInput::kChain, true);
    for (size_t i = 0; i < next.size(); ++i) next[i]->mtp_draft.push_back(ids[i]);
    prev_rows.assign(b.logit_rows.begin(), b.logit_rows.end());
    decoding = std::move(next);
  }
}

Result<std::vector<std::vector<float>>> Engine::mtp_logits(const std::vector<int32_t>& prompt) {
  if (!runner_->mtp_enabled()) return invalid_argument("mtp_logits: the engine has no MTP layer (--speculative-method mtp)");
  KILN_RETURN_IF_ERROR(check_prompt(prompt, 0));
  const int32_t n = int32_t(prompt.size());
  BlockTable table;
  if (!blocks_->can_allocate(blocks_->blocks_needed(table, n))) return Status(StatusCode::kResourceExhausted, "KV cache full");
  blocks_->allocate(table, {}, n);
  const int32_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk : n;
  std::vector<std::vector<float>> out;
  for (int32_t begin = 0; begin < n; begin += chunk) {
    const int32_t end = std::min(n, begin + chunk);
    const std::span<const int32_t> all(prompt);
    forward(one_sequence_batch(table, all.subspan(size_t(begin), size_t(end - begin)), begin, false));
    // The MTP layer over this chunk's positions that have a next token: row t the token t + 1.
    const int32_t last = std::min(end, n - 1);
    if (last <= begin) break;
    mtp_batch_ = one_sequence_batch(table, all.subspan(size_t(begin + 1), size_t(last - begin)), begin, true);
    const ops::BatchMeta& m = mtp_batch_;
    std::vector<int32_t> h_rows(size_t(last - begin));
    for (size_t r = 0; r < h_rows.size(); ++r) h_rows[r] = int32_t(r);
    KILN_ASSIGN_OR_RETURN(const Tensor logits, runner_->mtp_forward(m, h_rows, ModelRunner::MtpInput::kStep, kv_));
    std::vector<float> flat(size_t(logits.numel()));
    backend_->to_host_f32(logits, flat.data());
    const size_t vocab = size_t(config_.vocab_size);
    for (int32_t r = 0; r < last - begin; ++r)
      out.emplace_back(flat.begin() + long(size_t(r) * vocab), flat.begin() + long(size_t(r + 1) * vocab));
  }
  blocks_->free(table);
  return out;
}

}  // namespace kiln::runtime
