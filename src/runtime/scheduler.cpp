#include "runtime/scheduler.h"

#include <algorithm>
#include <unordered_set>

#include "core/check.h"

namespace kiln::runtime {

void Scheduler::add(Sequence* seq) {
  seq->state = SeqState::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::remove(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) waiting_.erase(it);
}

void Scheduler::preempt(Sequence* seq, BlockManager& blocks, Schedule& out) {
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  blocks.free(seq->table);
  seq->n_computed = 0;
  seq->draft.clear();
  seq->state = SeqState::kWaiting;
  // Preempted newest first, so each goes in front of the later ones: oldest first again.
  waiting_.push_front(seq);
  out.preempted.push_back(seq);
  ++preemptions_;
}

Schedule Scheduler::schedule(BlockManager& blocks) {
  Schedule out;
  int32_t budget = config_.max_num_batched_tokens;
  auto cap = [&](int32_t n) {
    n = std::min(n, budget);
    return config_.max_prefill_chunk > 0 ? std::min(n, config_.max_prefill_chunk) : n;
  };
  // Recurrent models: chunk ends on block boundaries (SchedulerConfig::align_prefill_to_blocks).
  auto align = [&](const Sequence* s, int32_t start, int32_t n) {
    if (!config_.align_prefill_to_blocks) return n;
    const int32_t bs = blocks.block_size(), end = start + n, total = s->n_tokens();
    const int32_t last_full = (total - 1) / bs * bs;  // a later prefix match ends here at most
    if (start < last_full && end > last_full) return last_full - start;
    if (end < total && end / bs * bs > start) return end / bs * bs - start;
    return n;
  };
  std::unordered_set<const Sequence*> scheduled;
  auto take = [&](Sequence* s, int32_t n_new) {
    out.seqs.push_back({s, n_new});
    out.n_tokens += n_new;
    budget -= n_new;
    scheduled.insert(s);
  };

  // 1. Decoding sequences first (one token each), so a long prefill never stalls them.
  //    Without room, the newest running sequence makes way.
  int32_t decoding_left = 0;  // decoding sequences not yet scheduled: one token each first
  for (const Sequence* s : running_) decoding_left += s->n_uncomputed() == 1 ? 1 : 0;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i];
    if (s->n_uncomputed() != 1) continue;
    --decoding_left;
    int32_t n_draft = std::min(int32_t(s->draft.size()), std::max(0, budget - 1 - decoding_left));
    // Drafts only with a block to spare for each later decoding sequence: they never
    // cause a preemption.
    if (n_draft > 0 && !blocks.can_allocate(blocks.blocks_needed(s->table, s->n_computed + 1 + n_draft) + decoding_left))
      n_draft = 0;
    const int32_t need = blocks.blocks_needed(s->table, s->n_computed + 1);
    bool self_preempted = false;
    while (!blocks.can_allocate(need)) {
      Sequence* victim = running_.back();
      preempt(victim, blocks, out);
      if (victim == s) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // s was the newest: everything after it is gone too
    blocks.allocate(s->table, {}, s->n_computed + 1 + n_draft);
    take(s, 1 + n_draft);
    out.seqs.back().n_draft = n_draft;
  }

  // 2. Running sequences still prefilling: their next chunk. The newest sequence not yet
  //    in this step makes way when blocks run out.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i];
    if (scheduled.count(s) != 0 || s->n_uncomputed() <= 1) continue;
    const int32_t n_new = align(s, s->n_computed, cap(s->n_uncomputed()));
    const int32_t need = blocks.blocks_needed(s->table, s->n_computed + n_new);
    while (!blocks.can_allocate(need) && running_.back() != s && scheduled.count(running_.back()) == 0)
      preempt(running_.back(), blocks, out);
    if (!blocks.can_allocate(need)) break;  // wait for scheduled sequences to free blocks
    blocks.allocate(s->table, {}, s->n_computed + n_new);
    take(s, n_new);
  }

  // 3. New sequences, first come first served, when nothing had to make way.
  if (!out.preempted.empty()) return out;
  while (!waiting_.empty() && int32_t(running_.size()) < config_.max_num_seqs && budget > 0) {
    Sequence* s = waiting_.front();
    if (s->wait_for != nullptr && !s->wait_for->prefilled()) break;
    // At least the last token is computed: its logits give the next token.
    PrefixMatch match = blocks.match_prefix(s->tokens, s->n_tokens() - 1);
    if (usable_prefix_ && !match.blocks.empty()) match = blocks.truncate(match, usable_prefix_(match));
    const int32_t n_new = align(s, match.n_tokens, cap(s->n_tokens() - match.n_tokens));
    const int32_t bs = blocks.block_size();
    const int32_t need = (match.n_tokens + n_new + bs - 1) / bs - int32_t(match.blocks.size()) + match.n_free;
    if (!blocks.can_allocate(need)) break;
    blocks.count_lookup(s->n_tokens(), match.n_tokens);
    blocks.allocate(s->table, match, match.n_tokens + n_new);
    s->n_computed = match.n_tokens;
    s->state = SeqState::kRunning;
    waiting_.pop_front();
    running_.push_back(s);
    take(s, n_new);
  }
  return out;
}

}  // namespace kiln::runtime
