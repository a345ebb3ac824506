// `kiln bench op`: every CUDA op other than paged attention on real model shapes, each
// as a fraction of its roofline, against ceilings measured on this machine in the same
// run. The method (timing, work counted per op) is in bench_op.cpp's header; the cases
// are in bench_op_cases.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kiln::cli {

struct BenchOpOptions {
  int smem_cap = 101376;  // shared memory per block every kernel fits, bytes (an RTX 50's; 0: the device limit)
  int iters = 20;         // timed calls per case (median), after one warm-up call
  std::string only;       // keep the cases whose label contains this ("": all)
};

// The ceilings rows are reported against. All but the wgmma peak are measured at the
// start of the run; 0 where the device has no such instruction.
struct OpCeilings {
  double copy_gbs = 0.0;           // cudaMemcpyAsync device to device, 1 GiB, read + write
  double mma_bf16_tflops = 0.0;    // mma.sync m16n8k16 bf16, fp32 accumulation (mma_peak.cu)
  double mma_e4m3_tflops = 0.0;    // mma.sync m16n8k32 e4m3, fp32 accumulation (SM 8.9 on)
  double wgmma_bf16_tflops = 0.0;  // H100 SXM dense bf16, datasheet: cuBLASLt's wgmma kernels
};

// One timed case. Exactly one of bytes (against the copy bandwidth) and flops (against
// the mma.sync bf16 peak, or the e4m3 one for e4m3 work) is > 0.
struct OpRow {
  std::string op, shape;
  int64_t rows = 0;  // n_tokens of the call
  double time_us = 0.0;  // median host wall time of the call
  int iters = 0;         // timed calls behind the median
  double bytes = 0.0, flops = 0.0;
  double achieved = 0.0;        // GB/s for bytes, TFLOP/s for flops
  double fraction = 0.0;        // of ceilings.copy_gbs, mma_bf16_tflops or mma_e4m3_tflops
  double fraction_wgmma = 0.0;  // cuBLASLt GEMM flops rows: of ceilings.wgmma_bf16_tflops; else 0
  bool e4m3 = false;            // flops rows of e4m3 tensor-core work: of ceilings.mma_e4m3_tflops
  std::string note;

  // "<op> <shape> rows <n>", what --only matches.
  std::string label() const { return op + " " + shape + " rows " + std::to_string(rows); }
};

struct OpBenchReport {
  std::string device;
  int sm_count = 0;
  BenchOpOptions options;
  OpCeilings ceilings;
  double floor_us = 0.0;  // an 8-element add timed like every case: the method's own floor
  std::vector<OpRow> rows;
};

// Measures the ceilings, then times every case --only keeps on CUDA device 0, printing
// the markdown table to stdout as rows complete and progress to stderr. Fails when this
// kiln has no CUDA backend or no device can run it.
Result<OpBenchReport> run_bench_op(const BenchOpOptions& options);

// The report as --json writes it: device, options, ceilings, timing floor and every row.
nlohmann::ordered_json op_bench_json(const OpBenchReport& report);

}  // namespace kiln::cli
