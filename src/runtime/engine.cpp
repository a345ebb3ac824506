#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>
#include <mutex>
#include <sstream>

#include "core/log.h"
#include "formats/quant_config.h"
#include "formats/safetensors.h"
#include "grammar/token_mask.h"
#include "model/inspect.h"
#include "model/loader.h"
#include "models/registry.h"
#include "runtime/ngram_drafter.h"
#include "runtime/sizing.h"

namespace kiln::runtime {

void EngineStats::add(const EngineStats& o) {
  steps += o.steps, prompt_tokens += o.prompt_tokens, computed_tokens += o.computed_tokens;
  generated_tokens += o.generated_tokens, preemptions += o.preemptions;
  prefix_queried_tokens += o.prefix_queried_tokens, prefix_hit_tokens += o.prefix_hit_tokens;
  running += o.running, waiting += o.waiting, waiting_requests += o.waiting_requests;
  kv_blocks_used += o.kv_blocks_used, kv_blocks_total += o.kv_blocks_total;
  const auto add_kind = [](StepKind& k, const StepKind& ok) {
    k.steps += ok.steps, k.tokens += ok.tokens, k.seconds += ok.seconds;
    for (int i = 0; i < kPhases; ++i) k.phase_seconds[i] += ok.phase_seconds[i];
  };
  add_kind(decode_steps, o.decode_steps);
  add_kind(verify_steps, o.verify_steps);
  add_kind(mixed_steps, o.mixed_steps);
  one_time_steps += o.one_time_steps;
  spec_draft_tokens += o.spec_draft_tokens, spec_accepted_tokens += o.spec_accepted_tokens;
  spec_verified_seqs += o.spec_verified_seqs;
  spec_depth_steps += o.spec_depth_steps, spec_depth_total += o.spec_depth_total;
  mtp_deferred_rows += o.mtp_deferred_rows, mtp_flushes += o.mtp_flushes;
  mtp_draft_steps += o.mtp_draft_steps, mtp_chained_passes += o.mtp_chained_passes;
}
namespace {

std::string mib(int64_t bytes) { return std::to_string((bytes + (1 << 19)) >> 20) + " MiB"; }

bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopToken: return "stop_token";
    case FinishReason::kGrammar: return "grammar";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

Result<std::unique_ptr<Engine>> Engine::load(const std::string& model_dir,
                                             std::unique_ptr<ops::Backend> backend,
                                             const EngineOptions& options) {
  std::vector<std::unique_ptr<ops::Backend>> one;
  one.push_back(std::move(backend));
  return load(model_dir, std::move(one), options);
}

Result<std::unique_ptr<Engine>> Engine::load(const std::string& model_dir,
                                             std::vector<std::unique_ptr<ops::Backend>> backends,
                                             const EngineOptions& options) {
  if (options.speculative_method != SpeculativeMethod::kOff && options.num_speculative_tokens < 1) {
    return invalid_argument("speculative decoding needs --num-speculative-tokens of at least 1 (got " +
                            std::to_string(options.num_speculative_tokens) + ")");
  }
  std::unique_ptr<Engine> e(new Engine());
  EngineOptions o = options;
  Result<formats::QuantConfig> quant = e->read_config(model_dir, o);
  if (!quant.ok()) return quant.status().with_context("loading " + model_dir);
  if (!backends.empty() && backends[0] != nullptr && backends[0]->memory_info()) {
    std::vector<ops::Backend*> devices;
    for (const auto& b : backends) devices.push_back(b.get());
    Result<std::vector<RankSizing>> sizes = e->check_layout_fits(*quant, o, devices);
    if (!sizes.ok()) return sizes.status().with_context("loading " + model_dir);
    // The communicators are made before the weights load and choose their NCCL channels
    // for micro-batches (cli::cuda_comm_world): a model whose layers never split must not
    // be given them (runtime::resolve_micro_batch_rows, 0 here: as good as never).
    const bool split = std::all_of(sizes->begin(), sizes->end(), [](const RankSizing& r) { return r.micro_batches; });
    if (!split && o.parallel.micro_batch_rows < 0) o.parallel.micro_batch_rows = 0;
  }
  e->options_ = o;
  KILN_ASSIGN_OR_RETURN(e->runner_, ModelRunner::create(std::move(backends), o.parallel, o.comms));
  e->backend_ = &e->runner_->backend(0);
  KILN_RETURN_IF_ERROR(e->load_weights(model_dir, o, *quant).with_context("loading " + model_dir));
  for (const auto* ids : {&e->config_.eos_token_ids, &e->config_.generation_eos_token_ids})
    for (int64_t id : *ids)
      if (id >= 0 && id < e->config_.vocab_size && !contains(e->eos_ids_, int32_t(id))) e->eos_ids_.push_back(int32_t(id));
  // Recurrent layers (Gated DeltaNet): a verify step leaves the state after each of its rows
  // in a snapshot row, and the one after the last accepted draft is copied back, which
  // takes the backend's kStateSnapshots.
  if (options.speculative_method != SpeculativeMethod::kOff && e->runner_->recurrent()) {
    for (int r = 0; r < e->runner_->world(); ++r)
      KILN_RETURN_IF_ERROR(e->runner_->backend(r)
                               .supports_op(ops::OptionalOp::kStateSnapshots)
                               .with_context("speculative decoding of " + e->config_.architecture +
                                             " (Gated DeltaNet); use --speculative-method off"));
  }
  if (options.speculative_method == SpeculativeMethod::kMtp && !e->runner_->model(0).mtp) {
    return invalid_argument(
        "--speculative-method mtp needs the checkpoint's multi-token prediction layer, and " + e->config_.architecture +
        (e->config_.n_mtp_layers == 0
             ? " here has none (num_nextn_predict_layers / mtp_num_hidden_layers is 0 or absent)"
             : " has one kiln cannot run yet (DeepSeek-V3 / GLM-4.5 / Qwen3-Next-style layers only, and "
               "no pipeline parallelism)") +
        "; use --speculative-method ngram");
  }
  KILN_RETURN_IF_ERROR(e->size_kv_cache(options).with_context("loading " + model_dir));
  if (e->backend_->memory_info())  // a device backend: the host's cores are free during a step
    e->mask_threads_ = std::clamp(int(std::thread::hardware_concurrency()) / 2, 4, 16);
  if (options.speculative_method != SpeculativeMethod::kOff)
    e->depth_ = std::make_unique<AdaptiveDepth>(AdaptiveDepthConfig{.max_depth = options.num_speculative_tokens,
                                                                     .adaptive = options.speculative_adaptive,
                                                                     .probe_interval = options.speculative_probe_interval,
                                                                     .governor_window = options.speculative_governor_window,
                                                                     .schedule = options.speculative_depth_schedule});
  return e;
}

Result<formats::QuantConfig> Engine::read_config(const std::string& model_dir, const EngineOptions& options) {
  const bool dummy = options.load_format == LoadFormat::kDummy;
  if (dummy && std::filesystem::is_regular_file(model_dir)) {
    std::ifstream f(model_dir);
    std::stringstream text;
    text << f.rdbuf();
    KILN_ASSIGN_OR_RETURN(config_, formats::parse_config(text.str(), model_dir));
  } else {
    KILN_ASSIGN_OR_RETURN(config_, formats::load_config(model_dir));
  }
  if (options.num_layers < 0) return invalid_argument("num_layers must not be negative");
  if (options.num_layers > 0 && options.num_layers < config_.n_layers) {
    config_.n_layers = options.num_layers;
    if (config_.layer_types.size() > size_t(options.num_layers)) config_.layer_types.resize(size_t(options.num_layers));
  }
  return std::filesystem::is_regular_file(model_dir)  // dummy: a config .json
             ? formats::parse_quant_config(config_.raw.dump(), "", model_dir)
             : formats::load_quant_config(model_dir);
}

Status Engine::load_weights(const std::string& model_dir, const EngineOptions& options,
                            const formats::QuantConfig& quant) {
  const bool dummy = options.load_format == LoadFormat::kDummy;
  std::optional<formats::Checkpoint> ckpt;
  if (!dummy) {
    KILN_ASSIGN_OR_RETURN(ckpt, formats::Checkpoint::open(model_dir));
    if (!config_.language_model_prefix.empty()) ckpt->rename_prefix(config_.language_model_prefix, "model.");
  }
  std::vector<std::string> unused;
  // Progress over every rank's loader (each reads its part): their bytes summed.
  std::mutex progress_mu;
  std::vector<uint64_t> rank_done(size_t(runner_->world()), 0);
  std::vector<int64_t> rank_weights(size_t(runner_->world()), 0);
  const auto report = [&](int rank, uint64_t done, uint64_t total) {
    std::lock_guard<std::mutex> lock(progress_mu);
    rank_done[size_t(rank)] = done;
    uint64_t sum = 0;
    for (uint64_t d : rank_done) sum += d;
    options.on_load_progress(std::min(sum, total), total);
  };
  KILN_RETURN_IF_ERROR(runner_->build(config_.n_layers, [&](int rank, const model::Shard& shard) -> Result<model::CausalLM> {
    ops::Backend& be = runner_->backend(rank);
    const auto before = be.memory_info();
    model::WeightLoader loader = dummy ? model::WeightLoader::dummy(be, /*seed=*/20261123, quant)
                                       : model::WeightLoader(*ckpt, be, quant);
    model::Shard sh = shard;
    // MTP layers of the DeepSeek-V3 / GLM-4.5 / DeepSeek-V3.2 / GLM-5 kind; not with a
    // pipeline (its last stage would need the first's embedding).
    sh.mtp = options.speculative_method == SpeculativeMethod::kMtp && options.parallel.pipeline_parallel == 1;
    loader.set_shard(sh);
    if (options.on_load_progress) {
      loader.set_progress([&report, rank](uint64_t done, uint64_t total) { report(rank, done, total); });
    }
    KILN_ASSIGN_OR_RETURN(model::CausalLM lm, models::build_model(config_, loader));
    KILN_RETURN_IF_ERROR(model::check_backend_support(lm, be));
    if (rank == 0) unused = loader.unused();
    if (before) {  // what the allocator took for the weights, against their bytes
      const int64_t took = be.memory_info()->in_use - before->in_use, bytes = int64_t(loader.device_bytes());
      rank_weights[size_t(rank)] = bytes;
      KILN_LOG(kInfo, "rank " << rank << " weights: " << mib(bytes) << " of tensors, " << mib(took)
                              << " of device memory (" << (bytes > 0 ? 100.0 * double(took - bytes) / double(bytes) : 0.0)
                              << "% over)");
    }
    return lm;
  }));
  weight_bytes_ = 0;
  for (int64_t b : rank_weights) weight_bytes_ += b;
  for (const model::PathRecord& r : model::path_records(runner_->model(0), runner_->backend(0))) {
    KILN_LOG(kInfo, "path: layers " << (r.layers.empty() ? "-" : r.layers) << " " << r.group << " (" << r.format
                                    << "): " << r.path);
  }
  if (runner_->world() == 1) {  // with several ranks each one skips the others' tensors
    for (const std::string& name : unused) {
      KILN_LOG(kInfo, "checkpoint tensor not used by " << config_.architecture << ": " << name);
    }
  }
  return Status::Ok();
}

int64_t Engine::device_memory_bytes() const {
  const std::optional<ops::MemoryInfo> mem = backend_->memory_info();
  return mem ? mem->device_total : 0;
}

Result<std::vector<RankSizing>> Engine::check_layout_fits(const formats::QuantConfig& quant, const EngineOptions& o,
                                                          const std::vector<ops::Backend*>& devices) {
  SizingOptions so{.parallel = o.parallel,
                   .kv_dtype = o.kv_cache_dtype,
                   .max_num_batched_tokens = o.max_num_batched_tokens > 0 ? o.max_num_batched_tokens
                                                                          : std::max(2048, o.max_num_seqs),
                   .max_num_seqs = o.max_num_seqs,
                   .mtp = o.speculative_method == SpeculativeMethod::kMtp};
  ops::Backend& host = *devices[0];
  so.held_bytes = [&host](const formats::QuantizedTensor& q) { return host.quantized_bytes(q); };
  Result<std::vector<RankSizing>> sizes = size_layout(config_, quant, host, so);
  if (!sizes.ok()) {  // the load itself names what is wrong, if anything is
    KILN_LOG(kWarn, "could not size the layout before loading: " << sizes.status().to_string());
    return std::vector<RankSizing>{};
  }
  for (const RankSizing& r : *sizes) {
    if (size_t(r.rank) >= devices.size()) break;  // (the backends' count is checked with the runner's)
    const ops::MemoryInfo mem = *devices[size_t(r.rank)]->memory_info();
    const int64_t reserve = device_reserve_bytes(mem.device_total);
    const int64_t need = r.weight_bytes + r.activation_bytes + reserve;
    KILN_LOG(kInfo, "rank " << r.rank << " sized: " << mib(r.weight_bytes) << " of weights, about "
                            << mib(r.activation_bytes) << " of activations, " << mib(reserve) << " kept; "
                            << mib(mem.available) << " free");
    if (need > mem.available) {
      return Status(StatusCode::kResourceExhausted,
                    "this layout does not fit: rank " + std::to_string(r.rank) + " needs " + mib(r.weight_bytes) +
                        " of weights + about " + mib(r.activation_bytes) + " of activations + " + mib(reserve) +
                        " kept for the runtime, and its GPU has " + mib(mem.available) + " free (tensor parallel " +
                        std::to_string(o.parallel.tensor_parallel) + " x pipeline parallel " +
                        std::to_string(o.parallel.pipeline_parallel) +
                        "); use more GPUs, a quantized checkpoint or fewer --max-num-batched-tokens (`kiln inspect "
                        "--tensor-parallel-size N` sizes a layout without a GPU)");
    }
  }
  return sizes;
}

Status Engine::size_kv_cache(const EngineOptions& o) {
  const int32_t bs = o.block_size;
  if (bs <= 0) return invalid_argument("block size must be positive (got " + std::to_string(bs) + ")");
  if (o.max_num_seqs <= 0) return invalid_argument("max_num_seqs must be positive");
  const int32_t max_batched = o.max_num_batched_tokens > 0 ? o.max_num_batched_tokens : std::max(2048, o.max_num_seqs);
  if (max_batched < o.max_num_seqs) {
    return invalid_argument("max_num_batched_tokens (" + std::to_string(max_batched) +
                            ") must be at least max_num_seqs (" + std::to_string(o.max_num_seqs) + ")");
  }
  if (o.max_model_len < 0) return invalid_argument("max_model_len must not be negative");
  if (!(o.gpu_memory_utilization > 0.0f && o.gpu_memory_utilization <= 1.0f)) {
    return invalid_argument("gpu_memory_utilization must be in (0, 1] (got " +
                            std::to_string(o.gpu_memory_utilization) + ")");
  }
  // MTP: forward keeps every row's final hidden state (the largest step's rows: its
  // token budget, or a decode step's padded rows).
  // And the rows of up to mtp_deferred_steps decode steps (at most 64 MiB of them, within
  // a step's rows; runtime/mtp_drafts.cpp), for the MTP layer to run over at once while
  // the depth policy plans no drafts.
  if (o.speculative_method == SpeculativeMethod::kMtp) {
    const int32_t rows = std::max(max_batched, decode_bucket(o.max_num_seqs));
    const int64_t step_rows = decode_bucket(o.max_num_seqs);
    const int64_t cap = std::min<int64_t>({int64_t(std::max(o.mtp_deferred_steps, 0)) * step_rows,
                                           (int64_t(64) << 20) / (2 * std::max<int64_t>(config_.d_model, 1)), rows});
    runner_->enable_mtp(rows, int32_t(cap < step_rows ? 0 : cap), std::max(o.num_speculative_tokens, 1));
  }
  int64_t len = o.max_model_len > 0 ? o.max_model_len
                                    : (config_.max_position_embeddings > 0 ? config_.max_position_embeddings : 8192);
  max_model_len_ = len;
  const bool recurrent = runner_->recurrent();
  scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{.max_num_seqs = o.max_num_seqs,
                                                           .max_num_batched_tokens = max_batched,
                                                           .max_prefill_chunk = o.prefill_chunk,
                                                           .align_prefill_to_blocks = recurrent && o.enable_prefix_caching});
  // Recurrent layers (Gated DeltaNet): a state row per sequence that may run, a scratch
  // row, and the prefix cache's state checkpoints (runtime/state_cache.h).
  const int32_t n_checkpoints =
      recurrent && o.enable_prefix_caching ? (o.state_checkpoints >= 0 ? o.state_checkpoints : o.max_num_seqs) : 0;
  // With speculative decoding, K snapshot rows per sequence (runtime/state_cache.h).
  const int32_t n_snapshots =
      recurrent && o.speculative_method != SpeculativeMethod::kOff ? o.max_num_seqs * o.num_speculative_tokens : 0;
  const int32_t n_state_rows = recurrent ? StateCache::rows(o.max_num_seqs, n_checkpoints, n_snapshots) : 0;
  const int64_t state_bytes = int64_t(n_state_rows) * runner_->state_bytes_per_row();

