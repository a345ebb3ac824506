#include "model/loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/thread_pool.h"
#include "model/dummy_quant.h"
#include "ops/random.h"

namespace kiln::model {
namespace {

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The (begin, count) of each dimension of `s` that `part` keeps.
Result<std::vector<std::pair<int64_t, int64_t>>> part_ranges(const Shape& s, const Part& part) {
  if (int(part.dims.size()) > s.rank) {
    return invalid_argument("a part of " + std::to_string(part.dims.size()) + " dimensions of a tensor " +
                            s.to_string());
  }
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int d = 0; d < s.rank; ++d) {
    auto [begin, count] = size_t(d) < part.dims.size() ? part.dims[size_t(d)] : std::pair<int64_t, int64_t>{0, -1};
    if (count < 0) count = s[d] - begin;
    if (begin < 0 || count <= 0 || begin + count > s[d]) {
      return invalid_argument("part [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                              ") of dimension " + std::to_string(d) + " of a tensor " + s.to_string());
    }
    r.emplace_back(begin, count);
  }
  return r;
}

Shape part_shape(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  Shape out;
  for (const auto& [begin, count] : ranges) out.push_back(count);
  return out;
}

// How a quantized format's arrays follow its logical [n_out, n_in] matrix: inputs per
// data element, and inputs / outputs per scale element (0: the scale does not follow).
struct QuantGrid {
  int64_t in_per_elem = 1, scale_in = 0, scale_out = 0;
};

QuantGrid quant_grid(formats::QuantKind kind, int64_t block_n, int64_t block_k) {
  using formats::QuantKind;
  switch (kind) {
    case QuantKind::kFp8Block: return {1, block_k, block_n};
    case QuantKind::kFp8Channel: return {1, 0, 1};
    case QuantKind::kFp8Tensor: return {1, 0, 0};
    case QuantKind::kNvfp4: return {2, 16, 1};
    case QuantKind::kMxfp4: return {2, 32, 1};
    case QuantKind::kInt4Group: return {8, block_k, 1};
    case QuantKind::kNone: break;
  }
  return {};
}

// The scale blocks of the cut `r` (rows, cols) of q (only its kind, shape and blocks are
// read). FP8 block and INT4 scale grids are free: a cut through a block refines the grid
// (the same scale repeated over smaller blocks), so every tensor-parallel split works;
// other formats must be cut on their blocks' edges, else an error names `name`.
struct CutGrid {
  int64_t block_n = 0, block_k = 0;
};

Result<CutGrid> cut_grid(const formats::QuantizedTensor& q, const std::vector<std::pair<int64_t, int64_t>>& r,
                         const std::string& name) {
  const auto [row0, rows] = r[0];
  const auto [col0, cols] = r[1];
  CutGrid grid{q.block_n, q.block_k};
  if (q.kind == formats::QuantKind::kFp8Block || q.kind == formats::QuantKind::kInt4Group) {
    const auto refine = [](int64_t block, int64_t begin, int64_t count, int64_t n) {
      int64_t b = std::gcd(block, begin);
      return begin + count == n ? b : std::gcd(b, count);
    };
    if (q.kind == formats::QuantKind::kFp8Block) grid.block_n = refine(q.block_n, row0, rows, q.n_out);
    grid.block_k = refine(q.block_k, col0, cols, q.n_in);
    // Square FP8 blocks stay square: an expert's gate / up (cut by rows) and its down (cut
    // by columns, at the same d_ff offsets) then share one grid, as the GPU MoE kernels
    // take one format for all three (a 128 x 128 grid cut at 64 is 64 x 64 in each).
    if (q.kind == formats::QuantKind::kFp8Block && q.block_n == q.block_k) {
      grid.block_n = grid.block_k = std::gcd(grid.block_n, grid.block_k);
    }
    if (q.kind == formats::QuantKind::kInt4Group && grid.block_k != q.block_k && grid.block_k % 8 != 0) {
      return unsupported("cannot split " + name + " (int4-group) at inputs [" + std::to_string(col0) + ", " +
                         std::to_string(col0 + cols) + "): eight inputs share a packed word");
    }
  }
  const QuantGrid g = quant_grid(q.kind, grid.block_n, grid.block_k);
  const auto aligned = [&](int64_t begin, int64_t count, int64_t n, int64_t unit, const char* what) -> Status {
    if (unit <= 1 || (begin % unit == 0 && (count % unit == 0 || begin + count == n))) return Status::Ok();
    return unsupported("cannot split " + name + " (" + std::string(formats::quant_kind_name(q.kind)) + ") at " +
                       what + " [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                       "): its blocks are " + std::to_string(unit) + " " + what + " wide");
  };
  KILN_RETURN_IF_ERROR(aligned(col0, cols, q.n_in, std::max(g.in_per_elem, g.scale_in), "inputs"));
  KILN_RETURN_IF_ERROR(aligned(row0, rows, q.n_out, g.scale_out, "outputs"));
  return grid;
}

// The rows and columns `part` keeps of a quantized [n_out, n_in] matrix, cut along its
// scale blocks (cut_grid); an error names `name` when the cut would split one.
Result<formats::QuantizedTensor> cut_quantized(const formats::QuantizedTensor& q, const Part& part,
                                               const std::string& name) {
  if (part.whole()) return q;
  auto ranges = part_ranges(Shape{q.n_out, q.n_in}, part);
  if (!ranges.ok()) return ranges.status().with_context(name);
  const auto& r = *ranges;
  const auto [row0, rows] = r[0];
  const auto [col0, cols] = r[1];
  KILN_ASSIGN_OR_RETURN(const CutGrid grid, cut_grid(q, r, name));
  if (grid.block_n != q.block_n || grid.block_k != q.block_k) {  // the scales over the finer grid, then the cut
    const int64_t bn = grid.block_n, bk = grid.block_k;
    formats::QuantizedTensor fine = q;
    fine.block_n = int32_t(bn);
    fine.block_k = int32_t(bk);
    const int64_t old_cols = ceil_div(q.n_in, q.block_k);
    const int64_t new_rows = q.kind == formats::QuantKind::kFp8Block ? ceil_div(q.n_out, bn) : q.n_out;
    const int64_t new_cols = ceil_div(q.n_in, bk);
    fine.scale = host_tensor(q.scale.dtype, {new_rows, new_cols});
    const size_t elem = dtype_bits(q.scale.dtype) / 8;
    for (int64_t i = 0; i < new_rows; ++i)
      for (int64_t j = 0; j < new_cols; ++j) {
        const int64_t old_row = q.kind == formats::QuantKind::kFp8Block ? i * bn / q.block_n : i;
        std::memcpy(static_cast<uint8_t*>(fine.scale.data) + size_t(i * new_cols + j) * elem,
                    static_cast<const uint8_t*>(q.scale.data) + size_t(old_row * old_cols + j * bk / q.block_k) * elem,
                    elem);
      }
    return cut_quantized(fine, part, name);
  }
  const QuantGrid g = quant_grid(q.kind, q.block_n, q.block_k);
  formats::QuantizedTensor out = q;
  out.n_out = rows;
  out.n_in = cols;
  // data: [n_out, n_in / in_per_elem] (MXFP4's [n_out, n_in/32, 16] bytes seen as 2-D).
  const Tensor data = q.data.reshape({q.n_out, q.data.numel() / q.n_out});
  const Part data_part{{{row0, rows}, {col0 / g.in_per_elem, ceil_div(cols, g.in_per_elem)}}};
  KILN_ASSIGN_OR_RETURN(out.data, slice_part(data, data_part));
  if (q.kind == formats::QuantKind::kMxfp4) out.data = out.data.reshape(Shape{rows, cols / 32, int64_t(16)});
  if (g.scale_out > 0 || g.scale_in > 0) {
    const int64_t s_rows = q.scale.rank() >= 1 ? q.scale.dim(0) : 1;
    const Tensor scale = q.scale.reshape({s_rows, q.scale.numel() / s_rows});
    std::vector<std::pair<int64_t, int64_t>> s;
    s.emplace_back(g.scale_out > 0 ? std::pair{row0 / g.scale_out, ceil_div(row0 + rows, g.scale_out) - row0 / g.scale_out}
                                   : std::pair<int64_t, int64_t>{0, -1});
    s.emplace_back(g.scale_in > 0 ? std::pair{col0 / g.scale_in, ceil_div(col0 + cols, g.scale_in) - col0 / g.scale_in}
                                  : std::pair<int64_t, int64_t>{0, -1});
    const Part scale_part{s};
    KILN_ASSIGN_OR_RETURN(out.scale, slice_part(scale, scale_part));
  }
  return out;
}

}  // namespace

