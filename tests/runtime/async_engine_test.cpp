// AsyncEngine: the engine on its own thread, fed by client threads. Every wait here is
// bounded (a stuck engine fails the test instead of hanging it). Requests that must stay
// in flight for a while run on deepseek_v3_mla, the slowest fixture, with many tokens
// to go; they are cancelled once the test has what it needs.
#include <atomic>
#include <chrono>
#include <thread>

#include "engine_test_util.h"
#include "runtime/async_engine.h"

namespace kiln::runtime {
namespace {

using namespace std::chrono_literals;
using test::Outputs;
using test::SampleOut;

constexpr auto kWait = 10s;  // the most any test waits for one thing

// What a stream delivered, per sample.
struct Drained {
  std::map<int32_t, SampleOut> samples;
  int32_t events_after_end = 0;  // events of a sample after its finish (must stay 0)
  bool complete = false;         // every sample ended and every event was read
};

void take(Drained& d, std::vector<StreamEvent>& events) {
  for (StreamEvent& e : events) {
    SampleOut& s = d.samples[e.sample_index];
    if (s.n_finish > 0) ++d.events_after_end;
    if (e.has_token) {
      s.tokens.push_back(e.token.token);
      s.logprobs.push_back(e.token.logprob);
    }
    if (e.finish != FinishReason::kNone) {
      s.finish = e.finish;
      ++s.n_finish;
    }
  }
  events.clear();
}

// Reads the stream until it is done, or until `budget` has passed.
Drained drain(RequestStream& s, std::chrono::milliseconds budget = kWait) {
  Drained d;
  const auto deadline = Clock::now() + budget;
  std::vector<StreamEvent> events;
  while (!s.done() && Clock::now() < deadline) {
    s.next(events, 20ms);
    take(d, events);
  }
  d.complete = s.done();
  return d;
}

// Reads until sample `sample` has at least n tokens (or ended, or the budget passed).
void read_tokens(RequestStream& s, Drained& d, int32_t sample, size_t n) {
  const auto deadline = Clock::now() + kWait;
  std::vector<StreamEvent> events;
  while (d.samples[sample].tokens.size() < n && d.samples[sample].n_finish == 0 && Clock::now() < deadline) {
    s.next(events, 20ms);
    take(d, events);
  }
}

// Polls pred until it holds or the budget passes; whether it held.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds budget = std::chrono::milliseconds(kWait)) {
  const auto deadline = Clock::now() + budget;
  while (!pred()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

std::unique_ptr<AsyncEngine> start(const std::string& fixture, const EngineOptions& eo,
                                   const AsyncEngineOptions& ao = {}) {
  auto e = test::load_fixture(fixture, eo);
  if (!e) return nullptr;
  return std::make_unique<AsyncEngine>(std::move(e), ao);
}

// A request that runs for many steps unless cancelled.
Request long_request(uint32_t seed, int32_t n = 1) {
  return {.prompt = test::random_tokens(8, seed), .sampling = {.temperature = 1.0f, .seed = seed},
          .max_tokens = 240, .ignore_eos = true, .n = n};
}
const EngineOptions kLongOptions{.block_size = 16, .max_model_len = 256, .max_num_seqs = 4};

TEST(AsyncEngine, ConcurrentClientsGetTheSynchronousEnginesTokens) {
  const EngineOptions options{.block_size = 4, .max_model_len = 64};
  constexpr int32_t kThreads = 4, kPerThread = 6;
  std::vector<Request> requests;
  for (int32_t i = 0; i < kThreads * kPerThread; ++i) {
    SamplingParams p{.seed = 50 + uint64_t(i), .logprobs = 1};
    if (i % 3 != 0) p.temperature = 0.8f, p.top_k = 30;
    if (i % 4 == 1) p.presence_penalty = 0.5f;
    requests.push_back({.prompt = test::random_tokens(2 + (i * 5) % 30, 700 + uint32_t(i)), .sampling = p,
                        .max_tokens = 3 + i % 6, .n = 1 + i % 2});
  }
  auto sync = test::load_fixture("llama", options);
  ASSERT_TRUE(sync);
  std::vector<std::map<int32_t, SampleOut>> want(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    for (int32_t k = 0; k < requests[i].n; ++k) {
      Request one = requests[i];
      one.n = 1;
      one.sampling.seed += uint64_t(k);
      want[i][k] = test::run_alone(*sync, one);
    }
  }

  auto engine = start("llama", options);
  ASSERT_TRUE(engine);
  std::vector<Drained> got(requests.size());
  std::vector<StatusCode> submitted(requests.size(), StatusCode::kInternal);
  std::vector<std::thread> clients;
  for (int32_t t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      std::vector<std::pair<size_t, std::shared_ptr<RequestStream>>> mine;
      for (int32_t j = 0; j < kPerThread; ++j) {
        const size_t i = size_t(t * kPerThread + j);
        auto s = engine->submit(requests[i]);
        submitted[i] = s.status().code();
        if (s.ok()) mine.emplace_back(i, *s);
      }
      for (auto& [i, s] : mine) got[i] = drain(*s);
    });
  }
  for (std::thread& c : clients) c.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(submitted[i], StatusCode::kOk) << "request " << i;
    EXPECT_TRUE(got[i].complete) << "request " << i;
    EXPECT_EQ(got[i].events_after_end, 0) << "request " << i;
    EXPECT_EQ(got[i].samples, want[i]) << "request " << i;
  }
  ASSERT_TRUE(eventually([&] { return engine->stats().in_flight == 0; }));
  const AsyncEngineStats st = engine->stats();
  EXPECT_EQ(st.engine.kv_blocks_used, 0);
  EXPECT_EQ(st.finished_by_reason[int(FinishReason::kLength)], 36) << "24 requests, 36 samples";
  EXPECT_EQ(engine->metrics().time_to_first_token.snapshot().count, 24);
  EXPECT_EQ(engine->metrics().e2e_latency.snapshot().count, 24);
}

