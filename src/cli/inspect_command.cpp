// `kiln inspect --model DIR`: architecture, storage format per module group,
// parameter count, bytes on disk and the memory the model will need.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "cli/common.h"
#include "cli/subcommand.h"
#include "formats/quant_config.h"
#include "model/inspect.h"
#include "model/loader.h"
#include "models/registry.h"
#include "runtime/kv_cache.h"

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

int run_inspect(const std::string& dir, const CommonOptions& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "kiln: error: %s\n", s.to_string().c_str());
    return 1;
  };
  auto config = formats::load_config(dir);
  if (!config.ok()) return fail(config.status());
  auto quant = formats::load_quant_config(dir);
  if (!quant.ok()) return fail(quant.status());
  auto ckpt = formats::Checkpoint::open(dir);
  if (!ckpt.ok()) return fail(ckpt.status());
  // Binding on the CPU backend maps the files and checks every tensor without
  // copying or reading the weights.
  std::unique_ptr<ops::Backend> cpu = cpu::make_cpu_backend(1);
  model::WeightLoader loader(*ckpt, *cpu, *quant);
  auto lm = models::build_model(*config, loader);
  if (!lm.ok()) return fail(lm.status().with_context("loading " + dir));

  std::printf("model          %s\n", dir.c_str());
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
  uint64_t disk = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir))
    if (f.path().extension() == ".safetensors") disk += f.file_size();
  const auto layouts = lm->kv_layouts();
  const int64_t kv_token = runtime::KvCache::bytes_per_token(layouts, DType::kBF16);
  const int64_t max_len = config->max_position_embeddings;
  std::printf("%-18s %-28s %12s %14s\n", "total", "", human_count(double(params)).c_str(),
              human_bytes(double(bytes)).c_str());
  std::printf("\nbytes on disk  %s (*.safetensors)\n", human_bytes(double(disk)).c_str());
  std::printf("unused tensors %zu (e.g. MTP layers; KILN_LOG=info lists them at load)\n", loader.unused().size());
  std::printf("KV cache       %s per token (bf16); %s for one %lld-token sequence\n",
              human_bytes(double(kv_token)).c_str(), human_bytes(double(kv_token) * double(max_len)).c_str(),
              (long long)max_len);
  std::printf("memory         weights %s + KV cache for the tokens served\n", human_bytes(double(bytes)).c_str());

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
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, Subcommands& commands) {
  auto o = std::make_shared<CommonOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "print a checkpoint's architecture, formats, size, memory needs and "
                                                "the kernel paths its layers take on a backend");
  cmd->add_option("--model", o->model, "checkpoint directory")->required();
  cmd->add_option("--backend", o->backend, "the backend whose kernel paths to list: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--device", o->device, "CUDA device index");
  cmd->add_option("--smem-cap", o->smem_cap, "shared memory per block every CUDA kernel must fit (bytes)");
  commands.emplace_back(cmd, [o] { return run_inspect(o->model, *o); });
}

}  // namespace kiln::cli