int64_t WeightLoader::input_cut_unit(const std::string& name) const {
  // quant_config sets group_size for the block formats only (MXFP4 32, NVFP4 16, INT4).
  return quant_.is_quantized(name) ? std::max<int64_t>(1, quant_.group_size) : 1;
}

bool Part::whole() const {
  for (const auto& [begin, count] : dims)
    if (begin != 0 || count != -1) return false;
  return true;
}

Result<Tensor> slice_part(const Tensor& t, const Part& part) {
  if (part.whole()) return t;
  KILN_CHECK(dtype_bits(t.dtype) % 8 == 0 && t.device == Device::kHost) << "slice_part: " << dtype_name(t.dtype);
  KILN_ASSIGN_OR_RETURN(auto r, part_ranges(t.shape, part));
  const Shape out_shape = part_shape(r);
  bool rows_only = true;  // only dimension 0 is cut: a view
  for (int d = 1; d < t.rank(); ++d) rows_only = rows_only && r[size_t(d)].second == t.dim(d);
  if (rows_only) return t.slice0(r[0].first, r[0].first + r[0].second).reshape(out_shape);
  Tensor out = host_tensor(t.dtype, out_shape);
  const size_t elem = dtype_bits(t.dtype) / 8;
  const int rank = t.rank();
  std::vector<int64_t> stride(size_t(rank), 1);
  for (int d = rank - 2; d >= 0; --d) stride[size_t(d)] = stride[size_t(d) + 1] * t.dim(d + 1);
  const int64_t run = r[size_t(rank) - 1].second;  // elements copied at a time
  std::vector<int64_t> idx(size_t(rank), 0);
  auto* dst = static_cast<uint8_t*>(out.data);
  const auto* src = static_cast<const uint8_t*>(t.data);
  for (int64_t n = out.numel() / run; n > 0; --n) {
    int64_t offset = r[size_t(rank) - 1].first;
    for (int d = 0; d + 1 < rank; ++d) offset += (r[size_t(d)].first + idx[size_t(d)]) * stride[size_t(d)];
    std::memcpy(dst, src + size_t(offset) * elem, size_t(run) * elem);
    dst += size_t(run) * elem;
    for (int d = rank - 2; d >= 0; --d) {  // the next index of the leading dimensions
      if (++idx[size_t(d)] < r[size_t(d)].second) break;
      idx[size_t(d)] = 0;
    }
  }
  return out;
}

