#include "server/job.h"

#include <cstdio>

#include "core/log.h"

namespace kiln::server {

ApiResult<std::unique_ptr<JobRun>> JobRun::start(runtime::AsyncEngine& engine, Job job,
                                                 const tokenizer::Tokenizer& tok) {
  std::unique_ptr<JobRun> run(new JobRun(std::move(job)));
  run->n_ = run->job_.requests.empty() ? 1 : run->job_.requests.front().n;
  for (const runtime::Request& r : run->job_.requests) {
    run->prompt_tokens_ += int64_t(r.prompt.size());
    for (int32_t i = 0; i < r.n; ++i) run->samples_.emplace_back(tok, run->job_.sample);
  }
  for (runtime::Request& r : run->job_.requests) {
    auto stream = engine.submit(std::move(r));
    if (!stream.ok()) {
      run->cancel();
      const Status& s = stream.status();
      if (s.code() == StatusCode::kInternal) return ApiError{.status = 503, .message = s.message()};
      return api_error_from(s);
    }
    run->streams_.push_back(std::move(stream).value());
  }
  return run;
}

JobRun::~JobRun() {
  if (!done()) cancel();
  if (!logged_ && !streams_.empty()) {
    Usage usage{.prompt_tokens = prompt_tokens_};
    for (const SampleText& s : samples_) usage.completion_tokens += s.n_tokens();
    log_finished(usage, /*cancelled=*/true);
  }
}

void JobRun::cancel() {
  for (auto& s : streams_) s->cancel();
}

bool JobRun::done() const { return n_ended_ == samples_.size(); }

void JobRun::take(size_t stream, const runtime::StreamEvent& e, std::string& out) {
  const size_t choice = stream * size_t(n_) + size_t(e.sample_index);
  SampleText& sample = samples_[choice];
  if (sample.ended()) return;
  if (e.has_token) {
    last_token_ = runtime::Clock::now();
    if (first_token_ == runtime::Clock::time_point{}) first_token_ = last_token_;
  }
  SampleDelta d;
  sample.on_event(e, d);
  if (sample.ended()) {
    ++n_ended_;
    // A stop string ended it here; the engine may still be generating it.
    if (e.finish == runtime::FinishReason::kNone) streams_[stream]->cancel(e.sample_index);
  }
  out += job_.writer->delta(int32_t(choice), d, sample);
}

std::string JobRun::pump(std::chrono::milliseconds timeout) {
  std::string out;
  std::vector<runtime::StreamEvent> events;
  bool any = false;
  for (size_t i = 0; i < streams_.size(); ++i) {
    events.clear();
    if (!streams_[i]->next(events, std::chrono::milliseconds(0))) continue;
    any = true;
    for (const runtime::StreamEvent& e : events) take(i, e, out);
  }
  if (any || done()) return out;
  // Nothing was ready: wait on the first stream still running.
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i]->done()) continue;
    if (streams_[i]->next(events, timeout))
      for (const runtime::StreamEvent& e : events) take(i, e, out);
    break;
  }
  return out;
}

std::string JobRun::finish() {
  Usage usage{.prompt_tokens = prompt_tokens_};
  for (const SampleText& s : samples_) usage.completion_tokens += s.n_tokens();
  log_finished(usage, /*cancelled=*/false);
  return job_.writer->finish(usage, samples_);
}

// "request chatcmpl-1f...: prompt 12 tokens, output 64 tokens, TTFT 35.2 ms, 48.1 tok/s,
// finish length". Output tok/s: the tokens after the first over the time since the first
// (every sample's; "-" with fewer than two tokens). Finish: each sample's end, distinct.
void JobRun::log_finished(const Usage& usage, bool cancelled) {
  logged_ = true;
  if (log_level() < LogLevel::kInfo) return;
  const auto ms = [](runtime::Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  char ttft[32] = "-", speed[32] = "-";
  if (first_token_ != runtime::Clock::time_point{}) std::snprintf(ttft, sizeof(ttft), "%.1f ms", ms(first_token_ - started_));
  if (usage.completion_tokens > 1 && last_token_ > first_token_)
    std::snprintf(speed, sizeof(speed), "%.1f", double(usage.completion_tokens - 1) * 1000.0 / ms(last_token_ - first_token_));
  std::string reasons;
  for (const SampleText& s : samples_) {
    const std::string r = s.ended() ? end_reason_name(s.end_reason()) : "cancelled";
    if (reasons.find(r) == std::string::npos) reasons += (reasons.empty() ? "" : ",") + r;
  }
  if (cancelled && reasons.find("cancelled") == std::string::npos) reasons += (reasons.empty() ? "" : ",") + std::string("cancelled");
  KILN_LOG(kInfo, "request " << job_.writer->id() << ": prompt " << usage.prompt_tokens << " tokens, output "
                             << usage.completion_tokens << " tokens, TTFT " << ttft << ", " << speed
                             << " tok/s, finish " << reasons);
}

}  // namespace kiln::server
