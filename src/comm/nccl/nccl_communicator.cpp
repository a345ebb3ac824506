#include "comm/nccl/nccl_communicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <thread>

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/nccl/peer_all_reduce.h"
#include "core/log.h"

namespace kiln::comm {

// The failure state of a world and every group split from it, and their members (so
// that an abort reaches them all).
struct NcclWorld {
  std::mutex m;
  std::atomic<bool> failed{false};
  std::string reason;                       // the first abort's
  std::vector<NcclCommunicator*> members;   // live communicators of the world and its splits
};

namespace {

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') s += std::string(" (") + last + ")";
  return s;
}

// Reductions run in the tensor's dtype (see the header).
ncclDataType_t sum_type(const Tensor& t, const char* what) {
  KILN_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16)
      << what << ": sums take f32 or bf16 tensors, not " << dtype_name(t.dtype);
  return t.dtype == DType::kF32 ? ncclFloat32 : ncclBfloat16;
}

// ncclCommAbort of `comm` on a thread of its own, waited for at most `wait`. The call
// stops the communicator's kernels at once (its abort flag), but then waits until every
// CUDA graph that captured one of its collectives has been destroyed, which may be
// later (a watchdog's abort in the middle of serving) or never (a rank left stuck): a
// thread still waiting after `wait` is left to finish on its own. True if it finished.
bool abort_bounded(ncclComm_t comm, int device, int rank, std::chrono::milliseconds wait) {
  struct Done {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  std::thread([comm, device, rank, done] {
    cudaSetDevice(device);
    const ncclResult_t r = ncclCommAbort(comm);
    if (r != ncclSuccess) KILN_LOG(kWarn, "nccl: aborting rank " << rank << ": " << ncclGetErrorString(r));
    std::lock_guard<std::mutex> lock(done->m);
    done->done = true;
    done->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(done->m);
  return done->cv.wait_for(lock, wait, [&] { return done->done; });
}

void register_member(NcclWorld& w, NcclCommunicator* c) {
  std::lock_guard<std::mutex> lock(w.m);
  w.members.push_back(c);
}

// The one-shot all-reduce for a group of `devices` (in rank order), logged either way.
std::vector<std::unique_ptr<PeerAllReduce>> make_peer_group(const std::vector<int>& devices) {
  std::string why_not;
  auto peers = PeerAllReduce::create_group(devices, &why_not);
  if (peers.empty()) {
    KILN_LOG(kInfo, "nccl: every all-reduce of the group of " << devices.size() << " goes to NCCL (" << why_not << ")");
  } else {
    KILN_LOG(kInfo, "nccl: all-reduces of up to " << peers[0]->max_bytes() / 1024 << " KiB over the group of "
                                                   << devices.size() << " take the one-shot path over "
                                                   << (peers[0]->host_staged() ? "host" : "peer") << " memory");
  }
  return peers;
}

// Without peer access between 2 GPUs (consumer cards over PCIe, or NCCL_P2P_DISABLE),
// NCCL moves every sum through host memory (its SHM transport) on as many channels as it
// picks. Alone, 16 move more at once: on 2 x H200 with NCCL_P2P_DISABLE=1 (bench/comm_bench,
// docs/perf/multi-gpu.md) 256 KiB in 25 us instead of 37, 8 MiB (a 2,048-token prefill
// chunk of Qwen3-30B-A3B) in 281 instead of 310, and Qwen3-30B-A3B at TP2 served 2%
// more tokens a second at 64 streams. Beside other work (`overlapped`: a prompt chunk's
// micro-batches, model::CausalLM::micro_batch_rows) each channel's CTA is an SM taken from
// that work: the same benchmark served 3,449 output tok/s at 16 channels, 3,520 at 2, 3,556
// at 4 and 3,551 at 8 (twenty-seventh section), so 4 there. (A model whose layers keep
// their steps whole, CausalLM::splits_into_micro_batches, is known as such before the
// communicators are made, from its sized layers: runtime::Engine::load.) Not measured at
// more GPUs, so not set there; a user's own NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS
// stand. NCCL reads them once, at the process's first communicator (the world's, made
// before any other).
void channels_without_peer_access(const std::vector<int>& devices, bool overlapped) {
  if (devices.size() != 2 || std::getenv("NCCL_MIN_NCHANNELS") != nullptr ||
      std::getenv("NCCL_MAX_NCHANNELS") != nullptr)
    return;
  if (PeerAllReduce::no_peer_access(devices).empty()) return;
  if (overlapped) {
    setenv("NCCL_MIN_NCHANNELS", "4", 0);
    setenv("NCCL_MAX_NCHANNELS", "4", 0);
  } else {
    setenv("NCCL_MIN_NCHANNELS", "16", 0);
  }
  KILN_LOG(kInfo, "nccl: no peer access between the 2 GPUs: NCCL runs "
                      << (overlapped ? "4 channels, its sums beside other work (NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=4"
                                     : "16 channels (NCCL_MIN_NCHANNELS=16")
                      << "; set them to choose otherwise)");
}

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm* comm, int rank, int size, NcclRank where,
                                   std::shared_ptr<NcclWorld> world)
    : comm_(comm), rank_(rank), size_(size), where_(where), world_(std::move(world)) {
  register_member(*world_, this);
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(world_->m);
    auto& m = world_->members;
    m.erase(std::remove(m.begin(), m.end(), this), m.end());
  }
  std::lock_guard<std::timed_mutex> lock(call_mu_);
  if (side_ != nullptr) {  // start_all_reduce's stream, drained (or its sums ended by an abort)
    cudaSetDevice(where_.device);
    if (comm_ != nullptr) cudaStreamSynchronize(side_);
    cudaStreamDestroy(side_);
    cudaEventDestroy(queued_);
    for (cudaEvent_t e : done_) cudaEventDestroy(e);
  }
  if (comm_ == nullptr) return;
  // Aborted, never destroyed: ncclCommDestroy of a rank that has communicated is
  // collective (it waits for its peers' destroy), so one thread destroying the ranks of
  // a group one after another waits forever. ncclCommAbort is local, but it too waits
  // for the CUDA graphs that captured the communicator's collectives to be destroyed
  // (their owner releases them first: ModelRunner). The rank's stream drains first, so
  // no queued work is cut off; an abort that still does not finish is reported and left
  // to the process's exit rather than hanging it (seen on 2 H100s with NCCL 2.28: `kiln
  // serve --tensor-parallel-size 2` not exiting after SIGTERM once a decode step had
  // been recorded).
  cudaSetDevice(where_.device);
  cudaStreamSynchronize(where_.stream);
  if (!abort_bounded(comm_, where_.device, rank_, kReleaseWait)) {
    KILN_LOG(kWarn, "nccl: rank " << rank_ << "'s communicator did not finish its release in "
                                  << kReleaseWait.count() / 1000 << " s (a CUDA graph that captured its "
                                  << "collectives still lives?); left to the process's exit");
  }
  comm_ = nullptr;
}

Result<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::create_group(
    const std::vector<NcclRank>& ranks, bool overlapped_sums) {
  const int n = int(ranks.size());
  if (n == 0) return invalid_argument("nccl: a group of no ranks");
  std::vector<int> devices;
  for (const NcclRank& r : ranks) {
    if (std::find(devices.begin(), devices.end(), r.device) != devices.end()) {
      return invalid_argument("nccl: device " + std::to_string(r.device) + " given to two ranks");
    }
    devices.push_back(r.device);
  }
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = 0;
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  channels_without_peer_access(devices, overlapped_sums);
  const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data());
  cudaSetDevice(previous);  // ncclCommInitAll leaves the last rank's device current
  if (r != ncclSuccess) {
    return internal_error("nccl: creating a group of " + std::to_string(n) + " GPUs: " + nccl_error(r, nullptr));
  }
  auto world = std::make_shared<NcclWorld>();
  std::vector<std::unique_ptr<PeerAllReduce>> peers = make_peer_group(devices);
  const bool no_peers = !PeerAllReduce::no_peer_access(devices).empty();
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comms[size_t(i)], i, n, ranks[size_t(i)],
                                                                         world)));
    if (!peers.empty()) out.back()->peer_ = std::move(peers[size_t(i)]);
    out.back()->no_peer_access_ = no_peers;
  }
  KILN_LOG(kInfo, "nccl: group of " << n << " GPUs (NCCL " << NCCL_MAJOR << "." << NCCL_MINOR << "." << NCCL_PATCH
                                     << ")");
  return out;
}