Tensor WeightLoader::uploaded(const Tensor& t) {
  Tensor out = backend_.upload(t);
  device_bytes_ += uint64_t(out.nbytes());
  bytes_done_ += uint64_t(t.nbytes());
  if (progress_ && ckpt_) progress_(bytes_done_, ckpt_->total_bytes());
  return out;
}

uint64_t WeightLoader::dummy_seed(const std::string& name, uint64_t salt,
                                  const std::vector<std::pair<int64_t, int64_t>>& ranges) const {
  uint64_t seed = dummy_seed_;
  for (unsigned char c : name) seed = ops::splitmix64(seed ^ c);
  if (salt != 0) seed = ops::splitmix64(seed ^ salt);
  for (const auto& [begin, count] : ranges) seed = ops::splitmix64(seed ^ uint64_t(begin));  // a shard's own values
  return seed;
}

Tensor WeightLoader::generated(const std::string& name, const Shape& full, const Part& part) {
  auto ranges = part_ranges(full, part);
  KILN_CHECK(ranges.ok()) << name << ": " << ranges.status().to_string();
  const Shape shape = part_shape(*ranges);
  const DType dtype = shape.rank >= 2 ? DType::kBF16 : DType::kF32;
  if (sizing_) {
    device_bytes_ += uint64_t(unbacked_tensor(dtype, shape).nbytes());
    used_.insert(name);
    return unbacked_tensor(dtype, shape);
  }
  Tensor t = backend_.alloc_weight(dtype, shape);
  fill_generated(name, full, part, t);
  return t;
}

