// Scheduler (continuous batching, chunked prefill, preemption, cached-prefix admission)
// over hand-built Sequences, and the step batch built from its schedules. The engine is
// played by finish_step: the scheduled tokens are computed and committed, and a sequence
// that reached its end gets one more token.
#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/batch_builder.h"
#include "runtime/scheduler.h"

namespace kiln::runtime {
namespace {

constexpr int32_t kBs = 4;
constexpr int32_t kNextToken = 7;

class Sequences {
 public:
  Sequence* make(std::vector<int32_t> prompt) {
    auto r = std::make_shared<Request>(Request{.prompt = prompt});
    auto s = std::make_unique<Sequence>(next_id_++, 0, r, r->sampling);
    s->tokens = prompt;
    s->n_prompt = int32_t(prompt.size());
    all_.push_back(std::move(s));
    return all_.back().get();
  }
  Sequence* make(int32_t n_prompt, int32_t first = 1) {
    std::vector<int32_t> p(static_cast<size_t>(n_prompt));
    std::iota(p.begin(), p.end(), first);
    return make(p);
  }

 private:
  uint64_t next_id_ = 1;
  std::vector<std::unique_ptr<Sequence>> all_;
};

void finish_step(const Schedule& s, BlockManager& bm) {
  for (const ScheduledSeq& x : s.seqs) {
    x.seq->n_computed += x.n_new;
    bm.commit(x.seq->table, x.seq->tokens, x.seq->n_computed);
    if (x.seq->n_computed == x.seq->n_tokens()) x.seq->tokens.push_back(kNextToken);
  }
}

// The scheduled (sequence, n_new) pairs, in order.
std::vector<std::pair<Sequence*, int32_t>> pairs(const Schedule& s) {
  std::vector<std::pair<Sequence*, int32_t>> out;
  for (const ScheduledSeq& x : s.seqs) out.emplace_back(x.seq, x.n_new);
  return out;
}
using P = std::vector<std::pair<Sequence*, int32_t>>;

TEST(Scheduler, AdmitsFirstComeFirstServed) {
  BlockManager bm(64, kBs, false);
  Scheduler sched({});
  Sequences q;
  Sequence *a = q.make(5), *b = q.make(3), *c = q.make(8);
  for (Sequence* s : {a, b, c}) sched.add(s);
  EXPECT_EQ(a->state, SeqState::kWaiting);
  const Schedule s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 5}, {b, 3}, {c, 8}}));
  EXPECT_EQ(s.n_tokens, 16);
  EXPECT_FALSE(s.decode_only());
  EXPECT_EQ(sched.running(), (std::vector<Sequence*>{a, b, c}));
  EXPECT_TRUE(sched.waiting().empty());
  EXPECT_EQ(a->state, SeqState::kRunning);
  EXPECT_EQ(a->table.blocks.size(), 2u);
  EXPECT_EQ(b->table.blocks.size(), 1u);
  EXPECT_EQ(c->table.blocks.size(), 2u);
  EXPECT_EQ(bm.n_used(), 5) << "blocks for every scheduled token are allocated";
}

TEST(Scheduler, RespectsMaxNumSeqs) {
  BlockManager bm(64, kBs, false);
  Scheduler sched({.max_num_seqs = 2});
  Sequences q;
  Sequence *a = q.make(5), *b = q.make(3), *c = q.make(2);
  for (Sequence* s : {a, b, c}) sched.add(s);
  Schedule s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 5}, {b, 3}}));
  EXPECT_EQ(sched.waiting().front(), c);
  finish_step(s, bm);
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 1}, {b, 1}})) << "no free seat for c";
  finish_step(s, bm);
  sched.remove(a);  // a finished
  bm.free(a->table);
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{b, 1}, {c, 2}}));
  EXPECT_TRUE(sched.waiting().empty());
}

