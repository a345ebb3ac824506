// /metrics: the engine's counters and latency histograms and the server's request
// counts in the Prometheus text format (version 0.0.4).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "runtime/async_engine.h"

namespace kiln::server {

// status code -> responses sent.
using StatusCounts = std::map<int, int64_t>;

// One engine's numbers: the server's only one, or one data-parallel replica's.
struct EngineNumbers {
  runtime::AsyncEngineStats stats;
  const runtime::ServingMetrics* metrics = nullptr;
};

// Every metric covers the whole server: with several replicas their counters, gauges and
// histograms are added up (runtime::combined_stats), and a few per-replica series follow
// with an `engine` label (as vLLM's data-parallel metrics): requests in flight and running,
// tokens generated, KV cache use.
std::string metrics_text(const std::string& model_name, std::span<const EngineNumbers> engines,
                         const StatusCounts& statuses);

}  // namespace kiln::server
