#include "runtime/adaptive_depth.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/log.h"

namespace kiln::runtime {

void AdaptiveDepth::Ema::add(double x, double decay, int64_t units) {
  n += units;
  const double forget = 1.0 - std::pow(1.0 - decay, double(units));
  value += std::max(forget, double(units) / double(n)) * (x - value);
}

AdaptiveDepth::AdaptiveDepth(const AdaptiveDepthConfig& config)
    : config_(config),
      acceptance_ema_(size_t(std::max(config.max_depth, 1)), Ema{.n = kPriorTests, .value = 0.5}),
      acceptance_(acceptance_ema_.size(), 0.5),
      step_tested_(acceptance_.size(), 0),
      step_accepted_(acceptance_.size(), 0),
      costs_(kClasses) {
  KILN_CHECK_GE(config.max_depth, 1) << "adaptive depth needs num_speculative_tokens >= 1";
  KILN_CHECK_GE(config.probe_interval, 1);
}

size_t AdaptiveDepth::class_of(int32_t batch) {
  size_t c = 0;
  while (c + 1 < size_t(kClasses) && (int64_t(1) << c) < int64_t(batch)) ++c;
  return c;
}

AdaptiveDepth::Costs& AdaptiveDepth::costs_for(int32_t batch) {
  const size_t cls = class_of(batch);
  Costs& c = costs_[cls];
  if (c.seeded) return c;
  c.seeded = true;
  bool off_below = false, on_above = false;  // verdicts of classes with both modes measured
  for (size_t i = 0; i < costs_.size(); ++i) {
    const Costs& o = costs_[i];
    if (i == cls || o.rate[0].n == 0 || o.rate[1].n == 0) continue;
    off_below = off_below || (i < cls && !o.best_on);
    on_above = on_above || (i > cls && o.best_on);
  }
  if (off_below != on_above) {  // one verdict (none, or two that disagree: measure as new)
    c.prior = on_above ? 1 : 0;
    c.on = c.best_on = on_above;
  }
  return c;
}

void AdaptiveDepth::note_choice(int32_t k) {
  last_choice_ = k;
  ++choices_;
  depth_total_ += k;
  recent_depth_ += std::max(1.0 / 32, 1.0 / double(choices_)) * (double(k) - recent_depth_);
}

int32_t AdaptiveDepth::choose(std::span<const int32_t> draft_lengths) {
  if (std::none_of(draft_lengths.begin(), draft_lengths.end(), [](int32_t n) { return n > 0; })) return 0;
  const int32_t k = decide(draft_lengths);
  note_choice(k);
  return k;
}

int32_t AdaptiveDepth::estimate(const Costs& c, std::span<const int32_t> draft_lengths, int32_t& interval) const {
  const int32_t max_k = config_.max_depth;
  const StepCostModel cost = line(c);
  const int32_t chosen = best_depth(acceptance_, cost, draft_lengths, max_k, c.current);
  interval = config_.probe_interval;
  if (chosen == 0) {
    interval *= std::max(config_.losing_probe_factor, 1);
    if (hopeless(cost, draft_lengths, max_k)) interval *= std::max(config_.hopeless_probe_factor, 1);
  }
  return chosen;
}

int32_t AdaptiveDepth::decide(std::span<const int32_t> draft_lengths) {
  const int32_t max_k = config_.max_depth;
  if (!config_.adaptive) return max_k;
  if (config_.schedule) return std::clamp(config_.schedule(steps_ + 1), 0, max_k);
  Costs& c = costs_for(int32_t(draft_lengths.size()));
  if (!c.on) return 0;  // the governor: speculation off here for now
  // Warm-up: the cost of a decode step first, then that of a verify step at depth K (which
  // also measures acceptance at every position the drafts reach).
  if (c.decode_timed < config_.warmup_steps) return 0;
  if (c.verify_timed < config_.warmup_steps) return max_k;
  int32_t interval = 0;
  const int32_t chosen = estimate(c, draft_lengths, interval);
  c.current = chosen;
  if (++c.since_probe < interval) return chosen;
  c.since_probe = 0;
  // A probe: while speculation loses, each depth 1 .. K in turn (the acceptance of deeper
  // positions and the cost of more rows); while it wins, no drafts (the decode cost, which
  // changes with the batch) and K in turn.
  ++probes_;
  const int32_t turn = probe_cursor_++;
  if (chosen == 0) return 1 + turn % max_k;
  if (chosen == max_k) return 0;
  return turn % 2 == 0 ? 0 : max_k;
}

int32_t AdaptiveDepth::plan_drafts(int32_t batch) {
  const int32_t max_k = config_.max_depth;
  if (!config_.adaptive || batch <= 0) return max_k;
  if (config_.schedule) {  // the next step's depth (this one's is steps_ + 1)
    const int32_t k = std::clamp(config_.schedule(steps_ + 2), 0, max_k);
    if (k == 0) note_choice(0);
    return k;
  }
  Costs& c = costs_for(batch);
  if (!c.on) {
    note_choice(0);
    return 0;
  }
  if (c.decode_timed < config_.warmup_steps) return 0;
  if (c.verify_timed < config_.warmup_steps) return max_k;
  const std::vector<int32_t> lengths(size_t(batch), max_k);
  int32_t interval = 0;
  const int32_t chosen = estimate(c, lengths, interval);
  c.current = chosen;
  if (c.since_probe + 1 >= interval) return chosen == 0 ? 1 + probe_cursor_ % max_k : max_k;  // decide() probes
  if (chosen > 0) return std::min(max_k, chosen + 1);
  // The next step runs without drafts: a choice of 0, and a step towards the next probe.
  ++c.since_probe;
  note_choice(0);
  return 0;
}

void AdaptiveDepth::record_verification(int32_t n_draft, int32_t n_accepted) {
  KILN_CHECK(n_draft >= 1 && n_draft <= config_.max_depth && n_accepted >= 0 && n_accepted <= n_draft)
      << "verification of " << n_accepted << " of " << n_draft << " drafts, K = " << config_.max_depth;
  // Position i is tested when every draft before it stood; it stands when i <= n_accepted.
  const int32_t tested = std::min(n_accepted + 1, n_draft);
  for (int32_t i = 0; i < tested; ++i) {
    ++step_tested_[size_t(i)];
    if (i < n_accepted) ++step_accepted_[size_t(i)];
  }
}

void AdaptiveDepth::govern(Costs& c, int64_t emitted, double seconds) {
  c.window_tokens += emitted;
  c.window_seconds += seconds;
  if (++c.window_steps < config_.governor_window || c.window_seconds < config_.governor_min_window_s) return;
  const double window_rate = c.window_seconds > 0.0 ? double(c.window_tokens) / c.window_seconds : 0.0;
  if (c.window_seconds > 0.0) c.rate[c.on ? 1 : 0].add(window_rate, kGovernorDecay, 1);
  const bool was_on = c.on;
  c.window_steps = 0;
  c.window_tokens = 0;
  c.window_seconds = 0.0;
  ++c.windows;
  next_mode(c);
  // Every verdict in the log (KILN_LOG=debug): what the window measured and what runs next.
  KILN_LOG(kDebug, "speculation governor: batch class " << (&c - costs_.data()) << ", window " << c.windows
                   << " (" << (was_on ? "on" : "off") << "): " << int64_t(window_rate) << " tok/s; means off "
                   << int64_t(c.rate[0].value) << " (" << c.rate[0].n << " windows), on " << int64_t(c.rate[1].value)
                   << " (" << c.rate[1].n << "); best " << (c.best_on ? "on" : "off") << ", next "
                   << (c.on ? "on" : "off") << ", refresh every " << c.refresh_every << "; recent depth "
                   << recent_depth_);
}

void AdaptiveDepth::next_mode(Costs& c) {
  const int32_t base = std::max(config_.governor_refresh, 2);
  if (c.refresh_every == 0) c.refresh_every = base;
  // A window of the losing mode (a refresh window, or a trial before the first verdict)
  // that found it still losing by kRefreshBackoff makes the next refresh twice as far off
  // (up to kMaxRefreshFactor times governor_refresh windows); one that found it close
  // brings them back to every governor_refresh windows.
  if (c.on != c.best_on && c.rate[0].n > 0 && c.rate[1].n > 0) {
    const double best = c.rate[c.best_on ? 1 : 0].value, other = c.rate[c.best_on ? 0 : 1].value;
    c.refresh_every = best > other * (1.0 + kRefreshBackoff) ? std::min(2 * c.refresh_every, kMaxRefreshFactor * base)
                                                              : base;
  }
  // The next window: where the neighbours gave a verdict, a mode never measured in the
  // refresh window only; without one, the two modes in turn until each has its first
  // windows. Then the better one (the mode in use stays unless the other wins by kMargin),
  // the other one in a refresh window.
  const bool refresh = ++c.since_refresh >= c.refresh_every;
  if (refresh) c.since_refresh = 0;
  if (c.prior >= 0 && (c.rate[0].n == 0 || c.rate[1].n == 0)) {
    const bool missing = c.rate[1].n == 0;  // the mode not measured yet: on (true) or off
    c.on = refresh ? missing : !missing;
    return;
  }
  const int64_t first = std::max(config_.governor_first_windows, 1);
  if (c.prior < 0 && (c.rate[0].n < first || c.rate[1].n < first)) {
    c.on = c.rate[1].n <= c.rate[0].n;
    return;
  }
  const double off = c.rate[0].value, on = c.rate[1].value;
  c.best_on = c.best_on ? !(off > on * (1.0 + kMargin)) : on > off * (1.0 + kMargin);
  c.on = refresh ? !c.best_on : c.best_on;
}

void AdaptiveDepth::record_step(bool timed, bool verify, int32_t n_seqs, int64_t rows, double seconds,
                                int64_t emitted, bool one_time) {
  ++steps_;
  for (size_t i = 0; i < acceptance_.size(); ++i) {
    if (step_tested_[i] == 0) continue;
    acceptance_ema_[i].add(double(step_accepted_[i]) / double(step_tested_[i]), config_.decay, step_tested_[i]);
    acceptance_[i] = acceptance_ema_[i].value;
    step_tested_[i] = step_accepted_[i] = 0;
  }
  if (n_seqs <= 0) return;
  Costs& c = costs_for(n_seqs);
  if (config_.adaptive && !config_.schedule && config_.governor_window > 0) {
    const bool verdict = c.rate[0].n > 0 && c.rate[1].n > 0;
    if (one_time && !verdict) govern(c, 0, 0.0);  // counted as a step, not in the rate
    else govern(c, emitted, seconds);
  }
  if (!timed || one_time || rows <= 0) return;
  Ema& r = verify ? c.verify_rows : c.decode_rows;
  Ema& t = verify ? c.verify_seconds : c.decode_seconds;
  int64_t& last = verify ? c.verify_last_step : c.decode_last_step;
  // The steps since this kind's last measurement, as steps of forgetting (the first
  // measurement of a kind starts its mean: `units` only sets its weight among few).
  const int64_t gap = r.n == 0 ? 1 : steps_ - last;
  last = steps_;
  r.add(double(rows), config_.decay, gap);
  t.add(seconds, config_.decay, gap);
  ++(verify ? c.verify_timed : c.decode_timed);
}

bool AdaptiveDepth::speculation_hopeless(int32_t batch) const {
  if (!config_.adaptive || config_.schedule || batch <= 0) return false;
  const Costs& c = costs_[class_of(batch)];
  if (!warm(c)) return false;
  return hopeless(line(c), std::vector<int32_t>(size_t(batch), config_.max_depth), config_.max_depth);
}

bool AdaptiveDepth::hopeless(const StepCostModel& cost, std::span<const int32_t> draft_lengths, int32_t max_depth) {
  return best_depth(std::vector<double>(size_t(max_depth), kHopefulAcceptance), cost, draft_lengths, max_depth) == 0;
}

StepCostModel AdaptiveDepth::cost_model(int32_t batch) const { return line(costs_[class_of(batch)]); }

StepCostModel AdaptiveDepth::line(const Costs& c) {
  StepCostModel m;
  if (c.decode_rows.n == 0 || c.verify_rows.n == 0) return m;
  m.known = true;
  const double rd = c.decode_rows.value, td = c.decode_seconds.value;
  const double rv = c.verify_rows.value, tv = c.verify_seconds.value;
  if (std::fabs(rv - rd) >= 0.5) {
    // The line through the two points.
    m.per_row_s = std::max(0.0, (tv - td) / (rv - rd));
    m.fixed_s = td - m.per_row_s * rd;
    if (m.fixed_s < 0.0) {
      // Rows costing more than linearly: the line through the origin and the dearer point,
      // which prices every extra row at least as high as measured.
      m.fixed_s = 0.0;
      m.per_row_s = std::max(td / rd, tv / rv);
    }
  } else {
    // No spread in rows to separate the parts: everything per row (speculation then loses
    // unless acceptance is perfect, the safe side).
    m.per_row_s = (td + tv) / (rd + rv);
  }
  return m;
}

int32_t AdaptiveDepth::best_depth(std::span<const double> acceptance, const StepCostModel& cost,
                                  std::span<const int32_t> draft_lengths, int32_t max_depth, int32_t current) {
  if (!cost.known) return 0;
  // prefix[i] = prod_{j <= i} a_j: the expected tokens a sequence gains from its i-th draft.
  std::vector<double> prefix(size_t(std::max(max_depth, 0)) + 1, 0.0);
  double p = 1.0;
  for (int32_t i = 1; i <= max_depth; ++i) {
    p *= size_t(i) <= acceptance.size() ? std::clamp(acceptance[size_t(i - 1)], 0.0, 1.0) : 0.0;
    prefix[size_t(i)] = p;
  }
  const auto tokens_per_second = [&](int32_t k) {
    double tokens = 0.0, rows = 0.0;
    for (int32_t len : draft_lengths) {
      const int32_t d = std::min(k, std::max(len, 0));
      rows += 1.0 + d;
      tokens += 1.0;
      for (int32_t i = 1; i <= d; ++i) tokens += prefix[size_t(i)];
    }
    return tokens / std::max(cost.seconds(rows), 1e-12);
  };
  // The depth in use stays unless another beats it by kMargin (entering speculation from
  // 0 likewise takes a kMargin gain).
  current = std::clamp(current, 0, std::max(max_depth, 0));
  int32_t best = current;
  double best_rate = tokens_per_second(current) * (1.0 + kMargin);
  for (int32_t k = 0; k <= max_depth; ++k) {
    const double rate = tokens_per_second(k);
    if (k != current && rate > best_rate) best = k, best_rate = rate;
  }
  return best;
}

}  // namespace kiln::runtime