void WeightLoader::fill_generated(const std::string& name, const Shape& full, const Part& part, Tensor& t) {
  auto ranges = part_ranges(full, part);
  KILN_CHECK(ranges.ok()) << name << ": " << ranges.status().to_string();
  const bool norm = name.find("norm") != std::string::npos && !name.ends_with(".bias");  // LayerNorm biases near 0
  const bool vector = t.rank() < 2;
  float mean = 0.0f, stddev = 0.02f;
  if (norm && vector) {
    mean = 1.0f;  // RMSNorm gains
  } else if (name.find("sinks") != std::string::npos) {
    stddev = 1.0f;  // attention sink logits
  } else if (!vector) {
    stddev = float(1.0 / std::sqrt(double(full.dims[1])));  // [n_out, n_in] or [experts, n_in, n_out]
  }
  backend_.fill_random({.out = t, .seed = dummy_seed(name, 0, *ranges), .mean = mean, .stddev = stddev});
  device_bytes_ += uint64_t(t.nbytes());
  used_.insert(name);
}

Result<formats::QuantizedTensor> WeightLoader::generated_quantized(const std::string& name, formats::QuantKind kind,
                                                                   int64_t n_out, int64_t n_in, const Part& part,
                                                                   uint64_t salt) {
  using formats::QuantKind;
  // The checks quantized_host makes of a checkpoint's tensors.
  const int64_t group = kind == QuantKind::kNvfp4 ? 16 : kind == QuantKind::kMxfp4 ? 32
                        : kind == QuantKind::kInt4Group ? quant_.group_size : 1;
  if (group <= 0 || n_in % group != 0) {
    return corrupt(std::string(formats::quant_kind_name(kind)) + " group size " + std::to_string(group) +
                   " does not divide the input size " + std::to_string(n_in) + " of " + name);
  }
  formats::QuantizedTensor whole;  // the checkpoint tensor's shape and blocks, no data
  whole.kind = kind;
  whole.n_out = n_out;
  whole.n_in = n_in;
  whole.block_n = kind == QuantKind::kFp8Block ? quant_.block_n : 0;
  whole.block_k = kind == QuantKind::kFp8Block ? quant_.block_k : kind == QuantKind::kInt4Group ? int32_t(group) : 0;
  auto ranges = part_ranges(Shape{n_out, n_in}, part);
  if (!ranges.ok()) return ranges.status().with_context(name);
  KILN_ASSIGN_OR_RETURN(const CutGrid grid, cut_grid(whole, *ranges, name));
  const int64_t rows = (*ranges)[0].second, cols = (*ranges)[1].second;
  // Tensors of a few MiB and more (a full-size model's) are made on every core.
  if (!pool_ && !sizing_ && rows * cols >= (int64_t(4) << 20)) pool_ = std::make_shared<ThreadPool>(0);
  return random_quantized({.kind = kind,
                           .n_out = rows,
                           .n_in = cols,
                           .block_n = int32_t(grid.block_n),
                           .block_k = int32_t(grid.block_k),
                           .stddev = float(1.0 / std::sqrt(double(n_in))),  // the whole matrix's fan-in
                           .seed = dummy_seed(name, salt, *ranges),
                           .shapes_only = sizing_},
                          rows * cols >= (int64_t(1) << 20) ? pool_.get() : nullptr);
}

Result<Tensor> WeightLoader::typed(const std::string& name, std::initializer_list<DType> dtypes,
                                   const Shape& shape) {
  KILN_ASSIGN_OR_RETURN(Tensor t, host_typed(name, dtypes, shape));
  return uploaded(t);
}

Result<Tensor> WeightLoader::host_typed(const std::string& name, std::initializer_list<DType> dtypes,
                                        const Shape& shape) {
  KILN_CHECK(ckpt_ != nullptr) << name << ": dummy weights are generated, never read";
  KILN_ASSIGN_OR_RETURN(Tensor t, ckpt_->get(name, shape));
  bool ok = false;
  for (DType d : dtypes) ok = ok || t.dtype == d;
  if (!ok) {
    return corrupt("tensor " + name + " has dtype " + std::string(dtype_name(t.dtype)) + ", expected " +
                   dtype_list(dtypes));
  }
  used_.insert(name);
  return t;
}

