// HttpServer's states, driven over HTTP on 127.0.0.1: 503 in each API's format while the
// model loads, 200 once ready; 429 when the engine's queue is full; a drain lets the
// request in flight finish while new ones get 503; Content-Length headers that disagree
// get 400; data-parallel replicas share the requests, a conversation staying on the one
// that holds its prefix; deeply nested JSON is refused or kept as text, never a crash.
#include <gtest/gtest.h>

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "cli/demo.h"
#include "runtime/async_engine.h"
#include "server/http_server.h"
#include "server/served_model.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// The built-in demo model (models/kiln-demo).
const std::string& demo_dir() {
  static const std::string dir = cli::ensure_demo_model().value();
  return dir;
}

struct Served {
  std::unique_ptr<ServedModel> model;
  std::unique_ptr<runtime::AsyncEngine> engine;
};

Served load(int max_num_seqs, int max_queued) {
  Served s;
  auto model = ServedModel::load(demo_dir(), {.name = "kiln-demo"});
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  s.model = std::move(model).value();
  auto engine = runtime::Engine::load(demo_dir(), cpu::make_cpu_backend(2),
                                      {.max_model_len = 2048, .max_num_seqs = max_num_seqs});
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  s.engine = std::make_unique<runtime::AsyncEngine>(std::move(engine).value(),
                                                    runtime::AsyncEngineOptions{.max_queued_requests = max_queued});
  return s;
}

const std::string kChat = R"({"model": "kiln-demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})";
const std::string kMessages = R"({"model": "kiln-demo", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})";

TEST(HttpServer, AnswersHealthAndRequestsWith503WhileLoading) {
  HttpServer http({.port = 0});
  auto port = http.start();
  ASSERT_TRUE(port.ok()) << port.status().to_string();
  httplib::Client c("127.0.0.1", *port);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(json::parse(health->body)["status"], "loading");
  auto chat = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 503);
  EXPECT_EQ(json::parse(chat->body)["error"]["type"], "server_error");
  auto messages = c.Post("/v1/messages", kMessages, "application/json");
  ASSERT_TRUE(messages);
  EXPECT_EQ(messages->status, 503);
  EXPECT_EQ(json::parse(messages->body)["error"]["type"], "overloaded_error");
  EXPECT_EQ(c.Get("/metrics")->status, 503);

  Served s = load(4, 16);
  http.set_ready(s.engine.get(), s.model.get());
  EXPECT_EQ(c.Get("/health")->status, 200);
  auto ok = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["usage"]["completion_tokens"], 4);
  http.stop();
}

