// `kiln inspect --model DIR|CONFIG.json`: architecture, storage format per module group,
// parameter count, bytes on disk, and what each rank of a layout would hold (weights, KV
// cache per token, activations) -- sized from the shapes alone, so a config .json of a
// model too large for this machine, or a layout of GPUs it does not have, is sized too.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "backends/cpu/cpu_backend.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/quant_pack.h"
#endif
#include "cli/common.h"
#include "cli/subcommand.h"
#include "formats/quant_config.h"
#include "model/inspect.h"
#include "model/loader.h"
#include "models/registry.h"
#include "runtime/kv_cache.h"
#include "runtime/sizing.h"

namespace kiln::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string human_count(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000 && u < 4) n /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f%s" : "%.0f%s", n, units[u]);
  return buf;
}

struct InspectOptions {
  CommonOptions common;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 0;
  double gpu_memory_gib = 0;  // > 0: whether each rank fits a GPU of this much memory
};

Result<formats::ModelConfig> read_model_config(const std::string& model) {
  if (!std::filesystem::is_regular_file(model)) return formats::load_config(model);
  std::ifstream f(model);
  std::stringstream text;
  text << f.rdbuf();
  return formats::parse_config(text.str(), model);
}

// Each rank's weights, KV cache and activations under the layout the options name.
int print_ranks(const formats::ModelConfig& config, const formats::QuantConfig& quant, ops::Backend& cpu,
                const InspectOptions& io) {
  const CommonOptions& o = io.common;
  auto kv_dtype = runtime::parse_kv_cache_dtype(o.kv_cache_dtype);
  if (!kv_dtype.ok()) return fail(kv_dtype.status());
  runtime::SizingOptions so{.parallel = {.tensor_parallel = o.tensor_parallel,
                                         .pipeline_parallel = o.pipeline_parallel,
                                         .expert_parallel = o.expert_parallel},
                            .kv_dtype = *kv_dtype,
                            .max_num_batched_tokens = io.max_num_batched_tokens > 0 ? io.max_num_batched_tokens
                                                                                    : std::max(2048, io.max_num_seqs),
                            .max_num_seqs = io.max_num_seqs,
                            .mtp = o.speculative_method == "mtp"};
#ifdef KILN_HAVE_CUDA
  // The CUDA backend's packed layout (pure host arithmetic: no GPU needed).
  so.held_bytes = [](const formats::QuantizedTensor& q) -> Result<int64_t> {
    KILN_ASSIGN_OR_RETURN(const cuda::PackedQuant p, cuda::packed_layout(q));
    return cuda::packed_bytes(p);
  };
#endif
  auto sizes = runtime::size_layout(config, quant, cpu, so);
  if (!sizes.ok()) return fail(sizes.status());
  const int64_t max_len = o.max_model_len > 0 ? o.max_model_len : config.max_position_embeddings;
  std::printf("\nper rank: tensor parallel %d x pipeline parallel %d%s, KV cache %s, steps of %d tokens / %d "
              "sequences (weights as the %s backend holds them)\n",
              o.tensor_parallel, o.pipeline_parallel, o.expert_parallel ? " (expert parallel)" : "",
              o.kv_cache_dtype.c_str(), so.max_num_batched_tokens, so.max_num_seqs,
#ifdef KILN_HAVE_CUDA
              "CUDA"
#else
              "CPU"
#endif
  );
  std::printf("%-5s %12s %14s %16s %14s", "rank", "weights", "KV per token", "KV per sequence", "activations");
  const int64_t gpu = int64_t(io.gpu_memory_gib * double(int64_t(1) << 30));
  if (gpu > 0) std::printf(" %14s %14s", "left for KV", "KV tokens");
  std::printf("\n");
  bool fits = true;
  for (const runtime::RankSizing& r : *sizes) {
    std::printf("%-5d %12s %14s %16s %14s", r.rank, human_bytes(double(r.weight_bytes)).c_str(),
                human_bytes(double(r.kv_bytes_per_token)).c_str(),
                human_bytes(double(r.kv_bytes_per_token) * double(max_len) + double(r.state_bytes_per_sequence)).c_str(),
                ("~" + human_bytes(double(r.activation_bytes))).c_str());
    if (gpu > 0) {
      // What kiln serve keeps back (runtime::device_reserve_bytes).
      const int64_t reserve = runtime::device_reserve_bytes(gpu);
      // Recurrent models: max_num_seqs state rows, a scratch row and as many checkpoints.
      const int64_t states = (2 * int64_t(so.max_num_seqs) + 1) * r.state_bytes_per_sequence;
      const int64_t left = gpu - r.weight_bytes - r.activation_bytes - reserve - states;
      fits = fits && left > 0;
      std::printf(" %14s %14s", left > 0 ? human_bytes(double(left)).c_str() : "does not fit",
                  left > 0 ? human_count(double(left / r.kv_bytes_per_token)).c_str() : "-");
    }
    std::printf("\n");
  }
  if (sizes->front().state_bytes_per_sequence > 0) {
    std::printf("(recurrent state: %s per sequence, in KV per sequence; kiln serve holds %d running rows, a scratch row "
                "and %d prefix-cache checkpoints)\n",
                human_bytes(double(sizes->front().state_bytes_per_sequence)).c_str(), so.max_num_seqs, so.max_num_seqs);
  }
  std::printf("(KV per sequence: one of %lld tokens; activations: an estimate of the largest step's buffers, which "
              "kiln serve measures once loaded%s)\n",
              (long long)max_len, gpu > 0 ? "; left for KV: after the weights, activations and the runtime's reserve" : "");
  if (!fits) {
    std::printf("does not fit in %.0f GiB per GPU: use more GPUs, a quantized checkpoint, or fewer "
                "--max-num-batched-tokens (the activations grow with the step's tokens)\n",
                io.gpu_memory_gib);
  }
  return fits ? 0 : 3;
}

