// `kiln bench serve`: an HTTP load generator for any OpenAI-compatible server (kiln, vLLM,
// SGLang, llama.cpp's server, ...). Streams every response and times it as it arrives:
//   TTFT  send -> first chunk that carries text
//   ITL   gaps between text chunks after the first
//   TPOT  (e2e - ttft) / (output_tokens - 1)
// Load shape: for each --concurrency level C, max(num_prompts, C) requests with at most C in
// flight; or --request-rate R: Poisson arrivals (seeded) at R requests/s. --warmup requests
// run before each level and are not counted.
// Output: a table on stdout (one column per level), progress on stderr, --json FILE with
// every level's config, summary and per-request records, --html FILE with a self-contained
// page of charts and the table (bench_report.h; `kiln bench report` makes it from a JSON
// file). Against a server that counts speculative drafts in its /metrics (kiln's
// kiln_spec_decode_*, vLLM's vllm:spec_decode_*), each level also reports the draft
// acceptance and mean accepted length over it. A failed request is counted, never fatal; a level whose every request failed ends
// the run with exit code 1.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_report.h"
#include "cli/common.h"
#include "cli/subcommand.h"
#include "core/json_bounded.h"
#include "core/status.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;  // reports keep their fields in a reading order

constexpr int kMaxConcurrency = 1024;  // one thread (and one connection) per client

struct BenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // "": the first id of GET /v1/models
  std::string endpoint = "completions";
  int input_len = 512;
  int output_len = 128;
  double temperature = 0;  // 0: greedy (the default, as vLLM's benchmark)
  double top_p = 1;        // 1: off
  double random_range_ratio = 0;
  int num_prompts = 0;  // 0: max(8, 4 * C) per level; max(8, 10 * R) with --request-rate
  std::vector<int> concurrency{1};
  double request_rate = 0;  // requests/s; 0: fixed concurrency levels
  int warmup = 2;
  uint64_t seed = 0;
  int vocab = 256;  // token ids are drawn from [0, vocab): 256 is safe for byte-level tokenizers
  std::string api_key;
  std::string json_path;
  std::string html_path;
  int timeout_s = 600;  // per read of a response
  std::string json_schema_path;  // every request constrained by this schema (response_format)
  json json_schema;              // its contents, read once
};

// --url split for httplib: "scheme://host:port" and the API prefix ("/v1" unless the URL names one).
struct Target {
  std::string origin;
  std::string prefix;
};

struct Level {
  int concurrency = 0;      // clients in flight at most (0 with a request rate: unbounded)
  double request_rate = 0;  // requests/s (0: as fast as the clients go)
  int num_requests = 0;
  std::string label() const {
    char buf[48];
    if (request_rate > 0) std::snprintf(buf, sizeof buf, "rate %g/s", request_rate);
    else std::snprintf(buf, sizeof buf, "c=%d", concurrency);
    return buf;
  }
};

struct Request {
  std::string body;          // JSON
  int64_t input_tokens = 0;  // exact for token-id prompts; 0 for chat (the server's usage says)
};

struct RequestResult {
  bool ok = false;
  int http_status = 0;  // 0: no response
  std::string error;
  int64_t input_tokens = 0, output_tokens = 0;
  double ttft_ms = 0, tpot_ms = 0, e2e_ms = 0;  // tpot_ms: 0 unless output_tokens >= 2
  std::vector<double> itl_ms;
};

