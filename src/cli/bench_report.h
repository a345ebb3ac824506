// The HTML report of `kiln bench serve`: one self-contained page (inline CSS and SVG charts,
// no script, nothing fetched) drawn from the JSON report ({"levels": [{"config", "summary",
// "requests"}]}): what was measured, throughput and latency per level, the summary table
// and the error tally. Per-request records are never read, so the page stays small.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace kiln::cli {

// The page of a `kiln bench serve --json` report; an error names the first field that is
// missing or of the wrong type ("levels[1].summary.ttft_ms.p99: expected a number").
[[nodiscard]] Result<std::string> bench_report_html(const nlohmann::ordered_json& report);

// bench_report_html(report) written to html_path.
[[nodiscard]] Status write_bench_report_html(const nlohmann::ordered_json& report, const std::string& html_path);

// `kiln bench report`: the JSON file of an earlier run -> its HTML page.
[[nodiscard]] Status bench_report_from_file(const std::string& json_path, const std::string& html_path);

}  // namespace kiln::cli