Result<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::split_group(
    const std::vector<NcclCommunicator*>& world, const std::vector<int>& colors) {
  const size_t n = world.size();
  if (n == 0 || colors.size() != n) {
    return invalid_argument("nccl: split of " + std::to_string(n) + " ranks with " + std::to_string(colors.size()) +
                            " colors");
  }
  for (size_t i = 0; i < n; ++i) {
    KILN_CHECK(world[i] != nullptr && world[i]->rank() == int(i) && world[i]->size() == int(n) &&
               world[i]->world_ == world[0]->world_)
        << "nccl split: entry " << i << " is not rank " << i << " of one group of " << n;
  }
  if (world[0]->world_->failed.load()) return internal_error("nccl: split of an aborted group");
  // ncclCommSplit is collective and blocks until every rank has called it: one thread
  // per rank.
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<ncclResult_t> results(n, ncclSuccess);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      NcclCommunicator& c = *world[i];
      std::lock_guard<std::timed_mutex> lock(c.call_mu_);
      if (c.comm_ == nullptr) {
        results[i] = ncclInvalidUsage;
        return;
      }
      cudaSetDevice(c.device());
      const int color = colors[i] < 0 ? NCCL_SPLIT_NOCOLOR : colors[i];
      results[i] = ncclCommSplit(c.comm_, color, int(i), &comms[i], nullptr);
    });
  }
  for (std::thread& t : threads) t.join();
  std::string error;
  for (size_t i = 0; i < n; ++i) {
    if (results[i] != ncclSuccess && error.empty()) {
      error = "nccl: splitting rank " + std::to_string(i) + ": " + nccl_error(results[i], world[i]->comm_);
    }
  }
  if (!error.empty()) {
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommAbort(c);
    return internal_error(error);
  }
  std::vector<std::unique_ptr<NcclCommunicator>> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (comms[i] == nullptr) continue;  // no color
    int rank = 0, size = 0;
    ncclCommUserRank(comms[i], &rank);
    ncclCommCount(comms[i], &size);
    out[i] = std::unique_ptr<NcclCommunicator>(
        new NcclCommunicator(comms[i], rank, size, world[i]->where_, world[i]->world_));
  }
  // Each sub-group's one-shot all-reduce, over its members' GPUs in sub-group rank order.
  std::vector<int> done;
  for (size_t i = 0; i < n; ++i) {
    if (out[i] == nullptr || std::find(done.begin(), done.end(), colors[i]) != done.end()) continue;
    done.push_back(colors[i]);
    std::vector<NcclCommunicator*> members(size_t(out[i]->size()), nullptr);
    for (size_t j = 0; j < n; ++j)
      if (out[j] != nullptr && colors[j] == colors[i]) members[size_t(out[j]->rank())] = out[j].get();
    std::vector<int> devices;
    for (NcclCommunicator* m : members) devices.push_back(m->device());
    std::vector<std::unique_ptr<PeerAllReduce>> peers = make_peer_group(devices);
    for (size_t k = 0; k < peers.size(); ++k) members[k]->peer_ = std::move(peers[k]);
    const bool no_peers = !PeerAllReduce::no_peer_access(devices).empty();
    for (NcclCommunicator* m : members) m->no_peer_access_ = no_peers;
  }
  return out;
}