  const bool fp8 = o.kv_cache_dtype == KvCacheDtype::kFp8;
  for (int r = 0; r < runner_->world(); ++r) {
    ops::Backend& be = runner_->backend(r);
    KILN_RETURN_IF_ERROR(be.supports_kv_cache(fp8 ? DType::kF8E4M3 : be.activation_dtype())
                             .with_context(std::string("--kv-cache-dtype ") + kv_cache_dtype_name(o.kv_cache_dtype)));
  }
  // Every rank holds the same blocks (of its own layers and heads): sized by the rank
  // that needs the most bytes per token and has the least memory.
  const int64_t bytes_token = runner_->kv_bytes_per_token(o.kv_cache_dtype);
  int64_t kv_bytes = o.kv_cache_bytes;
  if (kv_bytes <= 0) {
    if (backend_->memory_info()) {
      const int64_t peak = measure_activation_peak();
      // The measured step's scratch back to the cache: held, it was counted twice (out of
      // what is available and again in the peak) and reported as weights.
      for (int r = 0; r < runner_->world(); ++r) runner_->backend(r).release_step_memory();
      ops::MemoryInfo mem = *backend_->memory_info();
      for (int r = 1; r < runner_->world(); ++r) mem.available = std::min(mem.available, runner_->backend(r).memory_info()->available);
      // Device memory that grows outside the backend's allocator while serving: the
      // driver's local memory (the largest stack launched so far times the resident
      // threads), cuBLASLt and CUDA graph executables of new batch shapes. gpt-oss-120b on
      // an 80 GB card, with 10% of ~4.9 GB left over, died at 128 streams in cuBLASLt.
      const int64_t reserve = device_reserve_bytes(mem.device_total);
      const int64_t free_bytes = mem.available - peak - reserve;
      if (free_bytes <= 0) {
        return Status(StatusCode::kResourceExhausted,
                      "no device memory left for the KV cache: " + mib(mem.in_use) + " of weights, a " + mib(peak) +
                          " activation peak, " + mib(reserve) + " kept for the runtime, " + mib(mem.available) +
                          " available");
      }
      kv_bytes = int64_t(double(o.gpu_memory_utilization) * double(free_bytes)) - state_bytes;
      KILN_LOG(kInfo, "memory: " << mib(mem.in_use) << " of weights and buffers, " << mib(peak) << " activation peak, "
                                 << mib(reserve) << " kept for the runtime, " << mib(mem.available)
                                 << " available; KV cache " << o.gpu_memory_utilization << " of what remains");
    } else {
      kv_bytes = std::min(kDefaultCpuKvBytes, int64_t(o.max_num_seqs) * len * bytes_token);
    }
  }
  // A model cut to recurrent layers only (--num-layers on a hybrid) stores no keys and
  // values: its blocks only count tokens, as many as every sequence at full length needs.
  const int64_t n_blocks =
      bytes_token > 0 ? kv_bytes / (bytes_token * bs) : int64_t(o.max_num_seqs) * ((len + bs - 1) / bs);
  if (n_blocks <= 0) {
    return Status(StatusCode::kResourceExhausted, "a KV cache of " + mib(kv_bytes) + " holds no block of " +
                                                      std::to_string(bs) + " tokens (" +
                                                      std::to_string(bytes_token) + " bytes per token)");
  }
  if (n_blocks > INT32_MAX / bs) return invalid_argument("KV cache of " + mib(kv_bytes) + " is too large");
  const int64_t capacity = n_blocks * bs;
  if (capacity < len) {
    if (o.max_model_len > 0) {
      return Status(StatusCode::kResourceExhausted,
                    "the KV cache (" + mib(n_blocks * bs * bytes_token) + ") holds " + std::to_string(capacity) +
                        " tokens, fewer than the maximum model length " + std::to_string(len) +
                        ": lower --max-model-len or give the cache more memory");
    }
    KILN_LOG(kWarn, "maximum model length " << len << " lowered to " << capacity << ", what the KV cache holds");
    max_model_len_ = capacity;
  }
  kv_ = runner_->make_kv(int32_t(n_blocks), bs, o.kv_cache_dtype, n_state_rows);
  kv_bytes_ = n_blocks * bs * bytes_token;
  states_ = recurrent ? StateCache(o.max_num_seqs, n_checkpoints, n_snapshots) : StateCache();
  if (recurrent) {
    scheduler_->set_usable_prefix([this](const PrefixMatch& m) {
      for (int32_t i = int32_t(m.hashes.size()); i > 0; --i)
        if (states_.has(m.hashes[size_t(i - 1)])) return i;
      return 0;
    });
    KILN_LOG(kInfo, "recurrent state: " << n_state_rows << " rows of "
                                        << mib(runner_->state_bytes_per_row()) << " (" << o.max_num_seqs
                                        << " running, " << n_checkpoints << " prefix checkpoints, " << n_snapshots
                                        << " speculative snapshots)");
  }
  const bool prefix_caching = o.enable_prefix_caching;
  blocks_ = std::make_unique<BlockManager>(int32_t(n_blocks), bs, prefix_caching);
  KILN_LOG(kInfo, "KV cache: " << dtype_name(kv_[0].storage) << (fp8 ? " with fp32 scales per row" : "") << ", "
                               << n_blocks << " blocks of " << bs
                               << " tokens = " << capacity << " tokens (" << mib(kv_bytes_) << ", " << bytes_token
                               << " bytes per token), max model len " << max_model_len_ << ", prefix caching "
                               << (prefix_caching ? "on" : "off"));
  return Status::Ok();
}

int64_t Engine::measure_activation_peak() {
  // The largest step: the whole token budget, over as many sequences as may run, each
  // sampling its last row with the most logprobs (with speculative decoding, its last
  // num_speculative_tokens + 1 rows: a verify step's logits).
  const SchedulerConfig& sc = scheduler_->config();
  const int32_t bs = options_.block_size;
  const int32_t n_seqs = std::max(1, std::min(sc.max_num_seqs, sc.max_num_batched_tokens));
  const int32_t per_seq = int32_t(std::min<int64_t>(max_model_len_, (sc.max_num_batched_tokens + n_seqs - 1) / n_seqs));
  const int32_t blocks_per_seq = (per_seq + bs - 1) / bs;
  const int world = runner_->world();
  std::vector<int64_t> base(static_cast<size_t>(world)), temp_kv(static_cast<size_t>(world));
  const auto in_use = [&](int r) { return runner_->backend(r).memory_info()->in_use; };
  for (int r = 0; r < world; ++r) {
    runner_->backend(r).synchronize();
    runner_->backend(r).reset_peak_memory();
    base[size_t(r)] = in_use(r);
  }
  {
    std::vector<KvCache> temp =
        runner_->make_kv(n_seqs * blocks_per_seq, bs, options_.kv_cache_dtype, runner_->recurrent() ? n_seqs + 1 : 0);
    for (int r = 0; r < world; ++r) temp_kv[size_t(r)] = in_use(r) - base[size_t(r)];
    ops::BatchMeta b;
    b.block_size = bs;
    b.max_blocks_per_seq = blocks_per_seq;
    for (int32_t s = 0; s < n_seqs; ++s) {
      b.q_start.push_back(b.n_tokens());
      b.context_len.push_back(per_seq);
      for (int32_t i = 0; i < blocks_per_seq; ++i) b.block_table.push_back(s * blocks_per_seq + i);
      const int32_t logit_rows =
          options_.speculative_method != SpeculativeMethod::kOff ? std::min(per_seq, options_.num_speculative_tokens + 1) : 1;
      for (int32_t p = 0; p < per_seq; ++p) {
        b.token_ids.push_back(int32_t((s * 7919 + p) % config_.vocab_size));
        b.positions.push_back(p);
        b.slot_mapping.push_back(int32_t(b.slot(s, p)));
        if (p >= per_seq - logit_rows) b.logit_rows.push_back(b.n_tokens() - 1);
      }
      if (runner_->recurrent()) b.state_slots.push_back(s);
    }
    b.q_start.push_back(b.n_tokens());
    step_batch_ = std::move(b);
    const Tensor logits = run_forward(temp);
    const size_t rows = step_batch_.logit_rows.size();
    std::vector<ops::SamplingParams> params(rows, {.temperature = 1.0f});
    std::vector<float> uniform(rows, 0.5f);
    const int32_t n_top = int32_t(std::min<int64_t>(ops::kMaxTopLogprobs, config_.vocab_size));
    std::vector<int32_t> tokens(rows), top_ids(rows * static_cast<size_t>(n_top));
    std::vector<float> logprobs(rows), top_logprobs(rows * static_cast<size_t>(n_top));
    backend_->sample({.logits = logits, .params = params, .uniform = uniform, .n_top = n_top, .tokens = tokens,
                      .logprobs = logprobs, .top_ids = top_ids, .top_logprobs = top_logprobs});
    for (int r = 0; r < world; ++r) runner_->backend(r).synchronize();
  }
  int64_t peak = 0;
  for (int r = 0; r < world; ++r) {
    peak = std::max(peak, runner_->backend(r).memory_info()->peak_in_use - base[size_t(r)] - temp_kv[size_t(r)]);
  }
  KILN_LOG(kInfo, "activation peak " << mib(peak) << " for a step of " << step_batch_.n_tokens() << " tokens in "
                                     << n_seqs << " sequences");
  step_batch_ = {};
  return std::max<int64_t>(peak, 0);
}

Status Engine::check_prompt(const std::vector<int32_t>& prompt, int64_t extra_tokens) const {
  if (prompt.empty()) return invalid_argument("the prompt has no tokens");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config_.vocab_size) {
      return invalid_argument("token " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")");
    }
  }
  if (int64_t(prompt.size()) + extra_tokens > max_model_len_) {
    return invalid_argument("this model's maximum context length is " + std::to_string(max_model_len_) +
                            " tokens, but " + std::to_string(int64_t(prompt.size()) + extra_tokens) +
                            " were requested (" + std::to_string(prompt.size()) + " in the prompt, " +
                            std::to_string(extra_tokens) + " to generate)");
  }
  return Status::Ok();
}

