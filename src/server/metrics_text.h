// /metrics: the engine's counters and latency histograms and the server's request
// counts in the Prometheus text format (version 0.0.4).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "runtime/async_engine.h"

namespace kiln::server {

// status code -> responses sent.
using StatusCounts = std::map<int, int64_t>;

std::string metrics_text(const std::string& model_name, const runtime::AsyncEngineStats& stats,
                         runtime::ServingMetrics& metrics, const StatusCounts& statuses);

}  // namespace kiln::server