int run_inspect(const InspectOptions& io) {
  const CommonOptions& o = io.common;
  const std::string& dir = o.model;
  const bool config_only = std::filesystem::is_regular_file(dir);  // a config .json: sized, not read
  auto config = read_model_config(dir);
  if (!config.ok()) return fail(config.status());
  if (o.num_layers > 0 && o.num_layers < config->n_layers) {
    config->n_layers = o.num_layers;
    if (config->layer_types.size() > size_t(o.num_layers)) config->layer_types.resize(size_t(o.num_layers));
  }
  auto quant = config_only ? formats::parse_quant_config(config->raw.dump(), "", dir) : formats::load_quant_config(dir);
  if (!quant.ok()) return fail(quant.status());
  std::optional<formats::Checkpoint> ckpt;
  if (!config_only) {
    auto opened = formats::Checkpoint::open(dir);
    if (!opened.ok()) return fail(opened.status());
    ckpt = std::move(opened).value();
    if (!config->language_model_prefix.empty()) ckpt->rename_prefix(config->language_model_prefix, "model.");
  }
  // Binding on the CPU backend maps the files and checks every tensor without copying
  // or reading the weights; a config alone is bound unbacked (WeightLoader::sizing).
  std::unique_ptr<ops::Backend> cpu = cpu::make_cpu_backend(1);
  model::WeightLoader loader = ckpt ? model::WeightLoader(*ckpt, *cpu, *quant) : model::WeightLoader::sizing(*cpu, *quant);
  auto lm = models::build_model(*config, loader);
  if (!lm.ok()) return fail(lm.status().with_context("loading " + dir));

  std::printf("model          %s%s\n", dir.c_str(), config_only ? " (a config: sized from its shapes)" : "");
  std::printf("architecture   %s (%lld layers, d_model %lld, vocab %lld)\n", config->architecture.c_str(),
              (long long)config->n_layers, (long long)config->d_model, (long long)config->vocab_size);
  std::printf("quantization   %s\n", quant->quantized() ? (quant->method + " (" +
                                                          std::string(formats::quant_kind_name(quant->kind)) + ")").c_str()
                                                        : "none");
  std::printf("\n%-18s %-28s %12s %14s\n", "group", "formats (tensors)", "params", "bytes");
  int64_t params = 0, bytes = 0;
  for (const model::GroupSummary& g : model::summarize(*lm)) {
    std::string fmts;
    for (const auto& [f, n] : g.formats) fmts += (fmts.empty() ? "" : ", ") + f + " (" + std::to_string(n) + ")";
    std::printf("%-18s %-28s %12s %14s\n", g.group.c_str(), fmts.c_str(), human_count(double(g.params)).c_str(),
                human_bytes(double(g.bytes)).c_str());
    params += g.params;
    bytes += g.bytes;
  }
  std::printf("%-18s %-28s %12s %14s\n", "total", "", human_count(double(params)).c_str(),
              human_bytes(double(bytes)).c_str());
  if (ckpt) {
    uint64_t disk = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir))
      if (f.path().extension() == ".safetensors") disk += f.file_size();
    std::printf("\nbytes on disk  %s (*.safetensors)\n", human_bytes(double(disk)).c_str());
    std::printf("unused tensors %zu (e.g. MTP layers; KILN_LOG=info lists them at load)\n", loader.unused().size());
  }
  const int code = print_ranks(*config, *quant, *cpu, io);
  if (code == 1 || config_only) return code;

  // Which kernels each layer's weights meet on the chosen backend (its self-test passed:
  // make_backend refuses otherwise; kiln doctor lists every path's result).
  auto be = o.backend == "cpu" ? std::move(cpu) : nullptr;
  if (!be) {
    auto made = make_backend(o);
    if (!made.ok()) return fail(made.status());
    be = std::move(made).value();
  }
  std::printf("\nkernel paths on %s\n%-8s %-16s %-12s %s\n", be->name().c_str(), "layers", "group", "format", "path");
  for (const model::PathRecord& r : model::path_records(*lm, *be)) {
    std::printf("%-8s %-16s %-12s %s\n", r.layers.c_str(), r.group.c_str(), r.format.c_str(), r.path.c_str());
  }
  return code;
}

}  // namespace

