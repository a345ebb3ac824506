// Communicator: the collectives one rank of a group of ranks (GPUs, or CPU backends
// in tests) runs with the others, over the tensors of its backend.
//
// Every rank of the group calls the same collectives in the same order with tensors of
// the same shape and dtype (f32 or bf16, contiguous); a collective returns when this
// rank's part is done (a GPU implementation: when it is enqueued on the rank's stream,
// ordered after the work before it). Sums are taken in fp32 in rank order 0..size-1,
// so every rank gets the same bits.
//
// Implementations: LocalGroup (local_group.h: ranks are threads of one process, tensors
// in host memory; the CPU backend and the tests) and NCCL (nccl/nccl_communicator.h:
// one thread per GPU in one process, built when NCCL is found).
//
// Failure: a rank that fails calls abort(reason); every rank blocked in a collective
// of the group, or entering one later, gets a CommAborted exception naming the reason,
// so a dead rank stops the others instead of hanging them.
#pragma once

#include <stdexcept>
#include <string>

#include "core/tensor.h"

namespace kiln::comm {

struct CommAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A name for logs ("local", "nccl").
  virtual std::string name() const = 0;

  // t = sum over ranks of t (in place).
  virtual void all_reduce(Tensor& t) = 0;
  // A layer's sum and what follows it, in one call where the implementation fuses them:
  // t = sum over ranks of t, residual += t, out = rms_norm(residual) x weight (bf16 t,
  // residual and out [rows, dim], fp32 weight [dim]; the GPU backend's rms_norm with a
  // residual). Returns false, having done nothing, where it does not fuse them (the
  // default): the caller then runs all_reduce and its backend's rms_norm. Every rank
  // makes the same call and gets the same answer for it.
  virtual bool all_reduce_add_rms_norm(Tensor& t, Tensor& residual, const Tensor& weight, Tensor& out, float eps) {
    return false;
  }
  // A sum that runs beside the caller's next work (micro-batches: model::CausalLM::
  // micro_batch_rows): start_all_reduce(t) begins t = sum over ranks of t, after the work
  // queued so far, and returns a ticket; finish_all_reduce(ticket) orders the work queued
  // after it behind that sum (and every sum started before it). In between the caller
  // neither reads nor writes t, and at most kMaxStartedSums are unfinished. Every rank
  // starts and finishes the same sums in the same order, and runs no other collective of
  // this group while one is unfinished. The default sums at once; a GPU group runs the sum
  // on a stream of its own.
  static constexpr int kMaxStartedSums = 4;
  virtual int start_all_reduce(Tensor& t) {
    all_reduce(t);
    return 0;
  }
  virtual void finish_all_reduce(int ticket) {}
  // Whether running large sums beside other work pays here: a GPU group whose sums
  // cross the host's bus (no peer access). The default (and a group whose sums run
  // in the caller's own time, as LocalGroup's do): false.
  virtual bool overlap_pays() const { return false; }
  // out [size * n] (flat) = every rank's `in` [n], in rank order.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // out [n] = sum over ranks r of r's in[rank * n, (rank + 1) * n) (in: [size * n], flat).
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  // in, out [size * n] (flat): this rank's in[j * n, (j + 1) * n) goes to rank j, and
  // out[j * n, (j + 1) * n) is what rank j sent here.
  virtual void all_to_all(const Tensor& in, Tensor& out) = 0;
  // t = root's t on every rank.
  virtual void broadcast(Tensor& t, int root) = 0;
  // Point to point: `peer` posts the matching recv (send) with the same shape. send may
  // return before the peer has received (a buffered or asynchronous send); messages
  // between two ranks arrive in the order they were sent.
  virtual void send(const Tensor& t, int peer) = 0;
  virtual void recv(Tensor& t, int peer) = 0;

  // Marks the group failed (see above); idempotent, never throws.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace kiln::comm