struct Dist {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

// A speculative-decoding server's counters over a level (the differences of its /metrics
// before and after): verify steps' drafts, draft tokens, and those that stood.
struct Speculation {
  double drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  double acceptance() const { return draft_tokens > 0 ? accepted_tokens / draft_tokens : 0.0; }
  // Tokens a sequence emits per verify step (vLLM's "mean acceptance length").
  double mean_accepted_length() const { return drafts > 0 ? 1.0 + accepted_tokens / drafts : 0.0; }
};

struct Summary {
  int successful = 0, failed = 0;
  double duration_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  double requests_per_s = 0, output_tokens_per_s = 0, total_tokens_per_s = 0;
  Dist ttft_ms, tpot_ms, itl_ms, e2e_ms;
  std::map<std::string, int> errors;  // message -> count
  std::optional<Speculation> speculation;  // where the server's /metrics counts drafts
};

struct LevelRun {
  Level level;
  std::string date;  // UTC, ISO 8601
  std::vector<RequestResult> results;
  Summary summary;
};

int fail_msg(const std::string& message) {
  std::fprintf(stderr, "kiln: error: %s\n", message.c_str());
  return 1;
}

std::string excerpt(std::string_view s, size_t n = 200) {
  std::string out(s.substr(0, n));
  for (char& c : out) if (c == '\n' || c == '\r') c = ' ';
  return s.size() > n ? out + "..." : out;
}

// The message of an OpenAI-style error body ({"error": {"message": ...}}), else the text.
std::string error_text(std::string_view body) {
  const json j = parse_json_bounded<json>(body);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return excerpt(body);
}

// httplib's error names ("Connection", "Read") in words.
std::string transport_error(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "connection refused or unreachable";
    case httplib::Error::ConnectionTimeout: return "connection timed out";
    case httplib::Error::Read: return "reading the response failed (connection closed, or --timeout passed)";
    case httplib::Error::Write: return "sending the request failed (connection closed)";
    default: return "HTTP client error: " + httplib::to_string(e);
  }
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Result<Target> parse_url(const std::string& url) {
  const size_t scheme_end = url.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : url.substr(0, scheme_end);
  const size_t path_start = scheme_end == std::string::npos ? std::string::npos : url.find('/', scheme_end + 3);
  if ((scheme != "http" && scheme != "https") || url.size() == scheme_end + 3 || path_start == scheme_end + 3)
    return invalid_argument("--url \"" + url + "\": expected http://HOST:PORT, optionally with the API prefix (/v1)");
  Target t{url.substr(0, path_start), path_start == std::string::npos ? "" : url.substr(path_start)};
  while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
  if (t.prefix.empty()) t.prefix = "/v1";
  return t;
}

std::unique_ptr<httplib::Client> make_client(const Target& t, const BenchOptions& o) {
  auto c = std::make_unique<httplib::Client>(t.origin);
  c->set_connection_timeout(10);
  c->set_read_timeout(o.timeout_s);
  c->set_write_timeout(60);
  c->set_keep_alive(true);
  // Headers and body go out as two writes: without TCP_NODELAY, Nagle holds the body until
  // the server's delayed ACK (40 ms on Linux), which would land in every TTFT.
  c->set_tcp_nodelay(true);
  if (!o.api_key.empty()) c->set_bearer_token_auth(o.api_key);
  return c;
}

// The first model id of GET {prefix}/models.
Result<std::string> first_model(const Target& t, const BenchOptions& o) {
  auto client = make_client(t, o);
  client->set_read_timeout(30);
  const std::string path = t.prefix + "/models";
  const httplib::Result r = client->Get(path);
  if (!r) return not_found("cannot reach " + o.url + " (GET " + path + ": " + transport_error(r.error()) + ")");
  if (r->status != 200)
    return not_found(o.url + ": GET " + path + " answered HTTP " + std::to_string(r->status) + ": " + error_text(r->body));
  const json j = parse_json_bounded<json>(r->body);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return not_found(o.url + ": GET " + path + " lists no model id; pass --model");
  return j["data"][0]["id"].get<std::string>();
}

// The speculative-decoding counters of GET {origin}/metrics (Prometheus text: kiln's
// kiln_spec_decode_* or vLLM's vllm:spec_decode_* series, summed over their labels), or
// nothing where the server has no such page or counts no drafts.
std::optional<Speculation> read_speculation(const Target& t, const BenchOptions& o) {
  auto client = make_client(t, o);
  client->set_read_timeout(10);
  const httplib::Result r = client->Get("/metrics");
  if (!r || r->status != 200) return std::nullopt;
  Speculation s;
  bool any = false;
  std::istringstream lines(r->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    if (name_end == std::string::npos || value_at == std::string::npos) continue;
    std::string name = line.substr(0, name_end);
    for (const char* prefix : {"kiln_", "vllm:"})
      if (name.rfind(prefix, 0) == 0) name = name.substr(std::strlen(prefix));
    double* field = name == "spec_decode_num_drafts_total"           ? &s.drafts
                    : name == "spec_decode_num_draft_tokens_total"    ? &s.draft_tokens
                    : name == "spec_decode_num_accepted_tokens_total" ? &s.accepted_tokens
                                                                      : nullptr;
    if (field == nullptr) continue;
    char* end = nullptr;
    const double v = std::strtod(line.c_str() + value_at + 1, &end);
    if (end == line.c_str() + value_at + 1) continue;
    *field += v;
    any = true;
  }
  if (!any) return std::nullopt;
  return s;
}

// ---- prompts ------------------------------------------------------------------------

// Common English words, most of them one token in any BPE vocabulary.
constexpr const char* kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "time", "people", "year", "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state",
    "family", "group", "country", "problem", "hand", "part", "place", "case", "week", "company", "system",
    "work", "number", "night", "point", "home", "water", "room", "area", "money", "story", "fact", "month"};