Result<formats::QuantizedTensor> WeightLoader::uploaded(const formats::QuantizedTensor& q) {
  if (sizing_) {
    int64_t bytes = int64_t(q.nbytes());
    if (held_bytes_) {
      KILN_ASSIGN_OR_RETURN(bytes, held_bytes_(q));
    }
    device_bytes_ += uint64_t(bytes);
    return q;
  }
  KILN_ASSIGN_OR_RETURN(formats::QuantizedTensor out, backend_.upload_quantized(q));
  device_bytes_ += uint64_t(out.nbytes());
  bytes_done_ += uint64_t(q.nbytes());
  if (progress_ && ckpt_) progress_(bytes_done_, ckpt_->total_bytes());
  return out;
}

Result<Tensor> WeightLoader::tensor(const std::string& name, const Shape& shape, const Part& part) {
  if (ckpt_ == nullptr) return generated(name, shape, part);
  KILN_ASSIGN_OR_RETURN(Tensor t, host_part(name, shape, part));
  return uploaded(t);
}

Result<Tensor> WeightLoader::host_part(const std::string& name, const Shape& shape, const Part& part) {
  KILN_ASSIGN_OR_RETURN(Tensor full, ckpt_->get(name, shape));
  auto sliced = slice_part(full, part);
  if (!sliced.ok()) return sliced.status().with_context(name);
  Tensor t = std::move(sliced).value();
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return unsupported("tensor " + name + " has dtype " + std::string(dtype_name(t.dtype)) +
                       "; this path takes f32, bf16 or f16 weights" +
                       (quant_.quantized() ? "" : " (the config has no quantization_config)"));
  }
  used_.insert(name);
  return t;
}

namespace {

// Host tensors of one dtype and row width, one after the other: [sum of rows, ...].
Tensor concat_rows(const std::vector<Tensor>& parts) {
  Shape shape = parts[0].shape;
  shape.dims[0] = 0;
  for (const Tensor& t : parts) shape.dims[0] += t.dim(0);
  Tensor out = host_tensor(parts[0].dtype, shape);
  size_t at = 0;
  for (const Tensor& t : parts) {
    std::memcpy(static_cast<char*>(out.data) + at, t.data, t.nbytes());
    at += t.nbytes();
  }
  return out;
}

}  // namespace

Result<Tensor> WeightLoader::tensor_rows(const std::string& name, const Shape& shape,
                                         const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t total = 0;
  for (const auto& [begin, count] : ranges) {
    KILN_CHECK(begin >= 0 && count > 0 && begin + count <= shape.dims[0]) << name << ": rows " << begin << " + " << count;
    total += count;
  }
  if (ranges.size() == 1) return tensor(name, shape, Part::rows(ranges[0].first, ranges[0].second));
  if (ckpt_ == nullptr) return generated(name, shape, Part::rows(0, total));  // random values: any rows will do
  KILN_ASSIGN_OR_RETURN(Tensor full, host_typed(name, {DType::kF32, DType::kBF16, DType::kF16}, shape));
  std::vector<Tensor> parts;
  for (const auto& [begin, count] : ranges) parts.push_back(full.slice0(begin, begin + count));
  return uploaded(concat_rows(parts));
}

Result<Tensor> WeightLoader::norm(const std::string& name, const Shape& shape, double offset) {
  if (offset == 0.0 || ckpt_ == nullptr) return tensor(name, shape);
  KILN_ASSIGN_OR_RETURN(Tensor t, host_typed(name, {DType::kF32, DType::kBF16, DType::kF16}, shape));
  Tensor f = host_tensor(DType::kF32, shape);
  to_f32(t, f.as<float>());
  for (int64_t i = 0; i < f.numel(); ++i) f.as<float>()[i] += float(offset);
  return uploaded(f);
}

Result<Tensor> WeightLoader::optional_tensor(const std::string& name, const Shape& shape) {
  if (!has(name)) return Tensor{};
  return tensor(name, shape);
}

Status WeightLoader::not_packed(const std::string& prefix) const {
  for (const char* packed : {".weight_packed", ".weight_scale", ".weight_scale_inv"}) {
    if (!has(prefix + packed)) continue;
    return corrupt(prefix + packed + " says " + prefix + " is stored quantized, but " +
                   (quant_.quantized() ? "quantization_config excludes it" : "config.json has no quantization_config"));
  }
  return Status::Ok();
}

