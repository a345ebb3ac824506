// Every CUDA op other than paged attention (bench/attention_bench.cpp), driven through
// the public ops::Backend interface on real model shapes, as a fraction of the
// machine's roofline: bytes moved / time against the measured device-to-device copy
// bandwidth for decode-shaped work (and for every elementwise op), FLOPs / time
// against the mma.sync bf16 peak for prefill-shaped GEMM-like work. What is timed is
// what kiln runs: argument checks, cuBLASLt plans, the caching allocator's scratch,
// host id copies, routing.
//
//   build-gpu/bin/ops_bench [--smem-cap 101376] [--iters 20] [--only SUBSTRING]
//
// --only keeps the cases whose label ("<op> <shape> rows <n>", as in the table)
// contains SUBSTRING; model weights are only built for the cases kept.
//
// Timing. CudaBackend queues all work on its own stream, created with
// cudaStreamNonBlocking and not reachable through ops::Backend, so cudaEvents on the
// legacy stream would not bracket it. Each call is therefore timed on the host:
//   begin_step(batch); memset 256 MiB (flushes the 50 MB L2); cudaDeviceSynchronize();
//   t0; op(); backend->synchronize(); t1
// and the table reports the median of --iters such calls (after one warm-up call,
// which also builds cuBLASLt plans and device tables). Nothing is subtracted: each
// time includes the host launch path and the stream-synchronize wake-up, so it is an
// upper bound on the GPU time; "timing floor" in the header (an 8-element add timed
// the same way: 11.2 us on the H100 VM, 2026-11-22) says how much of a decode op that
// is. The flush also makes activations come from DRAM, which in a real step are
// usually still in L2 from the op before: elementwise decode numbers are pessimistic.
// begin_step runs before every call, untimed, as in a forward step: it returns the
// previous call's op scratch to the allocator. Cases whose warm-up call is slow run
// fewer iterations, about kCaseBudgetUs each (the notes column says so). The whole run
// took 6 s on the H100 at --iters 20.
//
// Ceilings. The copy bandwidth is measured here at start-up (cudaMemcpyAsync of 1 GiB,
// device to device, bytes read + written / time, median of 10, cudaEvents on a stream
// of the bench's own). The mma.sync bf16 peak is the constant measured on the H100 in
// docs/PERF.md (642 TFLOP/s), not re-measured. cuBLASLt on sm_90 may pick wgmma kernels,
// whose peak is higher (989 TFLOP/s dense bf16 on H100 SXM, datasheet), so the GEMMs
// report both fractions.
//
// Work counted per op (bf16 = 2 bytes, fp32 vectors = 4):
//   linear        rows 1, 8: weight + bias + x + out bytes; rows 2048: 2 rows n_in n_out FLOPs
//   rms_norm      x + out (+ residual read and written) + weight
//   rope          x read and written (in place) + positions
//   glu, add      two inputs + output
//   embedding     the gathered rows read + written + ids (copied from the host inside the op)
//   slice_columns the kept columns read + written
//   moe           rows 1, 8: distinct experts the rows route to x expert bytes + router + x + out;
//                 the distinct count comes from the reference routing rule (backends/cpu) run
//                 on the host over fp32 logits of the same bf16 x and router (a near-tie may
//                 differ from the GPU's choice; the bound min(n_experts, rows top_k) is noted);
//                 rows 2048: 2 rows top_k 3 d_model d_ff FLOPs (router left out)
//   mla_attention decode: latent cache read + kv_b + q + out bytes; prefill: the absorbed
//                 form's FLOPs (q absorb, causal scores over d_latent + d_rope and the
//                 weighted latent sum, up-projection to d_v)
//   sample        the logits read (the op returns its outputs in host memory, so the
//                 device-to-host copy and its synchronize are inside the time)
//
// Weights and activations are random bf16 (never zero): two 64 MiB pools are generated
// on the host once, and each tensor (from Backend::alloc) is filled by device copies from
// a pool at a random offset, so a 22.5 GB expert set takes milliseconds instead of a
// minute of host conversion in Backend::upload. fp32 vectors (norm weights, biases,
// routing biases) go through Backend::upload. Each model's weights live in a backend of
// their own, destroyed (memory returned to the driver) before the next model's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backends/cpu/cpu_internal.h"  // cpu::route: the reference routing rule
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/kernels.h"
#include "ops/backend.h"

namespace {

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;
namespace ops = kiln::ops;

constexpr double kMmaPeakTflops = 642.0;    // H100 mma.sync bf16, fp32 accumulate: measured (docs/PERF.md)
constexpr double kWgmmaPeakTflops = 989.0;  // H100 SXM dense bf16 (datasheet; cuBLASLt's wgmma kernels)
constexpr size_t kFlushBytes = size_t(256) << 20;  // > the H100's 50 MB L2
constexpr double kCaseBudgetUs = 2e6;       // a slow case runs about this long (at least one timed call)
constexpr int kPrefillRows = 2048;

struct Options {
  int smem_cap = 101376;
  int iters = 20;
  std::string only;
};

// One table row: what ran and the work it had to do. Exactly one of bytes (a
// fraction of the copy bandwidth) and flops (a fraction of the mma peak) is set.
struct Case {
  std::string op, shape;
  int64_t rows = 0;
  double bytes = 0.0;
  double flops = 0.0;
  bool gemm = false;  // cuBLASLt: also against the wgmma peak
  std::string note;

