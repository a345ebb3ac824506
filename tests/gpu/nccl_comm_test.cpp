// The NCCL communicator (comm/nccl) against the obvious host computation, on groups of
// GPUs of this machine, one CUDA backend per GPU whose stream the communicator uses
// (cuda::stream_of), one thread per rank. Every collective of the Communicator
// interface, recorded into a CUDA graph and replayed, split into sub-groups, and
// aborted. A group of all visible GPUs always runs (one GPU still takes every NCCL call
// path); groups of 2 and 4 run when that many GPUs are visible and skip, saying so,
// otherwise. Values are small integers, so bf16 sums are exact whatever order NCCL adds
// in and results compare exactly.
#include <gtest/gtest.h>

#ifdef KILN_HAVE_NCCL

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <string>
#include <functional>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "backends/cuda/cuda_backend.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl/peer_all_reduce.h"

namespace kiln {
namespace {

using comm::CommAborted;
using comm::NcclCommunicator;
using comm::NcclRank;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Element i of rank r's input: a small integer.
float value(int r, int64_t i) { return float(int((i * 7 + r * 13) % 17) - 8); }

struct Group {
  std::vector<std::unique_ptr<ops::Backend>> backends;  // one per rank (GPU r)
  std::vector<std::unique_ptr<NcclCommunicator>> comms;
  int size() const { return int(comms.size()); }
};

// n ranks on GPUs 0..n-1, each with its own CUDA backend.
void make_group(int n, Group* g) {
  std::vector<NcclRank> ranks;
  for (int r = 0; r < n; ++r) {
    auto b = cuda::make_cuda_backend({.device = r});
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    g->backends.push_back(std::move(b).value());
    ranks.push_back({.device = cuda::device_of(*g->backends.back()), .stream = cuda::stream_of(*g->backends.back())});
  }
  auto comms = NcclCommunicator::create_group(ranks);
  ASSERT_TRUE(comms.ok()) << comms.status().to_string();
  g->comms = std::move(comms).value();
}

// fn(rank) on one thread per rank, its GPU current; exceptions come back to the caller.
void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        cudaSetDevice(r);
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

// A device tensor of rank r's backend holding `v` (f32, bf16 or i32 values).
Tensor device_tensor(ops::Backend& b, DType dtype, const std::vector<float>& v) {
  Tensor t = b.alloc(dtype, {int64_t(v.size())});
  std::vector<uint8_t> host(t.nbytes());
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) std::memcpy(&host[i * 4], &v[i], 4);
    else if (dtype == DType::kI32) { const int32_t x = int32_t(v[i]); std::memcpy(&host[i * 4], &x, 4); }
    else { const uint16_t x = f32_to_bf16(v[i]); std::memcpy(&host[i * 2], &x, 2); }
  }
  b.synchronize();
  KILN_CHECK(cudaMemcpy(t.data, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  // A copy from pageable memory may return before its DMA lands, and the backend's stream
  // does not wait for the legacy stream: without this, a collective could read the end
  // of the buffer before it is written (seen on the one-shot path's largest message).
  KILN_CHECK(cudaDeviceSynchronize() == cudaSuccess);
  return t;
}

std::vector<float> host_values(ops::Backend& b, const Tensor& t) {
  b.synchronize();  // the collectives ran on the backend's stream
  std::vector<uint8_t> host(t.nbytes());
  KILN_CHECK(cudaMemcpy(host.data(), t.data, host.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  std::vector<float> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == DType::kF32) std::memcpy(&v[i], &host[i * 4], 4);
    else if (t.dtype == DType::kI32) { int32_t x; std::memcpy(&x, &host[i * 4], 4); v[i] = float(x); }
    else { uint16_t x; std::memcpy(&x, &host[i * 2], 2); v[i] = bf16_to_f32(x); }
  }
  return v;
}

// Element-wise equality, reporting the first mismatches (never returning early: a rank
// that stopped would leave the others waiting in their next collective).
void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    if (got[i] != want[i] && bad++ < 3) ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

std::vector<float> rank_input(int r, int64_t n, int64_t offset = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(r, i + offset);
  return v;
}

// Every collective of a group of n ranks against the host computation.
void check_collectives(int n) {
  Group g;
  make_group(n, &g);
  if (::testing::Test::HasFatalFailure()) return;
  const int64_t m = 4099;  // elements per rank (odd: no alignment luck)
  on_ranks(n, [&](int r) {
    ops::Backend& b = *g.backends[size_t(r)];
    NcclCommunicator& c = *g.comms[size_t(r)];
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), n);
    EXPECT_EQ(c.name(), "nccl");
    // all_reduce, bf16 and f32 (and a large f32 message: other NCCL algorithms).
    for (auto [dtype, count] : {std::pair{DType::kBF16, m}, {DType::kF32, m}, {DType::kF32, int64_t(1) << 22}}) {
      Tensor t = device_tensor(b, dtype, rank_input(r, count));
      c.all_reduce(t);
      std::vector<float> want(static_cast<size_t>(count), 0.0f);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < count; ++i) want[size_t(i)] += value(q, i);
      expect_same(host_values(b, t), want, "all_reduce " + std::string(dtype_name(dtype)) + " rank " + std::to_string(r));
    }
    {  // all_gather: out[q m + i] = rank q's in[i]
      Tensor in = device_tensor(b, DType::kBF16, rank_input(r, m));
      Tensor out = device_tensor(b, DType::kBF16, std::vector<float>(size_t(n * m), -1.0f));
      c.all_gather(in, out);
      std::vector<float> want;
      for (int q = 0; q < n; ++q)
        for (float v : rank_input(q, m)) want.push_back(v);
      expect_same(host_values(b, out), want, "all_gather rank " + std::to_string(r));
    }
    {  // reduce_scatter: out[i] = sum over q of rank q's in[r m + i]
      Tensor in = device_tensor(b, DType::kF32, rank_input(r, n * m));
      Tensor out = device_tensor(b, DType::kF32, std::vector<float>(size_t(m), -1.0f));
      c.reduce_scatter(in, out);
      std::vector<float> want(static_cast<size_t>(m), 0.0f);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < m; ++i) want[size_t(i)] += value(q, r * m + i);
      expect_same(host_values(b, out), want, "reduce_scatter rank " + std::to_string(r));
    }
    {  // all_to_all: out[q m + i] = rank q's in[r m + i]
      Tensor in = device_tensor(b, DType::kI32, rank_input(r, n * m));
      Tensor out = device_tensor(b, DType::kI32, std::vector<float>(size_t(n * m), -100.0f));
      c.all_to_all(in, out);
      std::vector<float> want;
      for (int q = 0; q < n; ++q)
        for (float v : rank_input(q, m, r * m)) want.push_back(v);
      expect_same(host_values(b, out), want, "all_to_all rank " + std::to_string(r));
    }
    {  // broadcast from the last rank
      Tensor t = device_tensor(b, DType::kBF16, rank_input(r, m));
      c.broadcast(t, n - 1);
      expect_same(host_values(b, t), rank_input(n - 1, m), "broadcast rank " + std::to_string(r));
    }
    if (n >= 2) {  // a ring of send / recv: even ranks send first, odd ranks receive first
      Tensor mine = device_tensor(b, DType::kF32, rank_input(r, m));
      Tensor got = device_tensor(b, DType::kF32, std::vector<float>(size_t(m), -1.0f));
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      if (r % 2 == 0) c.send(mine, next), c.recv(got, prev);
      else c.recv(got, prev), c.send(mine, next);
      expect_same(host_values(b, got), rank_input(prev, m), "recv at rank " + std::to_string(r));
    }
  });
}