Result<ops::Weight> WeightLoader::dense_linear(const std::string& prefix, int64_t n_out, int64_t n_in,
                                               bool bias, const Part& part, bool bias_here) {
  ops::Weight w;
  KILN_RETURN_IF_ERROR(not_packed(prefix));
  KILN_ASSIGN_OR_RETURN(w.data, tensor(prefix + ".weight", {n_out, n_in}, part));
  KILN_RETURN_IF_ERROR(linear_bias(prefix, n_out, bias, part, bias_here, w));
  return w;
}

Result<std::vector<ops::Weight>> WeightLoader::adjacent_linears(const std::vector<RowLinear>& linears, int64_t n_in,
                                                                bool bias) {
  const auto dense = [&](const RowLinear& l) {
    return !quant_.is_quantized(l.prefix) || quant_.kind == formats::QuantKind::kMxfp4;
  };
  std::vector<ops::Weight> out;
  const auto apart = [&]() -> Result<std::vector<ops::Weight>> {
    for (const RowLinear& l : linears) {
      KILN_ASSIGN_OR_RETURN(ops::Weight w, linear(l.prefix, l.n_out, n_in, bias, l.part));
      out.push_back(std::move(w));
    }
    return out;
  };
  if (sizing_ || linears.size() < 2 || !backend_.fuses_adjacent_linears() ||
      !std::all_of(linears.begin(), linears.end(), dense))
    return apart();
  // Each linear's rows of the one matrix: [first, first + rows). Each view must start on
  // 256 bytes, what cuBLASLt assumes of a matrix (the bf16 GEMV: 16): else apart.
  std::vector<int64_t> first;
  int64_t rows = 0;
  bool aligned = true;
  for (const RowLinear& l : linears) {
    KILN_RETURN_IF_ERROR(not_packed(l.prefix));
    auto ranges = part_ranges({l.n_out, n_in}, l.part);
    if (!ranges.ok()) return ranges.status().with_context(l.prefix + ".weight");
    const Shape shape = part_shape(*ranges);
    KILN_CHECK_EQ(shape.dims[1], n_in) << l.prefix << ": adjacent linears are cut by rows only";
    first.push_back(rows);
    aligned = aligned && rows * n_in * 2 % 256 == 0;
    rows += shape.dims[0];
  }
  if (!aligned) return apart();
  Tensor all;
  if (ckpt_ == nullptr) {
    all = backend_.alloc_weight(DType::kBF16, {rows, n_in});
    for (size_t i = 0; i < linears.size(); ++i) {
      Tensor rows_i = all.slice0(first[i], i + 1 < first.size() ? first[i + 1] : rows);
      fill_generated(linears[i].prefix + ".weight", {linears[i].n_out, n_in}, linears[i].part, rows_i);
    }
  } else {
    // The cuts, one after the other on the host, uploaded once (apart where their dtypes differ).
    std::vector<Tensor> parts;
    for (const RowLinear& l : linears) {
      KILN_ASSIGN_OR_RETURN(Tensor t, host_part(l.prefix + ".weight", {l.n_out, n_in}, l.part));
      parts.push_back(std::move(t));
    }
    if (!std::all_of(parts.begin(), parts.end(), [&](const Tensor& t) { return t.dtype == parts[0].dtype; }))
      return apart();
    all = uploaded(concat_rows(parts));
  }
  for (size_t i = 0; i < linears.size(); ++i) {
    ops::Weight w;
    w.data = all.slice0(first[i], i + 1 < first.size() ? first[i + 1] : rows);
    KILN_RETURN_IF_ERROR(linear_bias(linears[i].prefix, linears[i].n_out, bias, linears[i].part, true, w));
    out.push_back(std::move(w));
  }
  return out;
}

Status WeightLoader::linear_bias(const std::string& prefix, int64_t n_out, bool bias, const Part& part,
                                 bool bias_here, ops::Weight& w) {
  if (!bias) return Status::Ok();
  if (!bias_here) {  // another rank adds it
    used_.insert(prefix + ".bias");
    return Status::Ok();
  }
  Part rows;
  if (!part.dims.empty()) rows.dims.push_back(part.dims[0]);
  KILN_ASSIGN_OR_RETURN(w.bias, tensor(prefix + ".bias", {n_out}, rows));
  return Status::Ok();
}