// A length uniform in [len * (1 - ratio), len], at least 1 (prompts and max_tokens, as
// vLLM's --random-range-ratio varies both: with equal output lengths, a batch's requests
// end in the same step and the next ones start together, which real traffic never does).
int64_t draw_len(std::mt19937_64& rng, int64_t len, double ratio) {
  const int64_t lo = std::clamp<int64_t>(int64_t(std::ceil(double(len) * (1.0 - ratio))), 1, len);
  return std::uniform_int_distribution<int64_t>(lo, len)(rng);
}

Request make_request(std::mt19937_64& rng, const BenchOptions& o, const std::string& model) {
  const int64_t n = draw_len(rng, o.input_len, o.random_range_ratio);
  const int64_t max_tokens = draw_len(rng, o.output_len, o.random_range_ratio);
  json body = {{"model", model},          {"max_tokens", max_tokens},
               {"ignore_eos", true},      {"temperature", o.temperature},
               {"stream", true},          {"stream_options", {{"include_usage", true}}}};
  if (o.top_p < 1) body["top_p"] = o.top_p;
  if (!o.json_schema.is_null())
    body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "bench"}, {"schema", o.json_schema}}}};
  if (o.endpoint == "completions") {
    // Token ids, so the input length is exact whatever the tokenizer.
    std::uniform_int_distribution<int> id(0, o.vocab - 1);
    std::vector<int> ids(static_cast<size_t>(n));
    for (int& x : ids) x = id(rng);
    body["prompt"] = std::move(ids);
    return {body.dump(), n};
  }
  // About one token per common word; the chat template adds its own.
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  std::string text;
  for (int64_t i = 0; i < n; ++i) text += (i ? " " : "") + std::string(kWords[word(rng)]);
  body["messages"] = json::array({{{"role", "user"}, {"content", std::move(text)}}});
  return {body.dump(), 0};
}

// ---- one streamed request -----------------------------------------------------------

