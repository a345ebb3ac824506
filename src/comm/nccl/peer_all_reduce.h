// PeerAllReduce: the one-shot all-reduce of a group of GPUs of this process over peer
// memory, for the small messages of decode steps, where NCCL's ring pays its latency
// (several hops and a kernel of its own) for a few kilobytes. The NCCL communicator
// sends a sum this way when the group has peer access between every pair of GPUs and
// the message is at most `max_bytes`; larger ones go to NCCL (the crossover: bench/
// comm_bench, docs/PERF.md).
//
// How. Ranks are threads of one process, so every rank's device pointers are valid on
// every other GPU once peer access is enabled: no IPC handles. One kernel per rank and
// call, on the rank's stream (so it records into CUDA graphs like any kernel), in the
// "push" form that costs one trip over the link (TensorRT-LLM's Lamport all-reduce):
//   1. each thread writes its 16-byte vectors of the rank's tensor straight into every
//      peer's receive buffer, into the slot of this rank (its own vectors it reads from
//      the tensor in step 2: nothing is sent to itself, which host staging would move
//      over the bus both ways);
//   2. it then reads its vectors of every peer's slot of its own receive buffer,
//      waiting on each until no element holds the "empty" pattern (remote stores
//      arrive in any order, so every element is checked: a 16-byte store may land in
//      parts; after 64 polls a waiting thread sleeps ~1 us between polls, so that a
//      rank far ahead of its peer does not flood its memory with loads), and puts the
//      pattern back once read;
//   3. it sums the slots in fp32 in rank order 0..size-1 and writes the sum over the
//      tensor (bf16: rounded once, to nearest even). Every rank gets the same bits, the
//      Communicator contract's sum (what the CPU's LocalGroup computes), unlike NCCL's
//      ring of bf16 additions.
// The empty pattern is the 32-bit word 0x80008000: two bf16 negative zeros, or one f32
// subnormal. A sender writes +0 for a bf16 -0 and -0 for that f32 value (which changes
// a sum by at most 4.6e-41, and the sign of an all-negative-zero sum), so real data is
// never mistaken for "not arrived".
// Receive buffers alternate between two halves by the parity of a call count kept in
// device memory (a replayed graph counts on; the last block of a call advances it). A
// rank writes half h of call e + 2 into a peer only after that peer's call e + 1 data
// reached it, which the peer sent after it finished reading half h in call e: a half is
// never written while its owner still reads it.
//
// Fused form (all_reduce with an AddRmsNorm): rows of `dim` bf16 values, a block per
// row; after the sum the block adds it into the residual stream and writes
// rms_norm(residual) x weight, as the CUDA backend's rms_norm with a residual does
// (the sum rounded to bf16, residual = bf16(residual + sum), fp32 norm): the layer's
// all-reduce, residual add and next norm in one launch.
//
// Host staging: where GPUs have no peer access (consumer cards over PCIe, or
// NCCL_P2P_DISABLE), the receive buffers can live in mapped host memory instead (by
// default at 2 ranks; KILN_ONESHOT_HOST; Staging): the same kernel, every store and poll
// crossing the GPU's bus. A GPU's posted writes reach host memory in the order it issued
// them, so the argument above holds: a receiver's emptying of a half lands before the
// data of its next call, which a sender sees before it writes that half again.
//
// Launched as a programmatic dependent launch where the CUDA backend's kernels are
// (pdl.cuh: SM 9.0+ and KILN_PDL not 0), so its start overlaps the end of the kernel
// before it and the next kernel's start overlaps it.
//
// Failure: a peer that never arrives would leave the others waiting in step 2 forever;
// abort() raises a flag in mapped host memory that the waiting threads poll, so their
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
  // The largest message the receive buffers take (each rank holds two halves of a slot
  // per rank, each slot the group's max_bytes): a 2,048-token prefill chunk at d_model
  // 2,048 (8 MiB; 32 MiB of buffers a rank at 2 ranks).
  static constexpr size_t kCapacity = size_t(8) << 20;
  // The widest row the fused form takes (bf16 values).
  static constexpr int64_t kMaxNormDim = 8192;
  // The largest message sent this way by default, from the crossover against NCCL
  // measured by bench/comm_bench on H200 SXM over NVLink (docs/perf/multi-gpu.md): at 2
  // ranks the one-shot sum is faster up to the whole capacity (0.37-0.57x NCCL's time up
  // to 3.5 MiB, 0.85-0.91x at 7-8 MiB, where the fused form also saves the separate add
  // and norm: Qwen3-30B-A3B's steps with a 2,048-token prefill chunk 6% faster at TP2
  // than with a 4 MiB capacity), at 4 up to 512 KiB (0.64-0.92x) and slower from 1 MiB
  // (1.0-1.3x), where each rank reads three peers' whole messages while NCCL's ring
  // moves 1.5x the message per link.
  // KILN_ONESHOT_MAX_BYTES overrides it (0 turns the path off).
  static size_t default_max_bytes(int ranks) { return ranks <= 2 ? kCapacity : size_t(512) << 10; }
  // Staged through host memory (below): the largest message by default (2 x H200 with
  // NCCL_P2P_DISABLE=1 against NCCL on the 16 channels kiln gives it there, since a
  // rank's own slot is no longer sent over its bus: 0.30-0.57x NCCL's time up to 256 KiB,
  // 0.58-0.63x at 448-512 KiB, 0.85-0.89x at 0.9-1 MiB, 0.96-1.01x at 1.8-2 MiB, 1.15x
  // at 3.5 MiB; a form with a flag per block instead of the empty pattern's second write
  // was slower at every size: docs/perf/multi-gpu.md, seventeenth section).
  static constexpr size_t kHostMaxBytes = size_t(1) << 20;
  // The empty pattern a receive buffer is filled with (a 32-bit word).
  static constexpr uint32_t kEmptyWord = 0x80008000u;

  // Where the receive buffers live. kAuto: in each GPU's memory where every pair of the
  // group's GPUs has peer access and NCCL_P2P_DISABLE is unset; else in mapped host
  // memory that every GPU writes and reads over its bus (the consumer cards' case: no
  // P2P) at 2 ranks, or where KILN_ONESHOT_HOST=1 asks (KILN_ONESHOT_HOST=0: never);
  // else no one-shot path. kHost: host memory
  // whatever the GPUs can do (tests; a group may then name one GPU twice).
  enum class Staging { kAuto, kHost };
  // Why the GPUs of `devices` cannot reach each other's memory directly
  // (NCCL_P2P_DISABLE set and not 0, or the first pair without peer access); empty where
  // every pair can. The same answer decides kAuto and NCCL's channels (the communicator).
  static std::string no_peer_access(const std::vector<int>& devices);
  // One object per rank of a group of GPUs (rank r on devices[r]), sharing each other's
  // buffers; empty, with the reason in *why_not, where the path is not taken: fewer than
  // 2 or more than kMaxRanks ranks, no peer access (above), KILN_ONESHOT_MAX_BYTES=0, or an
  // allocation that failed. Called from one thread; leaves the current device as it was.
  static std::vector<std::unique_ptr<PeerAllReduce>> create_group(const std::vector<int>& devices,
                                                                  std::string* why_not,
                                                                  Staging staging = Staging::kAuto);

  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  size_t max_bytes() const;
  // Whether the receive buffers are in host memory (Staging).
  bool host_staged() const;
  // Whether a sum of n elements (f32, or else bf16) at `data` goes this way: at most
  // max_bytes, and `data` aligned to 16 bytes.
  bool takes(const void* data, int64_t n, bool f32) const;
  // After the sum of `rows` x `dim` bf16 values: residual += sum (bf16 [rows, dim]), then
  // out = rms_norm(residual) x weight (fp32 [dim]), out bf16 [rows, dim].
  struct AddRmsNorm {
    void* residual = nullptr;
    const float* weight = nullptr;
    void* out = nullptr;
    int64_t rows = 0, dim = 0;
    float eps = 1e-6f;
  };
  // Whether the fused form takes it: takes() for the bf16 sum, dim a multiple of 8 up to
  // kMaxNormDim, every pointer aligned to 16 bytes.
  bool takes(const void* data, const AddRmsNorm& norm) const;
  // data = the sum over ranks of data (n elements, f32 or bf16, in place), then with
  // `norm` its add and norm (bf16 only; n = rows x dim), enqueued on `stream`; every
  // rank of the group makes the same calls in the same order. Returns the launch's error.
  cudaError_t all_reduce(void* data, int64_t n, bool f32, cudaStream_t stream, const AddRmsNorm* norm = nullptr);
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
  void* receive[PeerAllReduce::kMaxRanks];  // every rank's [2 halves][size slots][slot bytes]
  uint32_t* state;                          // this rank's {calls so far, blocks done in this call}
  const volatile int* abort;                // mapped host memory: non-zero after abort()
  void* data;
  int64_t n;
  size_t slot_bytes;
  int rank, size;
  bool f32;
  PeerAllReduce::AddRmsNorm norm;  // rows == 0: a plain sum
  // Launched as a programmatic dependent launch (SM 9.0+, KILN_PDL not 0, as the CUDA
  // backend's decode kernels): it may be scheduled while the kernel before it ends, and
  // waits for it before anything else; the kernel after it may be scheduled once it has.
  bool dependent_launch;
};
cudaError_t launch_peer_all_reduce(const PeerReduceLaunch& l, cudaStream_t stream);
// Loads the kernels on the current device now: with CUDA's lazy loading a kernel's first
// launch may wait for the device to go idle, which a sum waiting for its peers never does.
cudaError_t load_peer_reduce_kernels();
// Fills `words` 32-bit words at `p` with the empty pattern (on `stream`).
cudaError_t launch_peer_reduce_clear(void* p, size_t words, cudaStream_t stream);

}  // namespace kiln::comm
