#include "comm/nccl/peer_all_reduce.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "core/log.h"

namespace kiln::comm {

struct PeerAllReduce::Shared {
  std::vector<int> devices;
  std::vector<void*> receive;     // per rank: [2 halves][ranks slots][slot_bytes] on its device
  std::vector<uint32_t*> state;   // per rank: {calls so far, blocks done in this call}
  int* abort_flag = nullptr;      // mapped, portable host memory
  size_t max_bytes = 0, slot_bytes = 0;
  bool dependent_launch = false;  // every device SM 9.0+ and KILN_PDL not 0
  bool host = false;              // receive buffers in mapped host memory (no peer access)

  ~Shared() {
    int previous = 0;
    cudaGetDevice(&previous);
    for (size_t r = 0; r < devices.size(); ++r) {
      cudaSetDevice(devices[r]);
      if (r < receive.size()) host ? cudaFreeHost(receive[r]) : cudaFree(receive[r]);
      if (r < state.size()) cudaFree(state[r]);
    }
    if (abort_flag != nullptr) cudaFreeHost(abort_flag);
    cudaSetDevice(previous);
  }
};

namespace {

// KILN_ONESHOT_MAX_BYTES, or the default for `ranks`; at most the receive capacity.
size_t configured_max_bytes(int ranks, bool host) {
  const size_t fallback = host ? PeerAllReduce::kHostMaxBytes : PeerAllReduce::default_max_bytes(ranks);
  const char* v = std::getenv("KILN_ONESHOT_MAX_BYTES");
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') {
    KILN_LOG(kWarn, "KILN_ONESHOT_MAX_BYTES=" << v << " is not a byte count; using the default " << fallback);
    return fallback;
  }
  return std::min<size_t>(size_t(n), PeerAllReduce::kCapacity);
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// Staging through host memory where the GPUs cannot reach each other: KILN_ONESHOT_HOST=1
// or 0 asks for it or not; unset, it is taken at 2 ranks, where it beat NCCL's own path
// without P2P (bench/comm_bench on 2 x H200 with NCCL_P2P_DISABLE=1: 0.42-0.71x NCCL's
// time up to 256 KiB; Qwen3-30B-A3B at TP2 1.18x the tokens a second at one stream, 1.05x
// at 64: docs/perf/multi-gpu.md), and not at more ranks (not measured: each rank would
// read every peer's message over its bus).
bool host_staging_wanted(int ranks) {
  const char* v = std::getenv("KILN_ONESHOT_HOST");
  if (v == nullptr || *v == '\0') return ranks == 2;
  return std::strcmp(v, "0") != 0;
}

std::string cuda_error(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

}  // namespace

std::string PeerAllReduce::no_peer_access(const std::vector<int>& devices) {
  if (const char* p2p = std::getenv("NCCL_P2P_DISABLE"); env_set("NCCL_P2P_DISABLE")) {
    return std::string("NCCL_P2P_DISABLE=") + p2p + " asks for no peer-to-peer traffic";
  }
  for (int a : devices) {
    for (int b : devices) {
      int can = 0;
      if (a == b) continue;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0) {
        cudaGetLastError();
        return "GPU " + std::to_string(a) + " has no peer access to GPU " + std::to_string(b);
      }
    }
  }
  return "";
}

std::vector<std::unique_ptr<PeerAllReduce>> PeerAllReduce::create_group(const std::vector<int>& devices,
                                                                        std::string* why_not, Staging staging) {
  std::vector<std::unique_ptr<PeerAllReduce>> none;
  const int n = int(devices.size());
  if (n < 2 || n > kMaxRanks) {
    *why_not = "a group of " + std::to_string(n) + " (the one-shot path takes 2 to " + std::to_string(kMaxRanks) + ")";
    return none;
  }
  // Peer memory where every pair of GPUs has peer access and NCCL_P2P_DISABLE is unset;
  // else host memory where wanted (host_staging_wanted), else none.
  const std::string no_peers = no_peer_access(devices);
  const bool host = staging == Staging::kHost || (!no_peers.empty() && host_staging_wanted(n));
  if (!no_peers.empty() && !host) {
    *why_not = no_peers + (n == 2 ? "; KILN_ONESHOT_HOST=0 asked for NCCL alone"
                                  : "; KILN_ONESHOT_HOST=1 stages it through host memory instead");
    return none;
  }
  auto shared = std::make_shared<Shared>();
  shared->host = host;
  shared->max_bytes = configured_max_bytes(n, host);
  if (shared->max_bytes == 0) {
    *why_not = "KILN_ONESHOT_MAX_BYTES=0";
    return none;
  }
  int previous = 0;
  cudaGetDevice(&previous);
  std::string error;
  shared->devices = devices;
  shared->slot_bytes = (shared->max_bytes + 15) / 16 * 16;
  const char* pdl = std::getenv("KILN_PDL");
  shared->dependent_launch = pdl == nullptr || std::strcmp(pdl, "0") != 0;
  for (int d : devices) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess || major < 9)
      shared->dependent_launch = false;
  }
  cudaGetLastError();
  const size_t receive_bytes = 2 * size_t(n) * shared->slot_bytes;
  const size_t state_bytes = 2 * sizeof(uint32_t);
  for (int r = 0; r < n && error.empty(); ++r) {
    cudaSetDevice(devices[size_t(r)]);
    for (int peer : devices) {
      if (peer == devices[size_t(r)] || host) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else if (e != cudaSuccess) {
        error = cuda_error(("enabling peer access from GPU " + std::to_string(devices[size_t(r)]) + " to GPU " +
                            std::to_string(peer)).c_str(), e);
        break;
      }
    }
    void *receive = nullptr, *state = nullptr;
    cudaError_t e = host ? cudaHostAlloc(&receive, receive_bytes, cudaHostAllocMapped | cudaHostAllocPortable)
                         : cudaMalloc(&receive, receive_bytes);
    if (e == cudaSuccess) e = cudaMalloc(&state, state_bytes);
    if (e == cudaSuccess && host) {
      std::fill_n(static_cast<uint32_t*>(receive), receive_bytes / 4, kEmptyWord);
    } else if (e == cudaSuccess) {
      e = launch_peer_reduce_clear(receive, receive_bytes / 4, nullptr);
    }
    if (e == cudaSuccess) e = load_peer_reduce_kernels();
    if (e == cudaSuccess) e = cudaMemset(state, 0, state_bytes);
    shared->receive.push_back(receive);
    shared->state.push_back(static_cast<uint32_t*>(state));
    if (e != cudaSuccess && error.empty()) error = cuda_error("allocating the one-shot buffers", e);
  }
  if (error.empty()) {
    const cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&shared->abort_flag), sizeof(int),
                                        cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) error = cuda_error("allocating the one-shot abort flag", e);
    else *shared->abort_flag = 0;
  }
  if (error.empty()) {  // the fills above ran on the legacy streams: done before any use
    for (int d : devices) {
      cudaSetDevice(d);
      if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess && error.empty()) {
        error = cuda_error("preparing the one-shot buffers", e);
      }
    }
  }
  cudaSetDevice(previous);
  if (!error.empty()) {
    cudaGetLastError();
    *why_not = error;
    return none;
  }
  std::vector<std::unique_ptr<PeerAllReduce>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::unique_ptr<PeerAllReduce>(new PeerAllReduce(shared, r)));
  return out;
}

