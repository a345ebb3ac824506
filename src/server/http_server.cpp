#include "server/http_server.h"

#include <httplib.h>
#include <malloc.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <variant>

#include "core/log.h"
#include "core/json_bounded.h"
#include "core/json_error.h"
#include "server/anthropic_api.h"
#include "server/chat_page.h"
#include "server/client_connection.h"
#include "server/job.h"
#include "server/openai_api.h"

namespace kiln::server {
namespace {

constexpr auto kPumpWait = std::chrono::milliseconds(50);
// A streaming reply with nothing to send for this long gets an SSE comment, so a client
// that went away is noticed (the write fails) even while a long prompt is prefilled.
constexpr auto kKeepAlive = std::chrono::seconds(2);
// A large body (a long prompt) leaves its worker thread's malloc arena holding what
// tokenizing and templating it took, freed but kept by glibc (a 4 MiB prompt: about
// 100 MiB); with an arena per thread (up to 8 per core) kiln's resident memory grew by
// GBs under the fuzzer. After such a request the free pages go back (malloc_trim, a few ms).
constexpr size_t kTrimAfterBodyBytes = 256 << 10;
constexpr int kMallocArenas = 8;
// The status counted for a request whose client hung up before its reply (nginx's).
constexpr int kClientClosed = 499;

// %XX-escapes decoded (the test hook's header carries newlines that way).
std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += char(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The body as JSON, or a message saying why not. Deeper JSON than any API needs is
// refused, and never built (core/json_bounded.h: copying or rendering it recurses).
std::variant<ordered_json, std::string> parse_body(const std::string& body) {
  int depth = 0;
  ordered_json j = parse_json_bounded<ordered_json>(body, kMaxJsonDepth, &depth);
  if (j.is_discarded()) return "the request body is not valid JSON (UTF-8) at " + json_error(body);
  if (depth > kMaxJsonDepth)
    return "the request body nests JSON " + std::to_string(depth) + " levels deep (at most " +
           std::to_string(kMaxJsonDepth) + ")";
  return j;
}

bool is_anthropic(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

// Every route and the methods it takes (HEAD with GET: cpp-httplib answers it), for 405's
// Allow header and CORS preflights. routes() registers the handlers.
struct RouteMethods {
  const char* path;
  bool prefix;  // path and anything after it
  const char* methods;
};
constexpr RouteMethods kRouteMethods[] = {
    {"/", false, "GET, HEAD"},
    {"/health", false, "GET, HEAD"},
    {"/metrics", false, "GET, HEAD"},
    {"/v1/models", false, "GET, HEAD"},
    {"/v1/models/", true, "GET, HEAD"},
    {"/v1/chat/completions", false, "POST"},
    {"/v1/completions", false, "POST"},
    {"/v1/messages", false, "POST"},
    {"/v1/messages/count_tokens", false, "POST"},
};

// The methods `path` takes ("GET, HEAD", "POST"), or nullptr for no such route.
const char* route_methods(const std::string& path) {
  for (const RouteMethods& r : kRouteMethods) {
    if (r.prefix ? path.size() > std::strlen(r.path) && path.rfind(r.path, 0) == 0 : path == r.path) return r.methods;
  }
  return nullptr;
}

bool takes_method(const char* methods, const std::string& method) {
  const std::string_view list = methods;
  for (size_t at = 0; at < list.size();) {
    size_t end = list.find(", ", at);
    if (end == std::string_view::npos) end = list.size();
    if (list.substr(at, end - at) == method) return true;
    at = end + 2;
  }
  return false;
}

// A request's method and path for a message, cut short: a path can be long, and anything.
std::string method_and_path(const httplib::Request& req) {
  const std::string path = req.path.size() > 200 ? req.path.substr(0, 200) + "..." : req.path;
  return req.method + " " + path;
}

// Request headers a browser may send cross-origin: the APIs' own, and the ones their
// official clients add (x-stainless-*, ...) are mirrored from the preflight's list.
constexpr const char* kCorsHeaders = "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta";
constexpr int kCorsMaxAgeSeconds = 600;

std::string status_message(const httplib::Request& req, int status) {
  switch (status) {
    case 400: return "the request could not be parsed";
    case 404: return "no such endpoint: " + method_and_path(req);
    case 405: return "method not allowed: " + method_and_path(req);
    case 413: return "the request body is too large";
    case 414: return "the request URI is too long";
    case 431: return "the request headers are too large";
    default: return "HTTP error " + std::to_string(status);
  }
}

}  // namespace

HttpServer::HttpServer(ServerOptions options) : options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  created_ = unix_time();
  const size_t threads = size_t(std::max(4, options_.http_threads));
#ifdef __GLIBC__
  // Hundreds of worker threads would each get a malloc arena (glibc: up to 8 per core),
  // each keeping the largest request it served: cap them (MALLOC_ARENA_MAX overrides).
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, kMallocArenas);
#endif
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  http_->set_read_timeout(30, 0);
  // A streaming client that stops reading for this long has its request cancelled.
  http_->set_write_timeout(10, 0);
  http_->set_tcp_nodelay(true);
  http_->set_socket_options([this](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = int(sock);
  });
  routes();
}

HttpServer::~HttpServer() { stop(); }

Result<int> HttpServer::start() {
  int port = options_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(options_.host);
    if (port < 0) return internal_error("cannot bind to " + options_.host);
  } else if (!http_->bind_to_port(options_.host, port)) {
    return internal_error("cannot listen on " + options_.host + ":" + std::to_string(port) +
                          " (in use? --port picks another, --port 0 any free one)");
  }
  // cpp-httplib listens with a backlog of 5: a burst of new connections (64 clients at once)
  // overflows it and the kernel resets some. Listening again only raises the backlog.
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  thread_ = std::thread([this] {
    http_->listen_after_bind();
    listener_exited_ = true;
  });
  return port;
}