Tensor Engine::forward(ops::BatchMeta&& batch) {
  step_batch_ = std::move(batch);  // run_step needs the batch alive until the step's last op
  return run_forward(kv_);
}

Tensor Engine::run_forward(std::vector<KvCache>& kv) {
  Result<Tensor> logits = runner_->forward(step_batch_, kv);
  if (!logits.ok()) {  // a rank failed: the ranks' state is lost, nothing can go on
    KILN_LOG(kError, "model step failed: " << logits.status().to_string());
    throw EngineFailure(logits.status().to_string());
  }
  return std::move(logits).value();
}

ops::BatchMeta Engine::one_sequence_batch(const BlockTable& table, std::span<const int32_t> tokens, int32_t first_pos,
                                          bool all_rows) const {
  ops::BatchMeta b;
  b.block_size = kv_[0].block_size;
  b.block_table = table.blocks;
  b.max_blocks_per_seq = int32_t(table.blocks.size());
  const int32_t n = int32_t(tokens.size());
  b.q_start = {0, n};
  b.context_len = {first_pos + n};
  if (states_.enabled()) b.state_slots = {states_.scratch_row()};
  for (int32_t i = 0; i < n; ++i) {
    b.token_ids.push_back(tokens[size_t(i)]);
    b.positions.push_back(first_pos + i);
    b.slot_mapping.push_back(int32_t(b.slot(0, first_pos + i)));
    if (all_rows || i == n - 1) b.logit_rows.push_back(i);
  }
  return b;
}

