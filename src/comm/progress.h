// Where each rank of a world is in its collectives, for a watchdog: a ProgressBoard
// that every rank's WatchedCommunicator reports to (entering and leaving each call),
// and that the runner reports step starts and each rank's end of a step to.
//
// The watchdog (runtime/model_runner.cpp) reads it: when nothing has moved for its
// timeout while a step is in flight, the rank that lags (fewest collectives issued in
// this step, not waiting in one) is named with the operation the others wait in, and
// the world is aborted (Communicator::abort), which turns every wait into CommAborted.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace kiln::comm {

class ProgressBoard {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ProgressBoard(int world);

  // The runner: a step begins on every rank / rank `rank` has finished its part of it
  // (outside a step, e.g. while loading, nothing is watched).
  void step_begin();
  void rank_done(int rank);
  // A WatchedCommunicator: rank `rank` enters / leaves collective `op` (a static string).
  void enter(int rank, const char* op);
  void leave(int rank);

  // Seconds since anything moved, while a step is in flight (0 between steps).
  double idle_seconds() const;
  // Which rank holds the others up, and where each one is, in words: "watchdog: rank 1
  // made no progress for 30 s (past all_reduce #3); rank 0 waiting in all_reduce #4".
  std::string describe_stall() const;

 private:
  struct Rank {
    const char* op = nullptr;  // the collective it is in, or the last one it left
    bool inside = false, done = false;
    int64_t calls = 0;  // collectives entered this step
  };
  void touch() { last_ = Clock::now(); }

  mutable std::mutex mu_;
  std::vector<Rank> ranks_;
  bool in_step_ = false;
  Clock::time_point last_ = Clock::now();
};

// A communicator that reports its calls to a ProgressBoard as world rank `world_rank`
// and forwards them to `inner` (not owned).
class WatchedCommunicator final : public Communicator {
 public:
  WatchedCommunicator(Communicator* inner, std::shared_ptr<ProgressBoard> board, int world_rank)
      : inner_(inner), board_(std::move(board)), world_rank_(world_rank) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  void all_reduce(Tensor& t) override { watched("all_reduce", [&] { inner_->all_reduce(t); }); }
  bool all_reduce_add_rms_norm(Tensor& t, Tensor& residual, const Tensor& weight, Tensor& out, float eps) override {
    bool fused = false;
    watched("all_reduce", [&] { fused = inner_->all_reduce_add_rms_norm(t, residual, weight, out, eps); });
    return fused;
  }
  int start_all_reduce(Tensor& t) override {
    int ticket = 0;
    watched("all_reduce", [&] { ticket = inner_->start_all_reduce(t); });
    return ticket;
  }
  void finish_all_reduce(int ticket) override {
    watched("all_reduce", [&] { inner_->finish_all_reduce(ticket); });
  }
  bool overlap_pays() const override { return inner_->overlap_pays(); }
  void all_gather(const Tensor& in, Tensor& out) override {
    watched("all_gather", [&] { inner_->all_gather(in, out); });
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    watched("reduce_scatter", [&] { inner_->reduce_scatter(in, out); });
  }
  void all_to_all(const Tensor& in, Tensor& out) override {
    watched("all_to_all", [&] { inner_->all_to_all(in, out); });
  }
  void broadcast(Tensor& t, int root) override { watched("broadcast", [&] { inner_->broadcast(t, root); }); }
  void send(const Tensor& t, int peer) override { watched("send", [&] { inner_->send(t, peer); }); }
  void recv(Tensor& t, int peer) override { watched("recv", [&] { inner_->recv(t, peer); }); }
  void abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  template <typename F>
  void watched(const char* op, F&& call) {
    board_->enter(world_rank_, op);
    try {
      call();
    } catch (...) {
      board_->leave(world_rank_);
      throw;
    }
    board_->leave(world_rank_);
  }

  Communicator* inner_;
  std::shared_ptr<ProgressBoard> board_;
  int world_rank_;
};

}  // namespace kiln::comm