void NcclCommunicator::abort_locked() {
  if (comm_ == nullptr) return;
  // Not waited for past kAbortWait: the kernels stop at once, the release may wait for
  // the recorded steps (see abort_bounded).
  abort_bounded(comm_, where_.device, rank_, kAbortWait);
  comm_ = nullptr;
}

void NcclCommunicator::abort(const std::string& reason) {
  // Lock order: the world, then a member's call_mu_ (run() never takes the world's
  // lock while holding its own).
  std::lock_guard<std::mutex> lock(world_->m);
  if (!world_->failed.load()) {
    world_->reason = reason;
    world_->failed.store(true);
    KILN_LOG(kWarn, "nccl: rank " << rank_ << " of " << size_ << " aborts its group: " << reason);
  }
  // Kernels of a one-shot all-reduce waiting for a peer end first (they hold no lock).
  for (NcclCommunicator* c : world_->members)
    if (c->peer_ != nullptr) c->peer_->abort();
  for (NcclCommunicator* c : world_->members) {
    std::unique_lock<std::timed_mutex> member(c->call_mu_, std::defer_lock);
    if (member.try_lock_for(kAbortWait)) {
      c->abort_locked();
    } else {
      KILN_LOG(kWarn, "nccl: rank " << c->rank_ << " is inside an NCCL call; it aborts when the call returns");
    }
  }
}

void NcclCommunicator::raise_aborted() const {
  std::lock_guard<std::mutex> lock(world_->m);
  throw CommAborted("communicator group aborted: " + world_->reason);
}