Result<std::vector<std::vector<float>>> Engine::logits(const std::vector<int32_t>& prompt) {
  KILN_RETURN_IF_ERROR(check_prompt(prompt, 0));
  const int32_t n = int32_t(prompt.size());
  BlockTable table;
  if (!blocks_->can_allocate(blocks_->blocks_needed(table, n))) {
    return Status(StatusCode::kResourceExhausted, "KV cache full");
  }
  blocks_->allocate(table, {}, n);
  const int32_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk : n;
  std::vector<std::vector<float>> out;
  for (int32_t begin = 0; begin < n; begin += chunk) {
    const int32_t end = std::min(n, begin + chunk);
    const Tensor logits =
        forward(one_sequence_batch(table, std::span(prompt).subspan(size_t(begin), size_t(end - begin)), begin, true));
    std::vector<float> flat(size_t(logits.numel()));
    backend_->to_host_f32(logits, flat.data());
    const size_t vocab = size_t(config_.vocab_size);
    for (int32_t r = 0; r < end - begin; ++r)
      out.emplace_back(flat.begin() + long(size_t(r) * vocab), flat.begin() + long(size_t(r + 1) * vocab));
  }
  blocks_->free(table);
  return out;
}

Result<GenerateResult> Engine::generate(const std::vector<int32_t>& prompt, int32_t max_new_tokens,
                                        const SamplingParams& sampling, bool ignore_eos) {
  KILN_ASSIGN_OR_RETURN(std::vector<GenerateResult> r, generate_batch({prompt}, max_new_tokens, sampling, ignore_eos));
  return std::move(r.front());
}

