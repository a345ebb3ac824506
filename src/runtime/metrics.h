// Serving metrics the engine loop records: latency histograms and request counts,
// read by the server's /metrics (Prometheus text) from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::runtime {

// A cumulative histogram of seconds with fixed upper bounds (Prometheus' `le`).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}
  void observe(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < bounds_.size(); ++i)
      if (seconds <= bounds_[i]) ++counts_[i];
    ++count_;
    sum_ += seconds;
  }
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<int64_t> cumulative;  // observations <= bounds[i]
    int64_t count = 0;
    double sum = 0.0;
  };
  Snapshot snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {bounds_, counts_, count_, sum_};
  }

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  double sum_ = 0.0;
};

// Bounds in seconds, as vLLM's: time to first token and end-to-end latency span
// milliseconds to minutes, inter-token latency milliseconds to seconds.
inline std::vector<double> ttft_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
inline std::vector<double> itl_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
          0.75, 1.0, 2.5};
}
inline std::vector<double> e2e_bounds() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0};
}

struct ServingMetrics {
  Histogram time_to_first_token{ttft_bounds()};
  Histogram inter_token_latency{itl_bounds()};
  Histogram e2e_latency{e2e_bounds()};
};

}  // namespace kiln::runtime