int visible_gpus() { return cuda::device_count(); }

TEST(NcclComm, EveryCollectiveMatchesTheHostOnAllVisibleGpus) {
  const int n = visible_gpus();
  if (n == 0) GTEST_SKIP() << "no GPU visible";
  std::printf("nccl: a group of all %d visible GPU%s%s\n", n, n == 1 ? "" : "s",
              n == 1 ? " (send / recv need 2 ranks: not run)" : "");
  check_collectives(n);
}

TEST(NcclComm, EveryCollectiveMatchesTheHostOnTwoGpus) {
  if (visible_gpus() < 2) GTEST_SKIP() << "a group of 2 needs 2 GPUs; " << visible_gpus() << " visible: not run";
  check_collectives(2);
}

TEST(NcclComm, EveryCollectiveMatchesTheHostOnFourGpus) {
  if (visible_gpus() < 4) GTEST_SKIP() << "a group of 4 needs 4 GPUs; " << visible_gpus() << " visible: not run";
  check_collectives(4);
}

// Sums started beside other work (start_all_reduce / finish_all_reduce: the micro-batches
// of model::CausalLM) on 2 GPUs: a decode-sized and a prompt-sized bf16 sum and an f32
// one, started one after the other while the compute stream keeps adding other tensors;
// an add queued after a finish reads the finished sum; every result is the host's sum.
// Run with and without NCCL_P2P_DISABLE=1 (the one-shot path, NCCL over NVLink / PCIe,
// NCCL through host memory).
TEST(NcclComm, StartedSumsFinishLikePlainSums) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
  Group g;
  make_group(2, &g);
  if (::testing::Test::HasFatalFailure()) return;
  on_ranks(2, [&](int r) {
    ops::Backend& b = *g.backends[size_t(r)];
    NcclCommunicator& c = *g.comms[size_t(r)];
    const std::pair<DType, int64_t> sizes[] = {{DType::kBF16, 4096}, {DType::kBF16, int64_t(1) << 21},
                                               {DType::kF32, (int64_t(1) << 20) + 3}};
    for (int round = 0; round < 3; ++round) {
      std::vector<Tensor> t, after;
      std::vector<int> tickets;
      Tensor busy = device_tensor(b, DType::kBF16, rank_input(r, int64_t(1) << 22));
      for (auto [dtype, count] : sizes) {
        t.push_back(device_tensor(b, dtype, rank_input(r, count, round)));
        tickets.push_back(c.start_all_reduce(t.back()));
        for (int k = 0; k < 4; ++k) b.add({.a = busy, .b = busy, .out = busy});  // work beside the sum
      }
      for (size_t k = 0; k < t.size(); ++k) {
        c.finish_all_reduce(tickets[k]);
        if (t[k].dtype == DType::kBF16) {  // an op after the finish reads the sum
          after.push_back(b.alloc(DType::kBF16, t[k].shape));
          b.add({.a = t[k], .b = t[k], .out = after.back()});
        }
      }
      for (size_t k = 0; k < t.size(); ++k) {
        const int64_t count = t[k].numel();
        std::vector<float> want(static_cast<size_t>(count), 0.0f);
        for (int q = 0; q < 2; ++q)
          for (int64_t i = 0; i < count; ++i) want[size_t(i)] += value(q, i + round);
        std::vector<float> twice = want;
        for (float& x : twice) x *= 2;
        const std::string what = "started sum " + std::to_string(k) + " round " + std::to_string(round) + " rank " +
                                 std::to_string(r);
        expect_same(host_values(b, t[k]), want, what);
        if (k < after.size()) expect_same(host_values(b, after[k]), twice, what + ", read after its finish");
      }
    }
    // A plain sum after the started ones.
    Tensor plain = device_tensor(b, DType::kBF16, rank_input(r, 4099));
    c.all_reduce(plain);
    std::vector<float> want(4099, 0.0f);
    for (int q = 0; q < 2; ++q)
      for (int64_t i = 0; i < 4099; ++i) want[size_t(i)] += value(q, i);
    expect_same(host_values(b, plain), want, "a plain sum after started ones, rank " + std::to_string(r));
  });
}

