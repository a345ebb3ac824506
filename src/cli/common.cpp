#include "cli/common.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "cli/build_info.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/selftest.h"
#endif
#ifdef KILN_HAVE_NCCL
#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl/peer_all_reduce.h"
#endif
#include "core/check.h"

namespace kiln::cli {

void add_common(CLI::App* cmd, CommonOptions& o, bool model_option) {
  if (model_option) cmd->add_option("--model", o.model, "checkpoint directory (config.json + *.safetensors)");
  cmd->add_option("--backend", o.backend, "auto (cuda when this build has it and a GPU is present, else cpu), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--threads", o.threads, "CPU threads (0: all)");
  cmd->add_option("--device", o.device, "CUDA device index");
  cmd->add_option("--smem-cap", o.smem_cap,
                  "shared memory per block every CUDA kernel must fit, bytes (0: the device's limit; "
                  "101376 runs what an RTX 50 / PRO 6000 runs)");
  cmd->add_option("--block-size", o.block_size, "KV cache block size in tokens");
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "prefill at most N tokens of a sequence per step (0: no cap)");
  cmd->add_option("--max-model-len", o.max_model_len, "maximum sequence length (0: from config)");
  cmd->add_option("--load-format", o.load_format,
                  "auto: the checkpoint's weights; dummy: random weights from config.json alone, in the format its "
                  "quantization_config names (else bf16; MODEL may then be a config .json file), for benchmarks")
      ->check(CLI::IsMember({"auto", "dummy"}));
  cmd->add_option("--num-layers", o.num_layers, "use only the first N decoder layers (quick runs; 0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-cache-dtype", o.kv_cache_dtype,
                  "KV cache storage: bf16 (the activations as they are; fp32 on the CPU reference) or fp8 "
                  "(e4m3 with a scale per token and head: about twice the tokens in the same memory)")
      ->check(CLI::Validator(
          [](const std::string& v) {
            const auto d = runtime::parse_kv_cache_dtype(v);
            return d.ok() ? std::string() : d.status().message();
          },
          "bf16|fp8"));
  cmd->add_option("--tensor-parallel-size,--tp", o.tensor_parallel,
                  "ranks (GPUs) each holding a slice of every layer (heads, MLP columns, vocabulary)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--pipeline-parallel-size,--pp", o.pipeline_parallel,
                  "pipeline stages, each holding a run of layers (ranks = tensor x pipeline)")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--enable-expert-parallel", o.expert_parallel,
                "place routed experts whole across the tensor-parallel ranks instead of splitting each");
  cmd->add_option("--watchdog-timeout", o.watchdog_timeout,
                  "seconds a step with several ranks may go without any rank making progress before it is "
                  "aborted with an error naming the stalled rank (0: never)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--speculative-method", o.speculative_method,
                  "speculative decoding: off; ngram (drafts looked up in the sequence's own tokens); or mtp "
                  "(drafts from the checkpoint's multi-token prediction layer: DeepSeek-V3, GLM-4.5, Qwen3-Next and later); "
                  "verified exactly by the model (Gated DeltaNet models too: their state restored from per-row "
                  "snapshots)")
      ->check(CLI::IsMember({"off", "ngram", "mtp"}));
  cmd->add_option("--num-speculative-tokens", o.num_speculative_tokens,
                  "draft tokens per sequence and step with --speculative-method (at least 1)")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--speculative-adaptive", o.speculative_adaptive,
                  "on: each step's draft depth (0 to --num-speculative-tokens) chosen from the measured "
                  "acceptance by position and the measured cost of a step's rows, so that speculation does not "
                  "lower throughput (sampled outputs then depend on timing); off: always the full depth")
      ->check(CLI::IsMember({"on", "off"}));
}

runtime::EngineOptions engine_options(const CommonOptions& o) {
  auto kv_dtype = runtime::parse_kv_cache_dtype(o.kv_cache_dtype);
  KILN_CHECK(kv_dtype.ok()) << kv_dtype.status().to_string();  // --kv-cache-dtype's validator let it through
  return {.block_size = o.block_size,
          .max_model_len = o.max_model_len,
          .prefill_chunk = o.prefill_chunk,
          .kv_cache_dtype = *kv_dtype,
          .load_format = o.load_format == "dummy" ? runtime::LoadFormat::kDummy : runtime::LoadFormat::kAuto,
          .num_layers = o.num_layers,
          .speculative_method = o.speculative_method == "ngram" ? runtime::SpeculativeMethod::kNgram
                                : o.speculative_method == "mtp" ? runtime::SpeculativeMethod::kMtp
                                                                : runtime::SpeculativeMethod::kOff,
          .num_speculative_tokens = o.num_speculative_tokens,
          .speculative_adaptive = o.speculative_adaptive != "off",
          .parallel = {.tensor_parallel = o.tensor_parallel,
                       .pipeline_parallel = o.pipeline_parallel,
                       .expert_parallel = o.expert_parallel,
                       .watchdog_seconds = o.watchdog_timeout}};
}

CommonOptions with_backend_chosen(const CommonOptions& o) {
  CommonOptions out = o;
  out.backend = choose_backend(o.backend).backend;
  return out;
}

