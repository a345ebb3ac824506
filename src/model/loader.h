// WeightLoader: binds checkpoint tensors to model blocks, checking names, shapes
// and dtypes against config, and uploading them to the backend. Every error names
// the tensor and the problem.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/quant_config.h"
#include "formats/safetensors.h"
#include "ops/backend.h"

namespace kiln {
class ThreadPool;
}

namespace kiln::model {

// The part of a model one rank holds (tensor, expert and pipeline parallelism; see
// docs/ARCHITECTURE.md "Many GPUs").
struct Shard {
  int tp_rank = 0, tp_size = 1;  // the tensor-parallel group: heads, MLP columns, vocab split
  bool expert_parallel = false;  // routed experts placed whole across the tensor-parallel
                                 // group instead of each expert's d_ff being split
  int64_t layer_begin = 0;       // this pipeline stage's decoder layers [layer_begin, layer_end)
  int64_t layer_end = -1;        // -1: to the last layer
  bool first_stage = true, last_stage = true;
  bool mtp = false;              // load the checkpoint's first MTP layer (last stage; CausalLM::mtp)

  // This rank's part [begin, begin + count) of n items split over the tensor-parallel
  // group: even parts, the last ones shorter when n does not divide (the vocabulary).
  std::pair<int64_t, int64_t> split(int64_t n) const {
    const int64_t part = (n + tp_size - 1) / tp_size;
    const int64_t begin = std::min(n, part * tp_rank);
    return {begin, std::min(n, begin + part) - begin};
  }
  // This rank's part [begin, begin + count) of n columns split over the tensor-parallel
  // group in whole units of `unit` columns (a quantized weight's scale block along the
  // cut): the first (units % tp_size) ranks hold one unit more, so gpt-oss-120b's d_ff of
  // 2880 (90 MXFP4 blocks of 32) at TP4 is 23 / 23 / 22 / 22 blocks; n divisible by
  // tp_size * unit gives even parts. The last unit may be partial; a rank may get none.
  std::pair<int64_t, int64_t> split_units(int64_t n, int64_t unit) const {
    const int64_t units = (n + unit - 1) / unit, each = units / tp_size, extra = units % tp_size;
    const int64_t u0 = each * tp_rank + std::min<int64_t>(tp_rank, extra);
    const int64_t u1 = u0 + each + (tp_rank < extra ? 1 : 0);
    const int64_t begin = std::min(n, u0 * unit);
    return {begin, std::min(n, u1 * unit) - begin};
  }
  // The routed experts this rank holds under expert parallelism: [begin, begin + count).
  std::pair<int64_t, int64_t> experts(int64_t n) const {
    if (!expert_parallel) return {0, n};
    const int64_t begin = n * tp_rank / tp_size;
    return {begin, n * (tp_rank + 1) / tp_size - begin};
  }
};

// A block of a tensor: per dimension (begin, count), count -1 for all of it; dimensions
// past the list are whole. Part{} is the whole tensor.
struct Part {
  std::vector<std::pair<int64_t, int64_t>> dims;
  static Part rows(int64_t begin, int64_t count) { return {{{begin, count}}}; }
  static Part cols(int64_t begin, int64_t count) { return {{{0, -1}, {begin, count}}}; }
  bool whole() const;
};

// `t` (host, any dtype of whole bytes) cut to `part`: a view when the part is contiguous
// (leading rows of whole trailing dims), else a copy that reads only the part.
Result<Tensor> slice_part(const Tensor& t, const Part& part);

class WeightLoader {
 public:
  WeightLoader(const formats::Checkpoint& ckpt, ops::Backend& backend,
               formats::QuantConfig quant = {})
      : ckpt_(&ckpt), backend_(backend), quant_(std::move(quant)) {}

  // --load-format dummy: no checkpoint; every tensor a block asks for is made at the
  // shape the config implies (cut to the shard's part), seeded by its name: norms near 1,
  // biases near 0, matrices with a standard deviation of 1/sqrt(fan-in) so activations and
  // routing behave like a trained model's. Dense tensors are made on the backend
  // (Backend::fill_random) in bf16 (vectors in f32); a linear that `quant` marks quantized
  // is made on the host in its checkpoint layout (model/dummy_quant.h, rows in parallel)
  // and goes through Backend::upload_quantized like a real checkpoint's. Optional tensors
  // (has()) are absent.
  static WeightLoader dummy(ops::Backend& backend, uint64_t seed, formats::QuantConfig quant = {}) {
    return WeightLoader(backend, seed, std::move(quant));
  }

