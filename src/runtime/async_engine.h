// AsyncEngine: the Engine on its own thread, fed by many client threads.
//
//   client thread: submit(Request) -> checks it (Engine::check_request reads only what
//     load fixed), queues it in the bounded inbox (resource_exhausted when full) and
//     returns a RequestStream
//   engine thread: loop { take the inbox and the cancellations -> Engine::step()
//     -> push each sampled token into its request's stream }
//   client thread: RequestStream::next() waits for tokens; cancel() (client gone, stop
//     string matched) is honoured before the engine's next step, which frees the blocks.
//
// The engine never waits for a client: a stream's buffer is bounded, and a request whose
// reader falls that far behind is cancelled instead of stalling the batch.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/engine.h"
#include "runtime/metrics.h"

namespace kiln::runtime {

using Clock = std::chrono::steady_clock;
constexpr Clock::time_point kEnded = Clock::time_point::max();

// One event of a request's stream: a token of one sample, and/or that sample's end.
struct StreamEvent {
  int32_t sample_index = 0;
  bool has_token = false;
  SampledToken token;
  FinishReason finish = FinishReason::kNone;  // set on the sample's last event
};

class AsyncEngine;

// How a stream reaches its engine: cleared when the engine is destroyed, so a stream that
// outlives it can still be cancelled (a no-op then).
struct EngineLink {
  std::mutex mu;
  AsyncEngine* engine = nullptr;
};

class RequestStream {
 public:
  uint64_t id() const { return id_; }
  int32_t n_samples() const { return n_samples_; }
  // Appends the events that arrived, waiting up to `timeout` for the first one; false
  // when none arrived in time. Every sample ends with one event whose finish is set.
  bool next(std::vector<StreamEvent>& out, std::chrono::milliseconds timeout);
  // Every sample has ended and every event was read.
  bool done() const;
  // Asks the engine to end the request (or only sample `sample`); it frees the blocks
  // before its next step, and each unfinished sample it ends gets a kCancelled event.
  void cancel(int32_t sample = -1);
  Clock::time_point arrival() const { return arrival_; }

 private:
  friend class AsyncEngine;
  RequestStream(std::shared_ptr<EngineLink> link, uint64_t id, int32_t n, size_t capacity)
      : link_(std::move(link)), id_(id), n_samples_(n), open_samples_(n), capacity_(capacity) {}
  // Engine thread: false when the buffer is full (the request is then cancelled).
  bool push(StreamEvent e);

  std::shared_ptr<EngineLink> link_;
  uint64_t id_;
  int32_t n_samples_;
  Clock::time_point arrival_ = Clock::now();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  int32_t open_samples_;  // samples whose last event is not yet pushed
  size_t capacity_;
  std::atomic<bool> cancel_requested_{false};
  // Engine thread only: per sample, the time of its last token (kEnded once its last
  // event is pushed), for the latency metrics.
  bool first_token_seen_ = false;
  std::vector<Clock::time_point> last_token_;
};

struct AsyncEngineOptions {
  int32_t max_queued_requests = 1024;  // submitted but not yet running, at most
  size_t stream_capacity = 1 << 16;    // events buffered per request, at most
  // While there is work, an info line this often: running, waiting, KV cache use, prompt
  // and generation tok/s over the interval (vLLM's). Zero: never.
  std::chrono::milliseconds stats_log_interval{10000};
  // The stats line's prefix ("engine"; "engine 1" for a data-parallel replica).
  std::string log_name = "engine";
};

// Counters and gauges, copied out under a lock after every step.
struct AsyncEngineStats {
  EngineStats engine;
  int32_t queued = 0;       // requests in the inbox or not yet started by the engine
  int32_t in_flight = 0;    // streams not yet ended
  int64_t finished_by_reason[kFinishReasons] = {};  // indexed by FinishReason
};

// Data-parallel replicas' stats as one server's: counters and gauges summed (the KV
// cache's use is then the used blocks of all over the blocks of all), the recent mean
// draft depth averaged over the replicas that drafted.
AsyncEngineStats combined_stats(std::span<const AsyncEngineStats> replicas);

class AsyncEngine {
 public:
  AsyncEngine(std::unique_ptr<Engine> engine, const AsyncEngineOptions& options = {});
  ~AsyncEngine();  // stop(), and streams still held elsewhere let go of it

  // invalid_argument (the request cannot run), resource_exhausted (queue full), or
  // unavailable-style kInternal when stopping.
  Result<std::shared_ptr<RequestStream>> submit(Request request);
  // Ends the loop: cancels what is in flight (readers get kCancelled) and joins the thread.
  void stop();
  // Why the engine stopped by itself (a step failed on some rank: EngineFailure), or
  // empty while it runs. Requests in flight then were ended as cancelled, new ones are
  // refused; the server stops on it.
  std::string failure() const;

  // Read-only after load: safe from any thread.
  const Engine& engine() const { return *engine_; }
  AsyncEngineStats stats() const;
  ServingMetrics& metrics() { return metrics_; }
  // Requests submitted and not yet ended, now (not as of the last step): what a server
  // with several replicas balances (a burst between two steps would all see the same
  // stats).
  int32_t open_requests() const { return open_requests_.load(std::memory_order_relaxed); }

 private:
  friend class RequestStream;
  void request_cancel(uint64_t id, int32_t sample);
  void loop();
  void dispatch(std::vector<StepOutput>& outs);
  // Gives every sample of `s` (or only `sample`) not yet ended its last event, with `reason`.
  void end_stream(RequestStream& s, FinishReason reason, int32_t sample = -1);
  // Drops streams whose every sample has ended.
  void drop_ended_streams(Clock::time_point now);
  void publish_stats();
  // The stats now (engine thread; takes mu_ for the inbox, so never under it).
  AsyncEngineStats snapshot();
  // The interval's info line, when it has run its length (engine thread).
  void log_stats(Clock::time_point now, bool restart);

  std::unique_ptr<Engine> engine_;
  AsyncEngineOptions options_;
  std::shared_ptr<EngineLink> link_ = std::make_shared<EngineLink>();
  ServingMetrics metrics_;

  mutable std::mutex mu_;  // guards inbox_, cancels_, stopping_, streams_ membership
  std::condition_variable wake_;
  std::deque<std::pair<std::shared_ptr<RequestStream>, std::shared_ptr<const Request>>> inbox_;
  std::vector<std::pair<uint64_t, int32_t>> cancels_;  // (request, sample or -1 for all)
  bool stopping_ = false;
  std::string failure_;  // guarded by mu_
  uint64_t next_id_ = 1;
  std::atomic<int32_t> engine_waiting_{0};
  std::atomic<int32_t> open_requests_{0};  // submitted, not yet dropped from streams_

  // Engine thread only: the streams of requests in the engine, and finished samples by reason.
  std::unordered_map<uint64_t, std::shared_ptr<RequestStream>> streams_;
  int64_t finished_by_reason_[kFinishReasons] = {};

  // Engine thread only: the stats log's interval, its start and counters there.
  Clock::time_point log_start_{};
  int64_t log_prompt_tokens_ = 0, log_generated_tokens_ = 0;

  mutable std::mutex stats_mu_;
  AsyncEngineStats stats_;
  std::thread thread_;
};

}  // namespace kiln::runtime