// Reads an SSE body's `data:` lines as they arrive; notes when each text chunk came.
class StreamReader {
 public:
  // false: stop reading (error() says why).
  bool feed(const char* data, size_t n) {
    const Clock::time_point now = Clock::now();
    buf_.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = buf_.find('\n', start)) != std::string::npos; start = nl + 1)
      if (!line(std::string_view(buf_).substr(start, nl - start), now)) return false;
    buf_.erase(0, start);
    return true;
  }
  bool done() const { return done_; }
  bool has_usage() const { return has_usage_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  const std::vector<Clock::time_point>& chunk_times() const { return chunk_times_; }
  const std::string& error() const { return error_; }

 private:
  bool line(std::string_view l, Clock::time_point now) {
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (!l.starts_with("data:")) return true;  // blank lines, comments, event: lines
    l.remove_prefix(5);
    while (!l.empty() && l.front() == ' ') l.remove_prefix(1);
    if (l == "[DONE]") {
      done_ = true;
      return true;
    }
    const json j = parse_json_bounded<json>(l);
    if (!j.is_object()) {
      error_ = "malformed stream: " + excerpt(l);
      return false;
    }
    if (j.contains("error")) {
      error_ = "error in the stream: " + error_text(l);
      return false;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      has_usage_ = true;
      if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) prompt_tokens_ = u["prompt_tokens"];
      if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
        completion_tokens_ = u["completion_tokens"];
    }
    if (carries_text(j)) chunk_times_.push_back(now);
    return true;
  }

  // A completions chunk with text, or a chat delta with content, reasoning or a tool call.
  static bool carries_text(const json& j) {
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return false;
    const json& c = j["choices"][0];
    if (!c.is_object()) return false;
    auto nonempty = [](const json& o, const char* key) {
      return o.contains(key) && ((o[key].is_string() && !o[key].get_ref<const std::string&>().empty()) ||
                                 (o[key].is_array() && !o[key].empty()));
    };
    if (nonempty(c, "text")) return true;
    if (!c.contains("delta") || !c["delta"].is_object()) return false;
    const json& d = c["delta"];
    return nonempty(d, "content") || nonempty(d, "reasoning_content") || nonempty(d, "reasoning") ||
           nonempty(d, "tool_calls");
  }

  std::string buf_, error_;
  bool done_ = false, has_usage_ = false;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  std::vector<Clock::time_point> chunk_times_;
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Fills r from a finished stream; false (and r.error) when it holds no usable answer.
bool read_stream(const StreamReader& s, Clock::time_point sent, Clock::time_point ended, RequestResult& r) {
  if (!s.done()) {
    r.error = "the stream ended without data: [DONE]";
    return false;
  }
  const auto& t = s.chunk_times();
  r.output_tokens = s.has_usage() ? s.completion_tokens() : int64_t(t.size());
  if (s.has_usage() && s.prompt_tokens() > 0) r.input_tokens = s.prompt_tokens();
  if (t.empty() || r.output_tokens == 0) {
    r.error = "the stream carried no tokens";
    return false;
  }
  r.ttft_ms = ms_between(sent, t.front());
  r.e2e_ms = ms_between(sent, ended);
  for (size_t i = 1; i < t.size(); ++i) r.itl_ms.push_back(ms_between(t[i - 1], t[i]));
  if (r.output_tokens > 1) r.tpot_ms = (r.e2e_ms - r.ttft_ms) / double(r.output_tokens - 1);
  return true;
}

RequestResult send_request(httplib::Client& client, const std::string& path, const Request& rq) {
  RequestResult r{.input_tokens = rq.input_tokens};
  StreamReader stream;
  std::string error_body;  // the body of a non-200 answer
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = rq.body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.response_handler = [&](const httplib::Response& res) {
    r.http_status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (r.http_status == 200) return stream.feed(data, n);
    if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(n, 4096));
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const Clock::time_point sent = Clock::now();
  try {
    const bool answered = client.send(req, res, err);
    const Clock::time_point ended = Clock::now();
    if (!stream.error().empty()) r.error = stream.error();
    else if (!answered) r.error = transport_error(err);
    else if (r.http_status != 200) r.error = "HTTP " + std::to_string(r.http_status) + ": " + error_text(error_body);
    else r.ok = read_stream(stream, sent, ended, r);
  } catch (const std::exception& e) {
    r.error = std::string("client error: ") + e.what();
  }
  return r;
}

// ---- running a level ----------------------------------------------------------------

// Requests done so far, on stderr: redrawn in place on a terminal, else nothing until the end.
class Progress {
 public:
  Progress(std::string label, int total) : label_(std::move(label)), total_(total), tty_(isatty(STDERR_FILENO) == 1) {}
  void tick(bool ok) {
    const int done = ++done_, failed = failed_ += ok ? 0 : 1;
    if (!tty_) return;
    std::lock_guard<std::mutex> lock(mu_);
    const int filled = done * 30 / std::max(total_, 1);
    std::fprintf(stderr, "\rkiln: bench %s [%s%s] %d/%d (%d failed)", label_.c_str(),
                 std::string(size_t(filled), '#').c_str(), std::string(size_t(30 - filled), '.').c_str(), done,
                 total_, failed);
    std::fflush(stderr);
  }
  void finish(double seconds) {
    if (tty_) std::fputc('\n', stderr);
    std::fprintf(stderr, "kiln: bench %s: %d requests, %d failed, %.2f s\n", label_.c_str(), done_.load(),
                 failed_.load(), seconds);
  }

 private:
  std::string label_;
  int total_;
  bool tty_;
  std::atomic<int> done_{0}, failed_{0};
  std::mutex mu_;
};

