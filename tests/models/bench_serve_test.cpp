// `kiln bench serve` against a real `kiln serve` of the built-in demo model: the JSON report's
// counts and timings, and a clear failure against a closed port.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A fresh directory under the system temp dir, removed at the end of the scope (failed asserts included).
struct TempDir {
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
};

// `kiln serve --port 0 --threads 2 [extra]` (the built-in demo model; stderr in
// dir/serve.log) in the background; the destructor stops it (SIGTERM, then SIGKILL after 5 s).
class DemoServer {
 public:
  explicit DemoServer(const fs::path& dir, std::vector<std::string> extra = {}) : log_(dir / "serve.log") {
    int out[2];
    if (::pipe(out) != 0) return;
    const std::string cache_dir = (dir / "cache").string();
    std::vector<std::string> args = {"kiln", "serve", "--port", "0", "--threads", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setenv("KILN_CACHE_DIR", cache_dir.c_str(), 1);
      if (const int log = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644); log >= 0) ::dup2(log, STDERR_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      ::execv(KILN_BINARY, argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    stdout_fd_ = out[0];
  }
  ~DemoServer() {
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Waits (at most `timeout`) for "kiln: serving NAME at http://127.0.0.1:PORT/v1 ..."; "" on timeout.
  std::string wait_for_url(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::string text;
    const std::regex ready(R"(kiln: serving \S+ at (http://127\.0\.0\.1:\d+)/v1)");
    while (Clock::now() < deadline && stdout_fd_ >= 0) {
      pollfd p{.fd = stdout_fd_, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(stdout_fd_, buf, sizeof buf);
      if (n <= 0) break;  // the server exited
      text.append(buf, size_t(n));
      std::smatch m;
      if (std::regex_search(text, m, ready)) return m[1];
    }
    return "";
  }

  std::string log() const {
    std::ifstream f(log_);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }

 private:
  fs::path log_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
};

struct BenchRun {
  int exit_code = -1;
  std::string out, err;
};

// `kiln bench serve ARGS`, bounded by coreutils timeout.
BenchRun bench(const std::string& args) {
  const fs::path err_path = fs::temp_directory_path() / ("kiln_bench_err_" + std::to_string(::getpid()));
  const std::string cmd = "timeout 60 " + std::string(KILN_BINARY) + " bench serve " + args + " 2>" + err_path.string();
  BenchRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(err_path);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  fs::remove(err_path);
  return r;
}

// A port nothing listens on: bound by the kernel's choice, then closed.
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 1;  // privileged and unused on a test machine
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(BenchServe, ReportsEveryLevelAgainstTheDemoServer) {
  const TempDir tmp("kiln_bench_serve");
  const fs::path& dir = tmp.path;
  DemoServer server(dir);  // stopped before tmp is removed
  const std::string url = server.wait_for_url(std::chrono::seconds(60));
  ASSERT_FALSE(url.empty()) << "kiln serve printed no ready line within 60 s:\n" << server.log();
  // No --backend: the start-up line names the backend --backend auto chose, and why.
  EXPECT_NE(server.log().find(KILN_BINARY_HAS_CUDA ? " (auto: " : " on cpu (auto: this build has no CUDA backend)"),
            std::string::npos)
      << server.log();
  const fs::path json_path = dir / "bench.json";
  const BenchRun r = bench("--url " + url + " --input-len 32 --output-len 8 --concurrency 1,4 --num-prompts 8 --json " +
                           json_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.err << "\nkiln serve:\n" << server.log();
  EXPECT_NE(r.out.find("TTFT p99 (ms)"), std::string::npos) << r.out;
  std::ifstream f(json_path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "unreadable " << json_path;
  ASSERT_EQ(j["levels"].size(), 2u);
  const int concurrency[] = {1, 4};
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE("level " + std::to_string(i));
    const nlohmann::json& level = j["levels"][i];
    const nlohmann::json& s = level["summary"];
    EXPECT_EQ(level["config"]["concurrency"], concurrency[i]);
    EXPECT_EQ(level["config"]["model"], "kiln-demo");
    EXPECT_EQ(s["successful"], 8);
    EXPECT_EQ(s["failed"], 0);
    EXPECT_EQ(s["input_tokens"], 8 * 32);
    EXPECT_EQ(s["output_tokens"], 8 * 8);
    ASSERT_EQ(level["requests"].size(), 8u);
    for (const nlohmann::json& q : level["requests"]) {
      EXPECT_TRUE(q["ok"].get<bool>()) << q.dump();
      EXPECT_EQ(q["output_tokens"], 8);  // the demo honours ignore_eos
    }
    EXPECT_GT(s["ttft_ms"]["mean"].get<double>(), 0);
    EXPECT_GT(s["tpot_ms"]["mean"].get<double>(), 0);
    EXPECT_GT(s["output_tokens_per_s"].get<double>(), 0);
    EXPECT_FALSE(s.contains("speculative")) << "a server without speculative decoding";
    for (const char* metric : {"ttft_ms", "tpot_ms", "itl_ms"}) {
      EXPECT_LE(s[metric]["p50"].get<double>(), s[metric]["p90"].get<double>()) << metric;
      EXPECT_LE(s[metric]["p50"].get<double>(), s[metric]["p99"].get<double>()) << metric;
    }
  }
}

// --temperature / --top-p go into every request (a sampled decode, not the default greedy
// one) and into the report's config.
TEST(BenchServe, SampledRequestsAtTheGivenTemperature) {
  const TempDir tmp("kiln_bench_serve_t");
  const fs::path& dir = tmp.path;
  DemoServer server(dir);
  const std::string url = server.wait_for_url(std::chrono::seconds(60));
  ASSERT_FALSE(url.empty()) << "kiln serve printed no ready line within 60 s:\n" << server.log();
  const fs::path json_path = dir / "bench.json";
  const BenchRun r = bench("--url " + url + " --input-len 16 --output-len 8 --concurrency 2 --num-prompts 4 " +
                           "--temperature 0.8 --top-p 0.9 --json " + json_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.err << "\nkiln serve:\n" << server.log();
  EXPECT_NE(r.out.find("temperature 0.8, top-p 0.9"), std::string::npos) << r.out;
  std::ifstream f(json_path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "unreadable " << json_path;
  const nlohmann::json& level = j["levels"][0];
  EXPECT_DOUBLE_EQ(level["config"]["temperature"].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(level["config"]["top_p"].get<double>(), 0.9);
  EXPECT_EQ(level["summary"]["successful"], 4);
  EXPECT_EQ(level["summary"]["output_tokens"], 4 * 8);
  const BenchRun bad = bench("--url " + url + " --temperature 3");
  EXPECT_NE(bad.exit_code, 0) << "a temperature out of range was taken";
}

// Against a server with n-gram drafts (the demo model's chat replies repeat their prompts'
// words): each level reports the drafts verified, how many stood and the mean accepted
// length, the differences of the server's /metrics counters over the level.
TEST(BenchServe, ReportsSpeculativeAcceptanceFromTheServersMetrics) {
  const TempDir tmp("kiln_bench_spec");
  const fs::path& dir = tmp.path;
  DemoServer server(dir, {"--speculative-method", "ngram", "--num-speculative-tokens", "3"});
  const std::string url = server.wait_for_url(std::chrono::seconds(60));
  ASSERT_FALSE(url.empty()) << "kiln serve printed no ready line within 60 s:\n" << server.log();
  const fs::path json_path = dir / "bench.json";
  const BenchRun r = bench("--url " + url + " --endpoint chat --input-len 32 --output-len 64 --concurrency 1,2 " +
                           "--num-prompts 6 --warmup 0 --json " + json_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.err << "\nkiln serve:\n" << server.log();
  EXPECT_NE(r.out.find("draft acceptance (%)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mean accepted length"), std::string::npos) << r.out;
  std::ifstream f(json_path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "unreadable " << json_path;
  double drafts = 0, draft_tokens = 0, accepted = 0;
  for (const nlohmann::json& level : j["levels"]) {
    ASSERT_TRUE(level["summary"].contains("speculative")) << level["summary"].dump();
    const nlohmann::json& s = level["summary"]["speculative"];
    EXPECT_LE(s["accepted_tokens"].get<double>(), s["draft_tokens"].get<double>());
    EXPECT_LE(s["draft_tokens"].get<double>(), 3 * s["drafts"].get<double>());
    if (s["drafts"].get<double>() > 0) {
      EXPECT_NEAR(s["mean_accepted_length"].get<double>(),
                  1.0 + s["accepted_tokens"].get<double>() / s["drafts"].get<double>(), 1e-9);
      EXPECT_NEAR(s["acceptance"].get<double>(),
                  s["accepted_tokens"].get<double>() / s["draft_tokens"].get<double>(), 1e-9);
    }
    drafts += s["drafts"].get<double>();
    draft_tokens += s["draft_tokens"].get<double>();
    accepted += s["accepted_tokens"].get<double>();
  }
  EXPECT_GT(drafts, 0) << "some drafts were verified";
  EXPECT_GT(accepted, 0) << "and some stood";
}

// --json-schema constrains every request (response_format json_schema): a boolean schema
// is complete after "true" or "false", so each request ends well before its 16 tokens
// even with ignore_eos, and the report keeps the schema.
TEST(BenchServe, JsonSchemaConstrainsEveryRequest) {
  const TempDir tmp("kiln_bench_schema");
  const fs::path& dir = tmp.path;
  DemoServer server(dir);
  const std::string url = server.wait_for_url(std::chrono::seconds(60));
  ASSERT_FALSE(url.empty()) << "kiln serve printed no ready line within 60 s:\n" << server.log();
  const fs::path schema = dir / "schema.json", json_path = dir / "bench.json";
  std::ofstream(schema) << R"({"type": "boolean"})";
  const BenchRun r = bench("--url " + url + " --input-len 16 --output-len 16 --concurrency 2 --num-prompts 4 " +
                           "--json-schema " + schema.string() + " --json " + json_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.err << "\nkiln serve:\n" << server.log();
  std::ifstream f(json_path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "unreadable " << json_path;
  const nlohmann::json& level = j["levels"][0];
  EXPECT_EQ(level["config"]["json_schema"], nlohmann::json::parse(R"({"type": "boolean"})"));
  ASSERT_EQ(level["requests"].size(), 4u);
  for (const nlohmann::json& q : level["requests"]) {
    EXPECT_TRUE(q["ok"].get<bool>()) << q.dump();
    EXPECT_GE(q["output_tokens"].get<int>(), 1) << q.dump();
    EXPECT_LT(q["output_tokens"].get<int>(), 16) << q.dump();  // "false" is at most 5 byte tokens
  }
  const BenchRun bad = bench("--url " + url + " --json-schema " + (dir / "missing.json").string());
  EXPECT_NE(bad.exit_code, 0);
}

TEST(BenchServe, AClosedPortFailsWithAMessageNamingTheUrl) {
  const std::string url = "http://127.0.0.1:" + std::to_string(closed_port());
  const BenchRun r = bench("--url " + url + " --input-len 4 --output-len 2 --warmup 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("kiln: error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(url), std::string::npos) << r.err;
  // With --model no discovery request is made: the level itself fails, and says so.
  const BenchRun m = bench("--url " + url + " --model x --input-len 4 --output-len 2 --warmup 0 --num-prompts 2");
  EXPECT_NE(m.exit_code, 0);
  EXPECT_NE(m.err.find("every request of level c=1 failed against " + url), std::string::npos) << m.err;
}

}  // namespace
}  // namespace kiln
