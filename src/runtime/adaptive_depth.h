// Adaptive speculation depth: each step's draft length k in [0, K] (K =
// --num-speculative-tokens), chosen from online measurements so that speculation does not
// make throughput worse than decoding one token per step.
//
//   acceptance by position: a_i = P(draft i stands | drafts 1 .. i-1 stood), an EMA over
//     the recent tests of position i (a step's rate, accepted / tested at i, weighted by its
//     tests), starting from kPriorTests pseudo-tests at 1/2 so that one early rejection
//     does not rule a position out until a rare probe tests it again;
//   step cost: the wall time of a step as a line in its query rows, t(R) = fixed + per_row R,
//     through two EMA points, one of decode-only steps (R = B sequences) and one of verify
//     steps (R = B + drafts), kept apart for each batch size class (B rounded up to a power
//     of two: a line measured at one stream says little about 64, where the rows of a
//     weight-bound step start to cost); steps that carry prefill chunks are not timed. On a
//     GPU a small decode step is bound by reading the weights, so per_row is small and
//     speculation pays; on the CPU reference (compute-bound) a verify row costs nearly
//     what a decode row costs (measured on the 2-core CI VM: a 4-row verify step of the
//     12-layer MTP model ~1.2-1.5x a 1-row decode step, plus its MTP passes), so it
//     rarely does and the choice there is mostly 0.
//   choice: with the drafts proposed at depth K (length L_s for decoding sequence s, 0 when
//     none), the k maximising
//         sum_s E_s(k) / t(sum_s (1 + min(k, L_s))),  E_s(k) = 1 + sum_{i <= min(k, L_s)} prod_{j <= i} a_j,
//     where k > 0 must beat k = 0 by kMargin. The batch size enters through B in t(R): once
//     the rows of B (k + 1) cost about (k + 1) times those of B, the choice falls back to 0.
//   measuring: in each batch size class the first steps with drafts run at k = 0 (decode
//     cost), then at K (verify cost and acceptance at every position); afterwards one step
//     in probe_interval runs at another depth (1 .. K in turn while the choice is 0; 0
//     while it is K; 0 and K alternately in between), so an estimate that says
//     "speculation loses" can recover, and one that says it wins is checked against a fresh
//     decode step. While the choice is 0 probes are losing_probe_factor times rarer, and
//     where speculation would lose even at 90% acceptance hopeless_probe_factor times more.
//     Leaving the depth in use takes a kMargin gain too (hysteresis).
//   governing: the line above prices a step's rows, not what else speculation costs (on a
//     small, latency-bound model: verify steps that replay no recording, catch-up passes,
//     sequences whose ends drift apart so more steps carry a prefill). So each batch size
//     class also measures what counts, emitted tokens per second over windows of
//     governor_window steps and governor_min_window_s (every step, prefill or not): with
//     speculation on (the choices above) and off (no drafts, no probes), alternately
//     until each has governor_first_windows windows. The better mode runs, unless the
//     other wins by kMargin; one window in governor_refresh runs the other mode to keep
//     its rate current (EMAs over windows), backing off to one in 8 x governor_refresh
//     while each refresh finds that mode losing by more than 10%. A class met for the first time starts in the
//     mode its neighbours found (speculation that loses at a smaller batch loses at a
//     larger one, whose rows cost more; one that wins at a larger batch wins at a smaller
//     one) and tries the other mode only in its refresh window, not at once: exploring
//     each class from scratch cost several percent where batch sizes move.
//   planning (plan_drafts): a drafter whose drafts cost a pass of their own (MTP) asks
//     after each step how deep the next one may go; 0 (no drafts; the step is counted as a
//     choice of 0 then) lets it defer its work (runtime/mtp_drafts.cpp), and where the
//     governor has speculation off or the estimates settled on no drafts
//     (speculation_idle), or the cost line says drafts cannot pay (speculation_hopeless),
//     skip it.
//
// Greedy outputs do not depend on k (verification is exact). At temperature > 0 the emitted
// tokens are distributed exactly as without speculation, but which draws are made depends on
// k, so with adaptive depth a seeded sampled request is reproducible only with
// --speculative-adaptive off (k then is K wherever drafts and blocks allow).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace kiln::runtime {

