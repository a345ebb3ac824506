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
//     speculation losing at the batch size, or drafts cannot pay there at all, the MTP
//     layer does not run: its KV has holes at those positions, which later drafts read
//     (their quality, never the output).
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

void Engine::mtp_forget(Sequence& seq) {
  for (MtpKept& k : mtp_kept_)
    if (k.seq == &seq) k.seq = nullptr;
  if (seq.mtp_device_slot >= 0) {  // its drafts on the device are no one's now
    KILN_CHECK_LT(size_t(seq.mtp_device_slot), mtp_on_device_.size()) << "mtp: a draft slot without drafts";
    mtp_on_device_[size_t(seq.mtp_device_slot)] = nullptr;
    seq.mtp_device_slot = -1;
    seq.mtp_draft.clear();
    seq.mtp_draft_at = -1;
  }
}

void Engine::mtp_mark_device_drafts(ops::BatchMeta& b, const std::vector<StepBatch::Verify>& verify) const {
  if (mtp_on_device_.empty()) return;
  const size_t n_slots = mtp_on_device_.size();
  for (const StepBatch::Verify& v : verify) {
    const int32_t slot = v.seq->mtp_device_slot;
    if (slot < 0) continue;
    if (b.device_token_rows.empty()) b.device_token_rows.assign(size_t(b.n_tokens()), -1);
    for (int32_t j = 0; j < v.n_draft; ++j)  // its rows [last, d1 .. dk]: d_{j+1} from draft row j
      b.device_token_rows[size_t(v.first_row + 1 + j)] = int32_t(size_t(j) * n_slots + size_t(slot));
  }
  if (!b.device_token_rows.empty()) b.device_tokens = runner_->mtp_draft_ids();
}

void Engine::mtp_fetch() {
  if (mtp_on_device_.empty()) return;
  const size_t n_slots = mtp_on_device_.size();
  const std::vector<int32_t> ids = runner_->mtp_read_drafts(mtp_on_device_depths_, int32_t(n_slots));
  for (size_t i = 0; i < n_slots; ++i) {
    Sequence* seq = mtp_on_device_[i];
    if (seq == nullptr) continue;
    for (size_t j = 0; j < seq->mtp_draft.size(); ++j) seq->mtp_draft[j] = ids[j * n_slots + i];
    // A draft proposed from them is their prefix (Engine::propose_drafts).
    for (size_t j = 0; j < seq->draft.size() && j < seq->mtp_draft.size(); ++j) seq->draft[j] = seq->mtp_draft[j];
    seq->mtp_device_slot = -1;
  }
  mtp_on_device_.clear();
  mtp_on_device_depths_ = 0;
}