// The collectives enqueue on the stream only: recorded once into a CUDA graph per rank,
// each replay recomputes from the inputs' new contents.
TEST(NcclComm, CollectivesRecordedInACudaGraphReplay) {
  const int n = visible_gpus();
  if (n == 0) GTEST_SKIP() << "no GPU visible";
  Group g;
  make_group(n, &g);
  if (HasFatalFailure()) return;
  const int64_t m = 1000;
  on_ranks(n, [&](int r) {
    ops::Backend& b = *g.backends[size_t(r)];
    NcclCommunicator& c = *g.comms[size_t(r)];
    const cudaStream_t s = cuda::stream_of(b);
    Tensor sum = device_tensor(b, DType::kBF16, rank_input(r, m));
    Tensor part = device_tensor(b, DType::kF32, rank_input(r, m));
    Tensor gathered = device_tensor(b, DType::kF32, std::vector<float>(size_t(n * m), 0.0f));
    c.all_reduce(sum);  // eagerly first: NCCL connects peers on first use
    c.all_gather(part, gathered);
    b.synchronize();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    c.all_reduce(sum);
    c.all_gather(part, gathered);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 1; replay <= 2; ++replay) {
      // New inputs, written before the replay: rank r's values + replay.
      std::vector<float> in = rank_input(r, m);
      for (float& v : in) v += float(replay);
      Tensor fresh_sum = device_tensor(b, DType::kBF16, in), fresh_part = device_tensor(b, DType::kF32, in);
      CUDA_OK(cudaMemcpy(sum.data, fresh_sum.data, sum.nbytes(), cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaMemcpy(part.data, fresh_part.data, part.nbytes(), cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaGraphLaunch(exec, s));
      std::vector<float> want_sum(static_cast<size_t>(m), 0.0f), want_gathered;
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < m; ++i) {
          want_sum[size_t(i)] += value(q, i) + float(replay);
          want_gathered.push_back(value(q, i) + float(replay));
        }
      const std::string what = "replay " + std::to_string(replay) + " rank " + std::to_string(r);
      expect_same(host_values(b, sum), want_sum, what + " all_reduce");
      expect_same(host_values(b, gathered), want_gathered, what + " all_gather");
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  });
}

// Sub-groups (tensor-parallel groups of a world): ranks by color, ordered by world rank;
// color -1 joins none.
TEST(NcclComm, SplitMakesSubGroupsThatReduceAmongThemselves) {
  const int n = visible_gpus();
  if (n == 0) GTEST_SKIP() << "no GPU visible";
  Group g;
  make_group(n, &g);
  if (HasFatalFailure()) return;
  std::vector<NcclCommunicator*> world;
  for (auto& c : g.comms) world.push_back(c.get());
  // Pairs (r / 2) when there are several GPUs; with one, a group of one.
  std::vector<int> colors;
  for (int r = 0; r < n; ++r) colors.push_back(r / 2);
  auto sub = NcclCommunicator::split_group(world, colors);
  ASSERT_TRUE(sub.ok()) << sub.status().to_string();
  on_ranks(n, [&](int r) {
    NcclCommunicator& c = *(*sub)[size_t(r)];
    const int members = std::min(2, n - (r / 2) * 2);
    EXPECT_EQ(c.size(), members);
    EXPECT_EQ(c.rank(), r % 2);
    ops::Backend& b = *g.backends[size_t(r)];
    Tensor t = device_tensor(b, DType::kF32, rank_input(r, 513));
    c.all_reduce(t);
    std::vector<float> want(513, 0.0f);
    for (int q = (r / 2) * 2; q < (r / 2) * 2 + members; ++q)
      for (int64_t i = 0; i < 513; ++i) want[size_t(i)] += value(q, i);
    expect_same(host_values(b, t), want, "sub-group all_reduce, world rank " + std::to_string(r));
  });
  // Color -1: no sub-group for that rank.
  std::vector<int> none(size_t(n), 0);
  none[0] = -1;
  auto partial = NcclCommunicator::split_group(world, none);
  ASSERT_TRUE(partial.ok()) << partial.status().to_string();
  EXPECT_EQ((*partial)[0], nullptr);
  for (int r = 1; r < n; ++r) EXPECT_EQ((*partial)[size_t(r)]->size(), n - 1);
}

// abort on one rank fails every later collective of every rank of the world and of the
// groups split from it, naming the reason; a second abort is harmless.
TEST(NcclComm, AbortFailsEveryLaterCollectiveWithTheReason) {
  const int n = visible_gpus();
  if (n == 0) GTEST_SKIP() << "no GPU visible";
  Group g;
  make_group(n, &g);
  if (HasFatalFailure()) return;
  std::vector<NcclCommunicator*> world;
  for (auto& c : g.comms) world.push_back(c.get());
  auto sub = NcclCommunicator::split_group(world, std::vector<int>(size_t(n), 0));
  ASSERT_TRUE(sub.ok()) << sub.status().to_string();
  on_ranks(n, [&](int r) {  // the group works before
    Tensor t = device_tensor(*g.backends[size_t(r)], DType::kF32, rank_input(r, 64));
    g.comms[size_t(r)]->all_reduce(t);
    g.backends[size_t(r)]->synchronize();
  });
  (*sub)[0]->abort("rank 0 failed: test");
  (*sub)[0]->abort("again");
  on_ranks(n, [&](int r) {
    Tensor t = device_tensor(*g.backends[size_t(r)], DType::kF32, rank_input(r, 64));
    for (NcclCommunicator* c : {g.comms[size_t(r)].get(), (*sub)[size_t(r)].get()}) {
      try {
        c->all_reduce(t);
        ADD_FAILURE() << "rank " << r << ": all_reduce after abort did not throw";
      } catch (const CommAborted& e) {
        EXPECT_NE(std::string(e.what()).find("rank 0 failed: test"), std::string::npos) << e.what();
      }
    }
  });
}

// The one-shot all-reduce over peer memory (the small sums of decode steps): the
// Communicator contract's sum, fp32 in rank order rounded once, bit for bit, on values
// where NCCL's ring of bf16 additions would round differently at 3+ ranks; messages of
// many sizes interleaved (the receive halves alternate by the call count),
// a partial last 16 bytes, and replays of a recorded graph (the call count lives on
// the GPU).
float fraction(int r, int64_t i) { return float((i * 37 + r * 101) % 1000) / 997.0f - 0.5f; }

TEST(NcclComm, OneShotAllReduceSumsInFp32InRankOrder) {
  const int n = visible_gpus();
  if (n < 2) GTEST_SKIP() << "the one-shot path needs 2 GPUs; " << n << " visible";
  Group g;
  make_group(n, &g);
  if (HasFatalFailure()) return;
  const size_t max_bytes = g.comms[0]->one_shot_max_bytes();
  if (max_bytes == 0) GTEST_SKIP() << "no one-shot path on these GPUs (no peer access, or turned off): see the log";
  std::printf("one-shot all-reduce over %d GPUs: up to %zu bytes\n", n, max_bytes);
  // Element counts: one, a partial vector, decode-sized, and the largest the path takes.
  std::vector<int64_t> counts = {1, 7, 8, 4099, 64 * 2048};
  counts.push_back(int64_t(max_bytes / 4));  // f32: the whole capacity
  on_ranks(n, [&](int r) {
    ops::Backend& b = *g.backends[size_t(r)];
    NcclCommunicator& c = *g.comms[size_t(r)];
    for (int round = 0; round < 3; ++round) {
      for (int64_t count : counts) {
        for (DType dtype : {DType::kBF16, DType::kF32}) {
          std::vector<float> in(static_cast<size_t>(count));
          for (int64_t i = 0; i < count; ++i) in[size_t(i)] = fraction(r, i + round);
          Tensor t = device_tensor(b, dtype, in);
          c.all_reduce(t);
          std::vector<float> want(static_cast<size_t>(count), 0.0f);
          for (int q = 0; q < n; ++q)
            for (int64_t i = 0; i < count; ++i) {
              const float v = fraction(q, i + round);
              want[size_t(i)] += dtype == DType::kF32 ? v : bf16_to_f32(f32_to_bf16(v));
            }
          if (dtype == DType::kBF16)
            for (float& w : want) w = bf16_to_f32(f32_to_bf16(w));
          expect_same(host_values(b, t), want,
                      "one-shot " + std::string(dtype_name(dtype)) + " x " + std::to_string(count) + " round " +
                          std::to_string(round) + " rank " + std::to_string(r));
        }
      }
    }
    // Two sums recorded in one graph and replayed three times: every replay sums again
    // (all ranks hold the same S after the first, n S after the second, ...).
    const int64_t m = 4099;
    Tensor t = device_tensor(b, DType::kF32, rank_input(r, m));
    b.synchronize();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    const cudaStream_t s = cuda::stream_of(b);
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    c.all_reduce(t);
    c.all_reduce(t);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) CUDA_OK(cudaGraphLaunch(exec, s));
    std::vector<float> want(static_cast<size_t>(m), 0.0f);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < m; ++i) want[size_t(i)] += value(q, i);
    for (float& w : want) w *= std::pow(float(n), 5.0f);  // 6 sums: S, then x n five times
    expect_same(host_values(b, t), want, "replayed one-shot sums, rank " + std::to_string(r));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  });
}

