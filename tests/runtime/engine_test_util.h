// Helpers of the engine tests: load a fixture on the CPU reference, run requests to the
// end, and collect what each sample emitted.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "models/fixture.h"
#include "runtime/engine.h"

namespace kiln::runtime::test {

// One thread per engine: ctest runs two test processes at once on two cores.
inline std::unique_ptr<Engine> load_engine(const std::string& dir, const EngineOptions& options) {
  auto e = Engine::load(dir, cpu::make_cpu_backend(1), options);
  if (!e.ok()) {
    ADD_FAILURE() << "loading " << dir << ": " << e.status().to_string();
    return nullptr;
  }
  return std::move(e).value();
}
inline std::unique_ptr<Engine> load_fixture(const std::string& name, const EngineOptions& options) {
  return load_engine(testing::fixture_dir(name), options);
}

// What one sample emitted.
struct SampleOut {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::kNone;
  int32_t n_finish = 0;  // outputs with a finish reason (exactly one when it ended)
  bool operator==(const SampleOut&) const = default;
};
using Key = std::pair<uint64_t, int32_t>;  // (request id, sample index)
using Outputs = std::map<Key, SampleOut>;

inline void collect(Outputs& out, const std::vector<StepOutput>& step) {
  for (const StepOutput& o : step) {
    SampleOut& s = out[{o.request_id, o.sample_index}];
    EXPECT_EQ(s.n_finish, 0) << "request " << o.request_id << " sample " << o.sample_index
                             << ": a token after its finish";
    s.tokens.push_back(o.token.token);
    s.logprobs.push_back(o.token.logprob);
    if (o.finish != FinishReason::kNone) {
      s.finish = o.finish;
      ++s.n_finish;
    }
  }
}

// Steps until the engine is idle (a bounded number of steps: a stuck scheduler fails).
inline void run_until_idle(Engine& e, Outputs& out, int32_t max_steps = 20000) {
  for (int32_t i = 0; i < max_steps && !e.idle(); ++i) collect(out, e.step());
  EXPECT_TRUE(e.idle()) << "still busy after " << max_steps << " steps";
}

// Adds every request (ids first_id, first_id + 1, ...) before the first step, then runs
// them to the end together.
inline Outputs run_together(Engine& e, const std::vector<Request>& requests, uint64_t first_id = 0) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const Status s = e.add_request(first_id + i, std::make_shared<const Request>(requests[i]));
    EXPECT_TRUE(s.ok()) << "request " << i << ": " << s.to_string();
  }
  Outputs out;
  run_until_idle(e, out);
  return out;
}

// One request (sample 0) alone on an idle engine.
inline SampleOut run_alone(Engine& e, const Request& r, uint64_t id = 999999) {
  EXPECT_TRUE(e.idle());
  Outputs out = run_together(e, {r}, id);
  return out[{id, 0}];
}

inline std::vector<int32_t> random_tokens(int32_t n, uint32_t seed, int32_t vocab = 320) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& t : v) t = int32_t(rng() % uint32_t(vocab));
  return v;
}

}  // namespace kiln::runtime::test
