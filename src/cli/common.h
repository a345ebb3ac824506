// What several kiln commands share: the backend and engine options, making the backend
// (with the CUDA start-up self-test), and the error exit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "ops/backend.h"
#include "runtime/engine.h"

namespace kiln::cli {

struct CommonOptions {
  std::string model;
  std::string backend = "auto";  // auto | cpu | cuda (choose_backend, build_info.h)
  int threads = 0;
  int device = 0;
  int smem_cap = 0;
  int block_size = 16;
  int prefill_chunk = 0;
  int64_t max_model_len = 0;
  std::string load_format = "auto";  // auto | dummy
  int64_t num_layers = 0;            // > 0: the first N decoder layers only
  std::string kv_cache_dtype = "bf16";  // bf16 | fp8 (runtime::parse_kv_cache_dtype)
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  bool expert_parallel = false;
  double watchdog_timeout = 60.0;  // seconds; 0: off
  std::string speculative_method = "off";  // off | ngram | mtp
  int num_speculative_tokens = 0;
  std::string speculative_adaptive = "on";  // on | off (runtime/adaptive_depth.h)
};

// --backend, --threads, --device, --smem-cap, --block-size, --prefill-chunk,
// --max-model-len, --load-format, --num-layers, --kv-cache-dtype, --tensor-parallel-size,
// --pipeline-parallel-size, --enable-expert-parallel, --speculative-method,
// --num-speculative-tokens, --speculative-adaptive; and --model unless the command takes
// the model as an argument.
void add_common(CLI::App* cmd, CommonOptions& o, bool model_option = true);

// o with --backend auto replaced by the backend it chooses on this machine.
CommonOptions with_backend_chosen(const CommonOptions& o);

// The backend of o.backend (auto: chosen first); a CUDA backend has passed its start-up
// self-test.
Result<std::unique_ptr<ops::Backend>> make_backend(const CommonOptions& o);
// One backend per rank of the parallel options (CUDA: devices --device, --device + 1, ...;
// CPU: the threads shared out), each self-tested.
Result<std::vector<std::unique_ptr<ops::Backend>>> make_backends(const CommonOptions& o);
// make_backends, then the engine on them.
Result<std::unique_ptr<runtime::Engine>> load_engine(const std::string& dir, const CommonOptions& o,
                                                     const runtime::EngineOptions& options);

// The engine options the common options set.
runtime::EngineOptions engine_options(const CommonOptions& o);

#ifdef KILN_HAVE_NCCL
// NCCL communicators for CUDA ranks (a runtime::CommFactory): the world (pipeline
// hand-offs, logits to rank 0) on each backend's device and stream, split into one
// tensor-parallel group per stage.
Result<runtime::CommWorld> cuda_comm_world(const std::vector<ops::Backend*>& backends,
                                           const runtime::ParallelConfig& parallel);
#endif

// Why the CUDA devices first .. first + count - 1 cannot reach each other's memory
// (comm::PeerAllReduce::no_peer_access: no P2P between a pair, or NCCL_P2P_DISABLE set);
// "" where they can, or where this build has no NCCL.
std::string no_peer_access(int first, int count);

// A tensor / pipeline-parallel layout over GPUs without peer access sends every sum
// through host memory; where one GPU holds the whole model's weights with room for a KV
// cache (at most 60% of its memory), whole replicas on the same GPUs usually serve more
// (Qwen3-30B-A3B on 2 x H200 without P2P, 64 streams: `--data-parallel-size 2` 1.34x one
// GPU's output, `--tensor-parallel-size 2` 1.30x with its prompt chunks' sums overlapped;
// docs/perf/multi-gpu.md, twenty-seventh section). The note `kiln serve` prints then; "" when it does not apply (one rank, data
// parallelism already asked for, peer access, weights too large, sizes unknown).
std::string data_parallel_hint(int tensor_parallel, int pipeline_parallel, int data_parallel,
                               const std::string& no_peer_access, int64_t weight_bytes, int64_t device_bytes);

// Prints "kiln: error: ..." to stderr; returns the exit code 1 (2 is a command-line parse
// error: parse_errors.h).
int fail(const Status& s);

}  // namespace kiln::cli
