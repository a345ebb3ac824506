// LocalGroup: a group of ranks that are threads of one process, over host tensors
// (the CPU backend's). Every collective is a rendezvous: each rank publishes its
// buffer, waits for the others, reads what it needs from theirs, and waits again
// before its buffer may change; sums run in fp32 in rank order. send copies into a
// mailbox and returns (so pipeline stages overlap); recv waits for the message.
//
// Several groups may share one FailState (a world group and its tensor-parallel
// sub-groups): aborting any of them fails all, and waiting ranks notice within
// kPollInterval.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace kiln::comm {

struct FailState;  // local_group.cpp

class LocalGroup {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{50};

  // A group of `size` ranks; `fail`: share another group's failure state (or a new one).
  explicit LocalGroup(int size, std::shared_ptr<FailState> fail = nullptr);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const;
  // Rank `rank`'s communicator (owned by the group; one thread uses it).
  Communicator& rank(int rank);
  std::shared_ptr<FailState> fail_state() const;

  struct State;  // local_group.cpp

 private:
  std::shared_ptr<State> state_;
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

}  // namespace kiln::comm