  std::string label() const { return op + " " + shape + " rows " + std::to_string(rows); }
};

struct Timing {
  double us = 0.0;  // median
  int iters = 0;
};

template <typename... Args>
std::string fmt(const char* format, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

// ---- random device data ---------------------------------------------------------

// Random bf16 bits uniform in (-scale, scale), never exactly zero (splitmix64).
std::vector<uint16_t> random_bf16(size_t n, float scale, uint64_t seed) {
  std::vector<uint16_t> out(n);
  uint64_t s = seed;
  for (uint16_t& h : out) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = (float(z >> 40) + 0.5f) / float(1 << 24);  // (0, 1), never 0.5
    h = kiln::f32_to_bf16((2.0f * u - 1.0f) * scale);  // |2u - 1| >= 2^-24
  }
  return out;
}

// Fills backend tensors from two device pools of random bf16: activations in
// (-1, 1), weights in (-1/32, 1/32) (about the spread of trained weights, so
// outputs stay O(1)).
class Filler {
 public:
  static constexpr size_t kPoolElems = size_t(32) << 20;  // 64 MiB each

  Filler() {
    for (int i = 0; i < 2; ++i) {
      const std::vector<uint16_t> host = random_bf16(kPoolElems, i == 0 ? 1.0f : 1.0f / 32, 1234 + i);
      KILN_CUDA_CHECK(cudaMalloc(&pools_[i], kPoolElems * sizeof(uint16_t)));
      KILN_CUDA_CHECK(cudaMemcpy(pools_[i], host.data(), kPoolElems * sizeof(uint16_t), cudaMemcpyHostToDevice));
    }
  }
  ~Filler() {
    for (uint16_t* p : pools_) cudaFree(p);
  }
  Filler(const Filler&) = delete;
  Filler& operator=(const Filler&) = delete;

  Tensor activation(ops::Backend& be, Shape s) { return fill(be, s, pools_[0]); }
  Tensor weight(ops::Backend& be, Shape s) { return fill(be, s, pools_[1]); }

  // An fp32 device vector through Backend::upload (its rule keeps rank-1 tensors fp32).
  Tensor vector(ops::Backend& be, int64_t n, float lo, float hi, std::vector<float>* host_copy = nullptr) {
    std::vector<float> v(static_cast<size_t>(n));
    std::uniform_real_distribution<float> d(lo, hi);
    for (float& x : v) x = d(rng_);
    const Tensor t = be.upload(Tensor{.data = v.data(), .dtype = DType::kF32, .shape = {n}});
    if (host_copy) *host_copy = std::move(v);
    return t;
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  Tensor fill(ops::Backend& be, Shape s, const uint16_t* pool) {
    be.synchronize();  // the allocator may hand back a block the stream just finished with
    Tensor t = be.alloc(DType::kBF16, s);
    auto* dst = t.as<uint16_t>();
    const size_t n = size_t(t.numel());
    size_t done = 0, at = size_t(rng_() % kPoolElems);
    while (done < n) {
      const size_t len = std::min(n - done, kPoolElems - at);
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst + done, pool + at, len * sizeof(uint16_t), cudaMemcpyDeviceToDevice,
                                      nullptr));
      done += len;
      at = 0;
    }
    // The legacy stream does not order against the backend's non-blocking stream.
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    return t;
  }

  uint16_t* pools_[2] = {nullptr, nullptr};
  std::mt19937_64 rng_{7};
};

// n_seqs sequences of `context` cached tokens, each with its newest n_query in the
// step; the block table scatters blocks over the cache.
ops::BatchMeta paged_batch(int n_seqs, int context, int n_query, int block_size, std::mt19937_64& rng) {
  ops::BatchMeta b;
  b.block_size = block_size;
  b.max_blocks_per_seq = (context + block_size - 1) / block_size;
  b.block_table.resize(size_t(n_seqs) * size_t(b.max_blocks_per_seq));
  std::iota(b.block_table.begin(), b.block_table.end(), 0);
  std::shuffle(b.block_table.begin(), b.block_table.end(), rng);
  b.q_start.push_back(0);
  for (int s = 0; s < n_seqs; ++s) {
    for (int p = context - n_query; p < context; ++p) {
      b.positions.push_back(p);
      b.slot_mapping.push_back(int32_t(b.slot(s, p)));
    }
    b.q_start.push_back(int32_t(b.positions.size()));
    b.context_len.push_back(context);
  }
  return b;
}

// ---- ceilings and timing ------------------------------------------------------------

// Device-to-device copy of 1 GiB, bytes read + written / time, median of 10 (GB/s).
double measure_copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&src, bytes));
  KILN_CUDA_CHECK(cudaMalloc(&dst, bytes));
  KILN_CUDA_CHECK(cudaMemset(src, 1, bytes));
  cudaStream_t stream;
  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {  // the first two are warm-up
    KILN_CUDA_CHECK(cudaEventRecord(start, stream));
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0.0f;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double median_ms = 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  KILN_CUDA_CHECK(cudaEventDestroy(start));
  KILN_CUDA_CHECK(cudaEventDestroy(stop));
  KILN_CUDA_CHECK(cudaStreamDestroy(stream));
  KILN_CUDA_CHECK(cudaFree(src));
  KILN_CUDA_CHECK(cudaFree(dst));
  return 2.0 * double(bytes) / (median_ms * 1e6);
}

class Bench {
 public:
  Bench(const Options& o, double copy_gbs) : o_(o), copy_gbs_(copy_gbs) {
    KILN_CUDA_CHECK(cudaMalloc(&flush_, kFlushBytes));
  }
  ~Bench() { cudaFree(flush_); }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  Filler fill;

  // A fresh backend: each model's weights live and die with one.
  std::unique_ptr<ops::Backend> backend() const {
    auto be = kiln::cuda::make_cuda_backend({.device = 0, .smem_cap = o_.smem_cap});
    if (!be.ok()) {
      std::fprintf(stderr, "ops_bench: %s\n", be.status().to_string().c_str());
      std::exit(1);
    }
    return std::move(be).value();
  }

  int iters() const { return o_.iters; }
  bool wanted(const Case& c) const { return o_.only.empty() || c.label().find(o_.only) != std::string::npos; }