// CORS, 404 and 405 need no model: they answer while it loads, in each API's format.
TEST(HttpServer, PreflightsAndWrongPathsAnswerWhileLoading) {
  HttpServer http({.port = 0, .allowed_origins = {"http://app.example"}});
  auto port = http.start();
  ASSERT_TRUE(port.ok()) << port.status().to_string();
  httplib::Client c("127.0.0.1", *port);
  auto ok = c.Options("/v1/messages", {{"Origin", "http://app.example"}, {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 204);
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Methods"), "POST, OPTIONS");
  EXPECT_NE(ok->get_header_value("Access-Control-Allow-Headers").find("anthropic-version"), std::string::npos);
  auto refused = c.Options("/v1/messages", {{"Origin", "http://other.example"}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 403);
  EXPECT_FALSE(refused->has_header("Access-Control-Allow-Origin"));
  EXPECT_EQ(json::parse(refused->body)["error"]["type"], "permission_error");
  // The loading 503 still names the allowed origin: a page can read why.
  auto loading = c.Post("/v1/chat/completions", {{"Origin", "http://app.example"}}, kChat, "application/json");
  ASSERT_TRUE(loading);
  EXPECT_EQ(loading->status, 503);
  EXPECT_EQ(loading->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  auto get = c.Get("/v1/messages/count_tokens");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_EQ(get->get_header_value("Allow"), "POST, OPTIONS");
  EXPECT_EQ(json::parse(get->body)["type"], "error");
  auto missing = c.Post("/v1/embeddings", "{}", "application/json");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["message"], "no such endpoint: POST /v1/embeddings");
  http.stop();
}

TEST(HttpServer, AFullQueueIs429InEachApisFormat) {
  Served s = load(/*max_num_seqs=*/1, /*max_queued=*/1);
  HttpServer http({.port = 0});
  auto port = http.start();
  ASSERT_TRUE(port.ok());
  http.set_ready(s.engine.get(), s.model.get());
  // One request runs (the only sequence slot), one waits: the queue is full.
  auto running = s.engine->submit({.prompt = {1, 2, 3}, .max_tokens = 2000, .ignore_eos = true});
  ASSERT_TRUE(running.ok());
  for (int i = 0; i < 500 && s.engine->stats().engine.running < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto waiting = s.engine->submit({.prompt = {4, 5}, .max_tokens = 2000, .ignore_eos = true});
  ASSERT_TRUE(waiting.ok());
  httplib::Client c("127.0.0.1", *port);
  auto chat = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 429);
  EXPECT_EQ(json::parse(chat->body)["error"]["type"], "rate_limit_error");
  EXPECT_NE(json::parse(chat->body)["error"]["message"].get<std::string>().find("queued"), std::string::npos);
  auto messages = c.Post("/v1/messages", kMessages, "application/json");
  ASSERT_TRUE(messages);
  EXPECT_EQ(messages->status, 429);
  EXPECT_EQ(json::parse(messages->body)["error"]["type"], "rate_limit_error");
  (*running)->cancel();
  (*waiting)->cancel();
  http.stop();
}

TEST(HttpServer, DrainFinishesTheRequestInFlightAndRefusesNewOnes) {
  Served s = load(4, 16);
  HttpServer http({.port = 0});
  auto port = http.start();
  ASSERT_TRUE(port.ok());
  http.set_ready(s.engine.get(), s.model.get());
  std::string streamed;
  int status = 0;
  std::thread client([&] {
    httplib::Client c("127.0.0.1", *port);
    const std::string body =
        R"({"model": "kiln-demo", "stream": true, "max_tokens": 60, "ignore_eos": true, "messages": [{"role": "user", "content": "Go on"}]})";
    auto r = c.Post("/v1/chat/completions", body, "application/json");
    if (r) {
      status = r->status;
      streamed = r->body;
    }
  });
  for (int i = 0; i < 500 && http.in_flight() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(http.in_flight(), 1);
  std::thread drainer([&] { http.drain(std::chrono::seconds(60)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  httplib::Client c("127.0.0.1", *port);
  auto refused = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(c.Get("/health")->status, 503);
  drainer.join();
  client.join();
  EXPECT_EQ(http.in_flight(), 0);
  EXPECT_EQ(status, 200);
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << "the request in flight finished";
  http.stop();
}

// Two data-parallel replicas of the demo model behind one server.
class HttpServerReplicas : public ::testing::Test {
 protected:
  void SetUp() override {
    auto p = http.start();
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    port = *p;
    http.set_ready({a.engine.get(), b.engine.get()}, a.model.get());
  }
  Served a = load(4, 16), b = load(4, 16);
  HttpServer http{{.port = 0}};
  int port = 0;
};

// Data-parallel replicas: a request goes to the engine with the fewest requests open (equal
// ones in turn), and /metrics adds the engines up and shows each one's share.
TEST_F(HttpServerReplicas, RequestsGoToTheReplicaWithTheFewestOpen) {
  const auto generated = [](const Served& s) { return s.engine->stats().engine.generated_tokens; };
  // Replica 0 is busy with a long request of its own: the next one goes to replica 1.
  auto busy = a.engine->submit({.prompt = {1, 2, 3}, .max_tokens = 2000, .ignore_eos = true});
  ASSERT_TRUE(busy.ok());
  ASSERT_EQ(a.engine->open_requests(), 1);
  httplib::Client c("127.0.0.1", port);
  auto r = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(generated(b), 4);
  (*busy)->cancel();
  for (int i = 0; i < 500 && a.engine->open_requests() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(a.engine->open_requests(), 0);
  // Both idle: requests one after another alternate.
  const int64_t a0 = generated(a), b0 = generated(b);
  for (int i = 0; i < 4; ++i) {
    auto ok = c.Post("/v1/chat/completions", kChat, "application/json");
    ASSERT_TRUE(ok);
    ASSERT_EQ(ok->status, 200) << ok->body;
  }
  EXPECT_EQ(generated(a) - a0, 8);
  EXPECT_EQ(generated(b) - b0, 8);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  const auto sample = [&](const std::string& prefix) {
    const size_t at = m->body.find("\n" + prefix);
    EXPECT_NE(at, std::string::npos) << prefix;
    if (at == std::string::npos) return -1.0;
    const size_t end = m->body.find('\n', at + 1);
    return std::stod(m->body.substr(m->body.rfind(' ', end) + 1, end - m->body.rfind(' ', end) - 1));
  };
  EXPECT_EQ(sample("kiln_generation_tokens_total{"), double(generated(a) + generated(b)));
  EXPECT_EQ(sample("kiln_engine_generation_tokens_total{model_name=\"kiln-demo\",engine=\"0\"}"), double(generated(a)));
  EXPECT_EQ(sample("kiln_engine_generation_tokens_total{model_name=\"kiln-demo\",engine=\"1\"}"), double(generated(b)));
  const auto ttft = [](const Served& s) { return s.engine->metrics().time_to_first_token.snapshot().count; };
  EXPECT_GE(ttft(b), 3);
  EXPECT_EQ(sample("kiln_time_to_first_token_seconds_count{"), double(ttft(a) + ttft(b))) << "the histograms added up";
  EXPECT_EQ(sample("kiln_kv_cache_blocks_total{"),
            double(a.engine->stats().engine.kv_blocks_total + b.engine->stats().engine.kv_blocks_total));
  http.stop();
}

// A conversation's next turn goes to the replica whose prefix cache holds its start.
TEST_F(HttpServerReplicas, AConversationsNextTurnGoesToTheReplicaThatHasItsPrefix) {
  httplib::Client c("127.0.0.1", port);
  const json system = {{"role", "system"},
                       {"content", "You are a careful assistant for a small bakery. You answer questions about opening "
                                   "hours, bread, cakes and orders in two short sentences, and you never invent prices."}};
  json turn1 = {{"model", "kiln-demo"}, {"max_tokens", 4}, {"temperature", 0},
                {"messages", {system, {{"role", "user"}, {"content", "When do you open on Sundays?"}}}}};
  const auto stats = [](const Served& s) { return s.engine->stats().engine; };
  auto r1 = c.Post("/v1/chat/completions", turn1.dump(), "application/json");
  ASSERT_TRUE(r1);
  ASSERT_EQ(r1->status, 200) << r1->body;
  const bool on_a = stats(a).generated_tokens > 0;
  const Served& first = on_a ? a : b;
  const Served& other = on_a ? b : a;
  ASSERT_EQ(stats(first).generated_tokens, 4);
  for (int turn = 0; turn < 3; ++turn) {  // the least busy would alternate; the prefix keeps it there
    json next = turn1;
    next["messages"].push_back({{"role", "assistant"}, {"content", json::parse(r1->body)["choices"][0]["message"]["content"]}});
    next["messages"].push_back({{"role", "user"}, {"content", "And on Mondays, number " + std::to_string(turn) + "?"}});
    auto r = c.Post("/v1/chat/completions", next.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
  }
  EXPECT_EQ(stats(first).generated_tokens, 16);
  EXPECT_EQ(stats(other).generated_tokens, 0);
  EXPECT_GT(stats(first).prefix_hit_tokens, 0);
  http.stop();
}

// `request` sent over a plain socket to 127.0.0.1:port; what comes back until the server
// closes (the request says Connection: close), or 10 s.
std::string raw_exchange(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval limit{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  std::string got;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, request.data(), request.size(), 0) == ssize_t(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
  }
  ::close(fd);
  return got;
}

// Two Content-Length headers that disagree: a 400 in the endpoint's error format (the
// body's end is ambiguous), before anything else is looked at (here: while the model
// loads); two that agree are one length, and the request goes on (the loading 503).
TEST(HttpServer, ContentLengthsThatDisagreeAre400) {
  HttpServer http({.port = 0});
  auto port = http.start();
  ASSERT_TRUE(port.ok()) << port.status().to_string();
  const auto request = [&](size_t second) {
    return "POST /v1/messages/count_tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
           "Content-Type: application/json\r\nContent-Length: " +
           std::to_string(kMessages.size()) + "\r\nContent-Length: " + std::to_string(second) + "\r\n\r\n" + kMessages;
  };
  const std::string refused = raw_exchange(*port, request(kMessages.size() + 5));
  ASSERT_EQ(refused.rfind("HTTP/1.1 400", 0), 0u) << refused;
  const json error = json::parse(refused.substr(refused.find("\r\n\r\n") + 4));
  EXPECT_EQ(error["type"], "error");
  EXPECT_EQ(error["error"]["type"], "invalid_request_error");
  EXPECT_EQ(error["error"]["message"], "the request has Content-Length headers that disagree");
  const std::string agreed = raw_exchange(*port, request(kMessages.size()));
  EXPECT_EQ(agreed.rfind("HTTP/1.1 503", 0), 0u) << agreed;
  http.stop();
}

// JSON nested far deeper than any API needs, where the parser's copies and the template's
// rendering would recurse once a level: 50,000 levels in a field, followed by another field
// (which overflowed a server thread's stack and ended the process), is a 400 naming the
// depth; a tool call's `arguments` string nested as deep (it crashed the same way) is kept
// as a string; and the server answers afterwards.
TEST(HttpServer, DeeplyNestedJsonIsRefusedOrKeptAsTextNeverACrash) {
  HttpServer http({.port = 0});
  auto port = http.start();
  ASSERT_TRUE(port.ok()) << port.status().to_string();
  Served s = load(4, 16);
  http.set_ready(s.engine.get(), s.model.get());
  httplib::Client c("127.0.0.1", *port);
  c.set_read_timeout(120, 0);
  const int levels = 50000;
  const std::string deep = std::string(levels, '[') + std::string(levels, ']');
  const std::string seed = R"({"model": "kiln-demo", "max_tokens": 4, "seed": )" + deep +
                           R"(, "stop": "x", "messages": [{"role": "user", "content": "Hi"}]})";
  auto refused = c.Post("/v1/chat/completions", seed, "application/json");
  ASSERT_TRUE(refused) << "no answer: the server is gone";
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_EQ(json::parse(refused->body)["error"]["message"],
            "the request body nests JSON 50000 levels deep (at most 128)");

  json chat = json::parse(kChat);
  chat["messages"].push_back({{"role", "assistant"},
                              {"content", nullptr},
                              {"tool_calls", {{{"id", "call_1"},
                                               {"type", "function"},
                                               {"function", {{"name", "f"}, {"arguments", "{\"a\": " + deep + "}"}}}}}}});
  chat["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "ok"}});
  auto served = c.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(served) << "no answer: the server is gone";
  // The arguments went into the prompt as text: 100,000 brackets are longer than the context.
  EXPECT_EQ(served->status, 400) << served->body;
  const std::string message = json::parse(served->body)["error"]["message"];
  EXPECT_NE(message.find("maximum context length is 2048 tokens"), std::string::npos) << message;

  auto after = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;
  http.stop();
}

}  // namespace
}  // namespace kiln::server
