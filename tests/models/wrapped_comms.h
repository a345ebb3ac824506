// Test helpers for the model's side of the tensor-parallel collectives on the CPU: engines
// of CPU ranks over in-process groups whose tensor-parallel communicators are wrapped
// (fused_reduce_test.cpp, micro_batch_test.cpp), and the layouts they run.
#pragma once

#include <iterator>
#include <tuple>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "runtime/engine.h"

namespace kiln::testing {

// local_comm_world with every tensor-parallel communicator replaced by
// wrap(inner, rank's backend, rank) (a std::unique_ptr of a Communicator), kept alive with
// the world.
template <typename Wrap>
runtime::CommFactory wrapped_tp_world(Wrap wrap) {
  return [wrap](const std::vector<ops::Backend*>& backends,
                const runtime::ParallelConfig& p) -> Result<runtime::CommWorld> {
    KILN_ASSIGN_OR_RETURN(runtime::CommWorld w, runtime::local_comm_world(backends, p));
    auto wrappers = std::make_shared<std::vector<std::unique_ptr<comm::Communicator>>>();
    for (size_t r = 0; r < w.tp.size(); ++r) {
      if (w.tp[r] == nullptr) continue;
      wrappers->push_back(wrap(w.tp[r], backends[r], int(r)));
      w.tp[r] = wrappers->back().get();
    }
    auto inner = w.owner;
    w.owner = std::make_shared<std::pair<std::shared_ptr<void>, decltype(wrappers)>>(inner, wrappers);
    return w;
  };
}

// An engine of `fixture` on p.world() CPU ranks (one thread each) over `comms`.
inline Result<std::unique_ptr<runtime::Engine>> load_cpu_ranks(const std::string& fixture,
                                                               const runtime::ParallelConfig& p,
                                                               runtime::CommFactory comms) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < p.world(); ++r) backends.push_back(cpu::make_cpu_backend({.n_threads = 1}));
  return runtime::Engine::load(fixture_dir(fixture), std::move(backends),
                               {.block_size = 4, .max_model_len = 256, .parallel = p, .comms = std::move(comms)});
}

struct TpLayout {
  const char* name;
  runtime::ParallelConfig parallel;
};
inline const TpLayout kTpLayouts[] = {{"tp2", {.tensor_parallel = 2}},
                                      {"tp2_ep", {.tensor_parallel = 2, .expert_parallel = true}},
                                      {"tp2_pp2", {.tensor_parallel = 2, .pipeline_parallel = 2}},
                                      {"tp4", {.tensor_parallel = 4}},
                                      {"tp4_ep", {.tensor_parallel = 4, .expert_parallel = true}}};
inline constexpr int kTpLayoutCount = int(std::size(kTpLayouts));
// The first three split 2 ways; the TP4 ones need 4 query heads (the MLA fixture has 2).
inline constexpr int kTp2LayoutCount = 3;
// A (fixture, layout index) test's name: FIXTURE_LAYOUT.
struct TpLayoutName {
  template <class Info>
  std::string operator()(const Info& info) const {
    return std::get<0>(info.param) + "_" + kTpLayouts[std::get<1>(info.param)].name;
  }
};

}  // namespace kiln::testing
