// `kiln bench op`: every CUDA op other than paged attention (bench/attention_bench.cpp),
// driven through the public ops::Backend interface on real model shapes, as a fraction of
// the machine's roofline: bytes moved / time against the measured device-to-device copy
// bandwidth for decode-shaped work (and for every elementwise op), FLOPs / time against
// the measured mma.sync bf16 peak for prefill-shaped GEMM-like work. What is timed is
// what kiln runs: argument checks, cuBLASLt plans, the caching allocator's scratch,
// host id copies, routing. (This was bench/ops_bench.cpp, a plain main.)
//
//   kiln bench op [--smem-cap 101376] [--iters 20] [--only SUBSTRING] [--json FILE]
//
// --only keeps the cases whose label ("<op> <shape> rows <n>", as in the table)
// contains SUBSTRING; model weights are only built for the cases kept. --json writes
// the ceilings and every row (op_bench_json).
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
// took 6 s on the H100 at --iters 20 (as ops_bench, before the mma peaks were measured
// here too).
//
// Ceilings, measured at start-up on the bench's own non-blocking stream. Copy
// bandwidth: cudaMemcpyAsync of 1 GiB, device to device, bytes read + written / time,
// median of 10 (cudaEvents). mma.sync peaks (backends/cuda/kernels/mma_peak.cu): bf16
// m16n8k16 and e4m3 m16n8k32, fp32 accumulation, back-to-back on register operands
// that change every iteration (a 64 x 64 warp tile's fragments), over every SM, best of
// 3. FLOP rows are fractions of the bf16 peak, the FP8 W8A8 rows (Case::e4m3) of the
// e4m3 one; SM 9.0 runs e4m3 mma.sync as conversions plus fp16 tensor-core work, and
// its measured peak is that emulation's rate. cuBLASLt on sm_90 may pick wgmma
// kernels, whose peak is higher (989 TFLOP/s dense bf16 on H100 SXM, datasheet, not
// measured), so the GEMMs report both fractions.
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
//                 DSA decode (DeepSeek-V3.2): dsa_select's bytes + min(context, top_k)
//                 latent rows + kv_b + q + out, against dense MLA over the whole context
//   gated_delta_net decode rows: the recurrent and conv states read and written + the row's
//                 inputs and output; prompts (as the recurrence and as the chunked form): the
//                 chunked form's multiply-adds x 2, 3 dk dv + 64 (3 dk + 2 dv) per row and
//                 value head (fp32 CUDA cores, yet against the bf16 mma peak)
//   dsa_select    the index keys of the context + the indexer's q and head weights + the
//                 selection written (its fp32 score scratch, written and read, not counted)
//   sample        the logits read (the op returns its outputs in host memory, so the
//                 device-to-host copy and its synchronize are inside the time)
//
// Weights and activations are random bf16 (never zero): two 64 MiB pools are generated
// on the host once, and each tensor (from Backend::alloc) is filled by device copies from
// a pool at a random offset, so a 22.5 GB expert set takes milliseconds instead of a
// minute of host conversion in Backend::upload. fp32 vectors (norm weights, biases,
// routing biases) go through Backend::upload. Each model's weights live in a backend of
// their own, destroyed (memory returned to the driver) before the next model's.
#include "cli/bench_op.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cli/common.h"
#include "cli/subcommand.h"
#ifdef KILN_HAVE_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/kernels/kernels.h"
#include "cli/bench_op_harness.h"
#include "core/check.h"
#endif

namespace kiln::cli {

#ifdef KILN_HAVE_CUDA
namespace op_bench {
namespace {

constexpr double kWgmmaPeakTflops = 989.0;  // H100 SXM dense bf16 (datasheet; cuBLASLt's wgmma kernels)
constexpr size_t kFlushBytes = size_t(256) << 20;  // > the H100's 50 MB L2
constexpr double kCaseBudgetUs = 2e6;       // a slow case runs about this long (at least one timed call)

template <typename... Args>
std::string fmt(const char* format, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

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
    h = f32_to_bf16((2.0f * u - 1.0f) * scale);  // |2u - 1| >= 2^-24
  }
  return out;
}

// Device-to-device copy of 1 GiB, bytes read + written / time, median of 10 (GB/s).
double measure_copy_bandwidth_gbs(cudaStream_t stream) {
  const size_t bytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&src, bytes));
  KILN_CUDA_CHECK(cudaMalloc(&dst, bytes));
  KILN_CUDA_CHECK(cudaMemset(src, 1, bytes));
  cudaEvent_t start, stop;
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
  KILN_CUDA_CHECK(cudaFree(src));
  KILN_CUDA_CHECK(cudaFree(dst));
  return 2.0 * double(bytes) / (median_ms * 1e6);
}