// Speculative decoding (n-gram drafts): several tokens of a sample per step, each its own
// event, in order, nothing after the finish; greedy tokens and logprobs as without drafts.
TEST(AsyncEngine, SpeculativeStepsStreamEveryAcceptedTokenInOrder) {
  std::vector<Request> requests;
  for (int32_t i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt;
    const std::vector<int32_t> phrase = test::random_tokens(3 + i % 4, 800 + uint32_t(i));
    for (int r = 0; r < 4; ++r) prompt.insert(prompt.end(), phrase.begin(), phrase.end());
    requests.push_back({.prompt = prompt, .sampling = {.logprobs = 1}, .max_tokens = 12 + i % 5, .n = 1 + i % 2});
  }
  const EngineOptions options{.block_size = 4, .max_model_len = 64};
  auto sync = test::load_fixture("llama", options);
  ASSERT_TRUE(sync);
  std::vector<std::map<int32_t, SampleOut>> want(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    Request one = requests[i];
    one.n = 1;
    const SampleOut alone = test::run_alone(*sync, one);
    for (int32_t k = 0; k < requests[i].n; ++k) want[i][k] = alone;  // greedy: every sample alike
  }
  EngineOptions spec = options;
  spec.speculative_method = SpeculativeMethod::kNgram;
  spec.num_speculative_tokens = 3;
  spec.speculative_adaptive = false;  // every step at depth 3 where drafts exist
  auto engine = start("llama", spec);
  ASSERT_TRUE(engine);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const Request& r : requests) {
    auto s = engine->submit(r);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const Drained d = drain(*streams[i]);
    EXPECT_TRUE(d.complete) << "request " << i;
    EXPECT_EQ(d.events_after_end, 0) << "request " << i;
    EXPECT_EQ(d.samples, want[i]) << "request " << i;
  }
  ASSERT_TRUE(eventually([&] { return engine->stats().in_flight == 0; }));
  const AsyncEngineStats st = engine->stats();
  EXPECT_GT(st.engine.spec_accepted_tokens, 0);
  EXPECT_EQ(st.engine.kv_blocks_used, 0);
  // One inter-token latency per token after each sample's first (tokens that arrive together
  // share the time since the previous one, AsyncEngine::dispatch).
  const Histogram::Snapshot itl = engine->metrics().inter_token_latency.snapshot();
  int64_t tokens_after_first = 0;
  for (size_t i = 0; i < requests.size(); ++i)
    tokens_after_first += int64_t(requests[i].n) * (requests[i].max_tokens - 1);
  EXPECT_EQ(itl.count, tokens_after_first);
  EXPECT_GT(itl.sum, 0.0);
}

TEST(AsyncEngine, CancelEndsTheStreamAndFreesItsBlocks) {
  auto engine = start("deepseek_v3_mla", kLongOptions);
  ASSERT_TRUE(engine);
  auto s = engine->submit(long_request(1));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  Drained d;
  read_tokens(**s, d, 0, 1);
  ASSERT_GE(d.samples[0].tokens.size(), 1u) << "no first token in time";
  // Stats are published after the step's tokens are pushed: they may lag a little.
  EXPECT_TRUE(eventually([&] { return engine->stats().engine.kv_blocks_used > 0; }));
  (*s)->cancel();
  (*s)->cancel();  // twice: harmless
  Drained rest = drain(**s);
  ASSERT_TRUE(rest.complete);
  EXPECT_EQ(rest.samples[0].finish, FinishReason::kCancelled);
  EXPECT_EQ(rest.samples[0].n_finish, 1);
  EXPECT_LT(d.samples[0].tokens.size() + rest.samples[0].tokens.size(), 240u);
  EXPECT_TRUE(eventually([&] { return engine->stats().engine.kv_blocks_used == 0; }))
      << engine->stats().engine.kv_blocks_used << " blocks still used";
  // The engine stopped the request at the cancel: it generated only what was delivered.
  EXPECT_EQ(engine->stats().engine.generated_tokens,
            int64_t(d.samples[0].tokens.size() + rest.samples[0].tokens.size()));
  EXPECT_TRUE(eventually([&] { return engine->stats().in_flight == 0; }));
  EXPECT_EQ(engine->stats().finished_by_reason[int(FinishReason::kCancelled)], 1);
}

