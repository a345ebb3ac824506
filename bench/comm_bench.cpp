// All-reduce latency and bus bandwidth of kiln's NCCL communicator (comm/nccl) over
// every visible GPU, for the bf16 messages tensor parallelism sends: one all-reduce of
// [tokens, d_model] per attention and per MLP block, from decode steps (1-64 tokens x
// d_model 2048-7168) to a prefill chunk (8192 x 7168).
//
//   build-gpu/bin/comm_bench [--iters 50] [--gpus N]
//
// Run it with NCCL_P2P_DISABLE=1 to see a PCIe machine without peer-to-peer (consumer
// cards): NCCL then stages through host memory, and so does kiln's one-shot path (its
// receive buffers in mapped host memory, KILN_ONESHOT_HOST).
//
// Two groups over the same GPUs: one sends every sum to NCCL (KILN_ONESHOT_MAX_BYTES=0),
// the other every sum up to the receive capacity (4 MiB) to the one-shot all-reduce over
// peer memory (comm/nccl/peer_all_reduce.h), so each row compares the two; the crossover
// kiln picks (PeerAllReduce::default_max_bytes) comes from this table. "fused" is the
// one-shot sum with the residual add and RMSNorm that follow it in a decoder layer, in
// the same launch (Communicator::all_reduce_add_rms_norm), where it takes the shape.
//
// Timing. One thread per rank (the layout kiln runs), each with a stream of its own;
// the ranks meet at a host barrier, then each enqueues --iters all-reduces and
// synchronizes its stream; "eager" is the slowest rank's wall time / iters, the launch
// path included (what an eager step pays). "graph" records the same --iters
// all-reduces into one CUDA graph per rank and times one replay / iters (what a
// recorded decode step pays). One warm-up round first (NCCL connects lazily).
// algbw = bytes / time; busbw = algbw x 2 (n - 1) / n, the bytes each GPU's link moves
// in a ring all-reduce (nccl-tests' definition), so it compares with the link's
// bandwidth. With one GPU there is nothing to move: NCCL returns from an in-place
// all-reduce of one rank without launching anything (measured on the H100: 0.3-1.0 us
// eager, the host path of kiln's call and NCCL's enqueue; an empty graph), so the table
// then shows that overhead and no bandwidth.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl/peer_all_reduce.h"