  // Median wall time of op() + synchronize(), L2 flushed before each call.
  Timing time(ops::Backend& be, const ops::BatchMeta& batch, const std::function<void()>& op) {
    const double warm_us = once(be, batch, op);
    const int iters = std::clamp(int(kCaseBudgetUs / std::max(warm_us, 1.0)), 1, o_.iters);
    std::vector<double> us(static_cast<size_t>(iters));
    for (double& u : us) u = once(be, batch, op);
    std::sort(us.begin(), us.end());
    const size_t m = us.size() / 2;
    return {.us = us.size() % 2 ? us[m] : 0.5 * (us[m - 1] + us[m]), .iters = iters};
  }

  // Times one case (if --only keeps it) and prints its table row.
  void run(ops::Backend& be, const ops::BatchMeta& batch, const Case& c, const std::function<void()>& op) {
    if (!wanted(c)) return;
    std::fprintf(stderr, "ops_bench: %s\n", c.label().c_str());
    report(c, time(be, batch, op));
  }

  // Prints the table row of a case timed as `t`.
  void report(const Case& c, const Timing& t) {
    std::string achieved, fraction;
    if (c.flops > 0.0) {
      const double tflops = c.flops / (t.us * 1e6);
      achieved = fmt("%.1f TFLOP/s", tflops);
      fraction = c.gemm ? fmt("%.1f%% of %.0f (mma.sync), %.1f%% of %.0f (wgmma)", 100.0 * tflops / kMmaPeakTflops,
                              kMmaPeakTflops, 100.0 * tflops / kWgmmaPeakTflops, kWgmmaPeakTflops)
                        : fmt("%.1f%% of %.0f TFLOP/s", 100.0 * tflops / kMmaPeakTflops, kMmaPeakTflops);
    } else {
      const double gbs = c.bytes / (t.us * 1e3);
      achieved = fmt("%.0f GB/s", gbs);
      fraction = fmt("%.1f%% of %.2f TB/s", 100.0 * gbs / copy_gbs_, copy_gbs_ / 1000.0);
    }
    std::string note = c.note;
    if (t.iters < o_.iters) note += (note.empty() ? "" : "; ") + std::to_string(t.iters) + " iters (slow case)";
    std::printf("| %s | %s | %lld | %.1f | %s | %s | %s |\n", c.op.c_str(), c.shape.c_str(), (long long)c.rows, t.us,
                achieved.c_str(), fraction.c_str(), note.c_str());
    std::fflush(stdout);
  }

  // One sequence whose newest `rows` tokens are in the step, of max(context, rows)
  // (ops that read no batch get one anyway: begin_step precedes every call).
  ops::BatchMeta rows_batch(int64_t rows, int context = 0) {
    return paged_batch(1, std::max<int>(context, int(rows)), int(rows), 16, fill.rng());
  }

 private:
  double once(ops::Backend& be, const ops::BatchMeta& batch, const std::function<void()>& op) {
    be.begin_step(batch);
    KILN_CUDA_CHECK(cudaMemsetAsync(flush_, ++flush_value_ & 0xff, kFlushBytes, nullptr));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    op();
    be.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    KILN_CUDA_CHECK(cudaGetLastError());
    return std::chrono::duration<double, std::micro>(t1 - t0).count();
  }

  Options o_;
  double copy_gbs_;
  void* flush_ = nullptr;
  int flush_value_ = 0;
};

// Whether --only keeps any of op/shape's row counts (builds nothing otherwise).
bool any_wanted(const Bench& b, const std::string& op, const std::string& shape, std::initializer_list<int> rows) {
  for (int r : rows)
    if (b.wanted(Case{.op = op, .shape = shape, .rows = r})) return true;
  return false;
}

std::string str(int64_t v) { return std::to_string(v); }

// ---- linear ---------------------------------------------------------------------------

// Real projection shapes, as y = x W^T with W [n_out, n_in].
struct LinearShape {
  const char* model;
  const char* name;
  int64_t n_in, n_out;
  bool bias;
};

constexpr LinearShape kLinearShapes[] = {
    {"gpt-oss-120b", "qkv", 2880, 5120, true},  // 64 q + 2 x 8 kv heads of 64
    {"gpt-oss-120b", "o", 4096, 2880, true},
    {"gpt-oss-120b", "lm_head", 2880, 201088, false},
    {"Qwen3-30B-A3B", "qkv", 2048, 5120, false},  // 32 q + 2 x 4 kv heads of 128
    {"Qwen3-30B-A3B", "o", 4096, 2048, false},
    {"Qwen3-30B-A3B", "lm_head", 2048, 151936, false},
    {"GLM-4.7", "qkv", 5120, 14336, true},  // 96 q + 2 x 8 kv heads of 128
    {"GLM-4.7", "o", 12288, 5120, false},
    {"Kimi-K2/DeepSeek-V3", "q_a", 7168, 1536, false},
    {"Kimi-K2/DeepSeek-V3", "q_b", 1536, 24576, false},  // 128 heads x (128 nope + 64 rope)
    {"Kimi-K2/DeepSeek-V3", "kv_a", 7168, 576, false},   // d_latent 512 + d_rope 64
    {"Kimi-K2/DeepSeek-V3", "o", 16384, 7168, false},
    {"Kimi-K2/DeepSeek-V3", "lm_head", 7168, 163840, false},
    {"Llama-3-8B", "gate_up", 4096, 28672, false},
    {"Llama-3-8B", "down", 14336, 4096, false},
};