Result<std::vector<GenerateResult>> Engine::generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                          int32_t max_new_tokens, const SamplingParams& sampling,
                                                          bool ignore_eos) {
  if (max_new_tokens < 0) return invalid_argument("max tokens must not be negative");
  if (prompts.empty()) return invalid_argument("no prompts");
  if (!idle()) return invalid_argument("generate_batch while requests are in flight");
  KILN_RETURN_IF_ERROR(validate(sampling, config_.vocab_size));
  for (const auto& prompt : prompts) KILN_RETURN_IF_ERROR(check_prompt(prompt, max_new_tokens));
  std::vector<GenerateResult> out(prompts.size());
  if (max_new_tokens == 0) return out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = std::make_shared<Request>(Request{
        .prompt = prompts[i], .sampling = sampling, .max_tokens = max_new_tokens, .ignore_eos = ignore_eos});
    KILN_RETURN_IF_ERROR(add_request(i, std::move(r)));
  }
  while (!idle()) {
    for (StepOutput& o : step()) {
      GenerateResult& g = out[size_t(o.request_id)];
      g.tokens.push_back(o.token.token);
      if (sampling.logprobs >= 0) g.logprobs.push_back(std::move(o.token));
      if (o.finish == FinishReason::kEos) g.stopped_by_eos = true;
    }
  }
  return out;
}

// Tests only (Request::forced_output): the token emitted is `id`, with its own logprob
// from the row's (penalised) logits; the top alternatives stay the model's.
void Engine::force(SampledToken& t, int32_t id, const Tensor& logits, size_t row, bool logprob) {
  t.token = id;
  if (logprob) {
    std::vector<float> x(size_t(config_.vocab_size));
    backend_->to_host_f32(logits.slice0(int64_t(row), int64_t(row) + 1), x.data());
    const double top = *std::max_element(x.begin(), x.end());
    double sum = 0.0;
    for (float v : x) sum += std::exp(double(v) - top);
    t.logprob = float(double(x[size_t(id)]) - top - std::log(sum));
  }
}

