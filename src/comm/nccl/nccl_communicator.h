// NcclCommunicator: one rank of a group of GPUs in this process, over NCCL. Built
// (library kiln_comm_nccl, KILN_HAVE_NCCL=1) only when CMake finds NCCL; it lives in
// its own directory so the generic comm layer builds without it.
//
// Each rank is one GPU and one CUDA stream, the stream the rank's backend queues its
// ops on (cuda::stream_of): a collective is enqueued on that stream after the work
// before it and returns at once, with no host synchronization, so it may be recorded
// into a CUDA graph (run it eagerly once first: NCCL connects peers lazily, on the
// first collective that needs them). Every rank calls the same collectives in the same
// order from its own thread (NCCL calls on one communicator never overlap in time;
// ranks of one group on one thread would deadlock at the first collective).
//
// Differences from the Communicator contract (communicator.h):
// - Sums: an all_reduce of at most PeerAllReduce's max_bytes (the decode steps' small
//   messages) goes to the one-shot all-reduce over peer memory (peer_all_reduce.h)
//   where every pair of the group's GPUs has peer access: it adds in fp32 in rank order
//   as the contract says. Larger ones, and every sum of a group without peer access,
//   go to NCCL, which adds in the tensor's dtype in the order of its ring / tree
//   algorithm: a bf16 all_reduce rounds to bf16 after every step of the reduction
//   (size - 1 roundings per element on a ring), where LocalGroup rounds the fp32 sum
//   once. All ranks still get the same bits either way. reduce_scatter is NCCL's.
//   all_reduce_add_rms_norm is fused on the one-shot path only. Without peer access
//   between 2 GPUs NCCL is given 16 channels, or 4 where sums overlap other work
//   (NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS, unless set; the .cpp says why).
// - send is asynchronous on the host, as the contract allows, but NCCL's send kernel
//   holds the sender's stream until the peer's recv has started: work queued after a
//   send waits for the peer.
// - abort(reason) marks the whole world failed (the group, every group split from it
//   and the world it was split from share one failure state) and calls ncclCommAbort
//   on every communicator of it, which ends NCCL kernels waiting on a dead peer, so a
//   rank blocked in a stream synchronize wakes up; every later collective on any of
//   them throws CommAborted naming the reason. A rank that is inside an NCCL call at
//   that moment (only a first collective's connection setup waits for peers on the
//   host) aborts its own communicator when the call returns. CUDA graphs that recorded
//   collectives of an aborted communicator must not be replayed.
// - The destructor drains the rank's stream and aborts its communicator (ncclCommAbort)
//   instead of ncclCommDestroy, which waits for every peer's destroy and so hangs when
//   one thread releases the ranks of a group one after another. Both wait until every
//   CUDA graph that captured one of the communicator's collectives is destroyed: release
//   those first (ops::Backend::release_step_memory); an abort still waiting after
//   kReleaseWait is logged and left to the process's exit instead of hanging it.
// - Any NCCL error (including an asynchronous one, ncclCommGetAsyncError) aborts the
//   world the same way and throws CommAborted with ncclGetErrorString and
//   ncclGetLastError.
//
// Tensors: CUDA device memory on the rank's device, contiguous; sums take f32 or bf16,
// the other collectives any dtype (moved as bytes).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include <cuda_runtime_api.h>

#include "comm/communicator.h"
#include "core/status.h"

struct ncclComm;  // nccl.h's ncclComm_t is ncclComm*

namespace kiln::comm {

class PeerAllReduce;
struct NcclWorld;  // nccl_communicator.cpp: the failure state a world and its splits share

// Where one rank runs: its GPU and the stream its collectives are enqueued on.
struct NcclRank {
  int device = 0;
  cudaStream_t stream = nullptr;
};

class NcclCommunicator final : public Communicator {
 public:
  // How long abort waits for a rank's NCCL call in progress before leaving that rank's
  // communicator to the rank itself (see above).
  static constexpr std::chrono::milliseconds kAbortWait{500};
  // How long the destructor waits for its communicator's release (see above).
  static constexpr std::chrono::milliseconds kReleaseWait{10000};