// A rank waiting in the one-shot all-reduce for a peer that never comes is released by
// the group's abort: its stream drains and the next collective throws CommAborted.
TEST(NcclComm, OneShotWaitForAMissingPeerEndsOnAbort) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
  Group g;
  make_group(2, &g);
  if (HasFatalFailure()) return;
  if (g.comms[0]->one_shot_max_bytes() == 0) GTEST_SKIP() << "no one-shot path on these GPUs";
  ops::Backend& b = *g.backends[0];
  cudaSetDevice(0);
  Tensor t = device_tensor(b, DType::kBF16, rank_input(0, 256));
  g.comms[0]->all_reduce(t);  // rank 1 never joins
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(cudaStreamQuery(cuda::stream_of(b)), cudaErrorNotReady) << "the sum finished without its peer";
  g.comms[1]->abort("rank 1 is gone: test");
  const auto t0 = std::chrono::steady_clock::now();
  while (cudaStreamQuery(cuda::stream_of(b)) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(cudaStreamQuery(cuda::stream_of(b)), cudaSuccess) << "rank 0 still waits 10 s after the abort";
  EXPECT_THROW(g.comms[0]->all_reduce(t), CommAborted);
}

// The fused form: sum, residual add and RMSNorm in one launch
// (Communicator::all_reduce_add_rms_norm), against the host's arithmetic (the CUDA
// rms_norm's: the sum rounded to bf16, residual = bf16(residual + sum), fp32 norm):
// the sum and the residual bit for bit, the normed rows within one bf16 rounding (the
// kernels add up the squares in different orders). Shapes: one decode row, odd row
// counts, gpt-oss's 2880 and DeepSeek's 7168 (several vectors per thread), 64 rows.
struct NormCase {
  int64_t rows, dim;
};
const NormCase kNormCases[] = {{1, 2048}, {3, 2880}, {64, 2048}, {5, 7168}, {2, 64}};
constexpr float kNormEps = 1e-6f;

