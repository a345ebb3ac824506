#include "comm/progress.h"

#include <algorithm>
#include <cmath>

namespace kiln::comm {

ProgressBoard::ProgressBoard(int world) : ranks_(size_t(world)) {}

void ProgressBoard::step_begin() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Rank& r : ranks_) r = Rank{};
  in_step_ = true;
  touch();
}

void ProgressBoard::rank_done(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  ranks_[size_t(rank)].done = true;
  ranks_[size_t(rank)].inside = false;
  if (in_step_) in_step_ = !std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.done; });
  touch();
}

void ProgressBoard::enter(int rank, const char* op) {
  std::lock_guard<std::mutex> lock(mu_);
  Rank& r = ranks_[size_t(rank)];
  r.op = op;
  r.inside = true;
  ++r.calls;
  touch();
}

void ProgressBoard::leave(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  ranks_[size_t(rank)].inside = false;
  touch();
}

double ProgressBoard::idle_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!in_step_) return 0.0;
  return std::chrono::duration<double>(Clock::now() - last_).count();
}

std::string ProgressBoard::describe_stall() const {
  std::lock_guard<std::mutex> lock(mu_);
  const double idle = std::chrono::duration<double>(Clock::now() - last_).count();
  // The laggard: a rank not done and not waiting in a collective, with the fewest calls
  // issued (it holds up those that wait for its next one); else the unfinished rank
  // with the fewest calls.
  int lag = -1;
  for (int pass = 0; pass < 2 && lag < 0; ++pass) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const Rank& r = ranks_[i];
      if (r.done || (pass == 0 && r.inside)) continue;
      if (lag < 0 || r.calls < ranks_[size_t(lag)].calls) lag = int(i);
    }
  }
  const auto where = [](const Rank& r) {
    if (r.done) return std::string("finished its part of the step");
    if (r.op == nullptr) return std::string("issued no collective this step");
    return (r.inside ? "waiting in " : "past ") + std::string(r.op) + " #" + std::to_string(r.calls);
  };
  std::string s = "watchdog: ";
  s += lag >= 0 ? "rank " + std::to_string(lag) + " made no progress for " : "no rank made progress for ";
  s += std::to_string(int64_t(std::llround(idle))) + " s";
  if (lag >= 0) s += " (" + where(ranks_[size_t(lag)]) + ")";
  std::string others;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (int(i) == lag) continue;
    others += (others.empty() ? "" : ", ") + ("rank " + std::to_string(i) + " " + where(ranks_[i]));
  }
  if (!others.empty()) s += "; " + others;
  return s;
}

}  // namespace kiln::comm