Result<std::unique_ptr<ops::Backend>> make_backend(const CommonOptions& options) {
  const CommonOptions o = with_backend_chosen(options);
  if (o.backend == "cpu") return cpu::make_cpu_backend(o.threads);
#ifdef KILN_HAVE_CUDA
  if (o.backend == "cuda") {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<ops::Backend> be,
                          cuda::make_cuda_backend({.device = o.device, .smem_cap = o.smem_cap}));
    // Never serve a kernel that gives wrong answers: every path is checked
    // against the CPU reference before the model loads (kiln doctor prints it).
    KILN_RETURN_IF_ERROR(cuda::self_test_status(cuda::run_self_test(*be)));
    return be;
  }
#endif
  return unsupported("the " + o.backend + " backend is not part of this build (CUDA was not found at build time)");
}

Result<std::vector<std::unique_ptr<ops::Backend>>> make_backends(const CommonOptions& options) {
  const CommonOptions o = with_backend_chosen(options);
  const int world = o.tensor_parallel * o.pipeline_parallel;
  std::vector<std::unique_ptr<ops::Backend>> out;
  for (int r = 0; r < world; ++r) {
    CommonOptions rank = o;
    rank.device = o.device + r;
    if (o.backend == "cpu" && world > 1) {  // the cores shared out
      const int cores = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
      rank.threads = std::max(1, cores / world);
    }
    auto be = make_backend(rank);
    if (!be.ok()) return world > 1 ? be.status().with_context("rank " + std::to_string(r)) : be.status();
    out.push_back(std::move(be).value());
  }
  return out;
}

#ifdef KILN_HAVE_NCCL
Result<runtime::CommWorld> cuda_comm_world(const std::vector<ops::Backend*>& backends,
                                           const runtime::ParallelConfig& parallel) {
  std::vector<comm::NcclRank> ranks;
  for (ops::Backend* b : backends) ranks.push_back({.device = cuda::device_of(*b), .stream = cuda::stream_of(*b)});
  struct Groups {
    std::vector<std::unique_ptr<comm::NcclCommunicator>> world, tp;
  };
  auto g = std::make_shared<Groups>();
  // Where the model's micro-batches overlap the sums (without peer access, by default).
  const bool overlapped = parallel.tensor_parallel > 1 && runtime::resolve_micro_batch_rows(parallel, true) > 0;
  KILN_ASSIGN_OR_RETURN(g->world, comm::NcclCommunicator::create_group(ranks, overlapped));
  std::vector<comm::NcclCommunicator*> world;
  std::vector<int> stage;
  for (size_t r = 0; r < g->world.size(); ++r) {
    world.push_back(g->world[r].get());
    stage.push_back(int(r) / parallel.tensor_parallel);
  }
  KILN_ASSIGN_OR_RETURN(g->tp, comm::NcclCommunicator::split_group(world, stage));
  runtime::CommWorld c;
  for (size_t r = 0; r < world.size(); ++r) {
    c.world.push_back(g->world[r].get());
    c.tp.push_back(g->tp[r].get());
  }
  comm::Communicator* any = c.world[0];
  c.abort = [any](const std::string& reason) { any->abort(reason); };  // the splits share the world's failure
  c.owner = g;
  return c;
}
#endif

Result<std::unique_ptr<runtime::Engine>> load_engine(const std::string& dir, const CommonOptions& common,
                                                     const runtime::EngineOptions& options) {
  const CommonOptions o = with_backend_chosen(common);
  KILN_ASSIGN_OR_RETURN(auto backends, make_backends(o));
  runtime::EngineOptions e = options;
#ifdef KILN_HAVE_NCCL
  if (o.backend == "cuda") e.comms = cuda_comm_world;
#endif
  return runtime::Engine::load(dir, std::move(backends), e);
}

std::string no_peer_access(int first, int count) {
#ifdef KILN_HAVE_NCCL
  std::vector<int> devices;
  for (int d = first; d < first + count; ++d) devices.push_back(d);
  return count > 1 ? comm::PeerAllReduce::no_peer_access(devices) : "";
#else
  (void)first, (void)count;
  return "";
#endif
}

std::string data_parallel_hint(int tensor_parallel, int pipeline_parallel, int data_parallel,
                               const std::string& no_peer_access, int64_t weight_bytes, int64_t device_bytes) {
  const int world = tensor_parallel * pipeline_parallel;
  if (world < 2 || data_parallel != 1 || no_peer_access.empty() || weight_bytes <= 0 || device_bytes <= 0 ||
      double(weight_bytes) > 0.6 * double(device_bytes))
    return "";
  char sizes[96];
  std::snprintf(sizes, sizeof sizes, "%.1f GiB", double(weight_bytes) / double(int64_t(1) << 30));
  char device[48];
  std::snprintf(device, sizeof device, "%.1f GiB", double(device_bytes) / double(int64_t(1) << 30));
  const std::string n = std::to_string(world);
  return "kiln: note: " + no_peer_access + ", so every sum between the " + n +
         " ranks goes through host memory; the weights (" + sizes + ") fit one of these GPUs (" + device +
         "), and --data-parallel-size " + n + " without --tensor-parallel-size / --pipeline-parallel-size (a whole "
         "copy on each GPU) usually serves more (Qwen3-30B-A3B on 2 x H200 without P2P at 64 streams: 1.34x one "
         "GPU's output, against 1.30x at --tensor-parallel-size 2; docs/perf/multi-gpu.md)";
}

int fail(const Status& s) {
  std::fprintf(stderr, "kiln: error: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace kiln::cli