float partial_value(int r, int64_t i) { return float(int((i * 37 + r * 101) % 1000) - 500) / 512.0f; }
float residual_value(int64_t i) { return float(int((i * 53) % 997) - 498) / 256.0f; }
float weight_value(int64_t i) { return 0.5f + float(i % 13) / 16.0f; }
float bf16r(float x) { return bf16_to_f32(f32_to_bf16(x)); }

struct NormWant {
  std::vector<float> sum, residual, out;
};

NormWant norm_reference(int ranks, const NormCase& c) {
  const int64_t n = c.rows * c.dim;
  NormWant w{std::vector<float>(size_t(n)), std::vector<float>(size_t(n)), std::vector<float>(size_t(n))};
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0.0f;
    for (int r = 0; r < ranks; ++r) acc += bf16r(partial_value(r, i));
    w.sum[size_t(i)] = bf16r(acc);
    w.residual[size_t(i)] = bf16r(bf16r(residual_value(i)) + w.sum[size_t(i)]);
  }
  for (int64_t row = 0; row < c.rows; ++row) {
    double ss = 0.0;
    for (int64_t j = 0; j < c.dim; ++j) ss += double(w.residual[size_t(row * c.dim + j)]) * w.residual[size_t(row * c.dim + j)];
    const float inv = float(1.0 / std::sqrt(ss / double(c.dim) + kNormEps));
    for (int64_t j = 0; j < c.dim; ++j) {
      const size_t i = size_t(row * c.dim + j);
      w.out[i] = bf16r(w.residual[i] * inv * weight_value(j));
    }
  }
  return w;
}

