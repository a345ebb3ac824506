// What the cases of `kiln bench op` (bench_op_cases.cpp) share with its driver
// (bench_op.cpp): the case description, random device data, the timer and the table.
// CUDA builds only (KILN_HAVE_CUDA); the method is described at the top of bench_op.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/bench_op.h"
#include "ops/backend.h"

namespace kiln::cli::op_bench {

constexpr int kPrefillRows = 2048;

// What one table row ran and the work it had to do. Exactly one of bytes (a fraction
// of the copy bandwidth) and flops (a fraction of the mma peak) is set.
struct Case {
  std::string op, shape;
  int64_t rows = 0;
  double bytes = 0.0;
  double flops = 0.0;
  bool gemm = false;  // cuBLASLt: also against the wgmma peak
  bool e4m3 = false;  // e4m3 tensor-core work: against the e4m3 mma.sync peak
  std::string note;

  std::string label() const { return op + " " + shape + " rows " + std::to_string(rows); }
};

struct Timing {
  double us = 0.0;  // median
  int iters = 0;
};

inline std::string str(int64_t v) { return std::to_string(v); }

// Fills backend tensors from two device pools of random bf16: activations in
// (-1, 1), weights in (-1/32, 1/32) (about the spread of trained weights, so
// outputs stay O(1)).
class Filler {
 public:
  static constexpr size_t kPoolElems = size_t(32) << 20;  // 64 MiB each

  Filler();
  ~Filler();
  Filler(const Filler&) = delete;
  Filler& operator=(const Filler&) = delete;

  Tensor activation(ops::Backend& be, Shape s) { return fill(be, s, pools_[0]); }
  Tensor weight(ops::Backend& be, Shape s) { return fill(be, s, pools_[1]); }

  // An fp32 device vector through Backend::upload (its rule keeps rank-1 tensors fp32).
  Tensor vector(ops::Backend& be, int64_t n, float lo, float hi, std::vector<float>* host_copy = nullptr);

  std::mt19937_64& rng() { return rng_; }

 private:
  Tensor fill(ops::Backend& be, Shape s, const uint16_t* pool);

  uint16_t* pools_[2] = {nullptr, nullptr};
  std::mt19937_64 rng_{7};
};

// n_seqs sequences of `context` cached tokens, each with its newest n_query in the
// step; the block table scatters blocks over the cache.
ops::BatchMeta paged_batch(int n_seqs, int context, int n_query, int block_size, std::mt19937_64& rng);

// The timer and the table: times cases, prints their rows and keeps them.
class Bench {
 public:
  Bench(const BenchOpOptions& o, const OpCeilings& ceilings);
  ~Bench();
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  Filler fill;

  // A fresh backend on device 0: each model's weights live and die with one.
  std::unique_ptr<ops::Backend> backend() const;

  int iters() const { return o_.iters; }
  bool filtered() const { return !o_.only.empty(); }  // --only given
  bool wanted(const Case& c) const { return o_.only.empty() || c.label().find(o_.only) != std::string::npos; }

  // Median wall time of op() + synchronize(), L2 flushed before each call.
  Timing time(ops::Backend& be, const ops::BatchMeta& batch, const std::function<void()>& op);

  // Times one case (if --only keeps it) and reports its row.
  void run(ops::Backend& be, const ops::BatchMeta& batch, const Case& c, const std::function<void()>& op);

  // Prints the table row of a case timed as `t` and keeps it.
  void report(const Case& c, const Timing& t);

  // One sequence whose newest `rows` tokens are in the step, of max(context, rows)
  // (ops that read no batch get one anyway: begin_step precedes every call).
  ops::BatchMeta rows_batch(int64_t rows, int context = 0) {
    return paged_batch(1, std::max<int>(context, int(rows)), int(rows), 16, fill.rng());
  }

  std::vector<OpRow>& rows() { return rows_; }

 private:
  double once(ops::Backend& be, const ops::BatchMeta& batch, const std::function<void()>& op);

  BenchOpOptions o_;
  OpCeilings ceilings_;
  void* flush_ = nullptr;
  int flush_value_ = 0;
  std::vector<OpRow> rows_;
};

// Whether --only keeps any of op/shape's row counts (builds nothing otherwise).
bool any_wanted(const Bench& b, const std::string& op, const std::string& shape, std::initializer_list<int> rows);

// bench_op_cases.cpp: every case, in the table's order. Each builds its weights only
// when --only keeps one of its rows.
void run_all_cases(Bench& b);

}  // namespace kiln::cli::op_bench