Status Engine::check_request(const Request& r) const {
  if (r.n < 1) return invalid_argument("n must be at least 1 (got " + std::to_string(r.n) + ")");
  if (r.max_tokens < 0) return invalid_argument("max_tokens must not be negative");
  KILN_RETURN_IF_ERROR(validate(r.sampling, config_.vocab_size));
  KILN_RETURN_IF_ERROR(check_prompt(r.prompt, r.max_tokens));
  for (const std::vector<int32_t>* ids : {&r.stop_token_ids, &r.forced_output}) {
    for (int32_t t : *ids) {
      if (t < 0 || t >= config_.vocab_size) {
        return invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                std::to_string(config_.vocab_size) + ")");
      }
    }
  }
  return Status::Ok();
}

Status Engine::add_request(uint64_t id, std::shared_ptr<const Request> r) {
  KILN_RETURN_IF_ERROR(check_request(*r));
  if (r->max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  if (const OutputConstraint* c = r->constraint.get()) {
    if (c->grammar == nullptr || c->masker == nullptr || c->token_bytes == nullptr)
      return invalid_argument("structured output without a grammar or a vocabulary");
    if (c->masker->vocab_size() > size_t(config_.vocab_size) || c->token_bytes->size() != c->masker->vocab_size())
      return invalid_argument("structured output's vocabulary (" + std::to_string(c->masker->vocab_size()) +
                              " tokens) does not fit the model's " + std::to_string(config_.vocab_size));
  }
  KILN_CHECK(requests_.count(id) == 0) << "request id " << id << " is in use";
  RequestState& st = requests_[id];
  st.request = r;
  st.n_unfinished = r->n;
  std::vector<int32_t> end_ids;  // structured output: allowed once the output is complete
  if (r->constraint != nullptr) {
    if (!r->ignore_eos) end_ids = eos_ids_;
    end_ids.insert(end_ids.end(), r->stop_token_ids.begin(), r->stop_token_ids.end());
  }
  // Samples after the first wait for its prompt blocks when there are full ones to share.
  const bool share = r->n > 1 && blocks_->prefix_caching() && int32_t(r->prompt.size()) > kv_[0].block_size;
  for (int32_t i = 0; i < r->n; ++i) {
    SamplingParams params = r->sampling;
    params.seed = r->sampling.seed + uint64_t(i);
    auto seq = std::make_unique<Sequence>(id, i, r, params);
    seq->tokens = r->prompt;
    seq->n_prompt = int32_t(r->prompt.size());
    seq->sampler.observe_prompt(r->prompt);
    if (r->constraint != nullptr) seq->sampler.constrain(r->constraint, end_ids);
    if (i > 0 && share) seq->wait_for = st.seqs.front().get();
    scheduler_->add(seq.get());
    st.seqs.push_back(std::move(seq));
  }
  stats_.prompt_tokens += int64_t(r->prompt.size());
  ++unstarted_requests_;
  return Status::Ok();
}

void Engine::release_state_slot(Sequence& seq) {
  if (seq.state_slot < 0) return;
  states_.release(seq.state_slot);
  seq.state_slot = -1;
}

void Engine::copy_state_row(int32_t src, int32_t dst) {
  for (int r = 0; r < runner_->world(); ++r)
    for (model::LayerKv& l : kv_[size_t(r)].layers)
      for (const Tensor* t : {&l.conv_state, &l.recurrent_state})
        if (t->defined()) runner_->backend(r).copy_rows({.src = *t, .src_row = src, .dst = *t, .dst_row = dst});
}

void Engine::assign_state_rows(const Schedule& schedule) {
  for (const ScheduledSeq& s : schedule.seqs) {
    Sequence& seq = *s.seq;
    if (seq.state_slot >= 0) continue;
    seq.state_slot = states_.acquire();
    if (seq.n_computed == 0) continue;  // starts from zeros (the layer clears the row)
    // It starts after cached blocks: the scheduler kept those up to a checkpoint.
    const int32_t bs = blocks_->block_size();
    KILN_CHECK(seq.table.n_full_hashed * bs == seq.n_computed) << "a resumed sequence's prefix is not its hashed blocks";
    const int32_t row = states_.find(seq.table.last_hash);
    KILN_CHECK(row >= 0) << "no state checkpoint for a cached prefix of " << seq.n_computed << " tokens";
    copy_state_row(row, seq.state_slot);
  }
}

void Engine::checkpoint_states(const Schedule& schedule) {
  for (const ScheduledSeq& s : schedule.seqs)
    if (s.n_draft == 0) checkpoint_state(*s.seq);  // (one with drafts: after its verification)
}

void Engine::checkpoint_state(const Sequence& seq) {
  if (!blocks_->prefix_caching()) return;
  const int32_t bs = blocks_->block_size();
  if (seq.n_computed % bs != 0 || seq.table.n_full_hashed * bs != seq.n_computed) return;
  const int32_t row = states_.store(seq.table.last_hash);
  if (row >= 0) copy_state_row(seq.state_slot, row);
}

void Engine::finish(Sequence& seq, FinishReason reason) {
  mtp_forget(seq);
  scheduler_->remove(&seq);
  blocks_->free(seq.table);
  release_state_slot(seq);
  seq.state = SeqState::kFinished;
  seq.finish = reason;
  RequestState& st = requests_.at(seq.request_id);
  if (seq.sample_index == 0)
    for (auto& s : st.seqs) s->wait_for = nullptr;
  --st.n_unfinished;
}

void Engine::cancel(uint64_t id, int32_t sample) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  for (auto& s : it->second.seqs)
    if (s->state != SeqState::kFinished && (sample < 0 || s->sample_index == sample)) finish(*s, FinishReason::kCancelled);
  if (it->second.n_unfinished == 0) drop_request(it);
}

void Engine::drop_request(std::unordered_map<uint64_t, RequestState>::iterator it) {
  if (!it->second.started) --unstarted_requests_;
  requests_.erase(it);
}