void HttpServer::set_ready(runtime::AsyncEngine* engine, const ServedModel* model) {
  set_ready(std::vector<runtime::AsyncEngine*>{engine}, model);
}

void HttpServer::set_ready(std::vector<runtime::AsyncEngine*> engines, const ServedModel* model) {
  KILN_CHECK(!engines.empty() && engine_.load() == nullptr) << "set_ready: once, with at least one engine";
  engines_ = std::move(engines);
  if (engines_.size() > 1) {
    // A replica holding a prompt's prefix may have an eighth of a batch (at least 2) more
    // requests open than the least busy one and still take it; without prefix caching
    // there is nothing to follow.
    const runtime::Engine& e = engines_[0]->engine();
    const int slack = e.prefix_caching() ? std::max(2, e.scheduler_config().max_num_seqs / 8) : -1;
    router_ = std::make_unique<ReplicaRouter>(int(engines_.size()), slack, e.block_size());
  }
  model_ = model;
  engine_ = engines_[0];
}

runtime::AsyncEngine& HttpServer::pick_engine(const Job& job) {
  if (engines_.size() == 1) return *engines_[0];
  std::vector<int32_t> open;
  for (runtime::AsyncEngine* e : engines_) open.push_back(e->open_requests());
  const std::vector<int32_t> none;
  return *engines_[size_t(router_->pick(job.requests.empty() ? none : job.requests[0].prompt, open))];
}