struct AdaptiveDepthConfig {
  int32_t max_depth = 1;        // K >= 1
  bool adaptive = true;         // false: always K
  int32_t probe_interval = 32;  // steps between two probes while drafts pay
  // ... times this while they do not: a probe there costs a step at a losing depth (and an
  // MTP drafter's deferred pass), which on a small, latency-bound model is several
  // percent at one in 32.
  int32_t losing_probe_factor = 4;
  // ... and times this while even drafts standing kHopefulAcceptance of the time would not pay
  // (the CPU reference): then only the cost line could change the choice, and it changes
  // slowly, so probes are rarer there and cost less.
  int32_t hopeless_probe_factor = 8;
  // EMA forgetting. Step cost: per step, so a measurement made `gap` steps after the
  // previous one of its kind weighs 1 - (1 - decay)^gap and a cost only probes refresh
  // follows the present as closely as one refreshed every step. Acceptance: per verified
  // draft position (a step that tested position i m times weighs 1 - (1 - decay)^m), since
  // each test is a single accept / reject. Both start as plain means.
  double decay = 1.0 / 32;
  int32_t warmup_steps = 2;     // timed steps of each kind before the model decides
  int32_t governor_window = 32;   // steps of one batch size class per governor window (0: no governor)
  // ... and at least this many seconds of steps: at one stream 32 steps are ~15 ms on a
  // small model, and one prefill step in a window moved its rate by 15%.
  double governor_min_window_s = 0.05;
  // Windows of each mode measured before the first verdict (alternating from on), where
  // no neighbouring class gave one: a single noisy window once turned one stream off.
  int32_t governor_first_windows = 2;
  int32_t governor_refresh = 16;  // one window in this many runs the losing mode
  // Tests: the depth of step n (from 1) instead of the estimates' (the plans follow it).
  std::function<int32_t(int64_t step)> schedule;
};

// The measured line t(R) = fixed_s + per_row_s * R (seconds); known once both kinds of step
// have been timed.
struct StepCostModel {
  bool known = false;
  double fixed_s = 0.0, per_row_s = 0.0;
  double seconds(double rows) const { return fixed_s + per_row_s * rows; }
};

class AdaptiveDepth {
 public:
  // A choice that k > 0 must beat by this fraction of k = 0's tokens per second.
  static constexpr double kMargin = 0.02;
  static constexpr double kHopefulAcceptance = 0.9;
  static constexpr int64_t kPriorTests = 2;
  static constexpr double kGovernorDecay = 0.25;  // per window, of each mode's rate
  // Refresh windows back off (twice as far apart, up to kMaxRefreshFactor x governor_refresh
  // windows) while the losing mode loses by more than this.
  static constexpr double kRefreshBackoff = 0.10;
  static constexpr int32_t kMaxRefreshFactor = 8;

  explicit AdaptiveDepth(const AdaptiveDepthConfig& config);

  // This step's depth, given the lengths of the drafts proposed at depth K for the decoding
  // sequences (0: none). 0 when no sequence has a draft (not counted as a choice).
  int32_t choose(std::span<const int32_t> draft_lengths);
  // How many drafts a drafter whose every draft costs a pass of its own (MTP) should make
  // for the next step of `batch` decoding sequences: K at a fixed depth and while this
  // batch size's verify cost is warming up; 0 while its decode cost is, and where the
  // estimates choose 0 and no probe is due (the next step then has no drafts, and counts
  // as a choice of 0 here); else one more than the depth they choose (a probe: its depth).
  int32_t plan_drafts(int32_t batch);
  // A sequence's verification in the current step: n_draft drafts, the first n_accepted stood.
  void record_verification(int32_t n_draft, int32_t n_accepted);
  // The end of a step: the verifications recorded since the last call enter the acceptance
  // EMA; a step whose sequences were all decoding (timed) enters the cost EMA of its kind
  // (verify: it had drafts) for its batch size (n_seqs); rows = its query rows. Every
  // step (timed or not) counts in the governor's window: `emitted` tokens in `seconds`.
  // A one-time step (a GPU backend ran its batch shape for the first time, or recorded
  // it) enters no cost EMA, and the governor's windows only once its batch size class has
  // a verdict: the first windows compare the modes unbiased by recordings, the later ones
  // see what speculation costs where its shapes keep changing (batch sizes that drift
  // make verify steps and MTP passes of new shapes: at 128 streams 46-54 more one-time
  // steps than without drafts, docs/perf/speculative.md).
  void record_step(bool timed, bool verify, int32_t n_seqs, int64_t rows, double seconds, int64_t emitted = 0,
                   bool one_time = false);

  // The best depth for these drafts under the given estimates (acceptance[i - 1] = a_i;
  // positions past its end count as 0); 0 when the model is unknown or k > 0 does not win
  // by kMargin.
  // `current`: the depth in use, which another must beat by kMargin too (so the choice
  // does not flap between two depths the estimates hardly tell apart).
  static int32_t best_depth(std::span<const double> acceptance, const StepCostModel& cost,
                            std::span<const int32_t> draft_lengths, int32_t max_depth, int32_t current = 0);