// Runs reqs on n_clients threads (each its own keep-alive connection); request i starts no
// earlier than start_s[i] seconds after the first (start_s empty: as soon as a client is free).
// Returns the wall time in seconds from the first send to the last answer.
double run_requests(const Target& t, const BenchOptions& o, const std::string& path, const std::vector<Request>& reqs,
                    int n_clients, const std::vector<double>& start_s, std::vector<RequestResult>& results,
                    Progress* progress) {
  results.assign(reqs.size(), {});
  std::atomic<size_t> next{0};
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < n_clients; ++c) {
    clients.emplace_back([&] {
      auto client = make_client(t, o);
      for (size_t i; (i = next++) < reqs.size();) {
        if (!start_s.empty())
          std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(start_s[i])));
        results[i] = send_request(*client, path, reqs[i]);
        if (progress) progress->tick(results[i].ok);
      }
    });
  }
  for (std::thread& c : clients) c.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Poisson arrivals: exponential gaps at rate requests/s, the first at 0.
std::vector<double> poisson_starts(std::mt19937_64& rng, double rate, size_t n) {
  std::exponential_distribution<double> gap(rate);
  std::vector<double> s(n, 0.0);
  for (size_t i = 1; i < n; ++i) s[i] = s[i - 1] + gap(rng);
  return s;
}

// Percentile of sorted values by linear interpolation between the two closest ranks
// (numpy's default): rank p/100 * (n - 1).
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = p / 100.0 * double(sorted.size() - 1);
  const size_t lo = size_t(rank), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (rank - double(lo)) * (sorted[hi] - sorted[lo]);
}

Dist distribution(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  return {.mean = sum / double(v.size()), .p50 = percentile(v, 50), .p90 = percentile(v, 90), .p99 = percentile(v, 99)};
}

Summary summarize(const std::vector<RequestResult>& results, double duration_s) {
  Summary s{.duration_s = duration_s};
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestResult& r : results) {
    if (!r.ok) {
      ++s.failed;
      ++s.errors[r.error];
      continue;
    }
    ++s.successful;
    s.input_tokens += r.input_tokens;
    s.output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    if (r.output_tokens > 1) tpot.push_back(r.tpot_ms);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
  }
  if (duration_s > 0) {
    s.requests_per_s = s.successful / duration_s;
    s.output_tokens_per_s = double(s.output_tokens) / duration_s;
    s.total_tokens_per_s = double(s.input_tokens + s.output_tokens) / duration_s;
  }
  s.ttft_ms = distribution(std::move(ttft));
  s.tpot_ms = distribution(std::move(tpot));
  s.itl_ms = distribution(std::move(itl));
  s.e2e_ms = distribution(std::move(e2e));
  return s;
}

LevelRun run_level(const Target& t, const BenchOptions& o, const std::string& model, const Level& level, int index) {
  std::seed_seq seq{uint32_t(o.seed), uint32_t(o.seed >> 32), uint32_t(index)};
  std::mt19937_64 rng(seq);
  const int n_clients = level.request_rate > 0 ? std::min(level.num_requests, kMaxConcurrency) : level.concurrency;
  const std::string path = t.prefix + (o.endpoint == "completions" ? "/completions" : "/chat/completions");
  std::vector<RequestResult> results;
  if (o.warmup > 0) {
    std::vector<Request> warm;
    for (int i = 0; i < o.warmup; ++i) warm.push_back(make_request(rng, o, model));
    run_requests(t, o, path, warm, std::min(o.warmup, n_clients), {}, results, nullptr);
  }
  std::vector<Request> reqs;
  for (int i = 0; i < level.num_requests; ++i) reqs.push_back(make_request(rng, o, model));
  const std::vector<double> starts =
      level.request_rate > 0 ? poisson_starts(rng, level.request_rate, reqs.size()) : std::vector<double>{};
  LevelRun run{.level = level, .date = utc_now()};
  const std::optional<Speculation> before = read_speculation(t, o);
  Progress progress(level.label(), level.num_requests);
  const double seconds = run_requests(t, o, path, reqs, n_clients, starts, run.results, &progress);
  progress.finish(seconds);
  run.summary = summarize(run.results, seconds);
  if (const std::optional<Speculation> after = read_speculation(t, o); before && after && after->drafts > 0)
    run.summary.speculation = Speculation{.drafts = after->drafts - before->drafts,
                                          .draft_tokens = after->draft_tokens - before->draft_tokens,
                                          .accepted_tokens = after->accepted_tokens - before->accepted_tokens};
  return run;
}