Result<ops::Weight> WeightLoader::linear(const std::string& prefix, int64_t n_out, int64_t n_in, bool bias,
                                         const Part& part, bool bias_here) {
  if (!quant_.is_quantized(prefix) || quant_.kind == formats::QuantKind::kMxfp4) {
    return dense_linear(prefix, n_out, n_in, bias, part, bias_here);
  }
  ops::Weight w;
  auto q = quantized(prefix, n_out, n_in, part);
  if (!q.ok()) {
    return q.status().with_context(prefix + " is quantized (" + std::string(formats::quant_kind_name(quant_.kind)) +
                                   ", " + quant_.method + " quantization_config)");
  }
  w.quant = std::move(q).value();
  KILN_RETURN_IF_ERROR(linear_bias(prefix, n_out, bias, part, bias_here, w));
  return w;
}

Result<formats::QuantizedTensor> WeightLoader::quantized(const std::string& p, int64_t n_out, int64_t n_in,
                                                         const Part& part) {
  if (ckpt_ == nullptr) {  // dummy: made at the cut's shape
    KILN_ASSIGN_OR_RETURN(formats::QuantizedTensor q, generated_quantized(p + ".weight", quant_.kind, n_out, n_in, part));
    return uploaded(q);
  }
  KILN_ASSIGN_OR_RETURN(formats::QuantizedTensor q, quantized_host(p, n_out, n_in));
  KILN_ASSIGN_OR_RETURN(q, cut_quantized(q, part, p + ".weight"));
  return uploaded(q);
}

Result<formats::QuantizedTensor> WeightLoader::quantized_host(const std::string& p, int64_t n_out, int64_t n_in) {
  using formats::QuantKind;
  formats::QuantizedTensor q;
  q.kind = quant_.kind;
  q.n_out = n_out;
  q.n_in = n_in;
  const auto need_divisible = [&](int64_t group, const char* what) -> Status {
    if (n_in % group == 0) return Status::Ok();
    return corrupt(std::string(what) + " group size " + std::to_string(group) + " does not divide the input size " +
                   std::to_string(n_in) + " of " + p + ".weight");
  };
  const std::initializer_list<DType> float_scale = {DType::kF32, DType::kBF16, DType::kF16};
  switch (quant_.kind) {
    case QuantKind::kFp8Block: {
      q.block_n = quant_.block_n;
      q.block_k = quant_.block_k;
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight", {DType::kF8E4M3}, {n_out, n_in}));
      // DeepSeek's native name is weight_scale_inv (multiplied despite the name).
      const std::string scale = quant_.method == "fp8" ? p + ".weight_scale_inv" : p + ".weight_scale";
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(scale, float_scale, {ceil_div(n_out, q.block_n), ceil_div(n_in, q.block_k)}));
      return q;
    }
    case QuantKind::kFp8Channel: {
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight", {DType::kF8E4M3}, {n_out, n_in}));
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(p + ".weight_scale", float_scale, {n_out, 1}));
      return q;
    }
    case QuantKind::kFp8Tensor: {
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight", {DType::kF8E4M3}, {n_out, n_in}));
      const formats::TensorInfo* info = ckpt_->info(p + ".weight_scale");
      const Shape s = info && info->shape.rank == 0 ? Shape{} : Shape{1};
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(p + ".weight_scale", float_scale, s));
      return q;
    }
    case QuantKind::kNvfp4: {
      KILN_RETURN_IF_ERROR(need_divisible(16, "NVFP4"));
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight", {DType::kU8}, {n_out, n_in / 2}));
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(p + ".weight_scale", {DType::kF8E4M3}, {n_out, n_in / 16}));
      const formats::TensorInfo* info = ckpt_->info(p + ".weight_scale_2");
      const Shape s = info && info->shape.rank == 0 ? Shape{} : Shape{1};
      KILN_ASSIGN_OR_RETURN(q.scale2, host_typed(p + ".weight_scale_2", {DType::kF32}, s));
      // The static activation scale is for FP4 activations; the reference computes
      // activations in fp32 and does not use it.
      if (has(p + ".input_scale")) used_.insert(p + ".input_scale");
      return q;
    }
    case QuantKind::kInt4Group: {
      const int64_t group = quant_.group_size;
      q.block_k = int32_t(group);
      KILN_RETURN_IF_ERROR(need_divisible(group, "INT4"));
      KILN_ASSIGN_OR_RETURN(q.data, host_typed(p + ".weight_packed", {DType::kI32}, {n_out, ceil_div(n_in, 8)}));
      KILN_ASSIGN_OR_RETURN(q.scale, host_typed(p + ".weight_scale", float_scale, {n_out, n_in / group}));
      if (has(p + ".weight_zero_point")) {
        return unsupported(p + ".weight_zero_point: asymmetric INT4 is not supported");
      }
      if (has(p + ".weight_shape")) {
        KILN_ASSIGN_OR_RETURN(Tensor shape, ckpt_->get(p + ".weight_shape", {2}));
        if (shape.dtype != DType::kI32 && shape.dtype != DType::kI64) {
          return corrupt("tensor " + p + ".weight_shape has dtype " + std::string(dtype_name(shape.dtype)));
        }
        const int64_t rows = shape.dtype == DType::kI32 ? shape.as<int32_t>()[0] : shape.as<int64_t>()[0];
        const int64_t cols = shape.dtype == DType::kI32 ? shape.as<int32_t>()[1] : shape.as<int64_t>()[1];
        if (rows != n_out || cols != n_in) {
          return corrupt("tensor " + p + ".weight_shape says [" + std::to_string(rows) + ", " + std::to_string(cols) +
                         "], the config implies [" + std::to_string(n_out) + ", " + std::to_string(n_in) + "]");
        }
        used_.insert(p + ".weight_shape");
      }
      return q;
    }
    case QuantKind::kMxfp4:
    case QuantKind::kNone: break;
  }
  return internal_error("no loader for " + std::string(formats::quant_kind_name(quant_.kind)) + " linears");
}