template <typename F>
void NcclCommunicator::run(const char* what, F&& call) {
  std::string error;
  {
    std::lock_guard<std::timed_mutex> lock(call_mu_);
    if (world_->failed.load() || comm_ == nullptr) {
      abort_locked();
    } else {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress) r = async;
      if (r == ncclSuccess) r = call(comm_);
      if (r == ncclSuccess) {
        if (!world_->failed.load()) return;
        abort_locked();  // aborted while this call ran: its work may never complete
      } else {
        error = std::string(what) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
                nccl_error(r, comm_);
      }
    }
  }
  if (!error.empty()) abort(error);
  raise_aborted();
}

void NcclCommunicator::check(const Tensor& t, const char* what) const {
  KILN_CHECK(t.defined() && t.device == Device::kCuda && t.device_index == where_.device)
      << what << ": NCCL rank " << rank_ << " takes tensors on its device " << where_.device;
}

size_t NcclCommunicator::one_shot_max_bytes() const { return peer_ == nullptr ? 0 : peer_->max_bytes(); }

void NcclCommunicator::all_reduce(Tensor& t) {
  if (world_->failed.load()) raise_aborted();  // (a step cut short by the abort left sums unfinished)
  KILN_CHECK_EQ(started_, finished_) << "all_reduce on rank " << rank_ << " while a started sum is unfinished";
  sum_on(t, where_.stream);
}

void NcclCommunicator::sum_on(Tensor& t, cudaStream_t stream) {
  check(t, "all_reduce");
  const ncclDataType_t type = sum_type(t, "all_reduce");
  const size_t n = size_t(t.numel());
  const bool f32 = t.dtype == DType::kF32;
  if (peer_ != nullptr && peer_->takes(t.data, int64_t(n), f32)) {
    if (world_->failed.load()) raise_aborted();
    const cudaError_t e = peer_->all_reduce(t.data, int64_t(n), f32, stream);
    if (e == cudaSuccess) return;
    abort("one-shot all_reduce on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
          cudaGetErrorString(e));
    raise_aborted();
  }
  run("all_reduce", [&](ncclComm_t c) { return ncclAllReduce(t.data, t.data, n, type, ncclSum, c, stream); });
}

int NcclCommunicator::start_all_reduce(Tensor& t) {
  KILN_CHECK_LT(started_ - finished_, kMaxStartedSums) << "start_all_reduce: too many unfinished sums";
  const auto cuda = [&](cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    abort(std::string("start_all_reduce on rank ") + std::to_string(rank_) + ": " + what + ": " +
          cudaGetErrorString(e));
    raise_aborted();
  };
  if (side_ == nullptr) {  // on the rank's device (its thread's current one)
    int lowest = 0, highest = 0;
    cuda(cudaDeviceGetStreamPriorityRange(&lowest, &highest), "stream priorities");
    cuda(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, highest), "a sum stream");
    cuda(cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming), "an event");
    for (cudaEvent_t& e : done_) cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "an event");
  }
  cuda(cudaEventRecord(queued_, where_.stream), "event record");
  cuda(cudaStreamWaitEvent(side_, queued_, 0), "stream wait");
  sum_on(t, side_);
  const int ticket = started_++;
  cuda(cudaEventRecord(done_[ticket % kMaxStartedSums], side_), "event record");
  return ticket;
}

void NcclCommunicator::finish_all_reduce(int ticket) {
  KILN_CHECK(ticket >= finished_ && ticket < started_) << "finish_all_reduce: ticket " << ticket << " of ["
                                                      << finished_ << ", " << started_ << ")";
  const cudaError_t e = cudaStreamWaitEvent(where_.stream, done_[ticket % kMaxStartedSums], 0);
  if (e != cudaSuccess) {
    abort("finish_all_reduce on rank " + std::to_string(rank_) + ": " + cudaGetErrorString(e));
    raise_aborted();
  }
  finished_ = ticket + 1;
  if (finished_ == started_) started_ = finished_ = 0;  // no ticket out: count afresh
}