TEST(Scheduler, RespectsTheTokenBudgetByChunkingTheLastAdmittedPrompt) {
  BlockManager bm(64, kBs, false);
  Scheduler sched({.max_num_batched_tokens = 10});
  Sequences q;
  Sequence *a = q.make(6), *b = q.make(6), *c = q.make(2);
  for (Sequence* s : {a, b, c}) sched.add(s);
  Schedule s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 6}, {b, 4}})) << "b gets the 4 tokens left; c waits";
  EXPECT_EQ(s.n_tokens, 10);
  EXPECT_EQ(b->table.blocks.size(), 1u) << "blocks for the chunk only";
  EXPECT_EQ(sched.waiting().size(), 1u);
  finish_step(s, bm);
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 1}, {b, 2}, {c, 2}}));
  EXPECT_EQ(s.n_tokens, 5);
}

TEST(Scheduler, PrefillsALongPromptInChunksOverSeveralSteps) {
  for (const SchedulerConfig& cfg :
       {SchedulerConfig{.max_prefill_chunk = 8}, SchedulerConfig{.max_num_batched_tokens = 6, .max_prefill_chunk = 8}}) {
    BlockManager bm(64, kBs, false);
    Scheduler sched(cfg);
    Sequences q;
    Sequence* a = q.make(20);
    sched.add(a);
    const int32_t chunk = std::min(cfg.max_num_batched_tokens, cfg.max_prefill_chunk);
    std::vector<int32_t> chunks;
    for (int step = 0; step < 10 && !a->prefilled(); ++step) {
      const Schedule s = sched.schedule(bm);
      ASSERT_EQ(s.seqs.size(), 1u);
      chunks.push_back(s.seqs[0].n_new);
      const StepBatch batch = build_step_batch(s, kBs);
      EXPECT_EQ(batch.meta.positions.front(), a->n_computed) << "the chunk starts at the first uncomputed token";
      const bool last = a->n_computed + s.seqs[0].n_new == 20;
      EXPECT_EQ(batch.sampled.size(), last ? 1u : 0u) << "logits only when the prompt is done";
      EXPECT_EQ(batch.meta.logit_rows.size(), last ? 1u : 0u);
      finish_step(s, bm);
    }
    if (chunk == 8) EXPECT_EQ(chunks, (std::vector<int32_t>{8, 8, 4}));
    else EXPECT_EQ(chunks, (std::vector<int32_t>{6, 6, 6, 2}));
    EXPECT_EQ(a->table.blocks.size(), 5u) << "20 prompt tokens";
    EXPECT_TRUE(sched.schedule(bm).decode_only());
    EXPECT_EQ(a->table.blocks.size(), 6u) << "the first generated token's slot opens a block";
  }
}

TEST(Scheduler, SchedulesDecodesBeforePrefillChunks) {
  BlockManager bm(64, kBs, false);
  Scheduler sched({.max_num_batched_tokens = 6, .max_prefill_chunk = 4});
  Sequences q;
  Sequence *a = q.make(12), *b = q.make(2);
  sched.add(a);
  sched.add(b);
  Schedule s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 4}, {b, 2}}));
  finish_step(s, bm);
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{b, 1}, {a, 4}})) << "b, admitted later, decodes before a's next chunk";
  EXPECT_FALSE(s.decode_only());
  {
    const StepBatch batch = build_step_batch(s, kBs);
    ASSERT_EQ(batch.sampled.size(), 1u);
    EXPECT_EQ(batch.sampled[0], b);
    EXPECT_EQ(batch.meta.logit_rows, (std::vector<int32_t>{0}));
    EXPECT_EQ(batch.meta.q_start, (std::vector<int32_t>{0, 1, 5}));
    EXPECT_EQ(batch.meta.n_tokens(), 5) << "no padding outside decode-only steps";
  }
  finish_step(s, bm);
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{b, 1}, {a, 4}}));
  finish_step(s, bm);
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 1}, {b, 1}})) << "both decoding: oldest first";
  EXPECT_TRUE(s.decode_only());
  EXPECT_FALSE(Schedule{}.decode_only());
}

