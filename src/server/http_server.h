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
//
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

#include "runtime/async_engine.h"
#include "server/metrics_text.h"
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
  // Tests only: a request's "X-Kiln-Test-Output" header text (%XX-escaped) is what every
  // sample of it emits (the model still runs). Set only by the test server binary; `kiln serve` has no
  // flag or variable that sets it.
  bool test_output_header = false;
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();

  // Binds and serves on a thread of its own; /health answers 503 until set_ready. Returns
  // the bound port.
  Result<int> start();
  // The model is loaded: generation endpoints open.
  void set_ready(runtime::AsyncEngine* engine, const ServedModel* model);
  // Graceful stop: new generation requests get 503; waits until the requests in flight
  // have finished (at most `timeout`).
  void drain(std::chrono::milliseconds timeout);
  // Closes the listener and joins its thread, however soon after start() it comes.
  void stop();
  int in_flight() const { return in_flight_.load(); }

 private:
  void routes();
  bool authorized(const httplib::Request& req) const;
  void send_error(const httplib::Request& req, httplib::Response& res, int status, const std::string& message,
                  const std::string& param = {});
  // Parses the body and runs `plan` (chat, completion or messages), then answers.
  template <typename Plan>
  void generate(const httplib::Request& req, httplib::Response& res, Plan plan);

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::atomic<bool> listener_exited_{false};
  int listen_fd_ = -1;
  std::atomic<runtime::AsyncEngine*> engine_{nullptr};
  std::atomic<const ServedModel*> model_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  int64_t created_ = 0;
  mutable std::mutex status_mu_;
  StatusCounts status_counts_;
};

}  // namespace kiln::server