Result<std::vector<formats::QuantizedTensor>> WeightLoader::mxfp4_experts(const std::string& name,
                                                                           int64_t n_experts, int64_t n_out,
                                                                           int64_t n_in, int64_t first, int64_t count,
                                                                           const Part& part) {
  if (n_in % 32 != 0) {
    return corrupt("MXFP4 group size 32 does not divide the input size " + std::to_string(n_in) + " of " + name);
  }
  if (ckpt_ == nullptr) {  // dummy: each expert made at the cut's shape
    std::vector<formats::QuantizedTensor> out;
    for (int64_t e = first; e < first + count; ++e) {
      KILN_ASSIGN_OR_RETURN(formats::QuantizedTensor q,
                            generated_quantized(name + "_blocks", formats::QuantKind::kMxfp4, n_out, n_in, part,
                                                /*salt=*/uint64_t(e) + 1));
      auto u = uploaded(q);
      if (!u.ok()) return u.status().with_context(name + " (MXFP4 experts)");
      out.push_back(std::move(u).value());
    }
    return out;
  }
  KILN_ASSIGN_OR_RETURN(Tensor blocks, host_typed(name + "_blocks", {DType::kU8}, {n_experts, n_out, n_in / 32, 16}));
  KILN_ASSIGN_OR_RETURN(Tensor scales,
                        host_typed(name + "_scales", {DType::kU8, DType::kE8M0}, {n_experts, n_out, n_in / 32}));
  std::vector<formats::QuantizedTensor> out;
  for (int64_t e = first; e < first + count; ++e) {
    formats::QuantizedTensor q;
    q.kind = formats::QuantKind::kMxfp4;
    q.n_out = n_out;
    q.n_in = n_in;
    q.data = blocks.index0(e);
    q.scale = scales.index0(e);
    auto cut = cut_quantized(q, part, name + " (expert " + std::to_string(e) + ")");
    if (!cut.ok()) return cut.status();
    auto u = uploaded(*cut);
    if (!u.ok()) return u.status().with_context(name + " (MXFP4 expert " + std::to_string(e) + ")");
    out.push_back(std::move(u).value());
  }
  return out;
}

std::vector<std::string> WeightLoader::unused() const {
  std::vector<std::string> out;
  if (ckpt_ == nullptr) return out;
  for (const std::string& n : ckpt_->names()) {
    bool skipped = false;
    for (const std::string& p : skipped_) skipped = skipped || n.rfind(p, 0) == 0;
    if (!used_.count(n) && !skipped) out.push_back(n);
  }
  return out;
}

}  // namespace kiln::model