void Engine::mtp_flush() {
  if (mtp_kept_.empty()) return;
  ops::BatchMeta& b = mtp_batch_;
  b = ops::BatchMeta{};
  b.block_size = blocks_->block_size();
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
      b.input_rows.push_back(i);
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
  Result<Tensor> logits = runner_->mtp_forward(b, ModelRunner::MtpInput::kKept, kv_);
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
  // Speculation settled off at this batch size, above kMtpSkipAbove sequences: where the
  // depth policy's governor found it losing (not its trial windows: holes there would cost
  // where speculation wins), or where the governor has it on but the estimates choose no
  // drafts (AdaptiveDepth::speculation_idle; probes aside, which plan_drafts plans), the
  // MTP layer does not run at all (its KV gets holes at these positions: drafts read
  // them later, outputs never do), since even deferred passes cost several percent of a
  // small model's steps there. (With deferred passes while the estimates chose no drafts,
  // "on" cost more than "off" and the governor, whose windows vary by 10-50% at 32-128
  // streams, could not tell them apart: the MTP demo model at 32 streams served 0.87x
  // the tokens a second of decoding without drafts in a run whose estimates chose depth 0
  // through most "on" windows, H200, 2026-11-29, docs/perf/speculative.md.) The holes make
  // a refresh window of "on" draft at its worst, so an "off" verdict tends to stay;
  // deferring the passes until an "off" verdict had held through two refresh windows cost
  // more than that (the demo model's 32-128-stream levels 0.90-0.95x against 0.99-1.00x,
  // H200, sixteenth session, docs/perf/speculative.md). At fewer sequences the passes stay
  // deferred (one pass over the kept rows whenever the pending buffer, sized for
  // max_num_seqs x mtp_deferred_steps rows, fills): one stream, turned off by a slow first
  // window, never turned back on with holes (H200, 2026-11-29).
  // 8: the MTP demo model's K = 3 still pays at one stream and is near even at 8; the
  // threshold was not tuned further.
  // Where the cost line says drafts cannot pay whatever their quality (speculation_hopeless:
  // a compute-bound backend, where a verified row costs about what a decoded one does), the
  // passes are skipped at any batch size: a deferred pass there costs the MTP layer's share
  // of every token. (This VM's CPU reference is not that at one stream: a verify step of 4
  // rows took ~1.2-1.5x a decode step, sixteenth session.)
  constexpr int32_t kMtpSkipAbove = 8;
  if (k == 0 && ((n_decoding > kMtpSkipAbove && depth_->speculation_idle(n_decoding)) ||
                 depth_->speculation_hopeless(n_decoding))) {
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
  std::vector<const std::vector<int32_t>*> tables;
  // A uniform step (sequence i's rows from row i R, R <= 8: decode steps, R = 1, and verify
  // steps build_step_batch padded, R the most rows a sequence has) runs as it was: R rows a
  // sequence, row r reading hidden row r, one logit row per sequence (its last kept row, or
  // any); the rows it did not keep (rejected drafts, padding) and those of a sequence that
  // ended in it are padding (nothing stored). So the MTP step has the step's shape and a GPU
  // backend replays a recording of it. Other steps run the kept rows only, with a logit row
  // per drafting sequence.
  int32_t R = 0;
  for (const StepBatch::Rows& r : rows) R = std::max(R, r.n_rows);
  bool uniform = R >= 1 && R <= 8;  // (a prefill chunk's rows would all be logit rows)
  for (size_t i = 0; i < rows.size() && uniform; ++i) uniform = rows[i].first_row == int32_t(i) * R;
  // A running sequence's rows, the padding rows' model (none: nothing to run).
  const auto it = std::find_if(rows.begin(), rows.end(), [](const StepBatch::Rows& r) {
    return r.seq->state == SeqState::kRunning && r.seq->n_computed > r.first_pos;
  });
  if (it == rows.end()) return;
  const StepBatch::Rows* live = &*it;
  // Logit row i of this pass is slot i of every chained pass: its drafting sequence, or
  // none (padding).
  std::vector<Sequence*> slots;
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
      b.input_rows.push_back(r.first_row + std::min(j, r.n_rows - 1));  // (a padding row: any of its rows)
    }
    if (kept > 0) {
      seq.mtp_draft.clear();
      seq.mtp_draft_at = -1;
    }
    const bool drafts = kept > 0 && seq.n_uncomputed() == 1;  // decoding: its last kept row drafts
    if (drafts || uniform) {
      b.logit_rows.push_back(b.n_tokens() - n + std::max(kept, 1) - 1);
      slots.push_back(drafts ? &seq : nullptr);
    }
  }
  if (b.n_tokens() == 0) return;
  // A uniform batch of R > 1 rows a sequence (after a verify step) is padded to
  // decode_bucket(n) sequences of R padding rows, as build_step_batch pads the verify
  // step, within the step's row budget: each padding row repeats the first sequence's row
  // (its hidden row too), stores nothing, and its sequence has a logit row (no slot).
  if (uniform && R > 1 && b.n_seqs() > 0 && b.n_tokens() == b.n_seqs() * R &&
      int64_t(decode_bucket(b.n_seqs())) * R <= scheduler_->config().max_num_batched_tokens) {
    for (int32_t s = b.n_seqs(), n = decode_bucket(b.n_seqs()); s < n; ++s) {
      b.q_start.push_back(b.n_tokens());
      b.context_len.push_back(b.context_len[0]);
      tables.push_back(tables[0]);
      for (int32_t j = 0; j < R; ++j) {
        b.token_ids.push_back(b.token_ids[size_t(j)]);
        b.positions.push_back(b.positions[size_t(j)]);
        b.slot_mapping.push_back(ops::kPadSlot);
        b.input_rows.push_back(b.input_rows[size_t(j)]);
      }
      b.logit_rows.push_back(b.n_tokens() - 1);
      slots.push_back(nullptr);
    }
  }
  // A decode-shaped batch (one row per sequence) is padded as decode steps are
  // (build_step_batch): few shapes, so a GPU backend replays recordings of them
  // (model::CausalLM::mtp_forward). Padding rows repeat the first row, store nothing.
  if (b.n_tokens() == b.n_seqs()) {
    bool identity = true;
    for (int32_t r = 0; r < b.n_tokens(); ++r) identity = identity && b.input_rows[size_t(r)] == r;
    for (int32_t r = b.n_tokens(); r < decode_bucket(b.n_seqs()); ++r) {
      b.q_start.push_back(r);
      b.context_len.push_back(b.context_len[0]);
      tables.push_back(tables[0]);
      b.token_ids.push_back(b.token_ids[0]);
      b.positions.push_back(b.positions[0]);
      b.slot_mapping.push_back(ops::kPadSlot);
      b.input_rows.push_back(identity ? r : b.input_rows[0]);  // (a decode step's padded rows are there)
    }
  }
  if (b.logit_rows.empty()) {  // nothing drafts (prompt chunks): the KV of the kept positions only
    b.logit_rows.push_back(b.n_tokens() - 1);
    slots.push_back(nullptr);
  }
  // Logit rows (the chained passes' slots) to a decode bucket too.
  const int32_t n_slots = decode_bucket(int32_t(b.logit_rows.size()));
  while (int32_t(b.logit_rows.size()) < n_slots) {
    b.logit_rows.push_back(b.logit_rows[0]);
    slots.push_back(nullptr);
  }
  fill_block_table(b, tables);
  b.q_start.push_back(b.n_tokens());
  const auto run = [&](ModelRunner::MtpInput from, int tokens_from_depth) {
    Result<Tensor> logits = runner_->mtp_forward(b, from, kv_, tokens_from_depth);
    if (!logits.ok()) {
      KILN_LOG(kError, "MTP step failed: " << logits.status().to_string());
      throw EngineFailure(logits.status().to_string());
    }
    return *logits;
  };
  if (k == 0 || std::none_of(slots.begin(), slots.end(), [](const Sequence* q) { return q != nullptr; })) {
    // the KV of the kept positions only
    run(ModelRunner::MtpInput::kStep, -1);
    return;
  }
  mtp_fetch();  // (the last drafts, if still on the device: this pass overwrites them)
  // Draft d_j of slot i is draft row j - 1's entry i (ModelRunner::mtp_argmax). With one
  // rank a chained pass reads its tokens where the previous pass's argmax left them, so the
  // passes queue back to back and the drafts come back once; with several, each pass's
  // drafts come to the host and go out in the next batch.
  const bool on_device = runner_->world() == 1 && options_.mtp_chain_on_device;
  runner_->mtp_argmax(run(ModelRunner::MtpInput::kStep, -1), 0);
  // depth_of[i]: the drafts slot i has.
  std::vector<int32_t> depth_of(slots.size(), 0);
  for (size_t i = 0; i < slots.size(); ++i) depth_of[i] = slots[i] != nullptr ? 1 : 0;
  std::vector<int32_t> host_ids;  // several ranks: the drafts so far
  int32_t depths = 1;
  // Chained drafts: row i continues slot i at its next position (its block allocated now
  // if need be; none free, or no more tokens to emit: its drafts stop here, and its row
  // becomes padding).
  for (int32_t depth = 2; depth <= k; ++depth) {
    b = ops::BatchMeta{};
    b.block_size = bs;
    tables.clear();
    if (!on_device) host_ids = runner_->mtp_read_drafts(depths, n_slots);
    int32_t model = -1;  // a row that drafts: the padding rows' model
    for (size_t i = 0; i < slots.size(); ++i) {
      Sequence* seq = slots[i];
      if (seq == nullptr || depth_of[i] != depth - 1) continue;
      const Request& r = *seq->request;
      const int64_t can_emit = std::min<int64_t>(r.max_tokens - seq->n_generated(), max_model_len_ - seq->n_tokens());
      if (depth > can_emit - 1) continue;
      const int32_t p = seq->n_computed + depth - 2;  // the position of d_{depth - 1}
      const int32_t need = blocks_->blocks_needed(seq->table, p + 1);
      if (need > 0) {
        if (!blocks_->can_allocate(need)) continue;
        blocks_->allocate(seq->table, {}, p + 1);
      }
      depth_of[i] = depth;
      if (model < 0) model = int32_t(i);
    }
    if (model < 0) break;
    for (size_t i = 0; i < slots.size(); ++i) {
      const bool real = depth_of[i] == depth;
      Sequence& seq = *slots[size_t(real ? int32_t(i) : model)];
      const int32_t p = seq.n_computed + depth - 2;
      b.q_start.push_back(b.n_tokens());
      b.context_len.push_back(p + 1);
      tables.push_back(&seq.table.blocks);
      b.token_ids.push_back(on_device ? 0 : host_ids[size_t(depth - 2) * size_t(n_slots) + (real ? i : size_t(model))]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(real ? seq.table.blocks[size_t(p / bs)] * bs + p % bs : ops::kPadSlot);
      b.logit_rows.push_back(int32_t(i));
      b.input_rows.push_back(int32_t(i));
    }
    fill_block_table(b, tables);
    b.q_start.push_back(b.n_tokens());
    runner_->mtp_argmax(run(ModelRunner::MtpInput::kChain, on_device ? depth - 2 : -1), depth - 1);
    ++stats_.mtp_chained_passes;
    depths = depth;
  }
  // With one rank the drafts stay on the device: the next verify step reads them there,
  // so it is queued without waiting for them (mtp_fetch reads them back after that).
  const std::vector<int32_t> ids = on_device ? std::vector<int32_t>{} : runner_->mtp_read_drafts(depths, n_slots);
  if (on_device) {
    mtp_on_device_.assign(slots.size(), nullptr);
    mtp_on_device_depths_ = depths;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] == nullptr) continue;
    Sequence& seq = *slots[i];
    for (int32_t j = 0; j < depth_of[i]; ++j) seq.mtp_draft.push_back(on_device ? 0 : ids[size_t(j) * size_t(n_slots) + i]);
    seq.mtp_draft_at = seq.n_tokens();
    if (on_device) {
      seq.mtp_device_slot = int32_t(i);
      mtp_on_device_[i] = &seq;
    }
  }
  ++stats_.mtp_draft_steps;
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
    mtp_batch_.input_rows.resize(size_t(last - begin));
    for (size_t r = 0; r < mtp_batch_.input_rows.size(); ++r) mtp_batch_.input_rows[r] = int32_t(r);
    KILN_ASSIGN_OR_RETURN(const Tensor logits, runner_->mtp_forward(m, ModelRunner::MtpInput::kStep, kv_));
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
