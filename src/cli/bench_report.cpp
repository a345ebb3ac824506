// The HTML report of `kiln bench serve` (bench_report.h). The JSON report is read into
// plain structs first (every field checked, an error names it), then drawn: two SVG line
// charts from one chart function (categorical x axis, one point per level, so 1, 8, 32, 128
// are evenly spaced), the summary table (with draft acceptance and mean accepted length
// where the levels measured speculative decoding) and the error tally. Every string from the report
// (URL, model, error messages) is escaped before it enters the page.
#include "cli/bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_bounded.h"

namespace kiln::cli {
namespace {

using json = nlohmann::ordered_json;

// ---- the report, read and checked ---------------------------------------------------

struct Dist {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

struct Level {
  double concurrency = 0;   // requests in flight at most; 0 with a request rate
  double request_rate = 0;  // requests/s; 0 at a fixed concurrency
  double num_requests = 0;
  std::string date;  // UTC, ISO 8601
  double successful = 0, failed = 0, duration_s = 0;
  double requests_per_s = 0, output_tokens_per_s = 0, total_tokens_per_s = 0;
  Dist ttft_ms, tpot_ms, itl_ms, e2e_ms;
  std::vector<std::pair<std::string, double>> errors;  // message, count
  // Speculative decoding over the level (summary.speculative, from the server's /metrics).
  bool speculative = false;
  double acceptance = 0, mean_accepted_length = 0, drafts = 0;
};

// What was measured: the first level's config (one run shares it).
struct Setup {
  std::string url, model, endpoint, seed, kiln_version;
  double input_len = 0, output_len = 0, random_range_ratio = 0, warmup = 0;
  double temperature = 0, top_p = 1;  // (absent from reports before they were options: greedy)
};

struct Report {
  Setup setup;
  std::vector<Level> levels;
};

// One JSON object's fields; the first problem lands in *error, naming the field.
class Fields {
 public:
  Fields(const json& j, std::string where, Status* error) : j_(j), where_(std::move(where)), error_(error) {
    if (!j_.is_object()) problem("", "an object");
  }
  // A required number; an optional one may be absent or null (0).
  double number(const char* key, bool required = true) const {
    const json* v = find(key);
    if (v && v->is_number()) return v->get<double>();
    if (required || (v && !v->is_null())) problem(key, "a number");
    return 0;
  }
  std::string text(const char* key, bool required = true) const {
    const json* v = find(key);
    if (v && v->is_string()) return v->get<std::string>();
    if (required || (v && !v->is_null())) problem(key, "a string");
    return "";
  }
  Fields object(const char* key) const {
    const json* v = find(key);
    if (v) return Fields(*v, where_ + "." + key, error_);
    problem(key, "an object");
    return Fields(kEmpty, where_ + "." + key, error_);
  }
  Dist dist(const char* key) const {
    const Fields d = object(key);
    return {d.number("mean"), d.number("p50"), d.number("p90"), d.number("p99")};
  }
  const json* find(const char* key) const {
    if (!j_.is_object()) return nullptr;
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  void problem(const std::string& key, const char* expected) const {
    if (error_->ok()) *error_ = invalid_argument(where_ + (key.empty() ? "" : "." + key) + ": expected " + expected);
  }

 private:
  static inline const json kEmpty = json::object();
  const json& j_;
  std::string where_;
  Status* error_;
};

Result<Report> read_report(const json& j) {
  if (!j.is_object() || !j.contains("levels") || !j["levels"].is_array() || j["levels"].empty())
    return invalid_argument("levels: expected a non-empty array (the JSON report of kiln bench serve --json)");
  Status error;
  Report r;
  for (size_t i = 0; i < j["levels"].size(); ++i) {
    const Fields level(j["levels"][i], "levels[" + std::to_string(i) + "]", &error);
    const Fields config = level.object("config"), summary = level.object("summary");
    if (i == 0) {
      const json* seed = config.find("seed");
      r.setup = {.url = config.text("url"),
                 .model = config.text("model"),
                 .endpoint = config.text("endpoint"),
                 .seed = seed && seed->is_number() ? seed->dump() : "",
                 .kiln_version = config.text("kiln_version", false),
                 .input_len = config.number("input_len"),
                 .output_len = config.number("output_len"),
                 .random_range_ratio = config.number("random_range_ratio", false),
                 .warmup = config.number("warmup", false),
                 .temperature = config.number("temperature", false),
                 .top_p = config.find("top_p") ? config.number("top_p") : 1.0};
    }
    Level l{.concurrency = config.number("concurrency", false),
            .request_rate = config.number("request_rate", false),
            .num_requests = config.number("num_requests"),
            .date = config.text("date", false),
            .successful = summary.number("successful"),
            .failed = summary.number("failed"),
            .duration_s = summary.number("duration_s"),
            .requests_per_s = summary.number("requests_per_s"),
            .output_tokens_per_s = summary.number("output_tokens_per_s"),
            .total_tokens_per_s = summary.number("total_tokens_per_s"),
            .ttft_ms = summary.dist("ttft_ms"),
            .tpot_ms = summary.dist("tpot_ms"),
            .itl_ms = summary.dist("itl_ms"),
            .e2e_ms = summary.dist("e2e_ms")};
    if (l.concurrency <= 0 && l.request_rate <= 0) config.problem("concurrency", "a positive number (or request_rate)");
    if (summary.find("speculative") != nullptr) {
      const Fields spec = summary.object("speculative");
      l.speculative = true;
      l.acceptance = spec.number("acceptance");
      l.mean_accepted_length = spec.number("mean_accepted_length");
      l.drafts = spec.number("drafts");
    }
    if (const json* errors = summary.find("errors"); errors && errors->is_object()) {
      for (const auto& [message, count] : errors->items()) {
        if (!count.is_number()) summary.problem("errors", "an object of message: count");
        l.errors.emplace_back(message, count.is_number() ? count.get<double>() : 0);
      }
    }
    r.levels.push_back(std::move(l));
  }
  if (!error.ok()) return error;
  return r;
}

// ---- text -----------------------------------------------------------------------------

std::string strf(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  char buf[512];
  const int n = std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return std::string(buf, size_t(std::clamp(n, 0, int(sizeof buf) - 1)));
}

// For text and attribute values alike.
std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// 12,345.6: thousands grouped (axis ticks and tooltips).
std::string grouped(double v, int decimals) {
  std::string s = strf("%.*f", decimals, v);
  const size_t start = s[0] == '-' ? 1 : 0;
  size_t point = s.find('.');
  if (point == std::string::npos) point = s.size();
  for (size_t i = point; i > start + 3; i -= 3) s.insert(s.begin() + std::ptrdiff_t(i - 3), ',');
  return s;
}

// The x tick of a level: its concurrency, or its request rate.
std::string level_tick(const Level& l) {
  return l.request_rate > 0 ? strf("%g/s", l.request_rate) : strf("%g", l.concurrency);
}

// The column head of a level, as the terminal table names it.
std::string level_label(const Level& l) {
  return l.request_rate > 0 ? strf("rate %g/s", l.request_rate) : strf("c=%g", l.concurrency);
}

// ---- numbers per level: table rows and chart series ---------------------------------

using Getter = std::function<double(const Level&)>;

Getter field_of(double Level::*field) {
  return [field](const Level& l) { return l.*field; };
}
Getter stat_of(Dist Level::*dist, double Dist::*stat) {
  return [dist, stat](const Level& l) { return (l.*dist).*stat; };
}

struct Row {
  std::string name;
  int decimals;  // as the terminal table prints it
  Getter of;
};

// The terminal table's rows (bench_serve.cpp print_table), with the request count first;
// the speculative-decoding rows where a level has them.
std::vector<Row> table_rows(const std::vector<Level>& levels) {
  std::vector<Row> rows = {{"requests", 0, field_of(&Level::num_requests)},
                           {"successful requests", 0, field_of(&Level::successful)},
                           {"failed requests", 0, field_of(&Level::failed)},
                           {"duration (s)", 2, field_of(&Level::duration_s)},
                           {"requests/s", 2, field_of(&Level::requests_per_s)},
                           {"output tokens/s", 1, field_of(&Level::output_tokens_per_s)},
                           {"total tokens/s", 1, field_of(&Level::total_tokens_per_s)}};
  const std::pair<const char*, Dist Level::*> dists[] = {
      {"TTFT", &Level::ttft_ms}, {"TPOT", &Level::tpot_ms}, {"ITL", &Level::itl_ms}};
  const std::pair<const char*, double Dist::*> stats[] = {
      {"mean", &Dist::mean}, {"p50", &Dist::p50}, {"p90", &Dist::p90}, {"p99", &Dist::p99}};
  for (const auto& [name, dist] : dists)
    for (const auto& [stat, field] : stats)
      rows.push_back({std::string(name) + " " + stat + " (ms)", 2, stat_of(dist, field)});
  rows.push_back({"E2E latency mean (ms)", 2, stat_of(&Level::e2e_ms, &Dist::mean)});
  if (std::any_of(levels.begin(), levels.end(), [](const Level& l) { return l.speculative; })) {
    rows.push_back({"draft acceptance (%)", 1, [](const Level& l) { return 100.0 * l.acceptance; }});
    rows.push_back({"mean accepted length", 2, field_of(&Level::mean_accepted_length)});
    rows.push_back({"verified drafts", 0, field_of(&Level::drafts)});
  }
  return rows;
}

// ---- charts -----------------------------------------------------------------------------

// The SVG canvas and its plot area (user units = CSS px at 100%).
constexpr double kWidth = 760, kHeight = 380;
constexpr double kLeft = 84, kRight = 740, kTop = 52, kBottom = 318;

struct Tick {
  double value;
  std::string label;
};

// A y axis: a value's height as a fraction of the plot, and the ticks to draw.
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  std::vector<Tick> ticks;
  double frac(double v) const {
    if (!log) return (v - lo) / (hi - lo);
    return (std::log10(std::max(v, lo)) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
  }
};

// 0 .. a round number at or above max, in steps of 1, 2 or 5 x 10^k (five or six ticks).
Axis linear_axis(double max) {
  if (!(max > 0)) max = 1;
  const double raw = max / 5, mag = std::pow(10.0, std::floor(std::log10(raw))), f = raw / mag;
  const double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  const int n = int(std::ceil(max / step - 1e-9));
  const int decimals = std::max(0, -int(std::floor(std::log10(step) + 1e-9)));
  Axis a{.lo = 0, .hi = n * step};
  for (int i = 0; i <= n; ++i) a.ticks.push_back({i * step, grouped(i * step, decimals)});
  return a;
}

// A log axis over [min_positive, max]: from the largest tick at or below min_positive to the
// smallest at or above max, ticks at 1, 2 and 5 x 10^k when at most three decades are
// spanned, else at 10^k. Latencies span decades (TPOT 5 ms, TTFT 4 s on a CPU).
Axis log_axis(double min_positive, double max) {
  if (!(max > 0)) max = 1;
  if (!(min_positive > 0) || min_positive > max) min_positive = max;
  const int k_lo = int(std::floor(std::log10(min_positive) + 1e-9));
  const int k_hi = std::max(k_lo + 1, int(std::ceil(std::log10(max) - 1e-9)));
  const bool fine = k_hi - k_lo <= 3;
  std::vector<Tick> candidates;  // ascending, from 10^k_lo to 10^k_hi
  for (int k = k_lo; k <= k_hi; ++k)
    for (double m : {1.0, 2.0, 5.0})
      if (m == 1 || (fine && k < k_hi)) {
        const double v = m * std::pow(10.0, k);
        candidates.push_back({v, grouped(v, std::max(0, -k))});
      }
  size_t first = 0, last = candidates.size() - 1;
  while (first + 1 < candidates.size() && candidates[first + 1].value <= min_positive * (1 + 1e-9)) ++first;
  while (last > first + 1 && candidates[last - 1].value >= max * (1 - 1e-9)) --last;
  Axis a{.lo = candidates[first].value, .hi = candidates[last].value, .log = true};
  a.ticks.assign(candidates.begin() + std::ptrdiff_t(first), candidates.begin() + std::ptrdiff_t(last) + 1);
  return a;
}

struct Series {
  std::string name;
  const char* color;
  bool dashed;
  Getter of;
};

struct Chart {
  std::string id, title, y_title, unit;  // unit: of a point's tooltip ("ms", "tokens/s")
  bool log_y;
  std::vector<Series> series;
};

// Plot coordinates of level i (categorical: evenly spaced) and of a value on axis y.
struct Plot {
  size_t n_levels;
  const Axis& y;
  double x(size_t i) const { return kLeft + (double(i) + 0.5) * (kRight - kLeft) / double(n_levels); }
  double y_of(double v) const { return kBottom - std::clamp(y.frac(v), 0.0, 1.0) * (kBottom - kTop); }
};

std::string y_axis_svg(const Plot& p, const std::string& title) {
  std::string s = "<g class=\"y-axis\">";
  for (const Tick& t : p.y.ticks) {
    const double y = p.y_of(t.value);
    s += strf("<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", kLeft, y, kRight, y);
    s += strf("<text class=\"tick y-tick\" x=\"%.1f\" y=\"%.1f\">", kLeft - 8, y + 4) + escape(t.label) + "</text>";
  }
  s += strf("<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", kLeft, kTop, kLeft, kBottom);
  s += strf("<text class=\"axis-title\" transform=\"translate(18 %.1f) rotate(-90)\">", (kTop + kBottom) / 2) +
       escape(title) + "</text></g>";
  return s;
}

std::string x_axis_svg(const Plot& p, const std::vector<Level>& levels, const std::string& title) {
  std::string s = "<g class=\"x-axis\">";
  s += strf("<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", kLeft, kBottom, kRight, kBottom);
  for (size_t i = 0; i < levels.size(); ++i) {
    s += strf("<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", p.x(i), kBottom, p.x(i),
              kBottom + 5);
    s += strf("<text class=\"tick x-tick\" x=\"%.1f\" y=\"%.1f\">", p.x(i), kBottom + 20) +
         escape(level_tick(levels[i])) + "</text>";
  }
  s += strf("<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\">", (kLeft + kRight) / 2, kHeight - 12) +
       escape(title) + "</text></g>";
  return s;
}

// One series: a polyline through its points and a marker per point (hover: the value).
std::string series_svg(const Plot& p, const Chart& c, const Series& series, const std::vector<Level>& levels) {
  std::string points, markers;
  for (size_t i = 0; i < levels.size(); ++i) {
    const double v = series.of(levels[i]);
    points += strf("%s%.1f,%.1f", i ? " " : "", p.x(i), p.y_of(v));
    markers += strf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\"><title>", p.x(i), p.y_of(v)) +
               escape(series.name + " at " + level_label(levels[i]) + ": " + grouped(v, v < 10 ? 2 : 1) + " " +
                      c.unit) +
               "</title></circle>";
  }
  return "<g class=\"series\" data-series=\"" + escape(series.name) + "\" style=\"--color: " + series.color + "\">" +
         "<polyline class=\"line" + (series.dashed ? " dashed" : "") + "\" points=\"" + points + "\"/>" + markers +
         "</g>";
}

// A row of (line, marker, name) entries above the plot.
std::string legend_svg(const std::vector<Series>& series) {
  std::string s = "<g class=\"legend\">";
  double x = kLeft;
  for (const Series& e : series) {
    s += "<g style=\"--color: " + std::string(e.color) + "\">";
    s += strf("<line class=\"line%s\" x1=\"%.1f\" y1=\"22\" x2=\"%.1f\" y2=\"22\"/>", e.dashed ? " dashed" : "", x,
              x + 26);
    s += strf("<circle cx=\"%.1f\" cy=\"22\" r=\"4\"/>", x + 13);
    s += strf("<text x=\"%.1f\" y=\"26\">", x + 32) + escape(e.name) + "</text></g>";
    x += 32 + 7.5 * double(e.name.size()) + 24;  // about 7.5 px per character at 13 px
  }
  return s + "</g>";
}

std::string chart_svg(const Chart& c, const std::vector<Level>& levels, const std::string& x_title) {
  double max = 0, min_positive = std::numeric_limits<double>::infinity();
  for (const Series& series : c.series)
    for (const Level& l : levels) {
      const double v = series.of(l);
      max = std::max(max, v);
      if (v > 0) min_positive = std::min(min_positive, v);
    }
  const Axis y = c.log_y ? log_axis(min_positive, max) : linear_axis(max);
  const Plot p{levels.size(), y};
  std::string s = strf("<svg id=\"%s\" role=\"img\" aria-labelledby=\"%s-title\" xmlns=\"http://www.w3.org/2000/svg\" "
                       "viewBox=\"0 0 %g %g\" width=\"%g\" height=\"%g\">",
                       c.id.c_str(), c.id.c_str(), kWidth, kHeight, kWidth, kHeight);
  s += "<title id=\"" + c.id + "-title\">" + escape(c.title) + "</title>";
  s += y_axis_svg(p, c.y_title) + x_axis_svg(p, levels, x_title);
  for (const Series& series : c.series) s += series_svg(p, c, series, levels);
  return s + legend_svg(c.series) + "</svg>\n";
}

// ---- the page -----------------------------------------------------------------------------

constexpr const char* kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330; margin: 0; }
main { max-width: 980px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 12px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
dl.setup { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
dl.setup dt { color: #5b6475; }
dl.setup dd { margin: 0; font-family: ui-monospace, "DejaVu Sans Mono", monospace; overflow-wrap: anywhere; }
svg { display: block; max-width: 100%; height: auto; font-size: 13px; }
svg text { fill: #1d2330; }
svg .grid { stroke: #e3e6ec; }
svg .axis { stroke: #5b6475; }
svg .y-tick { text-anchor: end; }
svg .x-tick, svg .axis-title { text-anchor: middle; }
svg .axis-title { font-weight: 600; }
svg .line { fill: none; stroke: var(--color); stroke-width: 2.2; }
svg .line.dashed { stroke-dasharray: 6 4; }
svg circle { fill: var(--color); stroke: #fff; stroke-width: 1.2; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e3e6ec; }
thead th { text-align: right; border-bottom: 2px solid #5b6475; }
tbody th { text-align: left; font-weight: normal; color: #5b6475; white-space: nowrap; }
td { text-align: right; }
table.errors th, table.errors td { text-align: left; }
table.errors .count { text-align: right; }
.note { color: #5b6475; font-size: 13px; }
)";

std::string setup_html(const Report& r) {
  const Setup& s = r.setup;
  std::string requests;  // per level: one number when every level ran as many
  bool same = true;
  for (const Level& l : r.levels) same = same && l.num_requests == r.levels[0].num_requests;
  for (size_t i = 0; i < r.levels.size() && !(same && i > 0); ++i)
    requests += (i ? ", " : "") + strf("%g", r.levels[i].num_requests);
  std::string lengths = strf("input %g tokens, output %g tokens", s.input_len, s.output_len);
  if (s.random_range_ratio > 0)
    lengths += strf(" (prompt and output lengths down to %g%% of these)", 100 * (1 - s.random_range_ratio));
  std::string date = r.levels.front().date;
  if (r.levels.back().date != date) date += " to " + r.levels.back().date;
  const std::string warmup =
      s.warmup > 0 ? strf(" (after %g warm-up request%s, not counted)", s.warmup, s.warmup == 1 ? "" : "s") : "";
  const std::pair<const char*, std::string> items[] = {
      {"server", s.url},
      {"model", s.model},
      {"endpoint", s.endpoint == "completions" ? "/v1/completions (token-id prompts)" : "/v1/chat/completions"},
      {"lengths", lengths},
      {"sampling", s.temperature > 0 ? strf("temperature %g", s.temperature) +
                                           (s.top_p < 1 ? strf(", top-p %g", s.top_p) : std::string())
                                     : std::string("greedy")},
      {"requests per level", requests + warmup},
      {"date (UTC)", date},
      {"seed", s.seed},
      {"kiln", s.kiln_version}};
  std::string html = "<dl class=\"setup\">";
  for (const auto& [name, value] : items)
    if (!value.empty()) html += "<dt>" + escape(name) + "</dt><dd>" + escape(value) + "</dd>";
  return html + "</dl>\n";
}

std::string table_html(const std::vector<Level>& levels) {
  std::string html = "<table id=\"summary\"><thead><tr><th></th>";
  for (const Level& l : levels) html += "<th scope=\"col\">" + escape(level_label(l)) + "</th>";
  html += "</tr></thead><tbody>\n";
  for (const Row& row : table_rows(levels)) {
    html += "<tr><th scope=\"row\">" + escape(row.name) + "</th>";
    for (const Level& l : levels) html += "<td>" + strf("%.*f", row.decimals, row.of(l)) + "</td>";
    html += "</tr>\n";
  }
  return html + "</tbody></table>\n";
}

// "" when every request succeeded.
std::string errors_html(const std::vector<Level>& levels) {
  std::string rows;
  for (const Level& l : levels)
    for (const auto& [message, count] : l.errors)
      rows += "<tr><td>" + escape(level_label(l)) + "</td><td class=\"count\">" + strf("%g", count) + "</td><td>" +
              escape(message) + "</td></tr>\n";
  if (rows.empty()) return "";
  return "<h2>Errors</h2>\n<table class=\"errors\" id=\"errors\"><thead><tr><th>level</th><th class=\"count\">requests</th>"
         "<th>error</th></tr></thead><tbody>\n" + rows + "</tbody></table>\n";
}

Status write_file(const std::string& text, const std::string& path) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (!f) return internal_error("cannot write " + path);
  return Status::Ok();
}

}  // namespace

Result<std::string> bench_report_html(const json& report) {
  KILN_ASSIGN_OR_RETURN(const Report r, read_report(report));
  const bool by_rate = std::all_of(r.levels.begin(), r.levels.end(), [](const Level& l) { return l.request_rate > 0; });
  const bool by_concurrency =
      std::none_of(r.levels.begin(), r.levels.end(), [](const Level& l) { return l.request_rate > 0; });
  const std::string x_title = by_rate ? "request rate (requests/s, Poisson arrivals)"
                              : by_concurrency ? "concurrency (requests in flight at most)"
                                               : "level";
  const std::string versus = by_rate ? "request rate" : by_concurrency ? "concurrency" : "level";
  const Chart throughput{.id = "throughput-chart",
                         .title = "Throughput vs " + versus + ": output and total (input + output) tokens/s",
                         .y_title = "tokens/s",
                         .unit = "tokens/s",
                         .log_y = false,
                         .series = {{"output tokens/s", "#2563eb", false, field_of(&Level::output_tokens_per_s)},
                                    {"total tokens/s", "#ea580c", false, field_of(&Level::total_tokens_per_s)}}};
  const Chart latency{.id = "latency-chart",
                      .title = "Latency vs " + versus + ": TTFT p50 and p99, TPOT p50, ITL p99 (ms, log scale)",
                      .y_title = "ms (log scale)",
                      .unit = "ms",
                      .log_y = true,
                      .series = {{"TTFT p50", "#2563eb", false, stat_of(&Level::ttft_ms, &Dist::p50)},
                                 {"TTFT p99", "#7c3aed", true, stat_of(&Level::ttft_ms, &Dist::p99)},
                                 {"TPOT p50", "#16a34a", false, stat_of(&Level::tpot_ms, &Dist::p50)},
                                 {"ITL p99", "#dc2626", true, stat_of(&Level::itl_ms, &Dist::p99)}}};
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>kiln bench serve: " +
      escape(r.setup.model) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n<main>\n";
  html += "<h1>kiln bench serve: " + escape(r.setup.model) + "</h1>\n" + setup_html(r);
  html += "<h2>Throughput</h2>\n" + chart_svg(throughput, r.levels, x_title);
  html += "<h2>Latency</h2>\n" + chart_svg(latency, r.levels, x_title);
  html += "<p class=\"note\">TTFT: send to the first chunk that carries text. TPOT: (end-to-end &minus; TTFT) / "
          "(output tokens &minus; 1). ITL: gaps between text chunks. Percentiles interpolate between ranks.</p>\n";
  html += "<h2>Summary per level</h2>\n" + table_html(r.levels) + errors_html(r.levels);
  return html + "</main>\n</body>\n</html>\n";
}

Status write_bench_report_html(const json& report, const std::string& html_path) {
  Result<std::string> html = bench_report_html(report);
  if (!html.ok()) return html.status();
  return write_file(*html, html_path);
}

Status bench_report_from_file(const std::string& json_path, const std::string& html_path) {
  std::ifstream f(json_path);
  if (!f) return not_found("cannot read " + json_path);
  std::string why;
  const json report = parse_json_explained<json>(std::string(std::istreambuf_iterator<char>(f), {}), &why);
  if (!why.empty()) return invalid_argument(json_path + ": " + why + " (expected a report of kiln bench serve --json)");
  Result<std::string> html = bench_report_html(report);
  if (!html.ok()) return html.status().with_context(json_path);
  return write_file(*html, html_path);
}

}  // namespace kiln::cli