void bench_linear(Bench& b) {
  auto be = b.backend();
  for (const LinearShape& s : kLinearShapes) {
    const std::string shape =
        std::string(s.model) + " " + s.name + " " + str(s.n_in) + "->" + str(s.n_out) + (s.bias ? " +bias" : "");
    if (!any_wanted(b, "linear", shape, {1, 8, kPrefillRows})) continue;
    ops::Weight w{.data = b.fill.weight(*be, {s.n_out, s.n_in})};  // [n_out, n_in]
    if (s.bias) w.bias = b.fill.vector(*be, s.n_out, -0.1f, 0.1f);
    const double weight_bytes = 2.0 * double(s.n_in) * double(s.n_out) + (s.bias ? 4.0 * double(s.n_out) : 0.0);
    for (int64_t rows : {1, 8, kPrefillRows}) {
      Case c{.op = "linear", .shape = shape, .rows = rows, .gemm = true};
      if (rows < kPrefillRows) c.bytes = weight_bytes + 2.0 * double(rows) * double(s.n_in + s.n_out);
      else c.flops = 2.0 * double(rows) * double(s.n_in) * double(s.n_out);
      if (s.bias) c.note = "fp32 GEMM output, then a bias + round kernel";
      if (!b.wanted(c)) continue;
      Tensor x = b.fill.activation(*be, {rows, s.n_in});
      Tensor out = be->alloc(DType::kBF16, {rows, s.n_out});
      b.run(*be, b.rows_batch(rows), c, [&] { be->linear({.x = x, .w = &w, .out = out}); });
    }
  }
}

// ---- norms and elementwise ops ------------------------------------------------------

void bench_rms_norm(Bench& b, ops::Backend& be) {
  for (int64_t d : {2880, 7168}) {
    Tensor weight = b.fill.vector(be, d, 0.5f, 1.5f);
    for (bool residual : {false, true}) {
      const std::string shape = "d " + str(d) + (residual ? " + residual" : "");
      for (int64_t rows : {1, 8, kPrefillRows}) {
        const double act = 2.0 * double(rows) * double(d);
        const Case c{.op = "rms_norm", .shape = shape, .rows = rows, .bytes = (residual ? 4 : 2) * act + 4.0 * d};
        if (!b.wanted(c)) continue;
        Tensor x = b.fill.activation(be, {rows, d});
        Tensor res = residual ? b.fill.activation(be, {rows, d}) : Tensor{};
        Tensor out = be.alloc(DType::kBF16, {rows, d});
        b.run(be, b.rows_batch(rows), c,
              [&] { be.rms_norm({.x = x, .weight = weight, .residual = res, .out = out, .eps = 1e-5f}); });
      }
    }
  }
}

void bench_rope(Bench& b, ops::Backend& be) {
  struct Heads { const char* model; int64_t n_heads, d_head; };
  for (const Heads h : {Heads{"gpt-oss", 64, 64}, Heads{"Qwen3-30B", 32, 128}}) {
    ops::RopeTable table{.d_rot = int(h.d_head)};
    for (int i = 0; i < table.d_rot / 2; ++i)
      table.inv_freq.push_back(float(std::pow(150000.0, -2.0 * i / double(table.d_rot))));
    const std::string shape = std::string(h.model) + " " + str(h.n_heads) + " heads x " + str(h.d_head);
    for (int64_t rows : {1, kPrefillRows}) {
      const Case c{.op = "rope", .shape = shape, .rows = rows,
                   .bytes = 2.0 * 2.0 * double(rows * h.n_heads * h.d_head) + 4.0 * double(rows)};
      if (!b.wanted(c)) continue;
      const ops::BatchMeta batch = b.rows_batch(rows, 4096);  // a decode token sits at position 4095
      Tensor x = b.fill.activation(be, {rows, h.n_heads, h.d_head});
      b.run(be, batch, c, [&] { be.rope({.x = x, .batch = &batch, .table = &table}); });
    }
  }
}

void bench_glu(Bench& b, ops::Backend& be) {
  struct Glu { const char* name; int64_t d_ff; ops::GluParams params; };
  const Glu glus[] = {{"gpt-oss clamped, d_ff 2880", 2880, {.kind = ops::GluKind::kGptOssClamp}},
                      {"silu, d_ff 18432 (DeepSeek-V3 dense)", 18432, {.kind = ops::GluKind::kSilu}}};
  for (const Glu& g : glus) {
    for (int64_t rows : {1, kPrefillRows}) {
      const Case c{.op = "glu", .shape = g.name, .rows = rows, .bytes = 3.0 * 2.0 * double(rows * g.d_ff)};
      if (!b.wanted(c)) continue;
      Tensor gate = b.fill.activation(be, {rows, g.d_ff});
      Tensor up = b.fill.activation(be, {rows, g.d_ff});
      Tensor out = be.alloc(DType::kBF16, {rows, g.d_ff});
      b.run(be, b.rows_batch(rows), c, [&] { be.glu({.gate = gate, .up = up, .out = out, .params = g.params}); });
    }
  }
}

void bench_add(Bench& b, ops::Backend& be) {
  for (int64_t d : {2880, 7168}) {
    for (int64_t rows : {1, kPrefillRows}) {
      const Case c{.op = "add", .shape = "d " + str(d), .rows = rows, .bytes = 3.0 * 2.0 * double(rows * d)};
      if (!b.wanted(c)) continue;
      Tensor x = b.fill.activation(be, {rows, d});
      Tensor y = b.fill.activation(be, {rows, d});
      Tensor out = be.alloc(DType::kBF16, {rows, d});
      b.run(be, b.rows_batch(rows), c, [&] { be.add({.a = x, .b = y, .out = out}); });
    }
  }
}

void bench_embedding(Bench& b, ops::Backend& be) {
  constexpr int64_t kVocab = 201088, kDModel = 2880;  // gpt-oss
  const std::string shape = "gpt-oss vocab " + str(kVocab) + " x " + str(kDModel);
  if (!any_wanted(b, "embedding", shape, {1, kPrefillRows})) return;
  Tensor table = b.fill.weight(be, {kVocab, kDModel});  // [vocab, d_model]
  for (int64_t rows : {1, kPrefillRows}) {
    const Case c{.op = "embedding", .shape = shape, .rows = rows,
                 .bytes = 2.0 * 2.0 * double(rows * kDModel) + 4.0 * double(rows),
                 .note = "includes the host ids' copy and its synchronize"};
    if (!b.wanted(c)) continue;
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int32_t& id : ids) id = int32_t(b.fill.rng()() % kVocab);
    const Tensor ids_t{.data = ids.data(), .dtype = DType::kI32, .shape = {rows}};  // host
    Tensor out = be.alloc(DType::kBF16, {rows, kDModel});
    b.run(be, b.rows_batch(rows), c, [&] { be.embedding({.table = table, .ids = ids_t, .out = out}); });
  }
}