namespace {

using kiln::comm::NcclCommunicator;
using kiln::comm::NcclRank;

#define BENCH_CUDA(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                            \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

struct Case {
  int64_t tokens, d_model;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50, gpus = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--gpus" && i + 1 < argc) gpus = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: comm_bench [--iters N] [--gpus N]\n");
      return 2;
    }
  }
  int visible = 0;
  BENCH_CUDA(cudaGetDeviceCount(&visible));
  const int n = gpus > 0 ? std::min(gpus, visible) : visible;
  if (n == 0) {
    std::fprintf(stderr, "comm_bench: no GPU visible\n");
    return 1;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  const char* p2p = std::getenv("NCCL_P2P_DISABLE");
  std::printf("# comm_bench: bf16 all-reduce over %d GPU%s (%s), NCCL_P2P_DISABLE=%s, %d iterations\n", n,
              n == 1 ? "" : "s", prop.name, p2p ? p2p : "unset", iters);
  if (n == 1) {
    std::printf("# only one GPU is visible: a group of one, where NCCL launches nothing for an in-place\n"
                "# all-reduce; eager us is the host cost of the call, and no interconnect is measured\n");
  }

  std::vector<Case> cases;
  for (int64_t d : {2048, 4096, 7168})
    for (int64_t t : {1, 8, 16, 32, 64, 128, 256}) cases.push_back({t, d});
  // Prefill chunks' sums (2,048 tokens is kiln's default chunk).
  for (int64_t t : {512, 2048}) cases.push_back({t, 2048});
  for (int64_t t : {512, 2048, 8192}) cases.push_back({t, 7168});
  size_t max_bytes = 0;
  for (const Case& c : cases) max_bytes = std::max(max_bytes, size_t(c.tokens * c.d_model * 2));

  std::vector<NcclRank> ranks(static_cast<size_t>(n));
  // Per rank: the message, then (the fused form) a residual stream, the normed output
  // and an fp32 norm weight; zeros, so sums and norms stay finite.
  constexpr int64_t kMaxDim = 7168;
  std::vector<void*> buffers(static_cast<size_t>(n), nullptr);
  const size_t fused_bytes = 3 * max_bytes + kMaxDim * 4;
  for (int r = 0; r < n; ++r) {
    BENCH_CUDA(cudaSetDevice(r));
    ranks[size_t(r)].device = r;
    BENCH_CUDA(cudaStreamCreateWithFlags(&ranks[size_t(r)].stream, cudaStreamNonBlocking));
    BENCH_CUDA(cudaMalloc(&buffers[size_t(r)], fused_bytes));
    BENCH_CUDA(cudaMemset(buffers[size_t(r)], 0, fused_bytes));
  }
  // The NCCL-only group, then the one-shot group (up to its capacity).
  std::vector<std::unique_ptr<NcclCommunicator>> groups[2];
  // Without peer access (NCCL_P2P_DISABLE=1) the one-shot group stages through host
  // memory (KILN_ONESHOT_HOST), so the table compares that with NCCL's own host path.
  setenv("KILN_ONESHOT_HOST", "1", 1);
  for (int k = 0; k < 2; ++k) {
    setenv("KILN_ONESHOT_MAX_BYTES", k == 0 ? "0" : std::to_string(kiln::comm::PeerAllReduce::kCapacity).c_str(), 1);
    auto group = NcclCommunicator::create_group(ranks);
    if (!group.ok()) {
      std::fprintf(stderr, "comm_bench: %s\n", group.status().to_string().c_str());
      return 1;
    }
    groups[k] = std::move(group).value();
  }
  const size_t one_shot_max = groups[1][0]->one_shot_max_bytes();
  std::printf("# one-shot all-reduce: %s\n", one_shot_max > 0 ? ("up to " + std::to_string(one_shot_max) +
                                                                    " bytes").c_str()
                                                               : "not available (see the log line above)");

  std::printf("\n| tokens | d_model | bytes | NCCL eager us | NCCL graph us | NCCL busbw GB/s (graph) | "
              "one-shot eager us | one-shot graph us | one-shot / NCCL (graph) | fused graph us |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::barrier sync(n);
  // Slowest rank's eager and graph time per all-reduce, in us.
  auto measure = [&](std::vector<std::unique_ptr<NcclCommunicator>>& comms, const Case& c, bool fused = false) {
    std::vector<double> eager(static_cast<size_t>(n)), graph(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        BENCH_CUDA(cudaSetDevice(r));
        NcclCommunicator& comm = *comms[size_t(r)];
        const auto tensor = [&](size_t offset, kiln::DType dtype, kiln::Shape shape) {
          return kiln::Tensor{.data = static_cast<char*>(buffers[size_t(r)]) + offset, .dtype = dtype,
                              .shape = shape, .device = kiln::Device::kCuda, .device_index = r};
        };
        kiln::Tensor t = tensor(0, kiln::DType::kBF16, {c.tokens, c.d_model});
        kiln::Tensor residual = tensor(max_bytes, kiln::DType::kBF16, {c.tokens, c.d_model});
        kiln::Tensor out = tensor(2 * max_bytes, kiln::DType::kBF16, {c.tokens, c.d_model});
        const kiln::Tensor weight = tensor(3 * max_bytes, kiln::DType::kF32, {c.d_model});
        const auto op = [&] {
          if (!fused) comm.all_reduce(t);
          else if (!comm.all_reduce_add_rms_norm(t, residual, weight, out, 1e-6f)) std::exit(3);
        };
        const cudaStream_t s = comm.stream();
        op();  // warm-up: lazy connection setup
        BENCH_CUDA(cudaStreamSynchronize(s));
        sync.arrive_and_wait();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) op();
        BENCH_CUDA(cudaStreamSynchronize(s));
        eager[size_t(r)] = seconds_since(t0);
        // The same all-reduces recorded once and replayed.
        cudaGraph_t g = nullptr;
        cudaGraphExec_t exec = nullptr;
        sync.arrive_and_wait();
        BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
        for (int i = 0; i < iters; ++i) op();
        BENCH_CUDA(cudaStreamEndCapture(s, &g));
        BENCH_CUDA(cudaGraphInstantiate(&exec, g, 0));
        BENCH_CUDA(cudaGraphLaunch(exec, s));  // warm-up replay
        BENCH_CUDA(cudaStreamSynchronize(s));
        sync.arrive_and_wait();
        t0 = std::chrono::steady_clock::now();
        BENCH_CUDA(cudaGraphLaunch(exec, s));
        BENCH_CUDA(cudaStreamSynchronize(s));
        graph[size_t(r)] = seconds_since(t0);
        BENCH_CUDA(cudaGraphExecDestroy(exec));
        BENCH_CUDA(cudaGraphDestroy(g));
      });
    }
    for (std::thread& th : threads) th.join();
    return std::pair{*std::max_element(eager.begin(), eager.end()) / iters * 1e6,
                     *std::max_element(graph.begin(), graph.end()) / iters * 1e6};
  };
  for (const Case& c : cases) {
    const size_t bytes = size_t(c.tokens * c.d_model * 2);
    const auto [eager_us, graph_us] = measure(groups[0], c);
    const double busbw = double(bytes) / (graph_us * 1e-6) / 1e9 * 2.0 * (n - 1) / n;
    std::printf("| %lld | %lld | %zu | %.1f | %.1f | ", static_cast<long long>(c.tokens),
                static_cast<long long>(c.d_model), bytes, eager_us, graph_us);
    if (n == 1) std::printf("- | ");
    else std::printf("%.1f | ", busbw);
    if (bytes <= one_shot_max) {
      const auto [one_eager, one_graph] = measure(groups[1], c);
      std::printf("%.1f | %.1f | %.2f | ", one_eager, one_graph, one_graph / graph_us);
      if (c.d_model % 8 == 0 && c.d_model <= kiln::comm::PeerAllReduce::kMaxNormDim) {
        std::printf("%.1f |\n", measure(groups[1], c, true).second);
      } else {
        std::printf("- |\n");
      }
    } else {
      std::printf("- | - | - | - |\n");
    }
  }
  groups[0].clear();
  groups[1].clear();
  for (int r = 0; r < n; ++r) {
    BENCH_CUDA(cudaSetDevice(r));
    BENCH_CUDA(cudaFree(buffers[size_t(r)]));
    BENCH_CUDA(cudaStreamDestroy(ranks[size_t(r)].stream));
  }
  return 0;
}