void add_inspect_command(CLI::App& app, Subcommands& commands) {
  auto io = std::make_shared<InspectOptions>();
  CommonOptions& o = io->common;
  CLI::App* cmd = app.add_subcommand("inspect", "print a checkpoint's (or a config .json's) architecture, formats, "
                                                "size, what each rank of a layout would hold, and the kernel paths "
                                                "its layers take on a backend");
  cmd->add_option("--model", o.model, "checkpoint directory, or a config .json (sized without weights)")->required();
  cmd->add_option("--backend", o.backend, "the backend whose kernel paths to list: auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--device", o.device, "CUDA device index");
  cmd->add_option("--smem-cap", o.smem_cap, "shared memory per block every CUDA kernel must fit (bytes)");
  cmd->add_option("--tensor-parallel-size,--tp", o.tensor_parallel, "ranks each holding a slice of every layer")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--pipeline-parallel-size,--pp", o.pipeline_parallel, "pipeline stages, each a run of layers")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_flag("--enable-expert-parallel", o.expert_parallel, "routed experts whole across the tensor-parallel ranks");
  cmd->add_option("--kv-cache-dtype", o.kv_cache_dtype, "bf16 or fp8")
      ->check(CLI::IsMember({"bf16", "fp8"}))
      ->capture_default_str();
  cmd->add_option("--max-model-len", o.max_model_len, "sequence length for the KV-per-sequence column (0: config)")
      ->capture_default_str();
  cmd->add_option("--num-layers", o.num_layers, "the first N decoder layers only (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--speculative-method", o.speculative_method,
                  "mtp: size the checkpoint's first MTP layer too, as kiln serve loads it for MTP drafts")
      ->check(CLI::IsMember({"off", "ngram", "mtp"}))
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", io->max_num_seqs, "sequences per step, as kiln serve's")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", io->max_num_batched_tokens,
                  "tokens per step, as kiln serve's (0: max(2048, max-num-seqs))")
      ->capture_default_str();
  cmd->add_option("--gpu-memory", io->gpu_memory_gib,
                  "GiB of each GPU: also print what is left for the KV cache per rank (exit status 3 if a rank "
                  "does not fit)")
      ->capture_default_str();
  commands.emplace_back(cmd, [io] { return run_inspect(*io); });
}

}  // namespace kiln::cli
