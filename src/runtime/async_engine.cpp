#include "runtime/async_engine.h"

#include <algorithm>
#include <cstdio>

#include "core/log.h"

namespace kiln::runtime {

bool RequestStream::next(std::vector<StreamEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return true;
}

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_samples_ == 0 && events_.empty();
}

void RequestStream::cancel(int32_t sample) {
  if (sample < 0 && cancel_requested_.exchange(true)) return;
  std::lock_guard<std::mutex> lock(link_->mu);
  if (link_->engine != nullptr) link_->engine->request_cancel(id_, sample);
}

bool RequestStream::push(StreamEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (e.finish == FinishReason::kNone && events_.size() >= capacity_) return false;
    if (e.finish != FinishReason::kNone) --open_samples_;
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
  return true;
}

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine, const AsyncEngineOptions& options)
    : engine_(std::move(engine)), options_(options) {
  link_->engine = this;
  publish_stats();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() {
  stop();
  std::lock_guard<std::mutex> lock(link_->mu);
  link_->engine = nullptr;
}

Result<std::shared_ptr<RequestStream>> AsyncEngine::submit(Request request) {
  KILN_RETURN_IF_ERROR(engine_->check_request(request));
  if (request.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  std::shared_ptr<RequestStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty()) return internal_error("the engine failed: " + failure_);
    if (stopping_) return internal_error("the server is shutting down");
    const int32_t queued = int32_t(inbox_.size()) + engine_waiting_.load();
    if (queued >= options_.max_queued_requests) {
      return Status(StatusCode::kResourceExhausted,
                    "the server is busy: " + std::to_string(queued) + " requests are already queued (limit " +
                        std::to_string(options_.max_queued_requests) + "); retry later");
    }
    stream.reset(new RequestStream(link_, next_id_++, request.n, options_.stream_capacity));
    inbox_.emplace_back(stream, std::make_shared<const Request>(std::move(request)));
    ++open_requests_;
  }
  wake_.notify_one();
  return stream;
}

void AsyncEngine::request_cancel(uint64_t id, int32_t sample) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.emplace_back(id, sample);
  }
  wake_.notify_one();
}

void AsyncEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

std::string AsyncEngine::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void AsyncEngine::end_stream(RequestStream& s, FinishReason reason, int32_t sample) {
  for (size_t i = 0; i < s.last_token_.size(); ++i) {
    if (s.last_token_[i] == kEnded || (sample >= 0 && size_t(sample) != i)) continue;
    s.last_token_[i] = kEnded;
    s.push({.sample_index = int32_t(i), .finish = reason});  // a sample's last event is never refused
    ++finished_by_reason_[int(reason)];
  }
}

void AsyncEngine::dispatch(std::vector<StepOutput>& outs) {
  const Clock::time_point now = Clock::now();
  std::vector<uint64_t> overflowed;
  // A sample may get several tokens in one step (speculative decoding), consecutive in
  // `outs`: the time since its previous token is shared by them, so the inter-token
  // latency is per token.
  const auto same_sample = [&](size_t a, size_t b) {
    return outs[a].request_id == outs[b].request_id && outs[a].sample_index == outs[b].sample_index;
  };
  double gap = 0.0;
  for (size_t i = 0; i < outs.size(); ++i) {
    StepOutput& o = outs[i];
    auto it = streams_.find(o.request_id);
    if (it == streams_.end()) continue;
    RequestStream& s = *it->second;
    if (!s.first_token_seen_) {
      s.first_token_seen_ = true;
      metrics_.time_to_first_token.observe(std::chrono::duration<double>(now - s.arrival_).count());
    }
    Clock::time_point& last = s.last_token_[size_t(o.sample_index)];
    if (last == kEnded) continue;
    if (i == 0 || !same_sample(i - 1, i)) {  // the first of this sample's tokens in the step
      size_t n = 1;
      while (i + n < outs.size() && same_sample(i, i + n)) ++n;
      gap = last == Clock::time_point{} ? 0.0 : std::chrono::duration<double>(now - last).count() / double(n);
    }
    if (last != Clock::time_point{}) metrics_.inter_token_latency.observe(gap);
    last = now;
    const FinishReason f = o.finish;
    if (!s.push({.sample_index = o.sample_index, .has_token = true, .token = std::move(o.token), .finish = f})) {
      overflowed.push_back(o.request_id);
      continue;
    }
    if (f != FinishReason::kNone) {
      last = kEnded;
      ++finished_by_reason_[int(f)];
    }
  }
  for (uint64_t id : overflowed) {
    auto it = streams_.find(id);
    if (it == streams_.end()) continue;
    KILN_LOG(kWarn, "request " << id << ": its reader fell " << options_.stream_capacity
                               << " events behind; cancelled");
    engine_->cancel(id);
    end_stream(*it->second, FinishReason::kCancelled);
  }
  drop_ended_streams(now);
}

void AsyncEngine::drop_ended_streams(Clock::time_point now) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    const RequestStream& s = *it->second;
    const bool ended = std::all_of(s.last_token_.begin(), s.last_token_.end(),
                                   [](Clock::time_point t) { return t == kEnded; });
    if (ended) {
      metrics_.e2e_latency.observe(std::chrono::duration<double>(now - s.arrival_).count());
      it = streams_.erase(it);
      --open_requests_;
    } else {
      ++it;
    }
  }
}

