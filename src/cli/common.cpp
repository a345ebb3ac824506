#include "cli/common.h"

#include <cstdio>

#include "backends/cpu/cpu_backend.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/selftest.h"
#endif
#include "core/check.h"

namespace kiln::cli {

void add_common(CLI::App* cmd, CommonOptions& o, bool model_option) {
  if (model_option) cmd->add_option("--model", o.model, "checkpoint directory (config.json + *.safetensors)");
  cmd->add_option("--backend", o.backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--threads", o.threads, "CPU threads (0: all)");
  cmd->add_option("--device", o.device, "CUDA device index");
  cmd->add_option("--smem-cap", o.smem_cap,
                  "shared memory per block every CUDA kernel must fit, bytes (0: the device's limit; "
                  "101376 runs what an RTX 50 / PRO 6000 runs)");
  cmd->add_option("--block-size", o.block_size, "KV cache block size in tokens");
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "prefill at most N tokens of a sequence per step (0: no cap)");
  cmd->add_option("--max-model-len", o.max_model_len, "maximum sequence length (0: from config)");
  cmd->add_option("--load-format", o.load_format,
                  "auto: the checkpoint's weights; dummy: random bf16 weights made on the device from config.json "
                  "alone (MODEL may then be a config .json file), for benchmarks")
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
}

runtime::EngineOptions engine_options(const CommonOptions& o) {
  auto kv_dtype = runtime::parse_kv_cache_dtype(o.kv_cache_dtype);
  KILN_CHECK(kv_dtype.ok()) << kv_dtype.status().to_string();  // --kv-cache-dtype's validator let it through
  return {.block_size = o.block_size,
          .max_model_len = o.max_model_len,
          .prefill_chunk = o.prefill_chunk,
          .kv_cache_dtype = *kv_dtype,
          .load_format = o.load_format == "dummy" ? runtime::LoadFormat::kDummy : runtime::LoadFormat::kAuto,
          .num_layers = o.num_layers};
}

Result<std::unique_ptr<ops::Backend>> make_backend(const CommonOptions& o) {
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

int fail(const Status& s) {
  std::fprintf(stderr, "kiln: error: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace kiln::cli