TEST(Scheduler, PreemptsTheNewestRunningSequenceWhenBlocksRunOut) {
  BlockManager bm(4, kBs, false);
  Scheduler sched({.max_num_seqs = 2});
  Sequences q;
  Sequence *a = q.make(7), *b = q.make(7, 50), *c = q.make(2, 90);
  for (Sequence* s : {a, b, c}) sched.add(s);
  Schedule s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 7}, {b, 7}}));
  EXPECT_EQ(bm.n_free(), 0);
  finish_step(s, bm);
  s = sched.schedule(bm);  // position 7: still in each second block
  EXPECT_EQ(pairs(s), (P{{a, 1}, {b, 1}}));
  finish_step(s, bm);

  s = sched.schedule(bm);  // position 8 needs a third block each: b makes way for a
  EXPECT_EQ(pairs(s), (P{{a, 1}}));
  EXPECT_EQ(s.preempted, (std::vector<Sequence*>{b}));
  EXPECT_EQ(sched.preemptions(), 1);
  EXPECT_EQ(b->state, SeqState::kWaiting);
  EXPECT_EQ(b->n_computed, 0) << "recomputed from scratch later";
  EXPECT_TRUE(b->table.blocks.empty());
  EXPECT_EQ(b->n_tokens(), 9) << "its generated tokens are kept";
  EXPECT_EQ(sched.waiting(), (std::deque<Sequence*>{b, c})) << "back at the front of the queue";
  EXPECT_EQ(sched.running(), (std::vector<Sequence*>{a}));
  // A free seat and a free block, enough for c: still nobody is admitted in this step.
  EXPECT_EQ(bm.n_free(), 1);
  EXPECT_EQ(a->table.blocks.size(), 3u);
  finish_step(s, bm);

  s = sched.schedule(bm);  // b needs 3 blocks, 1 is free: it waits, and c behind it
  EXPECT_EQ(pairs(s), (P{{a, 1}}));
  EXPECT_TRUE(s.preempted.empty());
  EXPECT_EQ(sched.waiting().size(), 2u);
  finish_step(s, bm);
  sched.remove(a);
  bm.free(a->table);
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{b, 9}, {c, 2}})) << "b recomputes its prompt and generated tokens, then c";
  EXPECT_EQ(b->n_computed, 0);
  EXPECT_EQ(bm.n_free(), 0);
}

TEST(Scheduler, AdmitsNothingInAStepThatPreempted) {
  BlockManager bm(4, kBs, false);
  Scheduler sched({.max_num_batched_tokens = 12, .max_prefill_chunk = 8});
  Sequences q;
  Sequence *p = q.make(20), *d = q.make(2, 40), *v = q.make(4, 60);
  for (Sequence* x : {p, d, v}) sched.add(x);
  Schedule s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{p, 8}, {d, 2}, {v, 2}})) << "v's first chunk is what the budget leaves";
  EXPECT_EQ(bm.n_free(), 0);
  finish_step(s, bm);
  // d decodes; p's next chunk needs 2 blocks: v (newest, not in this step) makes way, which
  // frees only 1, and d is in the step, so p waits. v would fit again, but is not re-admitted
  // in the step that preempted it.
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{d, 1}}));
  EXPECT_EQ(s.preempted, (std::vector<Sequence*>{v}));
  EXPECT_EQ(v->state, SeqState::kWaiting);
  EXPECT_EQ(sched.waiting(), (std::deque<Sequence*>{v}));
  EXPECT_EQ(sched.running(), (std::vector<Sequence*>{p, d}));
  EXPECT_EQ(bm.n_free(), 1);
  EXPECT_EQ(p->table.blocks.size(), 2u) << "p allocated nothing";
}

TEST(Scheduler, TheNewestSequencePreemptsItselfWhenOnlyItNeedsABlock) {
  BlockManager bm(3, kBs, false);
  Scheduler sched({});
  Sequences q;
  Sequence *a = q.make(6), *b = q.make(3, 40);
  sched.add(a);
  sched.add(b);
  Schedule s = sched.schedule(bm);
  EXPECT_EQ(bm.n_free(), 0);
  finish_step(s, bm);
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 1}, {b, 1}}));
  finish_step(s, bm);
  s = sched.schedule(bm);  // a: position 7 fits; b: position 4 needs a block
  EXPECT_EQ(pairs(s), (P{{a, 1}}));
  EXPECT_EQ(s.preempted, (std::vector<Sequence*>{b}));
  EXPECT_EQ(bm.n_free(), 1);
  EXPECT_EQ(a->table.blocks.size(), 2u) << "a was never touched";
}