std::vector<StepOutput> Engine::step() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t generated_before = stats_.generated_tokens;
  // Steps with a one-time cost (a batch shape's first run or recording on a GPU) say
  // nothing about the steady state the depth policy prices: they are left out of it.
  const auto one_time_steps = [&] {
    int64_t n = 0;
    for (int r = 0; r < runner_->world(); ++r) n += runner_->backend(r).one_time_steps();
    return n;
  };
  const int64_t one_time_before = one_time_steps();
  if (options_.speculative_method != SpeculativeMethod::kOff) propose_drafts();
  const Schedule schedule = scheduler_->schedule(*blocks_);
  // A preempted sequence starts again from position 0: its recurrent-state row is free.
  for (Sequence* s : schedule.preempted) {
    release_state_slot(*s);
    mtp_forget(*s);  // its blocks went back
  }
  if (schedule.empty()) return {};
  const bool decoding = std::all_of(schedule.seqs.begin(), schedule.seqs.end(), [](const ScheduledSeq& s) {
    return s.n_new == 1 + s.n_draft && s.seq->n_uncomputed() == 1;
  });
  EngineStats::StepKind& kind = schedule.decode_only() ? stats_.decode_steps
                                : decoding              ? stats_.verify_steps
                                                        : stats_.mixed_steps;
  ++kind.steps;
  kind.tokens += schedule.n_tokens;
  struct AddTime {  // on every return
    std::chrono::steady_clock::time_point start;
    double& seconds;
    ~AddTime() { seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
  } add_time{start, kind.seconds};
  if (states_.enabled()) assign_state_rows(schedule);
  StepBatch batch = build_step_batch(schedule, kv_[0].block_size, states_.enabled() ? states_.scratch_row() : -1,
                                     scheduler_->config().max_num_batched_tokens,
                                     /*pad_any_verify=*/options_.parallel.pipeline_parallel == 1);
  // Recurrent layers: verify row j < k of the i-th sequence with drafts leaves its state
  // in snapshot row i K + j (restored below where draft j + 1 is rejected).
  if (states_.enabled() && !batch.verify.empty()) {
    std::vector<int32_t>& snap = batch.meta.state_snapshots;
    snap.assign(size_t(batch.meta.n_tokens()), -1);
    for (size_t i = 0; i < batch.verify.size(); ++i)
      for (int32_t j = 0; j < batch.verify[i].n_draft; ++j)
        snap[size_t(batch.verify[i].first_row + j)] = states_.snapshot_row(int32_t(i) * options_.num_speculative_tokens + j);
  }
  mtp_mark_device_drafts(batch.meta, batch.verify);  // drafts the forward pass reads on the device
  const std::vector<Sequence*> sampled = std::move(batch.sampled);
  const std::vector<StepBatch::Verify> verify = std::move(batch.verify);
  const std::vector<StepBatch::Rows> rows = std::move(batch.rows);
  std::vector<Sampler*> samplers;
  for (Sequence* s : sampled) samplers.push_back(&s->sampler);
  // Structured output: the token masks of this step's samples on worker threads while the
  // forward pass runs (each sampler's matcher stands where its last token left it).
  std::future<std::vector<uint32_t>> masks;
  if (std::any_of(samplers.begin(), samplers.end(), [](const Sampler* s) { return s->constrained(); }))
    masks = std::async(std::launch::async, [&samplers, vocab = config_.vocab_size, threads = mask_threads_] {
      return token_masks(samplers, vocab, threads);
    });
  struct Join {  // on every return: the workers read the samplers
    std::function<void()> wait;
    ~Join() { wait(); }
  } join_masks{[&masks] {
    if (masks.valid()) masks.wait();
  }};
  // Constrained sequences with drafts: the masks of their verify rows, likewise (each
  // matcher is only read by one of the two tasks: a sequence samples or verifies).
  std::future<std::vector<std::vector<uint32_t>>> draft_masks;
  if (std::any_of(verify.begin(), verify.end(), [](const StepBatch::Verify& v) { return v.seq->sampler.constrained(); }))
    draft_masks = std::async(std::launch::async, [&verify, words = size_t(ops::token_mask_words(config_.vocab_size))] {
      std::vector<std::vector<uint32_t>> out(verify.size());
      for (size_t i = 0; i < verify.size(); ++i) {
        Sequence& seq = *verify[i].seq;
        if (!seq.sampler.constrained()) continue;
        out[i].resize(size_t(verify[i].n_draft + 1) * words);
        seq.sampler.fill_draft_masks(std::span(seq.draft.data(), size_t(verify[i].n_draft)), out[i], words);
      }
      return out;
    });
  Join join_draft_masks{[&draft_masks] {
    if (draft_masks.valid()) draft_masks.wait();
  }};
  // Steps whose sequences all decode (with or without drafts) price the depth policy's rows.
  const bool timed = decoding;
  auto phase_start = std::chrono::steady_clock::now();
  const auto end_phase = [&](int phase) {
    const auto now = std::chrono::steady_clock::now();
    kind.phase_seconds[phase] += std::chrono::duration<double>(now - phase_start).count();
    phase_start = now;
  };
  kind.phase_seconds[0] += std::chrono::duration<double>(phase_start - start).count();
  const Tensor logits = forward(std::move(batch.meta));
  end_phase(1);
  mtp_fetch();  // (queued after the forward pass: the drafts it verifies, for the host)
  for (const ScheduledSeq& s : schedule.seqs) {
    if (RequestState& st = requests_.at(s.seq->request_id); !st.started) {
      st.started = true;
      --unstarted_requests_;
    }
    // Drafts are computed but not yet known to stand: only the last token counts (the
    // accepted ones are added, and committed to the prefix cache, after verification).
    s.seq->n_computed += s.n_new - s.n_draft;
    blocks_->commit(s.seq->table, s.seq->tokens, s.seq->n_computed);
    stats_.computed_tokens += s.n_new;
  }
  if (states_.enabled()) checkpoint_states(schedule);
  ++stats_.steps;
  std::vector<StepOutput> outs;
  std::vector<uint64_t> done;
  if (!sampled.empty()) {
    std::vector<SampledToken> tokens = sample_rows(*backend_, logits.slice0(0, int64_t(sampled.size())), samplers,
                                                   masks.valid() ? masks.get() : std::vector<uint32_t>{});
    for (size_t i = 0; i < sampled.size(); ++i) {
      Sequence& seq = *sampled[i];
      const Request& r = *seq.request;
      SampledToken t = std::move(tokens[i]);
      if (size_t(seq.n_generated()) < r.forced_output.size()) force(t, r.forced_output[size_t(seq.n_generated())], logits, i, r.sampling.logprobs >= 0);
      emit(seq, std::move(t), outs, done);
    }
  }
  // Speculative verification: each sequence's rows [last, d1 .. dk] follow the sampled
  // ones; all of them sampled in one call.
  const std::vector<std::vector<uint32_t>> verify_masks =
      draft_masks.valid() ? draft_masks.get() : std::vector<std::vector<uint32_t>>(verify.size());
  std::vector<VerifyRows> to_verify;
  int64_t verify_rows = 0;
  for (size_t i = 0; i < verify.size(); ++i) {
    Sequence& seq = *verify[i].seq;
    to_verify.push_back({.sampler = &seq.sampler,
                         .draft = std::span<const int32_t>(seq.draft.data(), size_t(verify[i].n_draft)),
                         .allowed = verify_masks[i]});
    verify_rows += verify[i].n_draft + 1;
  }
  std::vector<Verification> results;
  if (!to_verify.empty()) {
    const int64_t row = int64_t(sampled.size());
    results = verify_drafts(*backend_, logits.slice0(row, row + verify_rows), to_verify);
  }
  end_phase(2);
  for (size_t i = 0; i < verify.size(); ++i) {
    const StepBatch::Verify& v = verify[i];
    Sequence& seq = *v.seq;
    Verification& result = results[i];
    stats_.spec_draft_tokens += v.n_draft;
    stats_.spec_accepted_tokens += result.n_accepted;
    ++stats_.spec_verified_seqs;
    depth_->record_verification(v.n_draft, result.n_accepted);
    // The accepted drafts' KV stands; the rejected positions' blocks go back.
    seq.n_computed += result.n_accepted;
    bool running = true;
    for (SampledToken& t : result.tokens)
      if (!(running = emit(seq, std::move(t), outs, done))) break;
    if (!running) continue;
    blocks_->shrink(seq.table, seq.n_computed);
    blocks_->commit(seq.table, seq.tokens, seq.n_computed);
    if (states_.enabled()) {
      // The state after the last row that stood: [last, d1 .. d_accepted].
      if (result.n_accepted < v.n_draft)
        copy_state_row(states_.snapshot_row(int32_t(i) * options_.num_speculative_tokens + result.n_accepted),
                       seq.state_slot);
      checkpoint_state(seq);
    }
  }
  if (options_.speculative_method == SpeculativeMethod::kMtp) mtp_drafts(rows);
  for (uint64_t id : done) drop_request(requests_.find(id));
  const int64_t one_time = one_time_steps() - one_time_before;
  stats_.one_time_steps += one_time > 0 ? 1 : 0;
  if (depth_) {
    depth_->record_step(timed, !verify.empty(), int32_t(schedule.seqs.size()), schedule.n_tokens,
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                        stats_.generated_tokens - generated_before, one_time > 0);
  }
  end_phase(3);
  return outs;
}

