#include "runtime/engine.h"

#include <algorithm>

#include "core/log.h"
#include "formats/quant_config.h"
#include "formats/safetensors.h"
#include "model/inspect.h"
#include "model/loader.h"
#include "models/registry.h"

namespace kiln::runtime {

Result<std::unique_ptr<Engine>> Engine::load(const std::string& model_dir,
                                             std::unique_ptr<ops::Backend> backend,
                                             const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  e->backend_ = std::move(backend);
  KILN_ASSIGN_OR_RETURN(e->config_, formats::load_config(model_dir));
  KILN_ASSIGN_OR_RETURN(formats::Checkpoint ckpt, formats::Checkpoint::open(model_dir));
  KILN_ASSIGN_OR_RETURN(formats::QuantConfig quant, formats::load_quant_config(model_dir));
  model::WeightLoader loader(ckpt, *e->backend_, quant);
  auto built = models::build_model(e->config_, loader);
  if (!built.ok()) return built.status().with_context("loading " + model_dir);
  e->model_ = std::move(built).value();
  KILN_RETURN_IF_ERROR(model::check_backend_support(e->model_, *e->backend_).with_context("loading " + model_dir));
  for (const std::string& name : loader.unused()) {
    KILN_LOG(kInfo, "checkpoint tensor not used by " << e->config_.architecture << ": " << name);
  }

  int64_t len = options.max_model_len;
  if (len <= 0) len = std::min<int64_t>(e->config_.max_position_embeddings > 0
                                            ? e->config_.max_position_embeddings
                                            : 8192,
                                        8192);
  e->max_model_len_ = len;
  const int32_t bs = options.block_size;
  if (bs <= 0) return invalid_argument("block size must be positive");
  const int32_t n_blocks = int32_t((len + bs - 1) / bs);
  e->kv_ = KvCache::create(*e->backend_, e->model_.kv_layouts(), n_blocks, bs);
  e->blocks_ = BlockAllocator(n_blocks);
  return e;
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
    return invalid_argument("prompt (" + std::to_string(prompt.size()) + " tokens) plus " +
                            std::to_string(extra_tokens) + " new tokens exceeds the maximum length " +
                            std::to_string(max_model_len_));
  }
  return Status::Ok();
}

Tensor Engine::step(const std::vector<int32_t>& seq, int32_t begin, int32_t end,
                    const std::vector<int32_t>& block_table, const std::vector<int32_t>& rows) {
  ops::BatchMeta b;
  b.block_size = kv_.block_size;
  b.block_table = block_table;
  b.max_blocks_per_seq = int32_t(block_table.size());
  b.q_start = {0, end - begin};
  b.context_len = {end};
  for (int32_t p = begin; p < end; ++p) {
    b.token_ids.push_back(seq[size_t(p)]);
    b.positions.push_back(p);
    b.slot_mapping.push_back(int32_t(b.slot(0, p)));
  }
  b.logit_rows = rows;
  step_batch_ = std::move(b);  // run_step needs the batch alive until the step's last op
  return model_.forward(*backend_, step_batch_, kv_.layers);
}

Result<std::vector<std::vector<float>>> Engine::logits(const std::vector<int32_t>& prompt) {
  KILN_RETURN_IF_ERROR(check_prompt(prompt, 0));
  const int32_t n = int32_t(prompt.size());
  const int32_t n_blocks = (n + kv_.block_size - 1) / kv_.block_size;
  if (!blocks_.can_allocate(n_blocks)) return Status(StatusCode::kResourceExhausted, "KV cache full");
  const std::vector<int32_t> table = blocks_.allocate(n_blocks);
  const int32_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk : n;
  std::vector<std::vector<float>> out;
  for (int32_t begin = 0; begin < n; begin += chunk) {
    const int32_t end = std::min(n, begin + chunk);
    std::vector<int32_t> rows(size_t(end - begin));
    for (int32_t r = 0; r < end - begin; ++r) rows[size_t(r)] = r;
    const Tensor logits = step(prompt, begin, end, table, rows);
    std::vector<float> flat(size_t(logits.numel()));
    backend_->to_host_f32(logits, flat.data());
    const size_t vocab = size_t(config_.vocab_size);
    for (size_t r = 0; r < rows.size(); ++r)
      out.emplace_back(flat.begin() + long(r * vocab), flat.begin() + long((r + 1) * vocab));
  }
  blocks_.release(table);
  return out;
}

Result<GenerateResult> Engine::generate(const std::vector<int32_t>& prompt, int32_t max_new_tokens,
                                        const SamplingParams& sampling, bool ignore_eos) {
  KILN_ASSIGN_OR_RETURN(std::vector<GenerateResult> r, generate_batch({prompt}, max_new_tokens, sampling, ignore_eos));
  return std::move(r.front());
}