  const AdaptiveDepthConfig& config() const { return config_; }
  // a_i estimates, i = 1 .. K (1/2 where never measured).
  const std::vector<double>& acceptance() const { return acceptance_; }
  // The cost line of steps of `batch` sequences (their batch size class).
  StepCostModel cost_model(int32_t batch) const;
  // Choices made (steps where some sequence had a draft, or planned without), the sum of
  // their depths, and an EMA of the recent ones.
  int64_t choices() const { return choices_; }
  int64_t depth_total() const { return depth_total_; }
  double recent_depth() const { return recent_depth_; }
  int64_t probes() const { return probes_; }
  // Whether speculation runs for steps of `batch` sequences (the governor's mode), and the
  // measured emitted tokens per second of that class's windows with it off / on (0: none).
  bool speculating(int32_t batch) const { return !config_.adaptive || costs_[class_of(batch)].on; }
  // Whether the governor found speculation losing for steps of `batch` sequences and has it
  // off (not a trial or refresh window of the losing mode).
  bool speculation_off(int32_t batch) const {
    const Costs& c = costs_[class_of(batch)];
    return config_.adaptive && !c.on && !c.best_on;
  }
  // Whether steps of `batch` sequences are settled on no drafts: speculation_off, or the
  // governor has it on but the estimates, past their warm-up, chose no drafts for the
  // step planned last (probes aside: plan_drafts plans them). A drafter whose drafts cost
  // passes of their own (MTP) may skip those passes while this holds.
  bool speculation_idle(int32_t batch) const {
    const Costs& c = costs_[class_of(batch)];
    return speculation_off(batch) || (config_.adaptive && !config_.schedule && c.on && warm(c) && c.current == 0);
  }
  // Whether, past the warm-up, the cost line of steps of `batch` sequences says that drafts
  // would not pay even if kHopefulAcceptance of them stood (a compute-bound backend, where
  // a verified row costs about what a decoded one does). Draft quality cannot change the
  // choice there, so an MTP drafter skips its passes at any batch size.
  bool speculation_hopeless(int32_t batch) const;
  double governor_rate(int32_t batch, bool on) const { return costs_[class_of(batch)].rate[on ? 1 : 0].value; }

 private:
  struct Ema {
    int64_t n = 0;  // units (steps or tests) so far
    double value = 0.0;
    // x measured over `units` units, forgetting `decay` of the past per unit.
    void add(double x, double decay, int64_t units);
  };
  // The measurements of one batch size class.
  struct Costs {
    Ema decode_rows, decode_seconds, verify_rows, verify_seconds;
    int64_t decode_last_step = 0, verify_last_step = 0;
    int32_t decode_timed = 0, verify_timed = 0;  // timed steps of each kind (warm-up)
    int32_t since_probe = 0;
    int32_t current = 0;  // the depth the estimates chose last
    // The governor: the mode of the current window, its counts, and each mode's rate.
    bool on = true, best_on = true;  // this window's mode; the better one
    int32_t window_steps = 0, windows = 0;
    int64_t window_tokens = 0;
    double window_seconds = 0.0;
    Ema rate[2];  // emitted tokens per second, speculation off / on
    int32_t refresh_every = 0, since_refresh = 0;  // windows between refresh windows (0: not set)
    bool seeded = false;  // met: its mode set from the neighbours' verdicts
    int8_t prior = -1;    // their verdict, off (0) / on (1), or none (-1)
  };
  // The class of `batch`, seeded from the other classes' verdicts when first met.
  Costs& costs_for(int32_t batch);
  void govern(Costs& c, int64_t emitted, double seconds);
  void next_mode(Costs& c);  // the mode of c's next window, once one has ended
  static constexpr int kClasses = 16;  // batch sizes 1, 2, 3-4, 5-8, ..., above 2^14
  static size_t class_of(int32_t batch);
  static StepCostModel line(const Costs& c);
  // Whether these drafts would not pay under `cost` even at kHopefulAcceptance.
  static bool hopeless(const StepCostModel& cost, std::span<const int32_t> draft_lengths, int32_t max_depth);
  bool warm(const Costs& c) const {  // both kinds of step timed through the warm-up
    return c.decode_timed >= config_.warmup_steps && c.verify_timed >= config_.warmup_steps;
  }
  // The depth the estimates choose for these drafts, and the steps between probes there.
  int32_t estimate(const Costs& c, std::span<const int32_t> draft_lengths, int32_t& interval) const;
  int32_t decide(std::span<const int32_t> draft_lengths);
  void note_choice(int32_t k);

  AdaptiveDepthConfig config_;
  std::vector<Ema> acceptance_ema_;
  std::vector<double> acceptance_;                    // acceptance_ema_'s values
  std::vector<int64_t> step_tested_, step_accepted_;  // the current step's counts by position
  std::vector<Costs> costs_;                          // by batch size class
  int64_t steps_ = 0, choices_ = 0, depth_total_ = 0, probes_ = 0;
  int32_t probe_cursor_ = 0;
  int32_t last_choice_ = 0;
  double recent_depth_ = 0.0;
};

}  // namespace kiln::runtime