  // A dummy loader that makes every tensor at its shape without memory or values (model/
  // dummy_quant.h's unbacked_tensor): a model bound with it is never run, only measured
  // (what each rank of a layout would hold: device_bytes(), CausalLM::kv_layouts()) on a
  // machine that need not have the memory, as `kiln inspect` and `kiln serve` do. The
  // backend only names where the weights would go.
  // `held_bytes`: what the device would hold for a quantized weight (its packed layout);
  // null counts the checkpoint layout's bytes.
  using HeldBytes = std::function<Result<int64_t>(const formats::QuantizedTensor&)>;
  static WeightLoader sizing(ops::Backend& backend, formats::QuantConfig quant = {}, HeldBytes held_bytes = nullptr) {
    WeightLoader w(backend, 0, std::move(quant));
    w.sizing_ = true;
    w.held_bytes_ = std::move(held_bytes);
    return w;
  }

  const formats::QuantConfig& quant() const { return quant_; }
  const Shard& shard() const { return shard_; }
  void set_shard(const Shard& s) { shard_ = s; }

  bool has(const std::string& name) const { return ckpt_ != nullptr && ckpt_->has(name); }
  // The columns a tensor-parallel cut of the linear `name`'s inputs must keep together:
  // its quantized format's scale block along the inputs (MXFP4 32, NVFP4 16, INT4 its
  // group size), 1 where any cut works (bf16; FP8 grids are refined at the cut).
  int64_t input_cut_unit(const std::string& name) const;

  // A float tensor (f32 / bf16 / f16) of exactly `shape` in the checkpoint, cut to `part`.
  Result<Tensor> tensor(const std::string& name, const Shape& shape, const Part& part = {});
  // Rows [begin, begin + count) of each range of a float tensor of exactly `shape`, one
  // after another (a tensor-parallel rank's channels of a weight whose rows are several
  // concatenated groups: Gated DeltaNet's conv1d over [q | k | v]).
  Result<Tensor> tensor_rows(const std::string& name, const Shape& shape,
                             const std::vector<std::pair<int64_t, int64_t>>& ranges);
  // A norm's weight: tensor() plus `offset` on every element (in f32; a norm that scales
  // by (1 + w) is stored as w: offset 1). Offset 0 is tensor().
  Result<Tensor> norm(const std::string& name, const Shape& shape, double offset);
  // Like tensor(), or an undefined Tensor when the checkpoint has no such name.
  Result<Tensor> optional_tensor(const std::string& name, const Shape& shape);
  // The linear layer `prefix` (an nn.Linear of the checkpoint): prefix.weight
  // [n_out, n_in] (+ prefix.bias [n_out] when `bias`), or its quantized tensors when
  // quantization_config says this layer is quantized (formats/quant.h layouts).
  // `part` (rows = outputs, cols = inputs) keeps a block of it, a quantized one cut
  // along its scale blocks (an error names the weight when a cut would split a block);
  // the bias follows the rows, and is loaded only where `bias_here` (a row-parallel
  // layer adds its bias on one rank).
  Result<ops::Weight> linear(const std::string& prefix, int64_t n_out, int64_t n_in, bool bias,
                             const Part& part = {}, bool bias_here = true);
  // Linears of one input (an attention's q, k and v), each as linear() loads it; where
  // the backend fuses adjacent linears (ops::Backend::fuses_adjacent_linears), all of
  // them are dense and each view would start on 256 bytes, their matrices are row views
  // of one allocation in this order (the same bytes, so the same memory), else separate.
  // Parts cut rows only.
  struct RowLinear {
    std::string prefix;
    int64_t n_out = 0;
    Part part;
  };
  Result<std::vector<ops::Weight>> adjacent_linears(const std::vector<RowLinear>& linears, int64_t n_in, bool bias);
  // A matrix that is never quantized (MoE routers, lm_head): prefix.weight (+ bias).
  Result<ops::Weight> dense_linear(const std::string& prefix, int64_t n_out, int64_t n_in, bool bias,
                                   const Part& part = {}, bool bias_here = true);
  // gpt-oss MXFP4 experts: NAME_blocks u8 [n_experts, n_out, n_in/32, 16] and
  // NAME_scales e8m0 [n_experts, n_out, n_in/32], one QuantizedTensor per expert of
  // [first, first + count), each cut to `part` (rows, cols of one expert's matrix).
  Result<std::vector<formats::QuantizedTensor>> mxfp4_experts(const std::string& name, int64_t n_experts,
                                                               int64_t n_out, int64_t n_in, int64_t first,
                                                               int64_t count, const Part& part = {});

