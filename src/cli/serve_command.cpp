// `kiln serve [MODEL]`: the OpenAI / Anthropic HTTP server over the continuous-batching
// engine. What is quick to check comes first (the model directory, config.json and its
// architecture, the tokenizer), so a model that cannot serve fails before the "listening"
// line; then the port is bound (/health answers 503 while loading), then the backend (the
// CUDA self-test), the weights (a progress bar) and the KV cache; one ready line with the
// URL follows. SIGINT / SIGTERM drain the requests in
// flight, then exit; a second signal exits at once.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/demo.h"
#include "cli/demo_tokenizer.h"
#include "cli/model_path.h"
#include "cli/subcommand.h"
#include "core/log.h"
#include "formats/hf_config.h"
#include "models/registry.h"
#include "runtime/async_engine.h"
#include "server/http_server.h"
#include "server/served_model.h"

namespace kiln::cli {
namespace {

struct ServeOptions {
  CommonOptions common;
  std::string tokenizer;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 0;
  int data_parallel = 1;
  bool prefix_caching = true;
  std::string kv_cache_memory;
  float gpu_memory_utilization = 0.9f;
  int max_queued_requests = 1024;
  std::string max_request_bytes = "32MiB";
  int http_threads = 0;
  std::string tool_call_parser = "auto";
  std::string reasoning_parser = "auto";
  double shutdown_timeout = 60.0;
  // CORS. "*" by default, as vLLM: kiln listens on 127.0.0.1 unless --host says otherwise,
  // so only pages open in this machine's browser can reach it, and the server keeps nothing
  // a page could read but the answers to its own requests (no history, no files); a page
  // could already make it generate without CORS (a "simple" POST), just not read the
  // reply. With --api-key a page needs the key too. "" or none: no origin but the server's
  // own (the chat page at /).
  std::string allowed_origins = "*";
  double log_stats_interval = 10.0;
};

// "--allowed-origins" as a list: comma-separated, trimmed, trailing '/' dropped (browsers
// send an origin without one); "" or "none" is no origin.
Result<std::vector<std::string>> parse_origins(const std::string& s) {
  std::vector<std::string> out;
  if (s == "none") return out;
  std::stringstream ss(s);
  std::string o;
  while (std::getline(ss, o, ',')) {
    while (!o.empty() && std::isspace(static_cast<unsigned char>(o.front()))) o.erase(o.begin());
    while (!o.empty() && (std::isspace(static_cast<unsigned char>(o.back())) || o.back() == '/')) o.pop_back();
    if (o.empty()) continue;
    if (o != "*" && o.find("://") == std::string::npos) {
      return invalid_argument("--allowed-origins \"" + o + "\": an origin is scheme://host[:port], e.g. http://localhost:3000, or *");
    }
    out.push_back(o);
  }
  return out;
}

// "1073741824", "512MiB", "4G", "1.5GB" -> bytes (K/M/G/T, binary).
Result<int64_t> parse_bytes(const std::string& s, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  for (char& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  if (used == 0 || scale == 0 || !(v > 0) || v * scale > 9e18) {
    return invalid_argument(std::string(flag) + " \"" + s + "\": expected a size such as 4GiB, 512MiB or 1073741824");
  }
  return int64_t(v * scale);
}

// Loading progress on stderr: a bar redrawn in place on a terminal, else a line per 10%.
class LoadProgress {
 public:
  LoadProgress() : tty_(isatty(STDERR_FILENO) == 1) {}
  void operator()(uint64_t done, uint64_t total) {
    if (total == 0) return;
    const int pct = int(100.0 * double(done) / double(total));
    if (tty_) {
      const int filled = pct * 30 / 100;
      std::fprintf(stderr, "\rkiln: loading weights [%s%s] %3d%% %.2f / %.2f GB", std::string(size_t(filled), '#').c_str(),
                   std::string(size_t(30 - filled), '.').c_str(), pct, double(done) / 1e9, double(total) / 1e9);
      if (done >= total) std::fputc('\n', stderr);
    } else if (pct / 10 > last_decile_) {
      last_decile_ = pct / 10;
      std::fprintf(stderr, "kiln: loading weights %d%% (%.2f / %.2f GB)\n", pct, double(done) / 1e9, double(total) / 1e9);
    }
    std::fflush(stderr);
  }
  void finish() {
    if (tty_) std::fputc('\n', stderr);
  }

 private:
  bool tty_;
  int last_decile_ = -1;
};

// The directory of a model argument (a config .json file's own directory).
std::string fs_dir(const std::string& model) {
  return std::filesystem::is_regular_file(model) ? std::filesystem::path(model).parent_path().string() : model;
}

// A dummy model without a tokenizer gets the generated one at its vocabulary size (every id
// decodes to text), written once into the kiln cache.
Result<std::string> dummy_tokenizer(const std::string& model) {
  std::ifstream f(std::filesystem::is_regular_file(model) ? model : model + "/config.json");
  std::stringstream text;
  text << f.rdbuf();
  KILN_ASSIGN_OR_RETURN(const formats::ModelConfig config, formats::parse_config(text.str(), model));
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) base = std::string(x) + "/kiln";
  else if (const char* h = std::getenv("HOME"); h && *h) base = std::string(h) + "/.cache/kiln";
  else base = "/tmp/kiln-cache";
  const std::string dir = base + "/tokenizer-" + std::to_string(config.vocab_size);
  if (!std::filesystem::exists(dir + "/tokenizer_config.json")) {
    std::fprintf(stderr, "kiln: writing a generated tokenizer of %lld ids for the dummy model into %s\n",
                 (long long)config.vocab_size, dir.c_str());
    const std::string tmp = dir + ".tmp" + std::to_string(::getpid());
    std::error_code ec;
    std::filesystem::create_directories(tmp, ec);
    KILN_RETURN_IF_ERROR(write_demo_tokenizer(tmp, config.vocab_size));
    std::filesystem::rename(tmp, dir, ec);
    if (ec && !std::filesystem::exists(dir + "/tokenizer_config.json")) {
      return internal_error("cannot write " + dir + ": " + ec.message());
    }
    std::filesystem::remove_all(tmp, ec);
  }
  return dir;
}

// SIGINT / SIGTERM arrive on one thread of their own (blocked in every other thread),
// which outlives serve(): what it reads is global. Before the model is ready a signal
// exits at once (128 + the signal); after, the first one drains.
std::atomic<int> g_signals{0};
std::atomic<bool> g_ready{false};
sigset_t g_stop_signals;

Status serve(ServeOptions o, const ServeHooks& hooks) {
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a dead server
  sigemptyset(&g_stop_signals);
  sigaddset(&g_stop_signals, SIGINT);
  sigaddset(&g_stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &g_stop_signals, nullptr);  // threads started from here inherit it
  std::thread signals([] {
    while (true) {
      int sig = 0;
      if (sigwait(&g_stop_signals, &sig) != 0) continue;
      if (g_signals.fetch_add(1) > 0 || !g_ready.load()) {
        std::fprintf(stderr, "\nkiln: stopped\n");
        std::_Exit(128 + sig);
      }
      std::fprintf(stderr, "\nkiln: %s: finishing the requests in flight (again to stop at once)\n", strsignal(sig));
    }
  });
  signals.detach();

  const bool dummy = o.common.load_format == "dummy";
  std::string dir = o.common.model;
  if (dir.empty()) {
    KILN_ASSIGN_OR_RETURN(dir, ensure_demo_model());
    if (o.served_model_name.empty()) o.served_model_name = "kiln-demo";
  } else if (!(dummy && std::filesystem::is_regular_file(dir))) {  // dummy: a config .json will do
    KILN_ASSIGN_OR_RETURN(dir, resolve_model_dir(dir));
  }
  if (o.served_model_name.empty()) o.served_model_name = o.common.model;
  std::string tokenizer_dir = o.tokenizer.empty() ? dir : o.tokenizer;
  if (dummy && o.tokenizer.empty() && !std::filesystem::exists(fs_dir(dir) + "/tokenizer.json")) {
    KILN_ASSIGN_OR_RETURN(tokenizer_dir, dummy_tokenizer(dir));
  }
  KILN_ASSIGN_OR_RETURN(const int64_t max_body, parse_bytes(o.max_request_bytes, "--max-request-bytes"));
  int64_t kv_bytes = 0;
  if (!o.kv_cache_memory.empty()) {
    KILN_ASSIGN_OR_RETURN(kv_bytes, parse_bytes(o.kv_cache_memory, "--kv-cache-memory"));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> origins, parse_origins(o.allowed_origins));

  // Checked before the port is bound (milliseconds): config.json, its architecture, the
  // tokenizer and chat template. The weights are checked as they load.
  std::string architecture;
  {
    const std::string config_path = std::filesystem::is_regular_file(dir) ? dir : dir + "/config.json";
    std::ifstream f(config_path);
    if (!f) return not_found("cannot read " + config_path);
    std::stringstream text;
    text << f.rdbuf();
    KILN_ASSIGN_OR_RETURN(const formats::ModelConfig config, formats::parse_config(text.str(), config_path));
    KILN_RETURN_IF_ERROR(models::check_architecture(config.architecture));
    architecture = config.architecture;
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<server::ServedModel> model,
                        server::ServedModel::load(tokenizer_dir,
                                                  {.name = o.served_model_name,
                                                   .tool_call_parser = o.tool_call_parser,
                                                   .reasoning_parser = o.reasoning_parser,
                                                   .generation_config_dir = dir,
                                                   .architecture = architecture}));

  server::HttpServer http({.host = o.host,
                           .port = o.port,
                           .api_key = o.api_key,
                           .max_body_bytes = size_t(max_body),
                           .http_threads = o.http_threads > 0 ? o.http_threads : o.max_num_seqs + 64,
                           .allowed_origins = std::move(origins),
                           .test_output_header = hooks.test_output_header});
  KILN_ASSIGN_OR_RETURN(const int port, http.start());
  std::fprintf(stderr, "kiln: listening on %s:%d (/health says 503 until the model is loaded)\n", o.host.c_str(), port);
  const int world = o.common.tensor_parallel * o.common.pipeline_parallel, dp = o.data_parallel;
  const BackendChoice backend = choose_backend(o.common.backend);
  o.common.backend = backend.backend;
  std::fprintf(stderr, "kiln: loading %s on %s%s%s%s\n", dir.c_str(), backend.backend.c_str(),
               backend.why.empty() ? "" : (" (" + backend.why + ")").c_str(),
               world > 1 ? (" x " + std::to_string(world) + " ranks (tensor-parallel " +
                            std::to_string(o.common.tensor_parallel) + ", pipeline " +
                            std::to_string(o.common.pipeline_parallel) +
                            (o.common.expert_parallel ? ", expert-parallel)" : ")")).c_str()
                         : "",
               dp > 1 ? (", " + std::to_string(dp) + " data-parallel replicas").c_str() : "");
  // Data parallelism: replica r is a whole engine of its own on devices --device + r *
  // world onwards (the CPU backend's threads shared out). Replicas load side by side, one
  // thread each (as the ranks of one replica do), with one progress bar over all; the
  // devices are counted first, before minutes of loading.
  if (const int devices = cuda_device_count(); backend.backend == "cuda" && dp > 1 &&
                                               o.common.device + dp * world > devices) {
    return invalid_argument("--data-parallel-size " + std::to_string(dp) + " x " + std::to_string(world) +
                            " rank(s) from --device " + std::to_string(o.common.device) + " needs " +
                            std::to_string(o.common.device + dp * world) + " CUDA devices; this machine has " +
                            std::to_string(devices));
  }
  LoadProgress progress;
  std::mutex progress_mu;
  std::vector<std::pair<uint64_t, uint64_t>> progress_of(size_t(dp), {0, 0});  // (done, total) a replica
  const auto load_replica = [&](int r) {
    CommonOptions common = o.common;
    common.device = o.common.device + r * world;
    if (common.backend == "cpu" && dp > 1) {
      const int cores = o.common.threads > 0 ? o.common.threads : int(std::max(1u, std::thread::hardware_concurrency()));
      common.threads = std::max(1, cores / dp);
    }
    runtime::EngineOptions e = engine_options(common);
    e.max_num_seqs = o.max_num_seqs;
    e.max_num_batched_tokens = o.max_num_batched_tokens;
    e.enable_prefix_caching = o.prefix_caching;
    e.kv_cache_bytes = kv_bytes;
    e.gpu_memory_utilization = o.gpu_memory_utilization;
    e.on_load_progress = [&, r](uint64_t done, uint64_t total) {
      std::lock_guard<std::mutex> lock(progress_mu);
      progress_of[size_t(r)] = {done, total};
      uint64_t d = 0, t = 0;
      for (const auto& [rd, rt] : progress_of) d += rd, t += rt;
      progress(d, t);
    };
    return load_engine(dir, common, e);
  };
  std::vector<std::optional<Result<std::unique_ptr<runtime::Engine>>>> loads(static_cast<size_t>(dp));
  if (dp == 1) {
    loads[0].emplace(load_replica(0));
  } else {
    std::vector<std::thread> loaders;
    for (int r = 0; r < dp; ++r) loaders.emplace_back([&, r] { loads[size_t(r)].emplace(load_replica(r)); });
    for (std::thread& t : loaders) t.join();
  }
  std::vector<std::unique_ptr<runtime::AsyncEngine>> replicas;
  for (int r = 0; r < dp; ++r) {
    const std::string name = dp > 1 ? "replica " + std::to_string(r) : "";
    Result<std::unique_ptr<runtime::Engine>>& loaded = *loads[size_t(r)];
    if (!loaded.ok()) return dp > 1 ? loaded.status().with_context("data-parallel " + name) : loaded.status();
    std::unique_ptr<runtime::Engine> engine = std::move(loaded).value();
    if (r == 0 && model->tokenizer().vocab_size() > engine->config().vocab_size) {
      KILN_LOG(kWarn, "the tokenizer has " << model->tokenizer().vocab_size() << " ids, the model "
                                           << engine->config().vocab_size << ": prompts with the extra ids are refused");
    }
    const runtime::Engine& e = *engine;
    std::fprintf(stderr,
                 "kiln: %s%sKV cache %lld tokens (%s, %.1f MiB, %lld-token blocks), max model len %lld, up to %d "
                 "sequences, %d tokens per step, prefix caching %s\n",
                 name.c_str(), name.empty() ? "" : ": ", (long long)e.kv_capacity_tokens(),
                 std::string(dtype_name(e.kv_cache_storage())).c_str(), double(e.kv_cache_bytes()) / (1 << 20),
                 (long long)o.common.block_size, (long long)e.max_model_len(), e.scheduler_config().max_num_seqs,
                 e.scheduler_config().max_num_batched_tokens, e.prefix_caching() ? "on" : "off");
    if (r > 0 && e.max_model_len() != replicas[0]->engine().max_model_len()) {
      return invalid_argument("data-parallel replicas " + std::to_string(r) + " and 0 hold different maximum lengths (" +
                              std::to_string(e.max_model_len()) + " and " +
                              std::to_string(replicas[0]->engine().max_model_len()) +
                              " tokens: their KV caches differ); set --max-model-len");
    }
    replicas.push_back(std::make_unique<runtime::AsyncEngine>(
        std::move(engine), runtime::AsyncEngineOptions{
                               .max_queued_requests = o.max_queued_requests,
                               .stats_log_interval = std::chrono::milliseconds(int64_t(o.log_stats_interval * 1000)),
                               .log_name = dp > 1 ? "engine " + std::to_string(r) : "engine"}));
  }
  if (backend.backend == "cuda") {  // a layout's sums through host memory where replicas would serve more
    const runtime::Engine& e = replicas[0]->engine();
    const std::string hint =
        data_parallel_hint(o.common.tensor_parallel, o.common.pipeline_parallel, dp,
                           world > 1 && dp == 1 ? no_peer_access(o.common.device, world) : std::string(),
                           e.weight_bytes(), e.device_memory_bytes());
    if (!hint.empty()) std::fprintf(stderr, "%s\n", hint.c_str());
  }
  std::vector<runtime::AsyncEngine*> engines;
  for (const auto& a : replicas) engines.push_back(a.get());
  http.set_ready(engines, model.get());
  g_ready = true;
  std::printf("kiln: serving %s at http://%s:%d/v1 (OpenAI /v1/chat/completions, Anthropic /v1/messages)\n",
              model->name().c_str(), o.host.c_str(), port);
  std::fflush(stdout);

  // The first replica's failure, or empty while every one runs.
  const auto failure = [&]() -> std::string {
    for (size_t r = 0; r < replicas.size(); ++r)
      if (std::string f = replicas[r]->failure(); !f.empty()) return dp > 1 ? "replica " + std::to_string(r) + ": " + f : f;
    return {};
  };
  const auto stop_all = [&] {
    for (auto& a : replicas) a->stop();
  };
  while (g_signals.load() == 0 && failure().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (const std::string f = failure(); !f.empty()) {
    http.stop();
    stop_all();
    return internal_error("the engine failed, the server stops: " + f);
  }
  http.drain(std::chrono::milliseconds(int64_t(o.shutdown_timeout * 1000)));
  http.stop();
  stop_all();
  std::fprintf(stderr, "kiln: stopped\n");
  return Status::Ok();
}

}  // namespace

void add_serve_command(CLI::App& app, Subcommands& commands, const ServeHooks& hooks) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "serve a model over the OpenAI and Anthropic HTTP APIs "
                                              "(without MODEL: the built-in demo model)");
  cmd->add_option("model,--model", o->common.model,
                  "checkpoint directory, or org/name in the Hugging Face cache (MODEL or --model MODEL)");
  add_common(cmd, o->common, /*model_option=*/false);
  cmd->add_option("--tokenizer", o->tokenizer, "directory with tokenizer.json and the chat template (default: MODEL)");
  cmd->add_option("--served-model-name", o->served_model_name, "the model id clients send (default: MODEL)");
  cmd->add_option("--host", o->host, "address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)");
  cmd->add_option("--port", o->port, "port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->api_key, "require this key (Authorization: Bearer KEY, or x-api-key)");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "sequences in the running batch at most")->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                  "tokens per engine step at most (0: max(2048, max-num-seqs))");
  cmd->add_option("--data-parallel-size", o->data_parallel,
                  "whole copies of the model, each on its own GPUs (tensor x pipeline parallel of them, from "
                  "--device on); a request goes to the one that served most of its prompt before, else the least busy")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->prefix_caching,
                "share the KV blocks of equal prompt prefixes (default on)");
  cmd->add_option("--kv-cache-memory", o->kv_cache_memory, "KV cache size, e.g. 8GiB (default: from free memory)");
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "fraction of the GPU memory left after weights and activations that the KV cache takes")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--max-queued-requests", o->max_queued_requests, "requests waiting to run at most (then 429)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-request-bytes", o->max_request_bytes, "request body size at most (then 413)");
  cmd->add_option("--http-threads", o->http_threads, "connections served at once (0: max-num-seqs + 64)");
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "auto (from the chat template), none, hermes, glm45, kimi_k2, deepseek_v3, harmony");
  cmd->add_option("--reasoning-parser", o->reasoning_parser, "auto (<think> in the template), think, none");
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout, "seconds to let requests finish after SIGINT/SIGTERM");
  cmd->add_option("--allowed-origins", o->allowed_origins,
                  "CORS: origins whose web pages may call the API, comma-separated (http://localhost:3000,...), "
                  "* for any, none for the server's own page only. * by default: on 127.0.0.1 that is pages in "
                  "this machine's browser (README: Browsers and CORS)");
  cmd->add_option("--log-stats-interval", o->log_stats_interval,
                  "seconds between the engine's info lines while it works (KILN_LOG=info; 0: none)")
      ->check(CLI::Range(0.0, 86400.0));
  commands.emplace_back(cmd, [o, hooks] {
    const Status s = serve(*o, hooks);
    return s.ok() ? 0 : fail(s);
  });
}

}  // namespace kiln::cli