void bench_slice_columns(Bench& b, ops::Backend& be) {
  // MLA's query split: [n_tokens * n_heads, d_nope + d_rope] -> the d_nope columns.
  constexpr int64_t kHeads = 128, kDQk = 192, kDNope = 128;
  for (int64_t rows : {1, kPrefillRows}) {
    const Case c{.op = "slice_columns", .shape = "DeepSeek-V3 q_nope: 128 heads, 192 -> 128 columns", .rows = rows,
                 .bytes = 2.0 * 2.0 * double(rows * kHeads * kDNope)};
    if (!b.wanted(c)) continue;
    Tensor src = b.fill.activation(be, {rows * kHeads, kDQk});
    Tensor dst = be.alloc(DType::kBF16, {rows * kHeads, kDNope});
    b.run(be, b.rows_batch(rows), c, [&] { be.slice_columns({.src = src, .col_begin = 0, .dst = dst}); });
  }
}

// ---- sample ------------------------------------------------------------------------------

void bench_sample(Bench& b, ops::Backend& be) {
  constexpr int64_t kVocab = 201088;  // gpt-oss
  struct Mode { const char* name; ops::SamplingParams params; };
  const Mode modes[] = {{"greedy", {}}, {"top-p 0.9, temperature 0.8", {.temperature = 0.8f, .top_p = 0.9f}}};
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::uniform_real_distribution<float> draw(0.0f, 0.99f);
  for (const Mode& m : modes) {
    for (int64_t rows : {1, 8}) {
      const Case c{.op = "sample", .shape = "gpt-oss vocab " + str(kVocab) + ", " + m.name, .rows = rows,
                   .bytes = 2.0 * double(rows * kVocab), .note = "logits ~ N(0, 3^2); no logprobs"};
      if (!b.wanted(c)) continue;
      // Spread like real logits, so top-p keeps a tail rather than most of the vocabulary.
      std::vector<float> host(static_cast<size_t>(rows * kVocab));
      for (float& x : host) x = logit(b.fill.rng());
      Tensor logits = be.alloc(DType::kBF16, {rows, kVocab});  // [n_rows, vocab]
      be.from_host_f32(host.data(), logits);
      const std::vector<ops::SamplingParams> params(size_t(rows), m.params);
      std::vector<float> uniform(static_cast<size_t>(rows));
      for (float& u : uniform) u = draw(b.fill.rng());
      std::vector<int32_t> tokens(static_cast<size_t>(rows));
      b.run(be, b.rows_batch(rows), c,
            [&] { be.sample({.logits = logits, .params = params, .uniform = uniform, .tokens = tokens}); });
    }
  }
}

// ---- moe -------------------------------------------------------------------------------

struct MoeModel {
  const char* name;
  int64_t n_experts, top_k, d_model, d_ff;
  bool gpt_oss_layout;  // fused interleaved gate_up, input-major, with biases (else separate gate / up)
  bool router_bias, correction_bias;
  ops::RouterParams routing;
  ops::GluParams glu;
};

const MoeModel kMoeModels[] = {
    {"gpt-oss-120b", 128, 4, 2880, 2880, true, true, false,
     {.kind = ops::RouterKind::kTopKSoftmax, .n_experts = 128, .top_k = 4},
     {.kind = ops::GluKind::kGptOssClamp}},
    {"Qwen3-30B-A3B", 128, 8, 2048, 768, false, false, false,
     {.kind = ops::RouterKind::kSoftmaxTopK, .n_experts = 128, .top_k = 8, .norm_topk_prob = true},
     {.kind = ops::GluKind::kSilu}},
    {"DeepSeek-V3/Kimi-K2-like", 256, 8, 7168, 2048, false, false, true,
     {.kind = ops::RouterKind::kSigmoidGroupedTopK, .n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 4,
      .norm_topk_prob = true, .routed_scaling_factor = 2.5f},
     {.kind = ops::GluKind::kSilu}},
};

// Distinct experts the rows of x route to: the reference rule on the host, over fp32
// logits of the same bf16 x and router.
int64_t distinct_experts(ops::Backend& be, const Tensor& x, const ops::Weight& router,
                         const std::vector<float>& router_bias, const std::vector<float>& correction,
                         const ops::RouterParams& r) {
  const int64_t rows = x.dim(0), d = x.dim(1), n = r.n_experts;
  std::vector<float> xs(static_cast<size_t>(rows * d)), ws(static_cast<size_t>(n * d));
  std::vector<float> logits(static_cast<size_t>(n)), weights(static_cast<size_t>(r.top_k));
  std::vector<int32_t> chosen(static_cast<size_t>(r.top_k));
  be.to_host_f32(x, xs.data());
  be.to_host_f32(router.data, ws.data());
  std::set<int32_t> used;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t e = 0; e < n; ++e) {
      float acc = router_bias.empty() ? 0.0f : router_bias[size_t(e)];
      for (int64_t i = 0; i < d; ++i) acc += xs[size_t(t * d + i)] * ws[size_t(e * d + i)];
      logits[size_t(e)] = acc;
    }
    kiln::cpu::route(logits.data(), correction.empty() ? nullptr : correction.data(), r, chosen.data(),
                     weights.data());
    used.insert(chosen.begin(), chosen.end());
  }
  return int64_t(used.size());
}