void AsyncEngine::publish_stats() {
  AsyncEngineStats s = snapshot();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = s;
}

AsyncEngineStats AsyncEngine::snapshot() {
  AsyncEngineStats s;
  s.engine = engine_->stats();
  int32_t inbox = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox = int32_t(inbox_.size());
  }
  s.queued = inbox + s.engine.waiting_requests;
  s.in_flight = inbox + int32_t(streams_.size());
  std::copy(std::begin(finished_by_reason_), std::end(finished_by_reason_), std::begin(s.finished_by_reason));
  return s;
}

void AsyncEngine::log_stats(Clock::time_point now, bool restart) {
  if (options_.stats_log_interval.count() <= 0 || log_level() < LogLevel::kInfo) return;
  const EngineStats e = engine_->stats();
  const double seconds = std::chrono::duration<double>(now - log_start_).count();
  if (!restart && now - log_start_ >= options_.stats_log_interval) {
    int32_t inbox = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      inbox = int32_t(inbox_.size());
    }
    const double kv_pct = e.kv_blocks_total > 0 ? 100.0 * e.kv_blocks_used / e.kv_blocks_total : 0.0;
    char line[256];
    std::snprintf(line, sizeof(line),
                  "%s: running %d seqs, waiting %d seqs, KV cache %.1f%% used, prompt %.1f tok/s, "
                  "generation %.1f tok/s (last %.1f s)",
                  options_.log_name.c_str(), e.running, e.waiting + inbox, kv_pct, double(e.prompt_tokens - log_prompt_tokens_) / seconds,
                  double(e.generated_tokens - log_generated_tokens_) / seconds, seconds);
    KILN_LOG(kInfo, line);
    restart = true;
  }
  if (restart) {
    log_start_ = now;
    log_prompt_tokens_ = e.prompt_tokens;
    log_generated_tokens_ = e.generated_tokens;
  }
}

AsyncEngineStats combined_stats(std::span<const AsyncEngineStats> replicas) {
  AsyncEngineStats out;
  if (replicas.empty()) return out;
  if (replicas.size() == 1) return replicas[0];
  EngineStats& e = out.engine;
  int drafting = 0;
  for (const AsyncEngineStats& r : replicas) {
    e.add(r.engine);
    if (r.engine.spec_depth_steps > 0) e.spec_depth_recent += r.engine.spec_depth_recent, ++drafting;
    out.queued += r.queued;
    out.in_flight += r.in_flight;
    for (int i = 0; i < kFinishReasons; ++i) out.finished_by_reason[i] += r.finished_by_reason[i];
  }
  e.spec_depth_recent = drafting > 0 ? e.spec_depth_recent / drafting : 0.0;
  return out;
}

AsyncEngineStats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void AsyncEngine::loop() {
  while (true) {
    decltype(inbox_) inbox;
    std::vector<std::pair<uint64_t, int32_t>> cancels;
    bool stopping = false;
    // Work after an idle wait starts a new stats interval: idle time is not averaged in.
    const bool was_idle = engine_->idle();
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || !engine_->idle(); });
      if (was_idle) log_stats(Clock::now(), /*restart=*/true);  // takes no lock when restarting
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      stopping = stopping_;
      // Under the lock, so that submit never sees a request neither in the inbox nor
      // counted by the engine (the queue limit would let one more in).
      for (auto& [stream, request] : inbox) {
        const uint64_t id = stream->id();
        stream->last_token_.assign(size_t(request->n), Clock::time_point{});
        const Status s = engine_->add_request(id, request);
        KILN_CHECK(s.ok()) << "request " << id << " passed check_request but not add_request: " << s.to_string();
        streams_[id] = stream;
        if (stream->cancel_requested_) cancels.emplace_back(id, -1);
      }
      engine_waiting_ = engine_->stats().waiting_requests;
    }
    for (auto [id, sample] : cancels) {
      auto it = streams_.find(id);
      if (it == streams_.end()) continue;
      engine_->cancel(id, sample);
      end_stream(*it->second, FinishReason::kCancelled, sample);
    }
    if (!cancels.empty()) drop_ended_streams(Clock::now());
    if (stopping) {
      for (auto& [id, stream] : streams_) {
        engine_->cancel(id);
        end_stream(*stream, FinishReason::kCancelled);
      }
      streams_.clear();
      open_requests_ = 0;
      publish_stats();
      return;
    }
    std::vector<StepOutput> outs;
    try {
      outs = engine_->step();
    } catch (const EngineFailure& e) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        failure_ = e.what();
        stopping_ = true;
      }
      for (auto& [id, stream] : streams_) end_stream(*stream, FinishReason::kCancelled);
      streams_.clear();
      open_requests_ = 0;
      publish_stats();
      return;
    }
    {
      // Readers of the stats wait while the outputs are handed out, so that a client that
      // has its last token reads stats that count the step which made it.
      std::lock_guard<std::mutex> hold(stats_mu_);
      dispatch(outs);
      engine_waiting_ = engine_->stats().waiting_requests;
      stats_ = snapshot();
    }
    log_stats(Clock::now(), /*restart=*/false);
  }
}

}  // namespace kiln::runtime