std::vector<Level> make_levels(const BenchOptions& o) {
  if (o.request_rate > 0) {
    const int n = o.num_prompts > 0 ? o.num_prompts : std::max(8, int(std::ceil(10 * o.request_rate)));
    return {{.concurrency = 0, .request_rate = o.request_rate, .num_requests = n}};
  }
  std::vector<Level> levels;
  for (int c : o.concurrency) {
    const int n = o.num_prompts > 0 ? std::max(o.num_prompts, c) : std::max(8, 4 * c);
    levels.push_back({.concurrency = c, .num_requests = n});
  }
  return levels;
}

// ---- reporting ----------------------------------------------------------------------

void print_table(const BenchOptions& o, const std::string& model, const std::vector<LevelRun>& runs) {
  std::printf("kiln bench serve: %s, model %s, %s, input %d, output %d", o.url.c_str(), model.c_str(),
              o.endpoint.c_str(), o.input_len, o.output_len);
  if (o.temperature > 0) std::printf(", temperature %g, top-p %g", o.temperature, o.top_p);
  std::printf("\n%-24s", "");
  for (const LevelRun& r : runs) std::printf("%12s", r.level.label().c_str());
  std::printf("\n");
  auto row = [&](const char* name, const char* fmt, auto field) {
    std::printf("%-24s", name);
    for (const LevelRun& r : runs) std::printf(fmt, field(r.summary));
    std::printf("\n");
  };
  row("successful requests", "%12d", [](const Summary& s) { return s.successful; });
  row("failed requests", "%12d", [](const Summary& s) { return s.failed; });
  row("duration (s)", "%12.2f", [](const Summary& s) { return s.duration_s; });
  row("requests/s", "%12.2f", [](const Summary& s) { return s.requests_per_s; });
  row("output tokens/s", "%12.1f", [](const Summary& s) { return s.output_tokens_per_s; });
  row("total tokens/s", "%12.1f", [](const Summary& s) { return s.total_tokens_per_s; });
  const std::pair<const char*, Dist Summary::*> dists[] = {
      {"TTFT", &Summary::ttft_ms}, {"TPOT", &Summary::tpot_ms}, {"ITL", &Summary::itl_ms}};
  for (const auto& [name, member] : dists) {
    const std::pair<const char*, double Dist::*> stats[] = {
        {"mean", &Dist::mean}, {"p50", &Dist::p50}, {"p90", &Dist::p90}, {"p99", &Dist::p99}};
    for (const auto& [stat, field] : stats) {
      const std::string label = std::string(name) + " " + stat + " (ms)";
      row(label.c_str(), "%12.2f", [&](const Summary& s) { return (s.*member).*field; });
    }
  }
  row("E2E latency mean (ms)", "%12.2f", [](const Summary& s) { return s.e2e_ms.mean; });
  // Speculative decoding, from the server's /metrics over each level (a server that counts
  // drafts; other traffic to it during the run counts too).
  if (std::any_of(runs.begin(), runs.end(), [](const LevelRun& r) { return r.summary.speculation.has_value(); })) {
    const auto spec = [](double (Speculation::*get)() const, double scale) {
      return [get, scale](const Summary& s) { return s.speculation ? ((*s.speculation).*get)() * scale : 0.0; };
    };
    row("draft acceptance (%)", "%12.1f", spec(&Speculation::acceptance, 100.0));
    row("mean accepted length", "%12.2f", spec(&Speculation::mean_accepted_length, 1.0));
    row("verified drafts", "%12.0f", [](const Summary& s) { return s.speculation ? s.speculation->drafts : 0.0; });
  }
  for (const LevelRun& r : runs)
    for (const auto& [message, count] : r.summary.errors)
      std::printf("%s: %d x %s\n", r.level.label().c_str(), count, message.c_str());
  std::fflush(stdout);
}

json dist_json(const Dist& d) { return {{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}}; }

