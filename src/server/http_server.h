// HttpServer: the HTTP front of kiln (cpp-httplib, one worker thread per connection).
//
//   GET  /                               the chat page (chat_page.html)
//   GET  /health                         503 while loading or draining, then 200
//   GET  /metrics                        Prometheus text
//   GET  /v1/models                      OpenAI
//   POST /v1/chat/completions            OpenAI (SSE when "stream": true)
//   POST /v1/completions                 OpenAI
//   POST /v1/messages                    Anthropic (SSE when "stream": true)
//   POST /v1/messages/count_tokens       Anthropic
//   OPTIONS on any of these              CORS preflight: 204 for an allowed Origin, else 403
//
// "model" may be left out of a request (the served model). An unknown path is a 404 that
// names it, another method on a known path a 405 with an Allow header, both in the error
// format of the API the path belongs to. Every response to an allowed Origin carries
// Access-Control-Allow-Origin (ServerOptions::allowed_origins).
// Every request is validated on its worker thread; whatever is wrong with it comes back
// as a 4xx in the error format of the API it called, never as a crash. A client that goes
// away, streaming or not, has its request cancelled: its connection is watched between
// engine events (at least every 50 ms), and its KV blocks are free before the engine's
// next step (ClientConnection).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/async_engine.h"
#include "server/metrics_text.h"
#include "server/replica_router.h"
#include "server/served_model.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kiln::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  // localhost unless told otherwise
  int port = 8000;                 // 0: a free port (start() returns it)
  std::string api_key;             // empty: no authentication
  size_t max_body_bytes = 32u << 20;
  int http_threads = 64;           // concurrent connections served (more wait in line)
  int32_t max_n = 64;              // parallel samples per request at most
  // CORS: origins ("http://localhost:3000") whose pages may call the API from a browser;
  // "*" is any. Empty: none (same-origin pages only, such as the chat page at /).
  std::vector<std::string> allowed_origins;
  // Tests only: a request's "X-Kiln-Test-Output" header text (%XX-escaped) is what every
  // sample of it emits (the model still runs). Set only by the test server binary; `kiln serve` has no
  // flag or variable that sets it.
  bool test_output_header = false;
};

struct Job;

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();

  // Binds and serves on a thread of its own; /health answers 503 until set_ready. Returns
  // the bound port.
  Result<int> start();
  // The model is loaded: generation endpoints open. With several engines (data-parallel
  // replicas of the model, `kiln serve --data-parallel-size`) a ReplicaRouter picks each
  // request's: the one that served most of its prompt before (its prefix cache), within a
  // load gap, else the one with the fewest requests open. They must be loaded from the
  // same model with the same options (read-only questions, such as the maximum length, go
  // to the first).
  void set_ready(runtime::AsyncEngine* engine, const ServedModel* model);
  void set_ready(std::vector<runtime::AsyncEngine*> engines, const ServedModel* model);
  // Graceful stop: new generation requests get 503; waits until the requests in flight
  // have finished (at most `timeout`).
  void drain(std::chrono::milliseconds timeout);
  // Closes the listener and joins its thread, however soon after start() it comes.
  void stop();
  int in_flight() const { return in_flight_.load(); }

 private:
  void routes();
  bool authorized(const httplib::Request& req) const;
  bool origin_allowed(const std::string& origin) const;
  // Sets Access-Control-Allow-Origin when the request has an allowed Origin; false when not.
  bool allow_origin(const httplib::Request& req, httplib::Response& res) const;
  // OPTIONS on a route: 204 with the CORS headers for an allowed origin, 403 for another.
  void preflight(const httplib::Request& req, httplib::Response& res, const char* methods);
  void send_error(const httplib::Request& req, httplib::Response& res, int status, const std::string& message,
                  const std::string& param = {});
  // Parses the body and runs `plan` (chat, completion or messages), then answers.
  template <typename Plan>
  void generate(const httplib::Request& req, httplib::Response& res, Plan plan);
  // The engine a new request goes to (set_ready).
  runtime::AsyncEngine& pick_engine(const Job& job);

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::atomic<bool> listener_exited_{false};
  int listen_fd_ = -1;
  std::atomic<runtime::AsyncEngine*> engine_{nullptr};  // engines_[0], stored last: ready
  std::vector<runtime::AsyncEngine*> engines_;          // written once, before engine_
  std::unique_ptr<ReplicaRouter> router_;               // with several engines; likewise
  std::atomic<const ServedModel*> model_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  int64_t created_ = 0;
  mutable std::mutex status_mu_;
  StatusCounts status_counts_;
};

}  // namespace kiln::server