void bench_moe_model(Bench& b, const MoeModel& m) {
  const std::string shape = std::string(m.name) + ": " + str(m.n_experts) + " experts top-" + str(m.top_k) +
                            ", d_model " + str(m.d_model) + ", d_ff " + str(m.d_ff);
  if (!any_wanted(b, "moe", shape, {1, 8, kPrefillRows})) return;
  const double expert_gb = 3.0 * 2.0 * double(m.n_experts * m.d_model * m.d_ff) / 1e9;
  std::fprintf(stderr, "ops_bench: building %s experts (%.1f GB)\n", m.name, expert_gb);
  auto be = b.backend();  // the expert set is freed with it, before the next model's
  const int64_t E = m.n_experts, d = m.d_model, f = m.d_ff;
  ops::MoeExperts ex{.d_ff = f};
  // Stacked as in the checkpoints; each expert's Weight is a view of its slice.
  Tensor gate_up, gate_up_bias, gate, up, down, down_bias;
  if (m.gpt_oss_layout) {
    gate_up = b.fill.weight(*be, {E, d, 2 * f});   // (n_experts, d_model, 2*d_ff): input-major
    gate_up_bias = b.fill.weight(*be, {E, 2 * f});  // bf16 matrix, as uploaded from the checkpoint
    down = b.fill.weight(*be, {E, f, d});           // (n_experts, d_ff, d_model): input-major
    down_bias = b.fill.weight(*be, {E, d});
    ex.gate_up_interleaved = true;
    for (int64_t e = 0; e < E; ++e) {
      ex.gate_up.push_back({.data = gate_up.index0(e), .transposed = true, .bias = gate_up_bias.index0(e)});
      ex.down.push_back({.data = down.index0(e), .transposed = true, .bias = down_bias.index0(e)});
    }
  } else {
    gate = b.fill.weight(*be, {E, f, d});  // (n_experts, d_ff, d_model)
    up = b.fill.weight(*be, {E, f, d});
    down = b.fill.weight(*be, {E, d, f});  // (n_experts, d_model, d_ff)
    for (int64_t e = 0; e < E; ++e) {
      ex.gate.push_back({.data = gate.index0(e)});
      ex.up.push_back({.data = up.index0(e)});
      ex.down.push_back({.data = down.index0(e)});
    }
  }
  std::vector<float> router_bias_host, correction_host;
  ops::Weight router{.data = b.fill.weight(*be, {E, d})};  // (n_experts, d_model)
  if (m.router_bias) router.bias = b.fill.vector(*be, E, -0.1f, 0.1f, &router_bias_host);
  const Tensor correction = m.correction_bias ? b.fill.vector(*be, E, -0.05f, 0.05f, &correction_host) : Tensor{};
  // What one expert's GEMVs read (the kernels read biases as fp32 copies).
  const double expert_bytes = 2.0 * 3.0 * double(d * f) + (m.gpt_oss_layout ? 4.0 * double(2 * f + d) : 0.0);
  const double router_bytes = 2.0 * double(E * d) + (m.router_bias ? 4.0 * double(E) : 0.0);

  for (int64_t rows : {1, 8, kPrefillRows}) {
    Case c{.op = "moe", .shape = shape, .rows = rows};
    if (!b.wanted(c)) continue;
    Tensor x = b.fill.activation(*be, {rows, d});
    Tensor out = be->alloc(DType::kBF16, {rows, d});
    if (rows < kPrefillRows) {
      const int64_t n_used = distinct_experts(*be, x, router, router_bias_host, correction_host, m.routing);
      c.bytes = double(n_used) * expert_bytes + router_bytes + 2.0 * 2.0 * double(rows * d);
      c.note = str(n_used) + " distinct experts (host routing; bound " + str(std::min(E, rows * m.top_k)) + ")";
    } else {
      c.flops = 2.0 * double(rows) * double(m.top_k) * 3.0 * double(d) * double(f);
    }
    b.run(*be, b.rows_batch(rows), c, [&] {
      be->moe({.x = x, .router = &router, .correction_bias = correction, .experts = &ex, .routing = m.routing,
               .glu = m.glu, .out = out});
    });
  }
}

// ---- moe over quantized experts (decode) ---------------------------------------------
//
// Decode reads each chosen expert's packed weights once; the question is how close to
// the copy bandwidth that runs. One call reads a few MB, of the order of the L2, so
// here a step is `layers` MoE layers with their own expert sets (together > 4 x the
// L2: no layer finds another's weights cached) recorded as one CUDA graph by
// Backend::run_step, as a decode step is, and timed over many replays on the host:
// time per layer = wall time / (replays x layers). No flush is needed, no host launch
// cost is counted. Codes are random bytes; scales a constant (the kernels' speed does
// not depend on the values).

struct QuantFormatCase {
  const char* name;
  kiln::formats::QuantKind kind;
  int bits, group, scale_bytes;
  DType scale_dtype;
  uint8_t scale_byte;  // memset value of every scale
};

constexpr QuantFormatCase kQuantFormats[] = {
    {"mxfp4", kiln::formats::QuantKind::kMxfp4, 4, 32, 1, DType::kE8M0, 0x7a},          // 2^-5
    {"nvfp4", kiln::formats::QuantKind::kNvfp4, 4, 16, 1, DType::kF8E4M3, 0x38},        // 1.0 (x scale2)
    {"int4 g32", kiln::formats::QuantKind::kInt4Group, 4, 32, 2, DType::kBF16, 0x3c},   // 0.0115
    {"fp8 block", kiln::formats::QuantKind::kFp8Block, 8, 128, 4, DType::kF32, 0x3c},  // 0.0115
};