TEST(AsyncEngine, CancellingOneSampleLeavesTheOthersRunning) {
  auto engine = start("deepseek_v3_mla", kLongOptions);
  ASSERT_TRUE(engine);
  auto s = engine->submit(long_request(2, /*n=*/2));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->n_samples(), 2);
  Drained d;
  read_tokens(**s, d, 1, 1);
  ASSERT_GE(d.samples[1].tokens.size(), 1u);
  (*s)->cancel(1);
  const auto deadline = Clock::now() + kWait;
  std::vector<StreamEvent> events;
  while (d.samples[1].n_finish == 0 && Clock::now() < deadline) {
    (*s)->next(events, 20ms);
    take(d, events);
  }
  ASSERT_EQ(d.samples[1].finish, FinishReason::kCancelled);
  const size_t sample0 = d.samples[0].tokens.size();
  read_tokens(**s, d, 0, sample0 + 3);
  EXPECT_GE(d.samples[0].tokens.size(), sample0 + 3) << "sample 0 goes on";
  EXPECT_EQ(d.samples[0].n_finish, 0);
  (*s)->cancel();
  Drained rest = drain(**s);
  ASSERT_TRUE(rest.complete);
  EXPECT_EQ(rest.samples[0].finish, FinishReason::kCancelled);
  EXPECT_EQ(rest.samples.count(1), 0u) << "nothing more for the cancelled sample";
  EXPECT_TRUE(eventually([&] { return engine->stats().engine.kv_blocks_used == 0; }));
  // Each sample stopped in the engine at its cancel: it generated only what was delivered.
  EXPECT_EQ(engine->stats().engine.generated_tokens,
            int64_t(d.samples[0].tokens.size() + d.samples[1].tokens.size() + rest.samples[0].tokens.size()));
}

TEST(AsyncEngine, AFullQueueRejectsWithResourceExhausted) {
  {
    auto engine = start("llama", {.block_size = 4, .max_model_len = 64}, {.max_queued_requests = 0});
    ASSERT_TRUE(engine);
    auto s = engine->submit({.prompt = {1, 2, 3}, .max_tokens = 2});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << s.status().to_string();
  }
  // One running sequence at most: a long request holds the seat, the next two queue.
  auto engine = start("deepseek_v3_mla", {.block_size = 16, .max_model_len = 256, .max_num_seqs = 1},
                      {.max_queued_requests = 2});
  ASSERT_TRUE(engine);
  auto a = engine->submit(long_request(3));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(eventually([&] { return engine->stats().engine.running == 1; }));
  auto b = engine->submit({.prompt = {1, 2}, .max_tokens = 2});
  auto c = engine->submit({.prompt = {3, 4}, .max_tokens = 2});
  ASSERT_TRUE(b.ok() && c.ok());
  // Both in the scheduler's queue (the count submit sees), not in the inbox any more.
  ASSERT_TRUE(eventually([&] { return engine->stats().engine.waiting == 2; }));
  EXPECT_EQ(engine->stats().queued, 2);
  auto d = engine->submit({.prompt = {5, 6}, .max_tokens = 2});
  ASSERT_FALSE(d.ok()) << "two queued, limit two";
  EXPECT_EQ(d.status().code(), StatusCode::kResourceExhausted);
  // Once the long request is gone, the queue drains and takes requests again.
  (*a)->cancel();
  EXPECT_TRUE(drain(**b).complete);
  EXPECT_TRUE(drain(**c).complete);
  auto e = engine->submit({.prompt = {5, 6}, .max_tokens = 2});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const Drained de = drain(**e);
  EXPECT_EQ(de.samples.at(0).finish, FinishReason::kLength);
}