bool NcclCommunicator::all_reduce_add_rms_norm(Tensor& t, Tensor& residual, const Tensor& weight, Tensor& out,
                                               float eps) {
  if (peer_ == nullptr || t.dtype != DType::kBF16 || t.rank() != 2 || residual.dtype != DType::kBF16 ||
      out.dtype != DType::kBF16 || weight.dtype != DType::kF32 || !(residual.shape == t.shape) ||
      !(out.shape == t.shape) || weight.numel() != t.dim(1))
    return false;
  const PeerAllReduce::AddRmsNorm norm{
      .residual = residual.data, .weight = static_cast<const float*>(weight.data), .out = out.data,
      .rows = t.dim(0), .dim = t.dim(1), .eps = eps};
  if (!peer_->takes(t.data, norm)) return false;
  check(t, "all_reduce_add_rms_norm");
  check(residual, "all_reduce_add_rms_norm residual");
  check(out, "all_reduce_add_rms_norm out");
  check(weight, "all_reduce_add_rms_norm weight");
  if (world_->failed.load()) raise_aborted();
  KILN_CHECK_EQ(started_, finished_) << "all_reduce_add_rms_norm on rank " << rank_
                                     << " while a started sum is unfinished";
  const cudaError_t e = peer_->all_reduce(t.data, t.numel(), false, where_.stream, &norm);
  if (e == cudaSuccess) return true;
  abort("one-shot all_reduce_add_rms_norm on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
        cudaGetErrorString(e));
  raise_aborted();
}

void NcclCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check(in, "all_gather in");
  check(out, "all_gather out");
  KILN_CHECK(in.dtype == out.dtype && out.numel() == in.numel() * size_)
      << "all_gather: out " << out.shape << " vs " << size_ << " x in " << in.shape;
  const size_t bytes = in.nbytes();
  run("all_gather", [&](ncclComm_t c) { return ncclAllGather(in.data, out.data, bytes, ncclUint8, c, where_.stream); });
}

void NcclCommunicator::reduce_scatter(const Tensor& in, Tensor& out) {
  check(in, "reduce_scatter in");
  check(out, "reduce_scatter out");
  KILN_CHECK(in.dtype == out.dtype && in.numel() == out.numel() * size_)
      << "reduce_scatter: in " << in.shape << " vs " << size_ << " x out " << out.shape;
  const ncclDataType_t type = sum_type(in, "reduce_scatter");
  const size_t n = size_t(out.numel());
  run("reduce_scatter",
      [&](ncclComm_t c) { return ncclReduceScatter(in.data, out.data, n, type, ncclSum, c, where_.stream); });
}

void NcclCommunicator::all_to_all(const Tensor& in, Tensor& out) {
  check(in, "all_to_all in");
  check(out, "all_to_all out");
  KILN_CHECK(in.dtype == out.dtype && in.numel() == out.numel() && in.numel() % size_ == 0)
      << "all_to_all: in " << in.shape << " out " << out.shape << " over " << size_ << " ranks";
  const size_t chunk = in.nbytes() / size_t(size_);
  const auto* src = static_cast<const uint8_t*>(in.data);
  auto* dst = static_cast<uint8_t*>(out.data);
  run("all_to_all", [&](ncclComm_t c) {
    // One group: every send and recv of the exchange, this rank's own chunk included.
    ncclResult_t r = ncclGroupStart();
    for (int j = 0; j < size_ && r == ncclSuccess; ++j) {
      r = ncclSend(src + size_t(j) * chunk, chunk, ncclUint8, j, c, where_.stream);
      if (r == ncclSuccess) r = ncclRecv(dst + size_t(j) * chunk, chunk, ncclUint8, j, c, where_.stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

void NcclCommunicator::broadcast(Tensor& t, int root) {
  check(t, "broadcast");
  KILN_CHECK(root >= 0 && root < size_) << "broadcast: root " << root << " of " << size_;
  const size_t bytes = t.nbytes();
  run("broadcast",
      [&](ncclComm_t c) { return ncclBroadcast(t.data, t.data, bytes, ncclUint8, root, c, where_.stream); });
}

void NcclCommunicator::send(const Tensor& t, int peer) {
  check(t, "send");
  KILN_CHECK(peer >= 0 && peer < size_ && peer != rank_) << "send: peer " << peer << " from rank " << rank_;
  const size_t bytes = t.nbytes();
  run("send", [&](ncclComm_t c) { return ncclSend(t.data, bytes, ncclUint8, peer, c, where_.stream); });
}

void NcclCommunicator::recv(Tensor& t, int peer) {
  check(t, "recv");
  KILN_CHECK(peer >= 0 && peer < size_ && peer != rank_) << "recv: peer " << peer << " at rank " << rank_;
  const size_t bytes = t.nbytes();
  run("recv", [&](ncclComm_t c) { return ncclRecv(t.data, bytes, ncclUint8, peer, c, where_.stream); });
}

}  // namespace kiln::comm