  // Bytes of the tensors this loader has put on the backend (as the backend holds them:
  // bf16 matrices, packed quantized layouts), to compare with what the allocator took.
  uint64_t device_bytes() const { return device_bytes_; }

  // Checkpoint tensors no block asked for (e.g. an MTP layer kiln skips), other than
  // those under a skipped prefix (another rank's part of the model).
  std::vector<std::string> unused() const;
  void skip_prefix(const std::string& prefix) { skipped_.push_back(prefix); }

  // Called after each tensor is uploaded: checkpoint bytes bound so far, and the
  // checkpoint's total (a progress bar; the total includes tensors a family skips).
  void set_progress(std::function<void(uint64_t done, uint64_t total)> progress) { progress_ = std::move(progress); }

 private:
  // A tensor of exactly `dtype` (one of `dtypes`) and `shape`, uploaded.
  Result<Tensor> typed(const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape);
  // The same checks, the checkpoint's host tensor (a quantized weight's parts, uploaded together).
  Result<Tensor> host_typed(const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape);
  // A quantized weight's host tensors made the backend's (Backend::upload_quantized).
  Result<formats::QuantizedTensor> uploaded(const formats::QuantizedTensor& q);
  // A quantized linear's host tensors, checked, whole.
  Result<formats::QuantizedTensor> quantized_host(const std::string& prefix, int64_t n_out, int64_t n_in);
  // ... cut to `part` and uploaded.
  Result<formats::QuantizedTensor> quantized(const std::string& prefix, int64_t n_out, int64_t n_in, const Part& part);
  Status linear_bias(const std::string& prefix, int64_t n_out, bool bias, const Part& part, bool bias_here,
                     ops::Weight& w);
  // An error where the checkpoint stores `prefix` quantized but the config says it is not.
  Status not_packed(const std::string& prefix) const;

  WeightLoader(ops::Backend& backend, uint64_t seed, formats::QuantConfig quant)
      : ckpt_(nullptr), backend_(backend), dummy_seed_(seed), quant_(std::move(quant)) {}
  // A dummy tensor (see dummy()) of the full `shape` cut to `part`.
  Tensor generated(const std::string& name, const Shape& shape, const Part& part = {});
  // Fills `t` (allocated at the cut's shape) with generated()'s values.
  void fill_generated(const std::string& name, const Shape& full, const Part& part, Tensor& t);
  // The checkpoint's float tensor `name` cut to `part` (host memory, not uploaded).
  Result<Tensor> host_part(const std::string& name, const Shape& shape, const Part& part);
  // A dummy quantized [n_out, n_in] matrix of `kind` (host tensors) cut to `part` with the
  // scale grid a checkpoint's cut would have; `salt` tells apart experts of one name.
  Result<formats::QuantizedTensor> generated_quantized(const std::string& name, formats::QuantKind kind,
                                                       int64_t n_out, int64_t n_in, const Part& part,
                                                       uint64_t salt = 0);
  // The seed of a dummy tensor: dummy_seed_, its name, `salt`, then the part's begins.
  uint64_t dummy_seed(const std::string& name, uint64_t salt,
                      const std::vector<std::pair<int64_t, int64_t>>& ranges) const;

  const formats::Checkpoint* ckpt_;  // null in dummy mode
  ops::Backend& backend_;
  uint64_t dummy_seed_ = 0;
  bool sizing_ = false;  // sizing(): shapes only
  HeldBytes held_bytes_;
  formats::QuantConfig quant_;
  Shard shard_;
  std::set<std::string> used_;
  std::vector<std::string> skipped_;
  std::function<void(uint64_t, uint64_t)> progress_;
  uint64_t bytes_done_ = 0;
  uint64_t device_bytes_ = 0;
  std::shared_ptr<ThreadPool> pool_;  // dummy quantized weights' generation, made when first needed
  Tensor uploaded(const Tensor& t);
};

}  // namespace kiln::model