json level_json(const BenchOptions& o, const std::string& model, const LevelRun& run) {
  const Level& l = run.level;
  json config = {{"url", o.url}, {"model", model}, {"endpoint", o.endpoint}, {"input_len", o.input_len},
                 {"output_len", o.output_len}, {"temperature", o.temperature}, {"top_p", o.top_p},
                 {"random_range_ratio", o.random_range_ratio},
                 {"num_requests", l.num_requests}, {"concurrency", l.concurrency > 0 ? json(l.concurrency) : json()},
                 {"request_rate", l.request_rate > 0 ? json(l.request_rate) : json()}, {"warmup", o.warmup},
                 {"seed", o.seed}, {"date", run.date}};
  if (!o.json_schema.is_null()) config["json_schema"] = o.json_schema;
#ifdef KILN_VERSION
  config["kiln_version"] = KILN_VERSION;
#endif
  const Summary& s = run.summary;
  json summary = {{"successful", s.successful}, {"failed", s.failed}, {"duration_s", s.duration_s},
                  {"input_tokens", s.input_tokens}, {"output_tokens", s.output_tokens},
                  {"requests_per_s", s.requests_per_s}, {"output_tokens_per_s", s.output_tokens_per_s},
                  {"total_tokens_per_s", s.total_tokens_per_s}, {"ttft_ms", dist_json(s.ttft_ms)},
                  {"tpot_ms", dist_json(s.tpot_ms)}, {"itl_ms", dist_json(s.itl_ms)},
                  {"e2e_ms", dist_json(s.e2e_ms)}, {"errors", s.errors}};
  if (s.speculation)
    summary["speculative"] = {{"drafts", s.speculation->drafts}, {"draft_tokens", s.speculation->draft_tokens},
                              {"accepted_tokens", s.speculation->accepted_tokens},
                              {"acceptance", s.speculation->acceptance()},
                              {"mean_accepted_length", s.speculation->mean_accepted_length()}};
  json requests = json::array();
  for (const RequestResult& r : run.results) {
    json q = {{"ok", r.ok}, {"http_status", r.http_status}, {"input_tokens", r.input_tokens},
              {"output_tokens", r.output_tokens}, {"ttft_ms", r.ttft_ms}, {"tpot_ms", r.tpot_ms}, {"e2e_ms", r.e2e_ms}};
    if (!r.ok) q["error"] = r.error;
    requests.push_back(std::move(q));
  }
  return {{"config", std::move(config)}, {"summary", std::move(summary)}, {"requests", std::move(requests)}};
}

json report_json(const BenchOptions& o, const std::string& model, const std::vector<LevelRun>& runs) {
  json levels = json::array();
  for (const LevelRun& r : runs) levels.push_back(level_json(o, model, r));
  return json{{"levels", std::move(levels)}};
}

Status write_json(const BenchOptions& o, const json& report) {
  std::ofstream f(o.json_path);
  f << report.dump(2) << "\n";
  f.close();
  if (!f) return internal_error("cannot write " + o.json_path);
  return Status::Ok();
}