PeerAllReduce::~PeerAllReduce() = default;

size_t PeerAllReduce::max_bytes() const { return shared_->max_bytes; }

bool PeerAllReduce::host_staged() const { return shared_->host; }

bool PeerAllReduce::takes(const void* data, int64_t n, bool f32) const {
  const size_t bytes = size_t(n) * (f32 ? 4 : 2);
  return n > 0 && bytes <= shared_->max_bytes && reinterpret_cast<uintptr_t>(data) % 16 == 0;
}

bool PeerAllReduce::takes(const void* data, const AddRmsNorm& norm) const {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return norm.rows > 0 && norm.dim > 0 && norm.dim % 8 == 0 && norm.dim <= kMaxNormDim &&
         takes(data, norm.rows * norm.dim, false) && aligned(norm.residual) && aligned(norm.weight) &&
         aligned(norm.out);
}

cudaError_t PeerAllReduce::all_reduce(void* data, int64_t n, bool f32, cudaStream_t stream, const AddRmsNorm* norm) {
  const Shared& s = *shared_;
  PeerReduceLaunch l{};
  for (size_t r = 0; r < s.devices.size(); ++r) l.receive[r] = s.receive[r];
  l.state = s.state[size_t(rank_)];
  l.abort = s.abort_flag;
  l.data = data;
  l.n = n;
  l.slot_bytes = s.slot_bytes;
  l.rank = rank_;
  l.size = int(s.devices.size());
  l.f32 = f32;
  l.dependent_launch = s.dependent_launch;
  if (norm != nullptr) l.norm = *norm;
  return launch_peer_all_reduce(l, stream);
}

void PeerAllReduce::abort() {
  if (shared_->abort_flag != nullptr) *static_cast<volatile int*>(shared_->abort_flag) = 1;
}

}  // namespace kiln::comm
