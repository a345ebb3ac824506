// CudaBackend::sample: the rows' parameters go up, sampling.cu runs one block per row on
// the device logits, and only the tokens (+ logprobs) come back.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_backend_impl.h"
#include "backends/cuda/kernels/token_mask.h"

namespace kiln::cuda {

static_assert(kSampleMaxTop == ops::kMaxTopLogprobs);

void CudaBackend::sample(const ops::SampleArgs& a) {
  ops::check_sample_args(a);
  KILN_CHECK(a.logits.device == Device::kCuda && a.logits.dtype == DType::kBF16)
      << "cuda: sample logits must be a bf16 device tensor (dtype " << dtype_name(a.logits.dtype) << ")";
  const int64_t n_rows = a.logits.dim(0), vocab = a.logits.dim(1);
  if (n_rows == 0) return;
  const int n_top = a.n_top;
  std::vector<SampleRow> rows(static_cast<size_t>(n_rows));
  for (size_t r = 0; r < rows.size(); ++r) {
    const ops::SamplingParams& p = a.params[r];
    rows[r] = {.temperature = p.temperature, .top_k = p.top_k, .top_p = p.top_p, .min_p = p.min_p,
               .uniform = a.uniform[r]};
  }
  // One device buffer in, one out: tokens | logprobs | top_ids | top_logprobs (4-byte words).
  const bool want_logprobs = !a.logprobs.empty();
  const size_t n_out = size_t(n_rows) * (2 + 2 * size_t(n_top));
  std::vector<std::shared_ptr<void>> keep;  // released after the synchronisation below
  auto* rows_d = scratch<SampleRow>(n_rows, keep);
  auto* out_d = scratch<int32_t>(int64_t(n_out), keep);
  int32_t* tokens_d = out_d;
  float* logprobs_d = reinterpret_cast<float*>(out_d + n_rows);
  int32_t* top_ids_d = out_d + 2 * n_rows;
  float* top_logprobs_d = reinterpret_cast<float*>(out_d + 2 * n_rows + n_rows * n_top);
  KILN_CUDA_CHECK(cudaMemcpyAsync(rows_d, rows.data(), rows.size() * sizeof(SampleRow), cudaMemcpyHostToDevice,
                                  stream_));
  // Penalties first, in place on the logits (host lists alive until the synchronisation).
  std::vector<PenaltyRow> prow;
  std::vector<PenaltyEntry> entries;
  if (!a.penalties.empty() && !a.penalty_tokens.empty()) {
    prow.resize(size_t(n_rows));
    entries.reserve(a.penalty_tokens.size());
    for (size_t r = 0; r < prow.size(); ++r) {
      const ops::PenaltyParams& p = a.penalties[r];
      prow[r] = {.repetition = p.repetition, .presence = p.presence, .frequency = p.frequency};
      for (int32_t e = a.penalty_start[r]; e < a.penalty_start[r + 1]; ++e)
        entries.push_back({.row = int32_t(r), .token = a.penalty_tokens[size_t(e)], .count = a.penalty_counts[size_t(e)]});
    }
    auto* prow_d = scratch<PenaltyRow>(n_rows, keep);
    auto* entries_d = scratch<PenaltyEntry>(int64_t(entries.size()), keep);
    KILN_CUDA_CHECK(cudaMemcpyAsync(prow_d, prow.data(), prow.size() * sizeof(PenaltyRow), cudaMemcpyHostToDevice,
                                    stream_));
    KILN_CUDA_CHECK(cudaMemcpyAsync(entries_d, entries.data(), entries.size() * sizeof(PenaltyEntry),
                                    cudaMemcpyHostToDevice, stream_));
    launch_apply_penalties(static_cast<bf16*>(a.logits.data), vocab, entries_d, int64_t(entries.size()), prow_d,
                           stream_);
  }
  if (!a.allowed.empty()) {  // structured output: masked tokens to -inf, after the penalties
    const int64_t words = ops::token_mask_words(vocab);
    auto* masks_d = scratch<uint32_t>(n_rows * words, keep);
    KILN_CUDA_CHECK(cudaMemcpyAsync(masks_d, a.allowed.data(), a.allowed.size_bytes(), cudaMemcpyHostToDevice, stream_));
    launch_apply_token_mask(static_cast<uint16_t*>(a.logits.data), n_rows, vocab, masks_d, words, stream_);
  }
  launch_sample(a.logits.as<bf16>(), n_rows, vocab, rows_d, n_top, tokens_d, want_logprobs ? logprobs_d : nullptr,
                top_ids_d, top_logprobs_d, stream_);
  std::vector<int32_t> out(n_out);
  KILN_CUDA_CHECK(cudaMemcpyAsync(out.data(), out_d, n_out * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  synchronize();  // also the end of `rows` and of the scratch
  const size_t nr = size_t(n_rows), nt = size_t(n_top);
  std::memcpy(a.tokens.data(), out.data(), nr * sizeof(int32_t));
  if (want_logprobs) std::memcpy(a.logprobs.data(), out.data() + nr, nr * sizeof(float));
  if (nt > 0) {
    std::memcpy(a.top_ids.data(), out.data() + 2 * nr, nr * nt * sizeof(int32_t));
    std::memcpy(a.top_logprobs.data(), out.data() + 2 * nr + nr * nt, nr * nt * sizeof(float));
  }
}

void CudaBackend::argmax(const ops::ArgmaxArgs& a) {
  KILN_CHECK(a.logits.device == Device::kCuda && a.logits.dtype == DType::kBF16 && a.logits.rank() == 2)
      << "cuda: argmax logits must be a bf16 device matrix (dtype " << dtype_name(a.logits.dtype) << ")";
  const int64_t n_rows = a.logits.dim(0);
  KILN_CHECK(a.out.device == Device::kCuda && a.out.dtype == DType::kI32 && a.out.numel() >= n_rows)
      << "cuda: argmax into " << dtype_name(a.out.dtype) << " " << a.out.shape << " for " << n_rows << " rows";
  if (n_rows == 0) return;
  // The sampling kernel's greedy pass (so the ids are sample()'s at temperature 0): rows
  // of default parameters, uploaded once per size (a synchronisation only then).
  if (greedy_rows_n_ < n_rows) {
    greedy_rows_n_ = std::max<int64_t>(n_rows, 2 * greedy_rows_n_);
    greedy_rows_ = allocator_->allocate(size_t(greedy_rows_n_) * sizeof(SampleRow));
    const std::vector<SampleRow> rows(static_cast<size_t>(greedy_rows_n_));
    KILN_CUDA_CHECK(cudaMemcpyAsync(greedy_rows_.get(), rows.data(), rows.size() * sizeof(SampleRow),
                                    cudaMemcpyHostToDevice, stream_));
    synchronize();
  }
  launch_sample(a.logits.as<bf16>(), n_rows, a.logits.dim(1), static_cast<const SampleRow*>(greedy_rows_.get()), 0,
                a.out.as<int32_t>(), nullptr, nullptr, nullptr, stream_);
}

}  // namespace kiln::cuda
