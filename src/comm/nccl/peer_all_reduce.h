// PeerAllReduce: the one-shot all-reduce of a group of GPUs of this process over peer
// memory, for the small messages of decode steps, where NCCL's ring pays its latency
// (several hops and a kernel of its own) for a few kilobytes. The NCCL communicator
// sends a sum this way when the group has peer access between every pair of GPUs and
// the message is at most `max_bytes`; larger ones go to NCCL (the crossover: bench/
// comm_bench, docs/PERF.md).
//
// How. Ranks are threads of one process, so every rank's device pointers are valid on
// every other GPU once peer access is enabled: no IPC handles. One kernel per rank and
// call, on the rank's stream (so it records into CUDA graphs like any kernel):
//   1. each block copies its part of the rank's tensor into the rank's staging buffer;
//   2. it tells the same block of every peer it is there (a flag written into the
//      peer's memory, with release semantics at system scope) and waits until every
//      peer's block has said the same;
//   3. it sums its part of every rank's staging buffer, in fp32 and in rank order
//      0..size-1, and writes the sum over the tensor (bf16: rounded once, to nearest
//      even). Every rank gets the same bits, the Communicator contract's sum (what the
//      CPU's LocalGroup computes), unlike NCCL's ring of bf16 additions.
// The flags carry a call count kept in device memory (so a replayed graph counts on),
// and the staging buffer alternates between two halves by its parity: a block can be at
// most one call ahead of its peers (it cannot pass call e + 1's flags until every peer's
// block has finished reading call e), so it never overwrites a half a peer still reads.
// Every element belongs to one fixed block whatever the message size (a fixed grid),
// which keeps that argument true across calls of different sizes.
//
// Failure: a peer that never arrives would leave the others waiting in step 2 forever;
// abort() raises a flag in mapped host memory that the waiting blocks poll, so their
// kernels end (with a meaningless sum; the group has failed anyway) and a stream
// synchronize returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace kiln::comm {

class PeerAllReduce {
 public:
  static constexpr int kMaxRanks = 8;
  // The largest message the staging buffers take (each rank holds two halves of it).
  static constexpr size_t kCapacity = size_t(4) << 20;
  // The largest message sent this way by default, from the crossover against NCCL
  // measured by bench/comm_bench on 4 H200 SXM over NVLink (docs/PERF.md): at 2 ranks
  // the one-shot sum is faster up to the whole capacity (0.6-0.97x NCCL's time), at 4
  // up to 512 KiB (0.64-0.92x) and slower from 1 MiB (1.0-1.3x), where each rank reads
  // three peers' whole messages while NCCL's ring moves 1.5x the message per link.
  // KILN_ONESHOT_MAX_BYTES overrides it (0 turns the path off).
  static size_t default_max_bytes(int ranks) { return ranks <= 2 ? kCapacity : size_t(512) << 10; }

  // One object per rank of a group of GPUs (rank r on devices[r]), sharing each other's
  // buffers; empty, with the reason in *why_not, where the path is not taken: fewer than
  // 2 or more than kMaxRanks ranks, a pair of GPUs without peer access, NCCL_P2P_DISABLE
  // set (the user asked for no peer-to-peer traffic), KILN_ONESHOT_MAX_BYTES=0, or an
  // allocation that failed. Called from one thread; leaves the current device as it was.
  static std::vector<std::unique_ptr<PeerAllReduce>> create_group(const std::vector<int>& devices,
                                                                  std::string* why_not);

  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  size_t max_bytes() const;
  // Whether a sum of n elements (f32, or else bf16) at `data` goes this way: at most
  // max_bytes, and `data` aligned to 16 bytes.
  bool takes(const void* data, int64_t n, bool f32) const;
  // data = the sum over ranks of data (n elements, f32 or bf16, in place), enqueued on
  // `stream`; every rank of the group makes the same calls in the same order. Returns
  // the launch's error.
  cudaError_t all_reduce(void* data, int64_t n, bool f32, cudaStream_t stream);
  // Ends every kernel of the group waiting for a peer, now and later (see above).
  void abort();

  struct Shared;  // peer_all_reduce.cpp: every rank's buffers, freed with the last rank

 private:
  PeerAllReduce(std::shared_ptr<Shared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}
  std::shared_ptr<Shared> shared_;
  int rank_ = 0;
};

// The kernel's view of one call (peer_all_reduce.cu).
struct PeerReduceLaunch {
  void* staging[PeerAllReduce::kMaxRanks];   // every rank's 2 x capacity bytes
  uint32_t* flags[PeerAllReduce::kMaxRanks];  // every rank's [blocks][kMaxRanks] arrivals
  uint32_t* counters;                         // this rank's calls so far, per block
  const volatile int* abort;                  // mapped host memory: non-zero after abort()
  void* data;
  int64_t n;
  size_t capacity;
  int rank, size;
  bool f32;
};
// Blocks of the fixed grid, and the launch.
inline constexpr int kPeerReduceBlocks = 32;
cudaError_t launch_peer_all_reduce(const PeerReduceLaunch& l, cudaStream_t stream);

}  // namespace kiln::comm