  // The communicators of a group of ranks.size() ranks of this process (rank r on
  // ranks[r].device; the devices distinct), made together (ncclCommInitAll) from one
  // thread, each then handed to its rank's thread.
  // overlapped_sums: the caller runs large sums beside other work (start_all_reduce: a
  // model's micro-batches), which sets how many channels NCCL runs without peer access (the
  // .cpp says why).
  static Result<std::vector<std::unique_ptr<NcclCommunicator>>> create_group(const std::vector<NcclRank>& ranks,
                                                                             bool overlapped_sums = false);
  // Sub-groups of a group (ncclCommSplit), e.g. the tensor-parallel groups of a world:
  // world[r] joins the sub-group of colors[r] (color < 0: none, its entry is null),
  // ranked by world rank, on world[r]'s device and stream. Called once from one thread
  // for every rank of the group (each rank's split runs on a thread of its own inside),
  // while no rank uses the group. The sub-groups share the world's failure state.
  static Result<std::vector<std::unique_ptr<NcclCommunicator>>> split_group(
      const std::vector<NcclCommunicator*>& world, const std::vector<int>& colors);

  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  int device() const { return where_.device; }
  cudaStream_t stream() const { return where_.stream; }
  // The largest all_reduce that takes the one-shot path (0: none does).
  size_t one_shot_max_bytes() const;

  void all_reduce(Tensor& t) override;
  // On a second stream of the rank's device (highest priority, so that the sum's kernels
  // get SMs as soon as the compute stream's free any), fenced by events.
  int start_all_reduce(Tensor& t) override;
  void finish_all_reduce(int ticket) override;
  // Where some pair of the group's GPUs has no peer access (NCCL moves sums through host memory).
  bool overlap_pays() const override { return no_peer_access_; }
  // Fused where the one-shot path takes the sum (PeerAllReduce::takes with its norm).
  bool all_reduce_add_rms_norm(Tensor& t, Tensor& residual, const Tensor& weight, Tensor& out, float eps) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter(const Tensor& in, Tensor& out) override;
  void all_to_all(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void send(const Tensor& t, int peer) override;
  void recv(Tensor& t, int peer) override;
  void abort(const std::string& reason) override;

 private:
  NcclCommunicator(ncclComm* comm, int rank, int size, NcclRank where, std::shared_ptr<NcclWorld> world);
  // Runs one NCCL call (or group) on this rank's communicator under call_mu_; any
  // failure, or the world's, throws CommAborted.
  template <typename F>
  void run(const char* what, F&& call);
  [[noreturn]] void raise_aborted() const;
  void check(const Tensor& t, const char* what) const;
  // ncclCommAbort of this communicator if it is still live; the caller holds call_mu_.
  void abort_locked();

  std::timed_mutex call_mu_;  // held across every NCCL call on comm_
  ncclComm* comm_ = nullptr;  // null once aborted
  int rank_ = 0, size_ = 0;
  NcclRank where_;
  std::shared_ptr<NcclWorld> world_;
  std::unique_ptr<PeerAllReduce> peer_;  // null: every sum goes to NCCL
  bool no_peer_access_ = false;
  // start_all_reduce's stream and events (made at its first call): `queued_` marks the
  // compute stream's work before a started sum, done_[ticket % kMaxStartedSums] its end.
  cudaStream_t side_ = nullptr;
  cudaEvent_t queued_ = nullptr;
  cudaEvent_t done_[kMaxStartedSums] = {};
  int started_ = 0, finished_ = 0;  // tickets given out; every ticket below finished_ has been finished
  // all_reduce's work on `stream` (this rank's or side_).
  void sum_on(Tensor& t, cudaStream_t stream);
};

}  // namespace kiln::comm