TEST(Scheduler, AdmissionTakesTheCachedPrefixAndLeavesOneTokenToCompute) {
  BlockManager bm(32, kBs, true);
  Scheduler sched({});
  Sequences q;
  Sequence* a = q.make(12);
  sched.add(a);
  Schedule s = sched.schedule(bm);
  finish_step(s, bm);  // a: 12 computed (3 blocks cached), 13 tokens
  std::vector<int32_t> a8(a->tokens.begin(), a->tokens.begin() + 8);
  Sequence* same = q.make(std::vector<int32_t>(a->tokens.begin(), a->tokens.begin() + 12));
  Sequence* eight = q.make(a8);
  Sequence* longer = q.make(a->tokens);  // a's 13 tokens
  std::vector<int32_t> fork = a8;
  fork.insert(fork.end(), {200, 201, 202});
  Sequence* forked = q.make(fork);
  for (Sequence* x : {same, eight, longer, forked}) sched.add(x);
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{a, 1}, {same, 4}, {eight, 4}, {longer, 1}, {forked, 3}}));
  EXPECT_EQ(same->n_computed, 8) << "12 cached, at most 11 taken: whole blocks, so 8";
  EXPECT_EQ(eight->n_computed, 4);
  EXPECT_EQ(longer->n_computed, 12);
  EXPECT_EQ(forked->n_computed, 8);
  for (Sequence* x : {same, longer, forked}) {
    EXPECT_EQ(x->table.blocks[0], a->table.blocks[0]);
    EXPECT_EQ(x->table.blocks[1], a->table.blocks[1]);
  }
  EXPECT_EQ(longer->table.blocks[2], a->table.blocks[2]);
  EXPECT_NE(same->table.blocks[2], a->table.blocks[2]) << "the block it recomputes is its own";
  EXPECT_EQ(bm.prefix_queried_tokens(), 12 + 12 + 8 + 13 + 11);
  EXPECT_EQ(bm.prefix_hit_tokens(), 8 + 4 + 12 + 8);
}

TEST(Scheduler, SiblingSamplesWaitForTheFirstSampleToPrefill) {
  BlockManager bm(32, kBs, true);
  Scheduler sched({.max_prefill_chunk = 4});
  Sequences q;
  Sequence* s0 = q.make(9);
  Sequence* s1 = q.make(9);
  s1->wait_for = s0;
  Sequence* other = q.make(3, 100);
  for (Sequence* x : {s0, s1, other}) sched.add(x);
  for (int32_t step = 0; step < 2; ++step) {
    const Schedule s = sched.schedule(bm);
    EXPECT_EQ(pairs(s), (P{{s0, 4}})) << "step " << step << ": s1 waits, and the queue behind it";
    EXPECT_EQ(sched.waiting(), (std::deque<Sequence*>{s1, other}));
    finish_step(s, bm);
  }
  Schedule s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{s0, 1}}));
  finish_step(s, bm);
  ASSERT_TRUE(s0->prefilled());
  s = sched.schedule(bm);
  EXPECT_EQ(pairs(s), (P{{s0, 1}, {s1, 1}, {other, 3}}));
  EXPECT_EQ(s1->n_computed, 8) << "the prompt's full blocks come from s0";
  EXPECT_EQ(s1->table.blocks[0], s0->table.blocks[0]);
  EXPECT_EQ(s1->table.blocks[1], s0->table.blocks[1]);
}