// n_experts packed [n_out, n_in] weights in one device allocation (views per expert),
// as CudaBackend::upload_quantized lays them out (backends/cuda/quant_pack.h).
std::vector<kiln::formats::QuantizedTensor> packed_experts(Bench& b, ops::Backend& be, const QuantFormatCase& f,
                                                           int64_t n_experts, int64_t n_out, int64_t n_in,
                                                           double* bytes_per_expert) {
  const kiln::cuda::QuantFormat qf{.value = f.bits == 8 ? 2 : 0, .scale_bytes = f.scale_bytes, .group = f.group};
  const int64_t code_row = qf.code_row_bytes(n_in), scale_row = qf.scale_row_bytes(n_in);
  // Codes: random bytes from the weight pool (a bf16 tensor of the same bytes).
  Tensor codes = b.fill.weight(be, {n_experts, n_out, code_row / 2});
  Tensor scales = be.alloc(DType::kU8, {n_experts, n_out, scale_row});
  KILN_CUDA_CHECK(cudaMemset(scales.data, f.scale_byte, scales.nbytes()));
  Tensor scale2;
  if (f.kind == kiln::formats::QuantKind::kNvfp4) scale2 = b.fill.vector(be, 1, 1.0f / 64, 1.0f / 64);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<kiln::formats::QuantizedTensor> out;
  for (int64_t e = 0; e < n_experts; ++e) {
    kiln::formats::QuantizedTensor q{.kind = f.kind, .n_out = n_out, .n_in = n_in, .block_n = 128, .block_k = f.group};
    q.packed_group = f.group;
    q.data = Tensor{.data = static_cast<char*>(codes.data) + e * n_out * code_row, .dtype = DType::kU8,
                    .shape = {n_out, code_row}, .device = kiln::Device::kCuda, .owner = codes.owner};
    q.scale = Tensor{.data = static_cast<char*>(scales.data) + e * n_out * scale_row, .dtype = f.scale_dtype,
                     .shape = {n_out, scale_row / f.scale_bytes}, .device = kiln::Device::kCuda,
                     .owner = scales.owner};
    q.scale2 = scale2;
    out.push_back(std::move(q));
  }
  *bytes_per_expert = double(n_out * (code_row + scale_row));
  return out;
}

void bench_quant_moe(Bench& b, const MoeModel& m, const QuantFormatCase& f) {
  const std::string shape = std::string(m.name) + " " + f.name + ": " + str(m.n_experts) + " experts top-" +
                            str(m.top_k) + ", d_model " + str(m.d_model) + ", d_ff " + str(m.d_ff);
  if (!any_wanted(b, "moe (quantized, graph)", shape, {1, 8})) return;
  auto be = b.backend();
  const int64_t E = m.n_experts, d = m.d_model, ff = m.d_ff;
  const double per_param = (f.bits + 8.0 * f.scale_bytes / f.group) / 8.0;
  const double set_gb = per_param * 3.0 * double(E * d * ff) / 1e9;
  // Layers: enough that one step's experts exceed 4 x a 50 MB L2 even at one row.
  const double one_row_bytes = per_param * 3.0 * double(d * ff) * double(m.top_k);
  const int layers = int(std::clamp(std::ceil(200e6 / one_row_bytes), 2.0, 16.0));
  std::fprintf(stderr, "ops_bench: building %d layers of %s %s experts (%.1f GB each)\n", layers, m.name, f.name, set_gb);
  std::vector<ops::MoeExperts> sets(static_cast<size_t>(layers));
  double gate_bytes = 0.0, down_bytes = 0.0;
  for (ops::MoeExperts& ex : sets) {
    ex.d_ff = ff;
    ex.gate_up_interleaved = m.gpt_oss_layout;
    auto add = [&](std::vector<ops::Weight>& list, int64_t n_out, int64_t n_in, double* bytes) {
      for (auto& q : packed_experts(b, *be, f, E, n_out, n_in, bytes)) list.push_back(ops::Weight{.quant = q});
    };
    if (m.gpt_oss_layout) {
      add(ex.gate_up, 2 * ff, d, &gate_bytes);
      gate_bytes /= 2;  // per matrix of d_ff rows, as below
    } else {
      add(ex.gate, ff, d, &gate_bytes);
      add(ex.up, ff, d, &gate_bytes);
    }
    add(ex.down, d, ff, &down_bytes);
  }
  const double expert_bytes = 2.0 * gate_bytes + down_bytes;
  std::vector<float> router_bias_host, correction_host;
  ops::Weight router{.data = b.fill.weight(*be, {E, d})};
  if (m.router_bias) router.bias = b.fill.vector(*be, E, -0.1f, 0.1f, &router_bias_host);
  const Tensor correction = m.correction_bias ? b.fill.vector(*be, E, -0.05f, 0.05f, &correction_host) : Tensor{};
  const double router_bytes = 2.0 * double(E * d);
  for (int64_t rows : {1, 8}) {
    Case c{.op = "moe (quantized, graph)", .shape = shape, .rows = rows};
    if (!b.wanted(c)) continue;
    Tensor x = b.fill.activation(*be, {rows, d});
    std::vector<Tensor> outs;
    for (int l = 0; l < layers; ++l) outs.push_back(be->alloc(DType::kBF16, {rows, d}));
    const int64_t n_used = distinct_experts(*be, x, router, router_bias_host, correction_host, m.routing);
    c.bytes = double(n_used) * expert_bytes + router_bytes + 2.0 * 2.0 * double(rows * d);
    c.note = str(n_used) + " distinct experts; " + str(layers) + " layers per graph";
    // Decode-shaped: `rows` sequences of one new token each (run_step records those).
    const ops::BatchMeta batch = paged_batch(int(rows), 16, 1, 16, b.fill.rng());
    const auto step = [&] {
      for (int l = 0; l < layers; ++l)
        be->moe({.x = x, .router = &router, .correction_bias = correction, .experts = &sets[size_t(l)],
                 .routing = m.routing, .glu = m.glu, .out = outs[size_t(l)]});
      return outs.back();
    };
    for (int i = 0; i < 3; ++i) be->run_step(batch, 1, step);  // eager, record, replay
    be->synchronize();
    const int replays = std::max(10, b.iters() * 5);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < replays; ++i) be->run_step(batch, 1, step);
    be->synchronize();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                      double(replays * layers);
    b.report(c, Timing{.us = us, .iters = b.iters()});
  }
}