// max_queued_requests counts requests not yet started, whatever their n: one queued
// request with n = 3 leaves room for a second under a limit of 2.
TEST(AsyncEngine, QueueLimitCountsRequestsNotSamples) {
  auto engine = start("deepseek_v3_mla", {.block_size = 16, .max_model_len = 256, .max_num_seqs = 1},
                      {.max_queued_requests = 2});
  ASSERT_TRUE(engine);
  auto a = engine->submit(long_request(4));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(eventually([&] { return engine->stats().engine.running == 1; }));
  auto b = engine->submit({.prompt = {1, 2}, .max_tokens = 2, .n = 3});
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(eventually([&] { return engine->stats().engine.waiting == 3; }));
  auto c = engine->submit({.prompt = {3, 4}, .max_tokens = 2});
  EXPECT_TRUE(c.ok()) << "one request is queued, the limit is two: " << c.status().to_string();
  (*a)->cancel();
  EXPECT_TRUE(drain(**b).complete);
  if (c.ok()) {
    EXPECT_TRUE(drain(**c).complete);
  }
}

TEST(AsyncEngine, StopEndsOpenStreamsWithCancelled) {
  auto engine = start("deepseek_v3_mla", kLongOptions);
  ASSERT_TRUE(engine);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (uint32_t i = 0; i < 3; ++i) {
    auto s = engine->submit(long_request(10 + i, i == 2 ? 2 : 1));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
  }
  Drained first;
  read_tokens(*streams[0], first, 0, 1);
  ASSERT_GE(first.samples[0].tokens.size(), 1u) << "no first token in time";
  engine->stop();
  size_t delivered = first.samples[0].tokens.size();
  for (size_t i = 0; i < streams.size(); ++i) {
    const Drained d = drain(*streams[i], 1s);  // stop has pushed every last event already
    for (const auto& [k, s] : d.samples) delivered += s.tokens.size();
    ASSERT_TRUE(d.complete) << "stream " << i;
    ASSERT_EQ(d.samples.size(), size_t(streams[i]->n_samples())) << "stream " << i;
    for (const auto& [k, s] : d.samples) {
      EXPECT_EQ(s.finish, FinishReason::kCancelled) << "stream " << i << " sample " << k;
      EXPECT_EQ(s.n_finish, 1);
    }
  }
  auto late = engine->submit({.prompt = {1}, .max_tokens = 1});
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kInternal) << late.status().to_string();
  EXPECT_EQ(engine->engine().stats().kv_blocks_used, 0);
  EXPECT_EQ(engine->engine().stats().generated_tokens, int64_t(delivered)) << "nothing ran after stop";
  EXPECT_TRUE(engine->engine().idle());
  EXPECT_EQ(engine->stats().in_flight, 0);
  EXPECT_EQ(engine->stats().finished_by_reason[int(FinishReason::kCancelled)], 4);
  engine->stop();  // again: nothing to do
}

TEST(AsyncEngine, ASlowReaderIsCancelledInsteadOfStallingTheBatch) {
  auto engine = start("llama", {.block_size = 4, .max_model_len = 64}, {.stream_capacity = 2});
  ASSERT_TRUE(engine);
  auto s = engine->submit({.prompt = {4, 5, 6}, .max_tokens = 40, .ignore_eos = true});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(eventually([&] { return engine->stats().finished_by_reason[int(FinishReason::kCancelled)] == 1; }));
  const Drained d = drain(**s);
  ASSERT_TRUE(d.complete);
  EXPECT_EQ(d.samples.at(0).tokens.size(), 2u) << "what the buffer held";
  EXPECT_EQ(d.samples.at(0).finish, FinishReason::kCancelled);
  EXPECT_TRUE(eventually([&] { return engine->stats().engine.kv_blocks_used == 0; }));
}

TEST(AsyncEngine, InvalidRequestsAreRejectedAtSubmit) {
  auto engine = start("llama", {.block_size = 4, .max_model_len = 32});
  ASSERT_TRUE(engine);
  const std::vector<Request> bad = {
      {.prompt = {}},
      {.prompt = {1, 320}},
      {.prompt = std::vector<int32_t>(30, 1), .max_tokens = 3},
      {.prompt = {1}, .max_tokens = 0},
      {.prompt = {1}, .n = 0},
      {.prompt = {1}, .sampling = {.temperature = -0.5f}},
      {.prompt = {1}, .sampling = {.min_p = 2.0f}},
      {.prompt = {1}, .sampling = {.logprobs = 1000}},
      {.prompt = {1}, .stop_token_ids = {-3}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    auto s = engine->submit(bad[i]);
    ASSERT_FALSE(s.ok()) << "case " << i;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << "case " << i << ": " << s.status().to_string();
  }
  EXPECT_EQ(engine->stats().queued, 0);
  EXPECT_EQ(engine->stats().in_flight, 0);
  auto ok = engine->submit({.prompt = {1, 2}, .max_tokens = 2});
  ASSERT_TRUE(ok.ok()) << "the engine still serves";
  EXPECT_EQ(drain(**ok).samples.at(0).tokens.size(), 2u);
}

}  // namespace
}  // namespace kiln::runtime