int run_bench(BenchOptions o) {
  std::signal(SIGPIPE, SIG_IGN);  // a server gone mid-request is a failed request
  if (o.request_rate == 0 && o.concurrency.empty()) return fail(invalid_argument("--concurrency is empty"));
  if (!o.json_schema_path.empty()) {
    std::ifstream f(o.json_schema_path, std::ios::binary);
    if (!f) return fail_msg("--json-schema: cannot open " + o.json_schema_path);
    std::string why;
    o.json_schema = parse_json_explained<json>(std::string(std::istreambuf_iterator<char>(f), {}), &why);
    if (!why.empty()) return fail_msg("--json-schema " + o.json_schema_path + ": " + why);
    if (!o.json_schema.is_object()) return fail_msg("--json-schema " + o.json_schema_path + " is not a JSON object");
  }
  Result<Target> target = parse_url(o.url);
  if (!target.ok()) return fail(target.status());
  std::string model = o.model;
  if (model.empty()) {
    Result<std::string> m = first_model(*target, o);
    if (!m.ok()) return fail_msg(m.status().message());
    model = *m;
  }
  std::fprintf(stderr, "kiln: bench serve: %s at %s (%s, input %d, output %d)\n", model.c_str(), o.url.c_str(),
               o.endpoint.c_str(), o.input_len, o.output_len);
  std::vector<LevelRun> runs;
  std::string all_failed;  // the label of a level whose every request failed
  const std::vector<Level> levels = make_levels(o);
  for (size_t i = 0; i < levels.size() && all_failed.empty(); ++i) {
    runs.push_back(run_level(*target, o, model, levels[i], int(i)));
    if (runs.back().summary.successful == 0) all_failed = levels[i].label();
  }
  print_table(o, model, runs);
  const json report = report_json(o, model, runs);
  if (!o.json_path.empty())
    if (Status s = write_json(o, report); !s.ok()) return fail(s);
  if (!o.html_path.empty())
    if (Status s = write_bench_report_html(report, o.html_path); !s.ok()) return fail(s);
  if (!all_failed.empty()) {
    const auto& errors = runs.back().summary.errors;
    const auto top = std::max_element(errors.begin(), errors.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
    return fail_msg("every request of level " + all_failed + " failed against " + o.url +
                    (top == errors.end() ? "" : ": " + top->first));
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, Subcommands& commands) {
  CLI::App* bench = app.add_subcommand(
      "bench", "benchmarks (bench serve: load-test an OpenAI-compatible server; bench report: its HTML page; "
               "bench op: CUDA ops against this GPU's roofline)");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "serve", "load-test an OpenAI-compatible server: TTFT, TPOT, ITL and throughput per concurrency level");
  cmd->add_option("--url", o->url, "the server, http://HOST:PORT[/v1]");
  cmd->add_option("--model", o->model, "the model id to request (default: the first of GET /v1/models)");
  cmd->add_option("--endpoint", o->endpoint, "completions (token-id prompts, exact input length) or chat")
      ->check(CLI::IsMember({"completions", "chat"}));
  cmd->add_option("--input-len", o->input_len, "prompt tokens (chat: words)")->check(CLI::PositiveNumber);
  cmd->add_option("--output-len", o->output_len, "max_tokens of every request")->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o->temperature, "sampling temperature of every request (0: greedy)")
      ->check(CLI::Range(0.0, 2.0));
  cmd->add_option("--top-p", o->top_p, "top_p of every request (1: off)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--random-range-ratio", o->random_range_ratio,
                  "prompt lengths and max_tokens uniform in [len * (1 - ratio), len]")->check(CLI::Range(0.0, 0.999));
  cmd->add_option("--num-prompts", o->num_prompts,
                  "requests per level (default: max(8, 4 * C); with --request-rate max(8, 10 * R))")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--concurrency", o->concurrency, "comma list of levels: requests in flight at most")
      ->delimiter(',')
      ->check(CLI::Range(1, kMaxConcurrency));
  cmd->add_option("--request-rate", o->request_rate, "Poisson arrivals at R requests/s instead of fixed concurrency")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--warmup", o->warmup, "requests before each level, not counted")->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o->seed, "seed of the prompts and arrival times");
  cmd->add_option("--vocab", o->vocab, "token ids of completions prompts are drawn from [0, N)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--api-key", o->api_key, "sent as Authorization: Bearer KEY");
  cmd->add_option("--timeout", o->timeout_s, "seconds to wait for each read of a response")->check(CLI::PositiveNumber);
  cmd->add_option("--json-schema", o->json_schema_path,
                  "constrain every request's output by this JSON schema file (response_format json_schema)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--json", o->json_path, "write every level's config, summary and requests to this file");
  cmd->add_option("--html", o->html_path, "write a self-contained HTML report (charts, table) to this file");
  commands.emplace_back(cmd, [o] { return run_bench(*o); });

  auto paths = std::make_shared<std::pair<std::string, std::string>>();  // JSON in, HTML out
  CLI::App* report = bench->add_subcommand("report", "the HTML report of an earlier bench serve --json file");
  report->add_option("--json", paths->first, "a JSON report of kiln bench serve --json")->required();
  report->add_option("--html", paths->second, "the HTML file to write")->required();
  commands.emplace_back(report, [paths] {
    if (Status s = bench_report_from_file(paths->first, paths->second); !s.ok()) return fail(s);
    return 0;
  });

  add_bench_op_command(*bench, commands);
}

}  // namespace kiln::cli