// ---- mla_attention --------------------------------------------------------------------

void bench_mla(Bench& b, const char* model, int64_t n_heads) {
  constexpr int64_t kDNope = 128, kDRope = 64, kDV = 128, kDLatent = 512;
  constexpr int kBlock = 64;
  struct Step { int n_seqs, context, n_query; };
  const Step steps[] = {{1, 4096, 1}, {8, 4096, 1}, {1, kPrefillRows, kPrefillRows}};
  const auto shape_of = [&](const Step& s) {
    return std::string(model) + " " + str(n_heads) + " heads, d_latent 512 + rope 64, " + str(s.n_seqs) +
           (s.n_seqs == 1 ? " seq" : " seqs") + " x context " + str(s.context);
  };
  bool any = false;
  for (const Step& s : steps) any = any || b.wanted(Case{.op = "mla_attention", .shape = shape_of(s),
                                                         .rows = s.n_seqs * s.n_query});
  if (!any) return;
  auto be = b.backend();
  // kv_b_proj: (n_heads * (d_nope + d_v), d_latent)
  const ops::Weight kv_b{.data = b.fill.weight(*be, {n_heads * (kDNope + kDV), kDLatent})};
  for (const Step& s : steps) {
    const int64_t n_tokens = int64_t(s.n_seqs) * s.n_query;
    Case c{.op = "mla_attention", .shape = shape_of(s), .rows = n_tokens};
    if (!b.wanted(c)) continue;
    if (s.n_query == 1) {
      c.bytes = 2.0 * double(s.n_seqs) * s.context * double(kDLatent + kDRope) + double(kv_b.nbytes()) +
                2.0 * double(n_tokens * n_heads * (kDNope + kDRope + kDV));
    } else {
      // Causal: query p sees p + 1 cached rows.
      const double pairs = double(s.n_query) * (s.n_query + 1) / 2.0;
      c.flops = double(n_heads) * (double(n_tokens) * 2.0 * kDLatent * (kDNope + kDV) +
                                   pairs * 2.0 * (2.0 * kDLatent + kDRope));
    }
    const ops::BatchMeta batch = paged_batch(s.n_seqs, s.context, s.n_query, kBlock, b.fill.rng());
    const int64_t n_blocks = int64_t(batch.block_table.size());
    Tensor cache = b.fill.activation(*be, {n_blocks, kBlock, kDLatent + kDRope});
    Tensor q_nope = b.fill.activation(*be, {n_tokens, n_heads, kDNope});
    Tensor q_rope = b.fill.activation(*be, {n_tokens, n_heads, kDRope});
    Tensor out = be->alloc(DType::kBF16, {n_tokens, n_heads, kDV});
    const float scale = 1.0f / std::sqrt(float(kDNope + kDRope));
    b.run(*be, batch, c, [&] {
      be->mla_attention({.q_nope = q_nope, .q_rope = q_rope, .latent_cache = cache, .kv_b = &kv_b, .out = out,
                         .batch = &batch, .scale = scale});
    });
  }
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--smem-cap BYTES] [--iters N] [--only SUBSTRING]\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smem-cap" && i + 1 < argc) o.smem_cap = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) o.iters = std::atoi(argv[++i]);
    else if (a == "--only" && i + 1 < argc) o.only = argv[++i];
    else return usage(argv[0]);
  }
  if (o.iters < 1 || o.smem_cap < 0) return usage(argv[0]);
  const auto start = std::chrono::steady_clock::now();

  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(stderr, "ops_bench: measuring the copy bandwidth\n");
  const double copy_gbs = measure_copy_bandwidth_gbs();
  Bench b(o, copy_gbs);

  // The method's floor: the cheapest op, timed the same way.
  double floor_us = 0.0;
  {
    auto be = b.backend();
    Tensor x = b.fill.activation(*be, {1, 8});
    Tensor out = be->alloc(DType::kBF16, {1, 8});
    floor_us = b.time(*be, b.rows_batch(1), [&] { be->add({.a = x, .b = x, .out = out}); }).us;
  }

  std::printf("device: %s (%d SMs), --smem-cap %d, median of %d iterations, L2 flushed before each\n", prop.name,
              prop.multiProcessorCount, o.smem_cap, o.iters);
  std::printf("ceilings: copy %.0f GB/s (measured here: cudaMemcpyAsync device to device, 1 GiB, read + write); "
              "mma.sync bf16 %.0f TFLOP/s (the constant measured on the H100 in docs/PERF.md, not re-measured); "
              "wgmma bf16 %.0f TFLOP/s (H100 SXM datasheet, dense; not measured)\n",
              copy_gbs, kMmaPeakTflops, kWgmmaPeakTflops);
  std::printf("timing: host wall clock from the op's launch to Backend::synchronize() returning (the backend's "
              "stream is private); timing floor %.1f us (an 8-element add, same method)\n\n", floor_us);
  std::printf("| op | shape | rows | time (us) | achieved | fraction of roofline | notes |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);

  bench_linear(b);
  {
    auto be = b.backend();
    bench_rms_norm(b, *be);
    bench_rope(b, *be);
    bench_glu(b, *be);
    bench_add(b, *be);
    bench_embedding(b, *be);
    bench_slice_columns(b, *be);
    bench_sample(b, *be);
  }
  for (const MoeModel& m : kMoeModels) bench_moe_model(b, m);
  for (const MoeModel& m : kMoeModels)
    for (const QuantFormatCase& f : kQuantFormats) bench_quant_moe(b, m, f);
  bench_mla(b, "DeepSeek-V3", 128);
  bench_mla(b, "Kimi-K2", 64);

  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "ops_bench: done in %.0f s\n", total_s);
  return 0;
}
