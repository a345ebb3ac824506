// The adaptive speculation depth policy (runtime/adaptive_depth.h) on synthetic
// measurements: the choice for given estimates, the estimates it builds from steps, and the
// closed loop on simulated machines whose step cost is fixed_ms + per_row_ms * rows.
#include "runtime/adaptive_depth.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace kiln::runtime {
namespace {

StepCostModel cost(double fixed_ms, double per_row_ms) {
  return {.known = true, .fixed_s = fixed_ms * 1e-3, .per_row_s = per_row_ms * 1e-3};
}

TEST(AdaptiveDepth, HighAcceptanceAndCheapRowsChooseFullDepth) {
  const std::vector<double> a = {0.9, 0.9, 0.9};
  EXPECT_EQ(AdaptiveDepth::best_depth(a, cost(10, 0.1), std::vector<int32_t>{3}, 3), 3);
  EXPECT_EQ(AdaptiveDepth::best_depth(a, cost(10, 0.1), std::vector<int32_t>(8, 3), 3), 3);
  // Drafts shorter than K: nothing beyond them is counted, so K is as good as their length.
  EXPECT_EQ(AdaptiveDepth::best_depth(a, cost(10, 0.1), std::vector<int32_t>{1, 0, 1}, 3), 1);
}

TEST(AdaptiveDepth, LowAcceptanceChoosesNoDrafts) {
  const std::vector<double> a = {0.05, 0.05, 0.05};
  EXPECT_EQ(AdaptiveDepth::best_depth(a, cost(10, 3), std::vector<int32_t>{3}, 3), 0);
  EXPECT_EQ(AdaptiveDepth::best_depth(std::vector<double>{0.0, 0.0, 0.0}, cost(10, 0.1), std::vector<int32_t>{3}, 3), 0);
}

// The CPU reference: a verify row costs what a decode row costs; no acceptance below 1 pays.
TEST(AdaptiveDepth, RowsCostingLinearlyChooseNoDrafts) {
  for (double a : {0.3, 0.6, 0.95})
    EXPECT_EQ(AdaptiveDepth::best_depth(std::vector<double>(5, a), cost(0, 1), std::vector<int32_t>{5, 5, 2}, 5), 0)
        << "acceptance " << a;
  // A small fixed part does not change that at moderate acceptance.
  EXPECT_EQ(AdaptiveDepth::best_depth(std::vector<double>(3, 0.6), cost(0.1, 1), std::vector<int32_t>{3}, 3), 0);
}

// A weight-bound step (10 ms) whose rows cost 0.2 ms each: speculation pays for one stream
// and fades as the batch grows (the cost of B (k + 1) rows takes over).
TEST(AdaptiveDepth, DepthFadesWithBatchSize) {
  const std::vector<double> a = {0.7, 0.7, 0.7};
  int32_t last = 4;
  std::vector<int32_t> depths;
  for (int32_t batch : {1, 8, 32, 64, 128, 256}) {
    const int32_t k = AdaptiveDepth::best_depth(a, cost(10, 0.2), std::vector<int32_t>(size_t(batch), 3), 3);
    EXPECT_LE(k, last) << "batch " << batch;
    depths.push_back(k);
    last = k;
  }
  EXPECT_EQ(depths.front(), 3);
  EXPECT_EQ(depths.back(), 0);
  EXPECT_EQ(AdaptiveDepth::best_depth(a, StepCostModel{}, std::vector<int32_t>{3}, 3), 0) << "unknown cost";
}

// The depth in use stays where another is not better by kMargin: at 10 ms + 0.1 ms a row
// and acceptance 0.6, 0.6, 0.1, depth 3 beats 2 by 0.9% and 1 by 22%.
TEST(AdaptiveDepth, TheDepthInUseStaysUnlessAnotherWinsByTheMargin) {
  const std::vector<double> a = {0.6, 0.6, 0.1};
  const std::vector<int32_t> one = {3};
  EXPECT_EQ(AdaptiveDepth::best_depth(a, cost(10, 0.1), one, 3), 3);
  EXPECT_EQ(AdaptiveDepth::best_depth(a, cost(10, 0.1), one, 3, 2), 2) << "within the margin of the best";
  EXPECT_EQ(AdaptiveDepth::best_depth(a, cost(10, 0.1), one, 3, 1), 3) << "depth 1 loses by more than the margin";
  EXPECT_EQ(AdaptiveDepth::best_depth(a, cost(0, 1), one, 3, 3), 0) << "rows at full cost: leave speculation";
}

TEST(AdaptiveDepth, MeasuresAcceptanceByPositionAndTheCostLine) {
  AdaptiveDepth p({.max_depth = 3, .governor_window = 0});
  p.record_verification(3, 1);  // position 1 stood, 2 was rejected, 3 not tested
  p.record_step(false, true, 1, 0, 0.0);
  // Two pseudo-tests at 1/2, then the plain mean of the tests' outcomes.
  EXPECT_DOUBLE_EQ(p.acceptance()[0], 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(p.acceptance()[1], 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(p.acceptance()[2], 0.5);
  p.record_verification(3, 3);
  p.record_verification(2, 0);  // position 1 rejected
  p.record_step(false, true, 1, 0, 0.0);
  // Position 1: 2 of 3 tests stood; with the pseudo-tests, 3 of 5.
  EXPECT_DOUBLE_EQ(p.acceptance()[0], 0.6);
  EXPECT_DOUBLE_EQ(p.acceptance()[1], 0.5);
  EXPECT_DOUBLE_EQ(p.acceptance()[2], 2.0 / 3.0);
  EXPECT_FALSE(p.cost_model(2).known);
  p.record_step(true, false, 2, 2, 10e-3);  // decode: 2 sequences, 2 rows, 10 ms
  p.record_step(true, true, 2, 6, 14e-3);   // verify: 6 rows, 14 ms
  EXPECT_FALSE(p.cost_model(1).known) << "another batch size class";
  EXPECT_FALSE(p.cost_model(3).known) << "another batch size class";
  const StepCostModel m = p.cost_model(2);
  ASSERT_TRUE(m.known);
  EXPECT_NEAR(m.per_row_s, 1e-3, 1e-12);
  EXPECT_NEAR(m.fixed_s, 8e-3, 1e-12);
}

TEST(AdaptiveDepth, OffAlwaysChoosesFullDepthAndNoDraftsIsNoChoice) {
  AdaptiveDepth p({.max_depth = 4, .adaptive = false});
  EXPECT_EQ(p.choose(std::vector<int32_t>{0, 0}), 0);
  EXPECT_EQ(p.choices(), 0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p.choose(std::vector<int32_t>{2, 0}), 4);
  EXPECT_EQ(p.choices(), 5);
  EXPECT_EQ(p.depth_total(), 20);
  EXPECT_DOUBLE_EQ(p.recent_depth(), 4.0);
}

// plan_drafts (how deep an MTP drafter chains for the next step): K at a fixed depth; 0
// for the decode steps of the warm-up, then K for its verify steps; then 0 while the
// estimates choose 0 (each such step a choice of 0, counted towards the next probe, whose
// depth it plans), else one more than the estimates' choice.
TEST(AdaptiveDepth, PlannedDraftsFollowTheEstimates) {
  AdaptiveDepth fixed({.max_depth = 3, .adaptive = false});
  EXPECT_EQ(fixed.plan_drafts(2), 3);
  AdaptiveDepth p({.max_depth = 3, .governor_window = 0});
  const std::vector<int32_t> lengths = {3, 3};
  for (int i = 0; i < 2; ++i) {  // timed decode steps first
    EXPECT_EQ(p.plan_drafts(2), 0);
    EXPECT_EQ(p.choose(std::vector<int32_t>{0, 0}), 0);  // none proposed: no choice
    p.record_step(true, false, 2, 2, 2e-3);
  }
  EXPECT_EQ(p.choices(), 0);
  for (int i = 0; i < 2; ++i) {  // then verify steps at K; every draft rejected, rows dear
    EXPECT_EQ(p.plan_drafts(2), 3);
    EXPECT_EQ(p.choose(lengths), 3);
    p.record_verification(3, 0);
    p.record_verification(3, 0);
    p.record_step(true, true, 2, 8, 8e-3);
  }
  // Speculation loses; a probe every 32 x 4 x 8 steps (even 90% acceptance would not pay
  // at 1 ms a row): 1023 steps planned without drafts, then the probe's depth.
  for (int i = 0; i < 1023; ++i) {
    ASSERT_EQ(p.plan_drafts(2), 0) << "step " << i;
    p.record_step(true, false, 2, 2, 2e-3);
  }
  EXPECT_EQ(p.choices(), 2 + 1023);
  EXPECT_EQ(p.depth_total(), 6);
  EXPECT_EQ(p.plan_drafts(2), 1);
  EXPECT_EQ(p.choose(lengths), 1);
  EXPECT_EQ(p.probes(), 1);
  // The probe finds rows cheap now (2 ms + 1 us a row).
  p.record_verification(1, 1);
  p.record_verification(1, 1);
  p.record_step(true, true, 2, 4, 2e-3 + 2e-6);
  // Cheap rows and drafts that stand (a simulated step cost of 2 ms + 1 us per extra row):
  // the plans climb to K, one more than the choice.
  std::vector<int32_t> seen;
  for (int i = 0; i < 400; ++i) {
    const int32_t planned = p.plan_drafts(2);
    const std::vector<int32_t> proposed(2, planned);
    const int32_t k = p.choose(proposed);
    seen.push_back(k);
    EXPECT_LE(k, planned) << "step " << i;
    for (int s = 0; s < 2 && k > 0; ++s) p.record_verification(k, k);
    p.record_step(true, k > 0, 2, 2 * (1 + k), 2e-3 + 1e-6 * k);
  }
  EXPECT_GT(std::count(seen.begin(), seen.end(), 3), 100) << "the policy climbed to K";
}

// speculation_idle: settled on no drafts once the estimates, past their warm-up, choose
// none (a drafter with passes of its own may skip them), not before, not while they
// choose drafts, never at a fixed depth.
TEST(AdaptiveDepth, IdleOnceTheEstimatesSettleOnNoDrafts) {
  AdaptiveDepth fixed({.max_depth = 3, .adaptive = false});
  EXPECT_EQ(fixed.plan_drafts(16), 3);
  EXPECT_FALSE(fixed.speculation_idle(16));
  AdaptiveDepth p({.max_depth = 3, .governor_window = 0});
  const std::vector<int32_t> lengths(16, 3);
  for (int i = 0; i < 2; ++i) {  // decode steps of the warm-up: no drafts, not idle
    EXPECT_EQ(p.plan_drafts(16), 0);
    EXPECT_FALSE(p.speculation_idle(16)) << "warm-up step " << i;
    p.record_step(true, false, 16, 16, 2e-3);
  }
  for (int i = 0; i < 2; ++i) {  // verify steps at K: every draft rejected, rows dear
    EXPECT_EQ(p.plan_drafts(16), 3);
    EXPECT_FALSE(p.speculation_idle(16));
    EXPECT_EQ(p.choose(lengths), 3);
    for (int s = 0; s < 16; ++s) p.record_verification(3, 0);
    p.record_step(true, true, 16, 64, 8e-3);
  }
  EXPECT_EQ(p.plan_drafts(16), 0);
  EXPECT_TRUE(p.speculation_idle(16));
  EXPECT_TRUE(p.speculation_hopeless(16)) << "rows cost linearly: drafts cannot pay";
  EXPECT_FALSE(p.speculation_off(16)) << "the governor (none here) did not turn it off";
  // Another batch size class has not warmed up.
  EXPECT_FALSE(p.speculation_idle(2));
  // Where drafts stand and rows are cheap the estimates choose drafts again.
  AdaptiveDepth q({.max_depth = 3, .governor_window = 0});
  for (int i = 0; i < 2; ++i) {
    q.plan_drafts(16);
    q.record_step(true, false, 16, 16, 2e-3);
  }
  for (int i = 0; i < 2; ++i) {
    q.plan_drafts(16);
    EXPECT_EQ(q.choose(lengths), 3);
    for (int s = 0; s < 16; ++s) q.record_verification(3, 3);
    q.record_step(true, true, 16, 64, 2e-3 + 48e-6);
  }
  EXPECT_GT(q.plan_drafts(16), 0);
  EXPECT_FALSE(q.speculation_idle(16));
  EXPECT_FALSE(q.speculation_hopeless(16));
  EXPECT_FALSE(AdaptiveDepth({.max_depth = 3}).speculation_hopeless(16)) << "not before the warm-up";
  EXPECT_FALSE(fixed.speculation_hopeless(16));
}

// A simulated machine: a step of R rows takes fixed_ms + per_row_ms * R; draft i stands with
// probability accept (given the ones before it stood).
struct Machine {
  double fixed_ms = 0.0, per_row_ms = 1.0, accept = 0.6;
};

// The verifications of one step at depth k over `batch` sequences whose drafts each stand
// with probability `rate` (given the ones before stood); returns the tokens emitted.
int64_t verify_step(AdaptiveDepth& p, int32_t batch, int32_t k, double rate, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int64_t emitted = batch;
  for (int32_t s = 0; s < batch && k > 0; ++s) {
    int32_t accepted = 0;
    while (accepted < k && u(rng) < rate) ++accepted;
    p.record_verification(k, accepted);
    emitted += accepted;
  }
  return emitted;
}

// n steps of `batch` sequences that always have K-token drafts; the depths chosen.
std::vector<int32_t> run(AdaptiveDepth& policy, const Machine& m, int32_t n, int32_t batch, std::mt19937& rng) {
  const std::vector<int32_t> lengths(size_t(batch), policy.config().max_depth);
  std::vector<int32_t> out;
  for (int32_t step = 0; step < n; ++step) {
    const int32_t k = policy.choose(lengths);
    out.push_back(k);
    const int64_t rows = int64_t(batch) * (1 + k);
    verify_step(policy, batch, k, m.accept, rng);
    policy.record_step(true, k > 0, batch, rows, (m.fixed_ms + m.per_row_ms * double(rows)) * 1e-3);
  }
  return out;
}

int64_t count(const std::vector<int32_t>& v, size_t from, int32_t k) {
  return std::count(v.begin() + long(from), v.end(), k);
}

// The CPU reference's shape (rows cost linearly): after the warm-up the policy decodes
// without drafts. Even 90% acceptance would not pay there, so it probes one step in 1024
// (32 x 4 x 8), at each depth 1 .. K in turn.
TEST(AdaptiveDepth, LinearCostFallsBackToNoDraftsAndProbesRarely) {
  AdaptiveDepth p({.max_depth = 3, .governor_window = 0});
  std::mt19937 rng(1);
  const std::vector<int32_t> k = run(p, {.fixed_ms = 0.05, .per_row_ms = 2.0, .accept = 0.6}, 4 + 1024 * 6, 1, rng);
  const size_t settled = 4;
  const int64_t drafted = int64_t(k.size() - settled) - count(k, settled, 0);
  EXPECT_EQ(drafted, 6) << "probes only";
  for (int32_t d = 1; d <= 3; ++d) EXPECT_EQ(count(k, settled, d), 2) << "probes at depth " << d;
  EXPECT_EQ(p.probes(), 6);
}

// Rows that cost something but not everything (10 ms + 3 ms per row): at 20% acceptance
// drafts do not pay, at 90% they would, so probes come one step in 128 (32 x 4).
TEST(AdaptiveDepth, LowAcceptanceFallsBackToNoDraftsAndProbesEvery128Steps) {
  AdaptiveDepth p({.max_depth = 3, .governor_window = 0});
  std::mt19937 rng(4);
  const std::vector<int32_t> k = run(p, {.fixed_ms = 10.0, .per_row_ms = 3.0, .accept = 0.2}, 64 + 128 * 20, 1, rng);
  const int64_t drafted = int64_t(k.size() - 64) - count(k, 64, 0);
  EXPECT_GE(drafted, 18);
  EXPECT_LE(drafted, 22) << "probes only";
  for (int32_t d = 1; d <= 3; ++d) EXPECT_GE(count(k, 64, d), 6) << "probes at depth " << d;
}

// A weight-bound machine: full depth, with a decode step now and then to keep the
// decode cost current; at 256 streams the same machine's rows dominate and it stops.
TEST(AdaptiveDepth, CheapRowsChooseFullDepthUntilTheBatchMakesThemDear) {
  AdaptiveDepth p({.max_depth = 3, .governor_window = 0});
  std::mt19937 rng(2);
  const Machine gpu{.fixed_ms = 10.0, .per_row_ms = 0.2, .accept = 0.7};
  const std::vector<int32_t> one = run(p, gpu, 320, 1, rng);
  EXPECT_GE(count(one, 64, 3), 240);
  EXPECT_GE(count(one, 64, 0), 4) << "decode probes";
  const std::vector<int32_t> many = run(p, gpu, 320, 256, rng);
  EXPECT_GE(count(many, 160, 0), 150) << "speculation off at 256 streams";
}

// Estimates recover both ways: rows getting cheap (probes find it), and dear again.
TEST(AdaptiveDepth, RecoversWhenTheCostOfRowsChanges) {
  AdaptiveDepth p({.max_depth = 4, .governor_window = 0});
  std::mt19937 rng(3);
  const Machine cpu{.fixed_ms = 0.0, .per_row_ms = 1.0, .accept = 0.8};
  const Machine gpu{.fixed_ms = 10.0, .per_row_ms = 0.1, .accept = 0.8};
  run(p, cpu, 300, 1, rng);
  EXPECT_LT(double(p.depth_total()) / double(p.choices()), 0.3);
  const std::vector<int32_t> cheap = run(p, gpu, 300, 1, rng);
  EXPECT_GE(count(cheap, 150, 4), 140) << "recovered to full depth";
  const std::vector<int32_t> dear = run(p, cpu, 400, 1, rng);
  EXPECT_GE(count(dear, 250, 0), 140) << "fell back to no drafts";
}

// The governor: a machine whose verify steps are cheap (10 ms + 0.2 ms a row, 70% of drafts
// stand) but where speculation costs elsewhere: every other step carries a prefill (not
// timed), 60 ms with speculation against 10 without. The line model alone keeps depth K;
// the governor, measuring emitted tokens per second over every step, turns speculation
// off but for its refresh windows, which back off (one in 16 windows, then 32, ... 128)
// while speculation keeps losing by more than 10%: fewer than 1 in 32 late steps draft
// (124 of 2,000 without the back-off). Without the hidden cost it keeps speculation on.
TEST(AdaptiveDepth, TheGovernorTurnsSpeculationOffWhereItLosesOverall) {
  for (bool hidden_cost : {true, false}) {
    AdaptiveDepth p({.max_depth = 3});
    std::mt19937 rng(5);
    const int32_t batch = 8;
    const std::vector<int32_t> lengths(size_t(batch), 3);
    int64_t late_steps = 0, late_drafting = 0;
    for (int step = 0; step < 4000; ++step) {
      const bool prefill = step % 2 == 1;
      const int32_t k = p.choose(lengths);
      const int64_t emitted = verify_step(p, batch, k, 0.7, rng);
      const int64_t rows = int64_t(batch) * (1 + k);
      const double ms = prefill ? (hidden_cost && p.speculating(batch) ? 60.0 : 10.0) + 0.2 * double(rows)
                                : 10.0 + 0.2 * double(rows);
      p.record_step(!prefill, k > 0, batch, rows, ms * 1e-3, emitted);
      if (step >= 2000) {
        ++late_steps;
        late_drafting += k > 0 ? 1 : 0;
      }
    }
    const double on = p.governor_rate(batch, true), off = p.governor_rate(batch, false);
    std::printf("hidden cost %d: %.0f tokens/s with speculation, %.0f without; %lld of %lld late steps drafted\n",
                int(hidden_cost), on, off, (long long)late_drafting, (long long)late_steps);
    if (hidden_cost) {
      EXPECT_LT(on, off);
      EXPECT_LT(late_drafting, late_steps / 32) << "speculation off but for the refresh windows, backing off";
    } else {
      EXPECT_GT(on, off);
      EXPECT_GT(late_drafting, late_steps * 3 / 4) << "speculation on but for the refresh windows and probes";
    }
  }
}

// A batch size class met for the first time starts where its neighbours' verdicts point:
// after batch 8 found speculation losing (the hidden cost above), batch 32 runs without
// drafts from its first step and tries speculation only in its refresh window (one in 16),
// while batch 1 (smaller: no verdict applies) measures both modes at once.
TEST(AdaptiveDepth, ANewBatchSizeStartsInTheModeItsNeighboursFound) {
  AdaptiveDepth p({.max_depth = 3});
  std::mt19937 rng(7);
  // `steps` steps of `batch` sequences; returns the steps that drafted, by window of 32.
  const auto run = [&](int32_t batch, int steps) {
    const std::vector<int32_t> lengths(size_t(batch), 3);
    std::vector<int32_t> drafted(size_t(steps + 31) / 32, 0);
    for (int step = 0; step < steps; ++step) {
      const bool prefill = step % 2 == 1;
      const int32_t k = p.choose(lengths);
      const int64_t emitted = verify_step(p, batch, k, 0.7, rng);
      const int64_t rows = int64_t(batch) * (1 + k);
      const double hidden = batch >= 8 && p.speculating(batch) ? 60.0 : 10.0;
      const double ms = (prefill ? hidden : 10.0) + 0.2 * double(rows);
      p.record_step(!prefill, k > 0, batch, rows, ms * 1e-3, emitted);
      drafted[size_t(step / 32)] += k > 0 ? 1 : 0;
    }
    return drafted;
  };
  run(8, 2000);
  ASSERT_LT(p.governor_rate(8, true), p.governor_rate(8, false)) << "batch 8: speculation loses";
  const std::vector<int32_t> big = run(32, 32 * 20);
  for (size_t w = 0; w < 16; ++w) EXPECT_EQ(big[w], 0) << "batch 32, window " << w << ": started off";
  EXPECT_GT(big[16], 0) << "batch 32 tries speculation in its refresh window";
  EXPECT_LT(p.governor_rate(32, true), p.governor_rate(32, false));
  const std::vector<int32_t> small = run(1, 32 * 4);
  EXPECT_GT(small[0], 0) << "batch 1 starts with speculation on";
  EXPECT_GT(p.governor_rate(1, true), p.governor_rate(1, false)) << "and keeps it: it wins there";
}

// One stream where speculation wins by ~70%, but the first window with it on carries a
// slow step (a long prefill, not timed: 40 ms against ~0.5 ms steps). While the governor
// has speculation off an MTP drafter's layer does not run, so the drafts of a request
// that lived through that stand far less often (25% instead of 70%: its MTP cache has
// holes) and the refresh windows see speculation lose. Judged on one window of each mode
// the governor turns it off and never back on; with two windows of each before the first
// verdict it stays on.
TEST(AdaptiveDepth, OneSlowWindowDoesNotTurnSpeculationOff) {
  for (int32_t first : {1, 2}) {
    AdaptiveDepth p({.max_depth = 3, .governor_first_windows = first});
    std::mt19937 rng(3);
    const std::vector<int32_t> lengths = {3};
    int64_t drafted = 0;
    bool slow_done = false, holes = false;
    double seconds = 0.0;
    for (int step = 0; step < 3000; ++step) {
      if (step % 150 == 0) holes = false;  // a new request
      holes = holes || p.speculation_off(1);
      const int32_t k = p.choose(lengths);
      const int64_t emitted = verify_step(p, 1, k, holes ? 0.25 : 0.7, rng);
      double ms = 0.45 + 0.05 * double(k);
      const bool slow = k > 0 && !slow_done && seconds > 0.02;
      if (slow) ms += 40.0, slow_done = true;
      seconds += ms * 1e-3;
      p.record_step(!slow, k > 0, 1, 1 + k, ms * 1e-3, emitted);
      if (step >= 1500) drafted += k > 0 ? 1 : 0;
    }
    std::printf("first windows %d: %.0f tokens/s on, %.0f off; %lld of the last 1500 steps drafted\n", first,
                p.governor_rate(1, true), p.governor_rate(1, false), (long long)drafted);
    if (first == 1) EXPECT_LT(drafted, 300) << "the control: one slow window decides";
    else EXPECT_GT(drafted, 1200) << "speculation stays on where it wins";
  }
}

// One-time steps (a batch shape run or recorded for the first time): speculation whose
// verify steps win by the line (10 ms + 0.2 ms a row, 70% of drafts standing) but where
// one verify step in two meets a new shape and costs 40 ms more. They stay out of the
// first windows (the first verdict: on) and count from then on, so the governor turns
// speculation off; where no step is one-time it stays on; where only the first windows
// hold the one-time steps (recordings as a class warms up) it stays on too.
TEST(AdaptiveDepth, TheGovernorCountsOneTimeStepsOnceItHasAVerdict) {
  for (int recurring : {1, 0, 2}) {  // one-time verify steps throughout, never, only early
    AdaptiveDepth p({.max_depth = 3});
    std::mt19937 rng(7);
    const int32_t batch = 64;
    const std::vector<int32_t> lengths(size_t(batch), 3);
    int64_t late_steps = 0, late_drafting = 0, verify_steps = 0;
    for (int step = 0; step < 6000; ++step) {
      const int32_t k = p.choose(lengths);
      const int64_t emitted = verify_step(p, batch, k, 0.7, rng);
      const int64_t rows = int64_t(batch) * (1 + k);
      const bool one_time = k > 0 && verify_steps++ % 2 == 0 && (recurring == 1 || (recurring == 2 && step < 300));
      const double ms = 10.0 + 0.2 * double(rows) + (one_time ? 40.0 : 0.0);
      p.record_step(true, k > 0, batch, rows, ms * 1e-3, emitted, one_time);
      if (step >= 3000) {
        ++late_steps;
        late_drafting += k > 0 ? 1 : 0;
      }
    }
    std::printf("one-time verify steps %d: %.0f tokens/s on, %.0f off; %lld of %lld late steps drafted\n", recurring,
                p.governor_rate(batch, true), p.governor_rate(batch, false), (long long)late_drafting,
                (long long)late_steps);
    if (recurring == 1) EXPECT_LT(late_drafting, late_steps / 16) << "off but for the refresh windows";
    else EXPECT_GT(late_drafting, late_steps * 3 / 4) << "on but for the refresh windows and probes";
  }
}

}  // namespace
}  // namespace kiln::runtime
