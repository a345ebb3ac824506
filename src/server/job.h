// A job: one API request after validation: the engine requests it makes (one per
// prompt; chat has one), how each sample's text is made, and the API's writer that
// turns deltas into SSE events or the final JSON body. JobRun drives it on the HTTP
// worker thread that received the request.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/async_engine.h"
#include "server/api_error.h"
#include "server/text_stream.h"

namespace kiln::server {

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // The response's id ("chatcmpl-...", "cmpl-...", "msg_..."), also in the request's log line.
  virtual const std::string& id() const = 0;
  // Streaming: SSE text before any delta (Anthropic's message_start).
  virtual std::string start() { return {}; }
  // What sample `choice` added. Streaming: the SSE events for it; else collects it and
  // returns nothing.
  virtual std::string delta(int32_t choice, const SampleDelta& d, const SampleText& sample) = 0;
  // After every sample ended. Streaming: the closing SSE events; else the JSON body.
  virtual std::string finish(const Usage& usage, const std::vector<SampleText>& samples) = 0;
};

struct Job {
  std::vector<runtime::Request> requests;  // one per prompt, each with n samples
  SampleOptions sample;
  bool stream = false;
  std::unique_ptr<ResponseWriter> writer;
};

class JobRun {
 public:
  // Submits every request (429 when the queue is full, 503 while stopping).
  static ApiResult<std::unique_ptr<JobRun>> start(runtime::AsyncEngine& engine, Job job,
                                                  const tokenizer::Tokenizer& tok);
  ~JobRun();  // cancels what is still running

  // Waits up to `timeout` for tokens and returns the SSE text they make (streaming),
  // or "" (not streaming, or nothing arrived).
  std::string pump(std::chrono::milliseconds timeout);
  bool done() const;
  // After done(): the closing SSE events, or the JSON body.
  std::string finish();
  void cancel();
  bool streaming() const { return job_.stream; }
  std::string start_text() { return job_.writer->start(); }

 private:
  JobRun(Job job) : job_(std::move(job)) {}
  void take(size_t stream, const runtime::StreamEvent& e, std::string& out);
  // The request's info line, once: id, tokens, TTFT, output tok/s, finish reasons.
  void log_finished(const Usage& usage, bool cancelled);

  Job job_;
  std::vector<std::shared_ptr<runtime::RequestStream>> streams_;
  std::vector<SampleText> samples_;  // choice = prompt index * n + sample index
  int32_t n_ = 1;
  int64_t prompt_tokens_ = 0;
  size_t n_ended_ = 0;
  runtime::Clock::time_point started_ = runtime::Clock::now();
  runtime::Clock::time_point first_token_{}, last_token_{};  // as this thread saw them arrive
  bool logged_ = false;
};

}  // namespace kiln::server