// Normed rows: within one bf16 rounding of each row's largest value.
void expect_close_rows(const std::vector<float>& got, const std::vector<float>& want, int64_t dim,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t row = 0; row * size_t(dim) < want.size(); ++row) {
    float top = 0.0f;
    for (int64_t j = 0; j < dim; ++j) top = std::max(top, std::fabs(want[row * size_t(dim) + size_t(j)]));
    for (int64_t j = 0; j < dim; ++j) {
      const size_t i = row * size_t(dim) + size_t(j);
      if (!(std::fabs(got[i] - want[i]) <= 2.0f / 256.0f * top) && bad++ < 3)
        ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// Copies on the backend's own stream only: two ranks on one GPU must not wait for the
// whole device (device_tensor does) while the other rank's sum waits for them.
Tensor upload(ops::Backend& b, DType dtype, Shape shape, const std::vector<float>& v) {
  Tensor t = b.alloc(dtype, shape);
  if (dtype == DType::kBF16) {
    b.from_host_f32(v.data(), t);
  } else {
    const cudaStream_t s = cuda::stream_of(b);
    KILN_CHECK(cudaMemcpyAsync(t.data, v.data(), t.nbytes(), cudaMemcpyHostToDevice, s) == cudaSuccess);
    KILN_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  }
  return t;
}

std::vector<float> download(ops::Backend& b, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kBF16) {
    b.to_host_f32(t, v.data());
  } else {
    const cudaStream_t s = cuda::stream_of(b);
    KILN_CHECK(cudaMemcpyAsync(v.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    KILN_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  }
  return v;
}

struct NormTensors {
  Tensor t, residual, weight, out;
};

NormTensors norm_inputs(ops::Backend& b, int r, const NormCase& c) {
  const int64_t n = c.rows * c.dim;
  std::vector<float> part(static_cast<size_t>(n)), res(static_cast<size_t>(n)), w(static_cast<size_t>(c.dim));
  for (int64_t i = 0; i < n; ++i) part[size_t(i)] = partial_value(r, i), res[size_t(i)] = residual_value(i);
  for (int64_t j = 0; j < c.dim; ++j) w[size_t(j)] = weight_value(j);
  const Shape shape{c.rows, c.dim};
  return {upload(b, DType::kBF16, shape, part), upload(b, DType::kBF16, shape, res),
          upload(b, DType::kF32, {c.dim}, w), upload(b, DType::kBF16, shape, std::vector<float>(size_t(n), NAN))};
}

void expect_norm_results(ops::Backend& b, const NormTensors& x, const NormWant& want, int64_t dim,
                         const std::string& what) {
  expect_same(download(b, x.t), want.sum, what + ": sum");
  expect_same(download(b, x.residual), want.residual, what + ": residual");
  expect_close_rows(download(b, x.out), want.out, dim, what + ": normed");
}

// Two ranks of the one-shot path on one GPU (a group may name a device twice): the
// push, the wait for every element and the fused epilogue, on the one-GPU machines, with
// plain sums of both dtypes in between (the receive halves alternate; a slot last used
// by an f32 sum must read as empty to a bf16 one). On one GPU a rank's sum waits for the
// other's launch, and an allocation or a free may wait for the whole GPU: every tensor
// is made before the first sum (a barrier) and lives to the end.
void two_ranks_on_one_gpu(comm::PeerAllReduce::Staging staging) {
  if (visible_gpus() < 1) GTEST_SKIP() << "no GPU visible";
  std::string why_not;
  auto peers = comm::PeerAllReduce::create_group({0, 0}, &why_not, staging);
  if (peers.empty()) GTEST_SKIP() << "no one-shot path: " << why_not;
  // kAuto stages through host memory too where NCCL_P2P_DISABLE asks for no peer access.
  EXPECT_EQ(peers[0]->host_staged(), staging == comm::PeerAllReduce::Staging::kHost ||
                                         !comm::PeerAllReduce::no_peer_access({0, 0}).empty());
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < 2; ++r) {
    auto b = cuda::make_cuda_backend({.device = 0});
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    backends.push_back(std::move(b).value());
  }
  constexpr int kRounds = 2;
  constexpr int64_t kCount = 4099;  // plain sums: a partial last vector
  const auto plain_want = [](DType dtype, int round) {
    std::vector<float> want(static_cast<size_t>(kCount), 0.0f);
    for (int q = 0; q < 2; ++q)
      for (int64_t i = 0; i < kCount; ++i) {
        const float v = fraction(q, i + round);
        want[size_t(i)] += dtype == DType::kF32 ? v : bf16r(v);
      }
    if (dtype == DType::kBF16)
      for (float& w : want) w = bf16r(w);
    return want;
  };
  std::barrier ready(2);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        cudaSetDevice(0);
        ops::Backend& b = *backends[size_t(r)];
        comm::PeerAllReduce& peer = *peers[size_t(r)];
        const cudaStream_t stream = cuda::stream_of(b);
        struct Step {
          NormCase c;
          NormTensors fused;
          Tensor plain[2];  // f32, bf16
        };
        std::vector<Step> steps;
        for (int round = 0; round < kRounds; ++round) {
          for (const NormCase& c : kNormCases) {
            Step st{c, norm_inputs(b, r, c), {}};
            for (int k = 0; k < 2; ++k) {
              std::vector<float> in(static_cast<size_t>(kCount));
              for (int64_t i = 0; i < kCount; ++i) in[size_t(i)] = fraction(r, i + round);
              st.plain[k] = upload(b, k == 0 ? DType::kF32 : DType::kBF16, {kCount}, in);
            }
            steps.push_back(std::move(st));
          }
        }
        ready.arrive_and_wait();
        for (Step& st : steps) {
          const comm::PeerAllReduce::AddRmsNorm norm{
              .residual = st.fused.residual.data, .weight = static_cast<const float*>(st.fused.weight.data),
              .out = st.fused.out.data, .rows = st.c.rows, .dim = st.c.dim, .eps = kNormEps};
          EXPECT_TRUE(peer.takes(st.fused.t.data, norm));
          EXPECT_EQ(peer.all_reduce(st.fused.t.data, st.fused.t.numel(), false, stream, &norm), cudaSuccess);
          for (int k = 0; k < 2; ++k)
            EXPECT_EQ(peer.all_reduce(st.plain[k].data, kCount, k == 0, stream), cudaSuccess);
        }
        for (size_t i = 0; i < steps.size(); ++i) {
          const Step& st = steps[i];
          const int round = int(i / std::size(kNormCases));
          const std::string what = std::to_string(st.c.rows) + " x " + std::to_string(st.c.dim) + " round " +
                                   std::to_string(round) + " rank " + std::to_string(r);
          expect_norm_results(b, st.fused, norm_reference(2, st.c), st.c.dim, "fused " + what);
          expect_same(download(b, st.plain[0]), plain_want(DType::kF32, round), "plain f32 sum after " + what);
          expect_same(download(b, st.plain[1]), plain_want(DType::kBF16, round), "plain bf16 sum after " + what);
        }
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(PeerAllReduce, TwoRanksOnOneGpuSumAndNormLikeTheHost) { two_ranks_on_one_gpu(comm::PeerAllReduce::Staging::kAuto); }

// The same with the receive buffers in mapped host memory (the path for GPUs without
// peer access, KILN_ONESHOT_HOST=1).
TEST(PeerAllReduce, TwoRanksStagedThroughHostMemory) { two_ranks_on_one_gpu(comm::PeerAllReduce::Staging::kHost); }

// The communicator's fused call on 2 GPUs: it fuses wherever the one-shot path takes the
// sum and gives what all_reduce and the backend's rms_norm give; a message over the
// one-shot limit is declined and left untouched. (300 rows only here: on one GPU two
// ranks' grids of 256 blocks might not both be resident, and each waits for the other.)
TEST(NcclComm, AllReduceAddRmsNormMatchesAllReduceThenRmsNorm) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 GPUs; " << visible_gpus() << " visible";
  Group g;
  make_group(2, &g);
  if (HasFatalFailure()) return;
  if (g.comms[0]->one_shot_max_bytes() == 0) GTEST_SKIP() << "no one-shot path on these GPUs: see the log";
  on_ranks(2, [&](int r) {
    ops::Backend& b = *g.backends[size_t(r)];
    NcclCommunicator& c = *g.comms[size_t(r)];
    std::vector<NormCase> cases(std::begin(kNormCases), std::end(kNormCases));
    // More rows than blocks: a block sends, then sums, several rows (600 KiB: within what
    // both the peer-memory and the host-staged path take).
    cases.push_back({300, 1024});
    // The largest message it takes at 2 ranks: a 2,048-token prefill chunk at d_model 2,048
    // (8 MiB, PeerAllReduce::kCapacity), where the message fits the path's limit.
    if (g.comms[0]->one_shot_max_bytes() >= size_t(2048) * 2048 * 2) cases.push_back({2048, 2048});
    for (const NormCase& nc : cases) {
      const std::string what = std::to_string(nc.rows) + " x " + std::to_string(nc.dim) + " rank " + std::to_string(r);
      NormTensors fused = norm_inputs(b, r, nc);
      EXPECT_TRUE(c.all_reduce_add_rms_norm(fused.t, fused.residual, fused.weight, fused.out, kNormEps)) << what;
      NormTensors plain = norm_inputs(b, r, nc);
      c.all_reduce(plain.t);
      b.rms_norm({.x = plain.t, .weight = plain.weight, .residual = plain.residual, .out = plain.out, .eps = kNormEps});
      expect_same(download(b, fused.t), download(b, plain.t), "fused vs plain sum " + what);
      expect_same(download(b, fused.residual), download(b, plain.residual), "fused vs plain residual " + what);
      expect_close_rows(download(b, fused.out), download(b, plain.out), nc.dim, "fused vs rms_norm " + what);
      expect_norm_results(b, fused, norm_reference(2, nc), nc.dim, "fused vs host " + what);
    }
    const NormCase big{int64_t(g.comms[0]->one_shot_max_bytes() / (2 * 2048)) + 1, 2048};
    NormTensors x = norm_inputs(b, r, big);
    EXPECT_FALSE(c.all_reduce_add_rms_norm(x.t, x.residual, x.weight, x.out, kNormEps));
    std::vector<float> part(size_t(big.rows * big.dim));
    for (size_t i = 0; i < part.size(); ++i) part[i] = bf16r(partial_value(r, int64_t(i)));
    expect_same(download(b, x.t), part, "a declined message is left as it was, rank " + std::to_string(r));
  });
}

}  // namespace
}  // namespace kiln

#else

TEST(NcclComm, NeedsNccl) { GTEST_SKIP() << "built without NCCL (KILN_HAVE_NCCL): no NCCL communicator to test"; }

#endif