void HttpServer::drain(std::chrono::milliseconds timeout) {
  draining_ = true;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void HttpServer::stop() {
  if (!thread_.joinable()) return;
  // cpp-httplib's stop() does nothing until listen_after_bind() has marked the server
  // running, and the listener then blocks in accept() for good: a stop soon after start()
  // (a model that fails to load at once) waits for the listener to be up first.
  while (!http_->is_running() && !listener_exited_.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();
  thread_.join();
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (options_.api_key.empty()) return true;
  const std::string bearer = req.get_header_value("Authorization");
  if (bearer == "Bearer " + options_.api_key) return true;
  return req.get_header_value("x-api-key") == options_.api_key;
}

bool HttpServer::origin_allowed(const std::string& origin) const {
  for (const std::string& o : options_.allowed_origins)
    if (o == "*" || o == origin) return true;
  return false;
}

bool HttpServer::allow_origin(const httplib::Request& req, httplib::Response& res) const {
  if (!req.has_header("Origin")) return false;
  const std::string origin = req.get_header_value("Origin");
  if (!origin_allowed(origin)) return false;
  const bool any = std::find(options_.allowed_origins.begin(), options_.allowed_origins.end(), "*") !=
                   options_.allowed_origins.end();
  res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
  if (!any) res.set_header("Vary", "Origin");  // the answer depends on the origin: caches keep one per origin
  return true;
}

void HttpServer::preflight(const httplib::Request& req, httplib::Response& res, const char* methods) {
  const std::string allow = std::string(methods) + ", OPTIONS";
  res.set_header("Allow", allow);
  if (!req.has_header("Origin")) {  // a plain OPTIONS, not a browser's preflight
    res.status = 204;
    return;
  }
  if (!allow_origin(req, res)) {
    send_error(req, res, 403,
               "origin " + req.get_header_value("Origin").substr(0, 200) +
                   " is not allowed (kiln serve --allowed-origins lists the origins that are)");
    return;
  }
  res.status = 204;
  res.set_header("Access-Control-Allow-Methods", allow);
  std::string headers = kCorsHeaders;
  if (const std::string asked = req.get_header_value("Access-Control-Request-Headers"); !asked.empty())
    headers += ", " + asked.substr(0, 2000);
  res.set_header("Access-Control-Allow-Headers", headers);
  res.set_header("Access-Control-Max-Age", std::to_string(kCorsMaxAgeSeconds));
}

void HttpServer::send_error(const httplib::Request& req, httplib::Response& res, int status,
                            const std::string& message, const std::string& param) {
  const ApiError e{.status = status, .message = message, .param = param};
  res.status = status;
  res.set_content(is_anthropic(req.path) ? anthropic::error_body(e) : openai::error_body(e), "application/json");
}

template <typename Plan>
void HttpServer::generate(const httplib::Request& req, httplib::Response& res, Plan plan) {
  runtime::AsyncEngine* engine = engine_.load();
  const ServedModel* model = model_.load();
  if (engine == nullptr || model == nullptr) return send_error(req, res, 503, "the model is still loading");
  if (draining_) return send_error(req, res, 503, "the server is shutting down");
  auto parsed = parse_body(req.body);
  if (auto* why = std::get_if<std::string>(&parsed)) return send_error(req, res, 400, *why);
  const ordered_json& body = std::get<ordered_json>(parsed);
  PlanContext ctx{.model = *model, .engine = engine->engine(), .max_n = options_.max_n};
  if (options_.test_output_header && req.has_header("X-Kiln-Test-Output"))
    ctx.forced_output = percent_decode(req.get_header_value("X-Kiln-Test-Output"));
  auto planned = plan(body, ctx);
  if (auto* e = std::get_if<ApiError>(&planned)) return send_error(req, res, e->status, e->message, e->param);
  Job& job = std::get<Job>(planned);
  runtime::AsyncEngine& target = pick_engine(job);  // before the job moves into its run
  auto started = JobRun::start(target, std::move(job), model->tokenizer());
  if (auto* e = std::get_if<ApiError>(&started)) return send_error(req, res, e->status, e->message, e->param);
  std::shared_ptr<JobRun> run = std::move(std::get<std::unique_ptr<JobRun>>(started));
  ++in_flight_;

  // The connection is watched between engine events (at least every kPumpWait): a client
  // that hangs up has its request cancelled, and the engine frees its blocks before its
  // next step. A streaming reply would also notice at its next write, but that may be a
  // long prefill (kKeepAlive) away.
  const ClientConnection client = ClientConnection::find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  if (!run->streaming()) {
    while (!run->done()) {
      run->pump(kPumpWait);
      if (!run->done() && client.gone()) {
        run->cancel();
        --in_flight_;
        return send_error(req, res, kClientClosed, "the client closed the connection");  // never read
      }
    }
    res.set_content(run->finish(), "application/json");
    --in_flight_;
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto first = std::make_shared<bool>(true);
  auto last_write = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  res.set_chunked_content_provider(
      "text/event-stream",
      [run, first, last_write, client](size_t, httplib::DataSink& sink) {
        if (!run->done() && client.gone()) return false;
        std::string out;
        if (*first) {
          *first = false;
          out = run->start_text();
        }
        if (!run->done()) out += run->pump(kPumpWait);
        const auto now = std::chrono::steady_clock::now();
        if (out.empty() && now - *last_write > kKeepAlive) out = ": keep-alive\n\n";
        if (!out.empty()) {
          if (!sink.write(out.data(), out.size())) return false;  // the client is gone
          *last_write = now;
        }
        if (run->done()) {
          const std::string tail = run->finish();
          if (!sink.write(tail.data(), tail.size())) return false;
          sink.done();
        }
        return true;
      },
      [this, run](bool) {
        if (!run->done()) run->cancel();
        --in_flight_;
      });
}

void HttpServer::routes() {
  using httplib::Request;
  using httplib::Response;
  using HR = httplib::Server::HandlerResponse;

  http_->set_pre_routing_handler([this](const Request& req, Response& res) {
    // Content-Length headers that disagree leave the body's end ambiguous (the ground of
    // request smuggling; RFC 9112 section 6.3 makes it an error): cpp-httplib reads the
    // body by the first, and the request is refused. (cpp-httplib 0.11 keeps or closes
    // the connection by the request's own Connection header, and reads no pipelined
    // bytes after a body as a request.)
    if (const size_t n = req.get_header_value_count("Content-Length"); n > 1) {
      for (size_t i = 1; i < n; ++i) {
        if (req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length", 0)) {
          send_error(req, res, 400, "the request has Content-Length headers that disagree");
          return HR::Handled;
        }
      }
    }
    const char* methods = route_methods(req.path);
    // A CORS preflight carries no credentials: answered before the API key is checked.
    if (req.method == "OPTIONS" && methods != nullptr) {
      preflight(req, res, methods);
      return HR::Handled;
    }
    if (req.path.rfind("/v1/", 0) == 0 && !authorized(req)) {
      send_error(req, res, 401, "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')");
      return HR::Handled;
    }
    if (methods != nullptr && !takes_method(methods, req.method)) {
      res.set_header("Allow", std::string(methods) + ", OPTIONS");
      send_error(req, res, 405, "method not allowed: " + method_and_path(req) + " (this endpoint takes " + methods + ")");
      return HR::Handled;
    }
    return HR::Unhandled;
  });
  // Every response, errors and streams included, names the request's origin when it is
  // allowed (headers are written after this handler).
  http_->set_post_routing_handler([this](const Request& req, Response& res) {
    if (req.method == "OPTIONS") return;  // preflight() set its own
    allow_origin(req, res);
  });
  http_->set_error_handler([this](const Request& req, Response& res) {
    if (res.body.empty()) send_error(req, res, res.status, status_message(req, res.status));
  });
  http_->set_exception_handler([this](const Request& req, Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    KILN_LOG(kError, "internal error on " << req.method << " " << req.path << ": " << what);
    send_error(req, res, 500, "internal server error: " + what);
  });
  http_->set_logger([this](const Request& req, const Response& res) {
    {
      std::lock_guard<std::mutex> lock(status_mu_);
      ++status_counts_[res.status];
    }
#ifdef __GLIBC__
    if (req.body.size() >= kTrimAfterBodyBytes) malloc_trim(0);
#endif
  });

  http_->Get("/", [](const Request&, Response& res) { res.set_content(chat_page_html(), "text/html; charset=utf-8"); });
  http_->Get("/health", [this](const Request&, Response& res) {
    const bool ready = engine_.load() != nullptr && !draining_;
    res.status = ready ? 200 : 503;
    res.set_content(ready ? R"({"status":"ok"})" : draining_ ? R"({"status":"draining"})" : R"({"status":"loading"})",
                    "application/json");
  });
  http_->Get("/metrics", [this](const Request&, Response& res) {
    runtime::AsyncEngine* engine = engine_.load();
    const ServedModel* model = model_.load();
    if (engine == nullptr || model == nullptr) {
      res.status = 503;
      res.set_content("# the model is still loading\n", "text/plain; version=0.0.4");
      return;
    }
    StatusCounts statuses;
    {
      std::lock_guard<std::mutex> lock(status_mu_);
      statuses = status_counts_;
    }
    std::vector<EngineNumbers> numbers;
    for (runtime::AsyncEngine* e : engines_) numbers.push_back({.stats = e->stats(), .metrics = &e->metrics()});
    res.set_content(metrics_text(model->name(), numbers, statuses), "text/plain; version=0.0.4");
  });
  http_->Get("/v1/models", [this](const Request& req, Response& res) {
    runtime::AsyncEngine* engine = engine_.load();
    const ServedModel* model = model_.load();
    if (engine == nullptr || model == nullptr) return send_error(req, res, 503, "the model is still loading");
    res.set_content(openai::models(*model, engine->engine().max_model_len(), created_).dump(), "application/json");
  });
  http_->Get(R"(/v1/models/(.+))", [this](const Request& req, Response& res) {
    runtime::AsyncEngine* engine = engine_.load();
    const ServedModel* model = model_.load();
    if (engine == nullptr || model == nullptr) return send_error(req, res, 503, "the model is still loading");
    if (req.matches[1] != model->name())
      return send_error(req, res, 404, "The model '" + std::string(req.matches[1]) + "' does not exist", "model");
    res.set_content(openai::models(*model, engine->engine().max_model_len(), created_)["data"][0].dump(),
                    "application/json");
  });
  http_->Post("/v1/chat/completions", [this](const Request& req, Response& res) { generate(req, res, openai::plan_chat); });
  http_->Post("/v1/completions", [this](const Request& req, Response& res) { generate(req, res, openai::plan_completion); });
  http_->Post("/v1/messages", [this](const Request& req, Response& res) { generate(req, res, anthropic::plan_messages); });
  http_->Post("/v1/messages/count_tokens", [this](const Request& req, Response& res) {
    runtime::AsyncEngine* engine = engine_.load();
    const ServedModel* model = model_.load();
    if (engine == nullptr || model == nullptr) return send_error(req, res, 503, "the model is still loading");
    auto parsed = parse_body(req.body);
    if (auto* why = std::get_if<std::string>(&parsed)) return send_error(req, res, 400, *why);
    const ordered_json& body = std::get<ordered_json>(parsed);
    auto counted = anthropic::count_tokens(body, PlanContext{.model = *model, .engine = engine->engine()});
    if (auto* e = std::get_if<ApiError>(&counted)) return send_error(req, res, e->status, e->message, e->param);
    res.set_content(std::get<ordered_json>(counted).dump(), "application/json");
  });
}

}  // namespace kiln::server