int32_t decode_bucket(int32_t n) {
  if (n <= 8) {
    int32_t b = 1;
    while (b < n) b *= 2;
    return b;
  }
  return (n + 7) / 8 * 8;
}

namespace {

// One sequence of a batched generation.
struct GenSeq {
  std::vector<int32_t> tokens;  // prompt + generated; all but the last are in the KV cache once decoding
  std::vector<int32_t> table;   // its KV blocks
  Sampler sampler;
  GenerateResult result;
  bool done = false;
};

}  // namespace

Result<std::vector<GenerateResult>> Engine::generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                          int32_t max_new_tokens, const SamplingParams& sampling,
                                                          bool ignore_eos) {
  if (max_new_tokens < 0) return invalid_argument("max tokens must not be negative");
  if (prompts.empty()) return invalid_argument("no prompts");
  KILN_RETURN_IF_ERROR(validate(sampling, config_.vocab_size));
  int32_t blocks_needed = 0;
  for (const auto& prompt : prompts) {
    KILN_RETURN_IF_ERROR(check_prompt(prompt, max_new_tokens));
    blocks_needed += (int32_t(prompt.size()) + max_new_tokens + kv_.block_size - 1) / kv_.block_size;
  }
  if (!blocks_.can_allocate(blocks_needed)) return Status(StatusCode::kResourceExhausted, "KV cache full");
  std::vector<GenSeq> seqs;
  for (const auto& prompt : prompts) {
    const int32_t n = (int32_t(prompt.size()) + max_new_tokens + kv_.block_size - 1) / kv_.block_size;
    seqs.push_back({.tokens = prompt, .table = blocks_.allocate(n), .sampler = Sampler(sampling)});
  }
  const auto& eos = config_.eos_token_ids;
  auto take = [&](GenSeq& s, SampledToken sampled) {
    s.result.tokens.push_back(sampled.token);
    s.tokens.push_back(sampled.token);
    if (sampling.logprobs >= 0) s.result.logprobs.push_back(std::move(sampled));
    if (!ignore_eos && std::find(eos.begin(), eos.end(), s.tokens.back()) != eos.end()) {
      s.result.stopped_by_eos = true;
      s.done = true;
    }
    if (int32_t(s.result.tokens.size()) >= max_new_tokens) s.done = true;
  };

  // Prefill each prompt on its own (in chunks if asked); its last row's logits
  // give its first token.
  if (max_new_tokens > 0) {
    for (GenSeq& s : seqs) {
      const int32_t n = int32_t(s.tokens.size());
      const int32_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk : n;
      for (int32_t begin = 0; begin < n; begin += chunk) {
        const int32_t end = std::min(n, begin + chunk);
        const Tensor logits = step(s.tokens, begin, end, s.table, {end - begin - 1});
        if (end == n) take(s, s.sampler.sample(*backend_, logits));
      }
    }
  }

  // Decode: the unfinished sequences advance one token per step, together, the
  // batch padded to decode_bucket(n) rows by repeating the first sequence's row
  // with a padding slot (it stores nothing and its logits are ignored), and the
  // block tables padded to one power-of-two width: few distinct batch shapes, so
  // the backend replays recorded steps (Backend::run_step).
  size_t width = 1;
  for (const GenSeq& s : seqs)
    while (width < s.table.size()) width *= 2;
  while (true) {
    std::vector<size_t> live;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (!seqs[i].done) live.push_back(i);
    if (live.empty()) break;
    const int32_t n = int32_t(live.size()), rows = decode_bucket(n);
    ops::BatchMeta b;
    b.block_size = kv_.block_size;
    b.max_blocks_per_seq = int32_t(width);
    for (int32_t r = 0; r < rows; ++r) {
      const GenSeq& s = seqs[live[size_t(r < n ? r : 0)]];
      const int32_t pos = int32_t(s.tokens.size()) - 1;
      b.q_start.push_back(r);
      b.context_len.push_back(pos + 1);
      b.block_table.insert(b.block_table.end(), s.table.begin(), s.table.end());
      b.block_table.resize(size_t(r + 1) * width, s.table.back());
      b.token_ids.push_back(s.tokens.back());
      b.positions.push_back(pos);
      b.slot_mapping.push_back(r < n ? int32_t(b.slot(r, pos)) : ops::kPadSlot);
      b.logit_rows.push_back(r);
    }
    b.q_start.push_back(rows);
    step_batch_ = std::move(b);
    const Tensor logits = model_.forward(*backend_, step_batch_, kv_.layers);
    for (int32_t r = 0; r < n; ++r) {
      GenSeq& s = seqs[live[size_t(r)]];
      take(s, s.sampler.sample(*backend_, logits.slice0(r, r + 1)));
    }
  }
  std::vector<GenerateResult> out;
  for (GenSeq& s : seqs) {
    blocks_.release(s.table);
    out.push_back(std::move(s.result));
  }
  return out;
}

}  // namespace kiln::runtime