TEST(DecodeBucket, IsAPowerOfTwoUpToEightThenAMultipleOfEight) {
  const std::pair<int32_t, int32_t> cases[] = {{1, 1}, {2, 2}, {3, 4}, {4, 4},   {5, 8},
                                               {8, 8}, {9, 16}, {16, 16}, {17, 24}, {33, 40}};
  for (auto [n, want] : cases) EXPECT_EQ(decode_bucket(n), want) << n;
}

// Three sequences (prompts of 9, 2 and 5 tokens) past their prefill step: decoding next.
struct ThreeDecoding {
  BlockManager bm{32, kBs, false};
  Scheduler sched{SchedulerConfig{}};
  Sequences q;
  Sequence* a = q.make(9);
  Sequence* b = q.make(2, 30);
  Sequence* c = q.make(5, 60);
  ThreeDecoding() {
    for (Sequence* x : {a, b, c}) sched.add(x);
    finish_step(sched.schedule(bm), bm);
  }
};

TEST(BuildStepBatch, PadsDecodeStepsWithPadSlotRowsAndPowerOfTwoBlockTables) {
  ThreeDecoding t;
  BlockManager& bm = t.bm;
  Scheduler& sched = t.sched;
  Sequence *a = t.a, *b = t.b, *c = t.c;
  const Schedule s = sched.schedule(bm);
  ASSERT_TRUE(s.decode_only());
  const StepBatch batch = build_step_batch(s, kBs);
  const ops::BatchMeta& m = batch.meta;
  EXPECT_EQ(batch.sampled, (std::vector<Sequence*>{a, b, c}));
  ASSERT_EQ(m.n_seqs(), 4) << "3 sequences padded to decode_bucket(3)";
  ASSERT_EQ(m.n_tokens(), 4);
  EXPECT_EQ(m.block_size, kBs);
  EXPECT_EQ(m.max_blocks_per_seq, 4) << "a holds 3 blocks: width 4";
  ASSERT_EQ(m.block_table.size(), 16u);
  EXPECT_EQ(m.positions, (std::vector<int32_t>{9, 2, 5, 9}));
  EXPECT_EQ(m.token_ids, (std::vector<int32_t>{kNextToken, kNextToken, kNextToken, kNextToken}));
  EXPECT_EQ(m.context_len, (std::vector<int32_t>{10, 3, 6, 10}));
  EXPECT_EQ(m.q_start, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  const Sequence* seqs[] = {a, b, c};
  for (int32_t r = 0; r < 3; ++r) {
    const std::vector<int32_t>& blocks = seqs[r]->table.blocks;
    for (int32_t i = 0; i < 4; ++i)
      EXPECT_EQ(m.block_table[size_t(r * 4 + i)], blocks[std::min(size_t(i), blocks.size() - 1)])
          << "row " << r << " entry " << i << ": padded with the last block";
    const int32_t pos = m.positions[size_t(r)];
    EXPECT_EQ(m.slot_mapping[size_t(r)], blocks[size_t(pos / kBs)] * kBs + pos % kBs) << "row " << r;
  }
  EXPECT_EQ(m.slot_mapping[3], ops::kPadSlot) << "a padding row stores nothing";
  EXPECT_EQ(m.logit_rows, (std::vector<int32_t>{0, 1, 2, 3})) << "the sampled rows first, then padding";
}

// A verify step in which every sequence verifies 2 drafts: 3 sequences padded to
// decode_bucket(3) = 4, the padding sequence 3 rows of padding (each a logit row: the
// step's shape is then a recorded one), no Verify or Rows entry for it; and not padded
// past the row budget, nor where the sequences' draft counts differ.
TEST(BuildStepBatch, PadsVerifyStepsOfOneDraftCountLikeDecodeSteps) {
  ThreeDecoding t;
  BlockManager& bm = t.bm;
  Scheduler& sched = t.sched;
  Sequence *a = t.a, *b = t.b, *c = t.c;
  for (Sequence* x : {a, b, c}) x->draft = {40, 41};
  const Schedule s = sched.schedule(bm);
  ASSERT_EQ(pairs(s), (P{{a, 3}, {b, 3}, {c, 3}}));
  ASSERT_EQ(verify_padding_drafts(s, false), 2);
  const StepBatch batch = build_step_batch(s, kBs, -1, /*max_rows=*/12);
  const ops::BatchMeta& m = batch.meta;
  ASSERT_EQ(m.n_seqs(), 4) << "3 sequences padded to decode_bucket(3)";
  ASSERT_EQ(m.n_tokens(), 12);
  EXPECT_EQ(m.q_start, (std::vector<int32_t>{0, 3, 6, 9, 12}));
  EXPECT_EQ(m.context_len, (std::vector<int32_t>{12, 5, 8, 12}));
  EXPECT_EQ(m.positions, (std::vector<int32_t>{9, 10, 11, 2, 3, 4, 5, 6, 7, 9, 10, 11}));
  std::vector<int32_t> all_rows(12);
  std::iota(all_rows.begin(), all_rows.end(), 0);
  EXPECT_EQ(m.logit_rows, all_rows) << "every row a logit row, the padding ones too";
  for (int32_t r = 0; r < 12; ++r)
    EXPECT_EQ(m.slot_mapping[size_t(r)] == ops::kPadSlot, r >= 9) << "row " << r << ": only padding stores nothing";
  ASSERT_EQ(batch.verify.size(), 3u);
  EXPECT_EQ(batch.verify[2].seq, c);
  EXPECT_EQ(batch.verify[2].first_row, 6);
  EXPECT_EQ(batch.rows.size(), 3u);
  EXPECT_TRUE(batch.sampled.empty());

  const StepBatch tight = build_step_batch(s, kBs, -1, /*max_rows=*/11);
  EXPECT_EQ(tight.meta.n_seqs(), 3) << "4 x 3 rows exceed the budget of 11";
  EXPECT_EQ(tight.meta.n_tokens(), 9);
  a->state_slot = 0, b->state_slot = 1, c->state_slot = 2;
  const StepBatch recurrent = build_step_batch(s, kBs, /*pad_state_slot=*/5, /*max_rows=*/12);
  EXPECT_EQ(recurrent.meta.n_seqs(), 3) << "recurrent layers' verify steps are not padded";
  Schedule mixed = s;
  mixed.seqs[1].n_draft = 1, mixed.seqs[1].n_new = 2, mixed.n_tokens -= 1;
  EXPECT_EQ(verify_padding_drafts(mixed, false), 0);
  EXPECT_EQ(verify_padding_drafts(mixed, true), 2);
  EXPECT_EQ(build_step_batch(mixed, kBs, -1, 12).meta.n_seqs(), 3) << "draft counts differ: no padding";
}

// With pad_any_verify, a verify step whose sequences decode with 2, 1 and no drafts is
// padded to decode_bucket(3) = 4 sequences of 3 rows: each sequence's padding rows repeat
// its last row (token and position, nothing stored), every row a logit row, the sampled
// ones first, then the verified rows, then the padding; without it, or where a sequence
// is still prefilling, no padding.
TEST(BuildStepBatch, PadsVerifyStepsOfDifferentDraftCountsWhenAsked) {
  ThreeDecoding t;
  BlockManager& bm = t.bm;
  Scheduler& sched = t.sched;
  Sequence *a = t.a, *b = t.b, *c = t.c;
  a->draft = {40, 41};
  b->draft = {42};
  const Schedule s = sched.schedule(bm);
  ASSERT_EQ(pairs(s), (P{{a, 3}, {b, 2}, {c, 1}}));
  const StepBatch batch = build_step_batch(s, kBs, -1, /*max_rows=*/12, /*pad_any_verify=*/true);
  const ops::BatchMeta& m = batch.meta;
  ASSERT_EQ(m.n_seqs(), 4);
  ASSERT_EQ(m.n_tokens(), 12);
  EXPECT_EQ(m.q_start, (std::vector<int32_t>{0, 3, 6, 9, 12})) << "c (no drafts) first, then a and b";
  EXPECT_EQ(m.positions, (std::vector<int32_t>{5, 5, 5, 9, 10, 11, 2, 3, 3, 5, 5, 5}));
  EXPECT_EQ(m.context_len, (std::vector<int32_t>{6, 12, 4, 6})) << "the real rows' context";
  EXPECT_EQ(m.token_ids[6], kNextToken);
  EXPECT_EQ(m.token_ids[7], 42);
  EXPECT_EQ(m.token_ids[8], 42) << "b's padding row repeats its draft row";
  const std::vector<int32_t> real = {0, 3, 4, 5, 6, 7};
  for (int32_t r = 0; r < 12; ++r)
    EXPECT_EQ(m.slot_mapping[size_t(r)] != ops::kPadSlot, std::count(real.begin(), real.end(), r) == 1) << "row " << r;
  EXPECT_EQ(m.logit_rows, (std::vector<int32_t>{0, 3, 4, 5, 6, 7, 1, 2, 8, 9, 10, 11}))
      << "sampled, verified, then padding rows";
  EXPECT_EQ(batch.sampled, (std::vector<Sequence*>{c}));
  ASSERT_EQ(batch.verify.size(), 2u);
  EXPECT_EQ(batch.verify[0].seq, a);
  EXPECT_EQ(batch.verify[0].first_row, 3);
  EXPECT_EQ(batch.verify[1].seq, b);
  EXPECT_EQ(batch.verify[1].n_draft, 1);
  EXPECT_EQ(batch.verify[1].first_row, 6);
  ASSERT_EQ(batch.rows.size(), 3u);
  EXPECT_EQ(batch.rows[0].n_rows, 1) << "c's real rows";
  EXPECT_EQ(batch.rows[2].first_row, 6);
  EXPECT_EQ(batch.rows[2].n_rows, 2);

  EXPECT_EQ(build_step_batch(s, kBs, -1, 12).meta.n_tokens(), 6) << "not asked: no padding";
  EXPECT_EQ(build_step_batch(s, kBs, -1, 11, true).meta.n_tokens(), 6) << "past the row budget";
  c->n_computed -= 1;  // c's row is now a prompt chunk short of its end, not decoding
  EXPECT_EQ(build_step_batch(s, kBs, -1, 12, true).meta.n_tokens(), 6) << "a step with a prompt chunk";
  c->n_computed += 1;
}

TEST(BuildStepBatch, AskForLogitsOnlyForSequencesReachingTheirEnd) {
  BlockManager bm(32, kBs, false);
  Scheduler sched({.max_prefill_chunk = 6});
  Sequences q;
  Sequence *a = q.make(3), *b = q.make(10, 20), *c = q.make(2, 40);
  for (Sequence* x : {a, b, c}) sched.add(x);
  const Schedule s = sched.schedule(bm);
  ASSERT_EQ(pairs(s), (P{{a, 3}, {b, 6}, {c, 2}}));
  const StepBatch batch = build_step_batch(s, kBs);
  const ops::BatchMeta& m = batch.meta;
  EXPECT_EQ(m.n_seqs(), 3) << "no padding in a prefill step";
  EXPECT_EQ(m.n_tokens(), 11);
  EXPECT_EQ(m.q_start, (std::vector<int32_t>{0, 3, 9, 11}));
  EXPECT_EQ(m.context_len, (std::vector<int32_t>{3, 6, 2}));
  EXPECT_EQ(m.max_blocks_per_seq, 2);
  EXPECT_EQ(m.logit_rows, (std::vector<int32_t>{2, 10})) << "b's chunk stops mid-prompt";
  EXPECT_EQ(batch.sampled, (std::vector<Sequence*>{a, c}));
  for (int32_t t = 3; t < 9; ++t) {
    EXPECT_EQ(m.token_ids[size_t(t)], 20 + (t - 3));
    EXPECT_EQ(m.positions[size_t(t)], t - 3);
    EXPECT_EQ(m.slot_mapping[size_t(t)], m.slot(1, t - 3));
    EXPECT_NE(m.slot_mapping[size_t(t)], ops::kPadSlot);
  }
}

}  // namespace
}  // namespace kiln::runtime