OpCeilings measure_ceilings() {
  cudaStream_t stream;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  OpCeilings c;
  std::fprintf(stderr, "kiln bench op: measuring the copy bandwidth\n");
  c.copy_gbs = measure_copy_bandwidth_gbs(stream);
  std::fprintf(stderr, "kiln bench op: measuring the mma.sync peaks\n");
  c.mma_bf16_tflops = cuda::measure_mma_peak_tflops(cuda::MmaKind::kBf16, stream);
  c.mma_e4m3_tflops = cuda::measure_mma_peak_tflops(cuda::MmaKind::kE4m3, stream);  // 0 before SM 8.9
  c.wgmma_bf16_tflops = kWgmmaPeakTflops;
  KILN_CUDA_CHECK(cudaStreamDestroy(stream));
  return c;
}

}  // namespace

// ---- random device data ---------------------------------------------------------------

Filler::Filler() {
  for (int i = 0; i < 2; ++i) {
    const std::vector<uint16_t> host = random_bf16(kPoolElems, i == 0 ? 1.0f : 1.0f / 32, 1234 + i);
    KILN_CUDA_CHECK(cudaMalloc(&pools_[i], kPoolElems * sizeof(uint16_t)));
    KILN_CUDA_CHECK(cudaMemcpy(pools_[i], host.data(), kPoolElems * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
}

Filler::~Filler() {
  for (uint16_t* p : pools_) cudaFree(p);
}

Tensor Filler::vector(ops::Backend& be, int64_t n, float lo, float hi, std::vector<float>* host_copy) {
  std::vector<float> v(static_cast<size_t>(n));
  std::uniform_real_distribution<float> d(lo, hi);
  for (float& x : v) x = d(rng_);
  const Tensor t = be.upload(Tensor{.data = v.data(), .dtype = DType::kF32, .shape = {n}});
  if (host_copy) *host_copy = std::move(v);
  return t;
}

Tensor Filler::fill(ops::Backend& be, Shape s, const uint16_t* pool) {
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

// ---- timing and the table ------------------------------------------------------------

Bench::Bench(const BenchOpOptions& o, const OpCeilings& ceilings) : o_(o), ceilings_(ceilings) {
  KILN_CUDA_CHECK(cudaMalloc(&flush_, kFlushBytes));
}

Bench::~Bench() { cudaFree(flush_); }

std::unique_ptr<ops::Backend> Bench::backend() const {
  auto be = cuda::make_cuda_backend({.device = 0, .smem_cap = o_.smem_cap});
  KILN_CHECK(be.ok()) << be.status().to_string() << " (run_bench_op made one with these options at start-up)";
  return std::move(be).value();
}

Timing Bench::time(ops::Backend& be, const ops::BatchMeta& batch, const std::function<void()>& op) {
  const double warm_us = once(be, batch, op);
  const int iters = std::clamp(int(kCaseBudgetUs / std::max(warm_us, 1.0)), 1, o_.iters);
  std::vector<double> us(static_cast<size_t>(iters));
  for (double& u : us) u = once(be, batch, op);
  std::sort(us.begin(), us.end());
  const size_t m = us.size() / 2;
  return {.us = us.size() % 2 ? us[m] : 0.5 * (us[m - 1] + us[m]), .iters = iters};
}

void Bench::run(ops::Backend& be, const ops::BatchMeta& batch, const Case& c, const std::function<void()>& op) {
  if (!wanted(c)) return;
  std::fprintf(stderr, "kiln bench op: %s\n", c.label().c_str());
  report(c, time(be, batch, op));
}

void Bench::report(const Case& c, const Timing& t) {
  OpRow r{.op = c.op, .shape = c.shape, .rows = c.rows, .time_us = t.us, .iters = t.iters, .bytes = c.bytes,
          .flops = c.flops, .e4m3 = c.e4m3, .note = c.note};
  std::string achieved, fraction;
  if (c.flops > 0.0) {
    const double peak = c.e4m3 ? ceilings_.mma_e4m3_tflops : ceilings_.mma_bf16_tflops;
    const double wgmma = ceilings_.wgmma_bf16_tflops;
    r.achieved = c.flops / (t.us * 1e6);  // TFLOP/s
    r.fraction = r.achieved / peak;
    achieved = fmt("%.1f TFLOP/s", r.achieved);
    if (c.gemm) {
      r.fraction_wgmma = r.achieved / wgmma;
      fraction = fmt("%.1f%% of %.0f (mma.sync), %.1f%% of %.0f (wgmma)", 100.0 * r.fraction, peak,
                     100.0 * r.fraction_wgmma, wgmma);
    } else {
      fraction = fmt("%.1f%% of %.0f TFLOP/s", 100.0 * r.fraction, peak);
    }
  } else {
    r.achieved = c.bytes / (t.us * 1e3);  // GB/s
    r.fraction = r.achieved / ceilings_.copy_gbs;
    achieved = fmt("%.0f GB/s", r.achieved);
    fraction = fmt("%.1f%% of %.2f TB/s", 100.0 * r.fraction, ceilings_.copy_gbs / 1000.0);
  }
  if (t.iters < o_.iters) r.note += (r.note.empty() ? "" : "; ") + std::to_string(t.iters) + " iters (slow case)";
  std::printf("| %s | %s | %lld | %.1f | %s | %s | %s |\n", r.op.c_str(), r.shape.c_str(), (long long)r.rows, r.time_us,
              achieved.c_str(), fraction.c_str(), r.note.c_str());
  std::fflush(stdout);
  rows_.push_back(std::move(r));
}

double Bench::once(ops::Backend& be, const ops::BatchMeta& batch, const std::function<void()>& op) {
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

bool any_wanted(const Bench& b, const std::string& op, const std::string& shape, std::initializer_list<int> rows) {
  for (int r : rows)
    if (b.wanted(Case{.op = op, .shape = shape, .rows = r})) return true;
  return false;
}

}  // namespace op_bench

Result<OpBenchReport> run_bench_op(const BenchOpOptions& o) {
  if (o.iters < 1) return invalid_argument("--iters must be at least 1 (got " + std::to_string(o.iters) + ")");
  if (o.smem_cap < 0) return invalid_argument("--smem-cap must be >= 0 (got " + std::to_string(o.smem_cap) + ")");
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(cuda::DeviceInfo device, cuda::query_device(0));
  // The options' first backend, checked here: the cases make theirs the same way.
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ops::Backend> first,
                        cuda::make_cuda_backend({.device = 0, .smem_cap = o.smem_cap}));

  OpBenchReport report{.device = device.name, .sm_count = device.sm_count, .options = o};
  report.ceilings = op_bench::measure_ceilings();
  const OpCeilings& c = report.ceilings;
  op_bench::Bench b(o, c);

  // The method's floor: the cheapest op, timed the same way.
  {
    ops::Backend& be = *first;
    Tensor x = b.fill.activation(be, {1, 8});
    Tensor out = be.alloc(DType::kBF16, {1, 8});
    report.floor_us = b.time(be, b.rows_batch(1), [&] { be.add({.a = x, .b = x, .out = out}); }).us;
  }
  first.reset();  // its memory back before the cases'

  const std::string e4m3 = c.mma_e4m3_tflops > 0.0 ? op_bench::fmt("e4m3 %.0f TFLOP/s", c.mma_e4m3_tflops)
                                                   : std::string("e4m3 n/a (needs SM 8.9)");
  std::printf("device: %s (%d SMs), --smem-cap %d, median of %d iterations, L2 flushed before each\n",
              device.name.c_str(), device.sm_count, o.smem_cap, o.iters);
  std::printf("ceilings: copy %.0f GB/s (measured here: cudaMemcpyAsync device to device, 1 GiB, read + write); "
              "mma.sync bf16 %.0f TFLOP/s, %s (measured here: back-to-back on every SM, fp32 accumulation); "
              "wgmma bf16 %.0f TFLOP/s (H100 SXM datasheet, dense; not measured)\n",
              c.copy_gbs, c.mma_bf16_tflops, e4m3.c_str(), c.wgmma_bf16_tflops);
  std::printf("timing: host wall clock from the op's launch to Backend::synchronize() returning (the backend's "
              "stream is private); timing floor %.1f us (an 8-element add, same method)\n\n", report.floor_us);
  std::printf("| op | shape | rows | time (us) | achieved | fraction of roofline | notes |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);

  op_bench::run_all_cases(b);
  report.rows = std::move(b.rows());

  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "kiln bench op: %zu rows in %.0f s\n", report.rows.size(), total_s);
  return report;
}
#else
Result<OpBenchReport> run_bench_op(const BenchOpOptions&) {
  return unsupported("kiln bench op needs the CUDA backend, and this kiln was built without it "
                     "(nvcc was not found at build time, or -DKILN_CUDA=OFF)");
}
#endif

nlohmann::ordered_json op_bench_json(const OpBenchReport& report) {
  using json = nlohmann::ordered_json;
  const OpCeilings& c = report.ceilings;
  json rows = json::array();
  for (const OpRow& r : report.rows) {
    json row = {{"label", r.label()}, {"op", r.op}, {"shape", r.shape}, {"rows", r.rows},
                {"time_us", r.time_us}, {"iters", r.iters}};
    if (r.flops > 0.0) {
      row["flops"] = r.flops;
      row["achieved_tflops"] = r.achieved;
      row["ceiling"] = r.e4m3 ? "mma_e4m3_tflops" : "mma_bf16_tflops";
    } else {
      row["bytes"] = r.bytes;
      row["achieved_gbs"] = r.achieved;
      row["ceiling"] = "copy_gbs";
    }
    row["fraction"] = r.fraction;
    if (r.fraction_wgmma > 0.0) row["fraction_wgmma"] = r.fraction_wgmma;
    row["note"] = r.note;
    rows.push_back(std::move(row));
  }
  return {{"device", report.device},
          {"sm_count", report.sm_count},
          {"options", {{"smem_cap", report.options.smem_cap}, {"iters", report.options.iters},
                       {"only", report.options.only}}},
          {"ceilings",
           {{"copy_gbs", c.copy_gbs},
            {"mma_bf16_tflops", c.mma_bf16_tflops},
            {"mma_e4m3_tflops", c.mma_e4m3_tflops > 0.0 ? json(c.mma_e4m3_tflops) : json(nullptr)},
            {"wgmma_bf16_tflops", c.wgmma_bf16_tflops},
            {"wgmma_source", "H100 SXM datasheet, dense; not measured"}}},
          {"timing_floor_us", report.floor_us},
          {"rows", std::move(rows)}};
}

void add_bench_op_command(CLI::App& bench, Subcommands& commands) {
  struct Args {
    BenchOpOptions options;
    std::string json_path;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "op", "time every CUDA op on real model shapes as a fraction of this GPU's measured copy bandwidth and "
            "mma.sync peak");
  cmd->add_option("--smem-cap", a->options.smem_cap,
                  "shared memory per block every kernel must fit, bytes (default 101376: what an RTX 50 / PRO 6000 "
                  "runs; 0: the device's limit)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--iters", a->options.iters, "timed calls per case, median reported")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--only", a->options.only, "keep the cases whose label (\"<op> <shape> rows <n>\") contains this");
  cmd->add_option("--json", a->json_path, "write the measured ceilings and every row to this file");
  commands.emplace_back(cmd, [a] {
    auto report = run_bench_op(a->options);
    if (!report.ok()) return fail(report.status());
    if (!a->json_path.empty()) {
      std::ofstream f(a->json_path);
      f << op_bench_json(*report).dump(2) << "\n";
      f.close();
      if (!f) return fail(internal_error("cannot write " + a->json_path));
    }
    return 0;
  });
}

}  // namespace kiln::cli