bool Engine::emit(Sequence& seq, SampledToken t, std::vector<StepOutput>& outs, std::vector<uint64_t>& done) {
  const Request& r = *seq.request;
  seq.tokens.push_back(t.token);
  seq.sampler.observe_generated(t.token);
  ++stats_.generated_tokens;
  if (seq.sample_index == 0 && seq.n_generated() == 1)
    for (auto& s : requests_.at(seq.request_id).seqs) s->wait_for = nullptr;  // the prompt is cached now
  FinishReason f = FinishReason::kNone;
  if (!r.ignore_eos && contains(eos_ids_, t.token)) f = FinishReason::kEos;
  else if (contains(r.stop_token_ids, t.token)) f = FinishReason::kStopToken;
  else if (seq.sampler.grammar_done()) f = FinishReason::kGrammar;
  else if (seq.n_generated() >= r.max_tokens || seq.n_tokens() >= max_model_len_) f = FinishReason::kLength;
  outs.push_back({.request_id = seq.request_id, .sample_index = seq.sample_index, .token = std::move(t), .finish = f});
  if (f == FinishReason::kNone) return true;
  finish(seq, f);
  if (requests_.at(seq.request_id).n_unfinished == 0) done.push_back(seq.request_id);
  return false;
}

void Engine::propose_drafts() {
  const int32_t k = options_.num_speculative_tokens;
  // A grammar cuts drafts by their values (below): those still on the device come first.
  if (std::any_of(scheduler_->running().begin(), scheduler_->running().end(),
                  [](const Sequence* s) { return s->mtp_device_slot >= 0 && s->sampler.constrained(); }))
    mtp_fetch();
  std::vector<int32_t> lengths;  // of the decoding sequences' drafts at depth K
  for (Sequence* seq : scheduler_->running()) {
    seq->draft.clear();
    const Request& r = *seq->request;
    // Decoding sequences only, not those the test hook forces.
    if (seq->n_uncomputed() != 1 || size_t(seq->n_generated()) < r.forced_output.size()) continue;
    // At most one token fewer than the sequence may still emit: the target's own token
    // always follows the accepted drafts.
    const int64_t can_emit = std::min<int64_t>(r.max_tokens - seq->n_generated(), max_model_len_ - seq->n_tokens());
    const int32_t n = int32_t(std::min<int64_t>(k, can_emit - 1));
    if (n >= 1 && options_.speculative_method == SpeculativeMethod::kNgram)
      seq->draft = options_.speculative_test_drafter ? options_.speculative_test_drafter(seq->request_id, seq->tokens, n)
                                                     : ngram_draft(seq->tokens, n);
    if (seq->draft.size() > size_t(std::max(n, 0))) seq->draft.resize(size_t(std::max(n, 0)));
    if (n >= 1 && options_.speculative_method == SpeculativeMethod::kMtp && seq->mtp_draft_at == seq->n_tokens())
      seq->draft.assign(seq->mtp_draft.begin(), seq->mtp_draft.begin() + std::min<ptrdiff_t>(n, ssize(seq->mtp_draft)));
    // Structured output: a draft stands only as a token the grammar allows, so the draft
    // ends where the grammar stops taking it.
    seq->draft.resize(seq->sampler.grammar_prefix(seq->draft));
    lengths.push_back(int32_t(seq->draft.size()));
  }
  // This step's depth (runtime/adaptive_depth.h): the drafts cut to it.
  const int32_t depth = depth_->choose(lengths);
  for (Sequence* seq : scheduler_->running())
    if (int32_t(seq->draft.size()) > depth) seq->draft.resize(size_t(depth));
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.preemptions = scheduler_->preemptions();
  s.prefix_queried_tokens = blocks_->prefix_queried_tokens();
  s.prefix_hit_tokens = blocks_->prefix_hit_tokens();
  s.running = int32_t(scheduler_->running().size());
  s.waiting = int32_t(scheduler_->waiting().size());
  s.waiting_requests = unstarted_requests_;
  s.kv_blocks_used = blocks_->n_used();
  s.kv_blocks_total = blocks_->n_blocks();
  if (depth_) {
    s.spec_depth_steps = depth_->choices();
    s.spec_depth_total = depth_->depth_total();
    s.spec_depth_recent = depth_->recent_depth();
  }
  return s;
}

}  // namespace kiln::runtime
