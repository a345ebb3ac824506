// The cases of `kiln bench op`, in the table's order: linear, norms and elementwise ops,
// sample, moe (bf16 and quantized experts), mla_attention, DSA decode against dense MLA,
// gated_delta_net, each at real model shapes.
// The method and the work counted per op are at the top of bench_op.cpp; the timer
// and the random data are bench_op_harness.h. CUDA builds only: without the CUDA
// backend this file compiles to nothing (run_bench_op says why).
#ifdef KILN_HAVE_CUDA
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backends/cpu/cpu_internal.h"  // cpu::route: the reference routing rule
#include "backends/cuda/cuda_backend_impl.h"  // set_w8a8: the FP8 cases' W8A16 rows
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/kernels.h"
#include "cli/bench_op_harness.h"
#include "ops/backend.h"

namespace kiln::cli::op_bench {
namespace {

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
    {"Qwen3-30B-A3B TP2 rank", "qkv", 2048, 2560, false},
    {"Qwen3-30B-A3B TP2 rank", "o", 2048, 2048, false},
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

std::string label(const LinearShape& s) {
  return std::string(s.model) + " " + s.name + " " + str(s.n_in) + "->" + str(s.n_out) + (s.bias ? " +bias" : "");
}

// A weight's bytes, with its fp32 bias.
double weight_bytes(const LinearShape& s) {
  return 2.0 * double(s.n_in) * double(s.n_out) + (s.bias ? 4.0 * double(s.n_out) : 0.0);
}

void bench_linear(Bench& b) {
  auto be = b.backend();
  for (const LinearShape& s : kLinearShapes) {
    const std::string shape = label(s);
    if (!any_wanted(b, "linear", shape, {1, 8, 64, kPrefillRows})) continue;
    ops::Weight w{.data = b.fill.weight(*be, {s.n_out, s.n_in})};  // [n_out, n_in]
    if (s.bias) w.bias = b.fill.vector(*be, s.n_out, -0.1f, 0.1f);
    for (int64_t rows : {1, 8, 64, kPrefillRows}) {  // 64: a decode step of 64 streams
      Case c{.op = "linear", .shape = shape, .rows = rows, .gemm = true};
      if (rows < kPrefillRows) c.bytes = weight_bytes(s) + 2.0 * double(rows) * double(s.n_in + s.n_out);
      else c.flops = 2.0 * double(rows) * double(s.n_in) * double(s.n_out);
      if (s.bias) c.note = "fp32 GEMM output, then a bias + round kernel";
      if (!b.wanted(c)) continue;
      Tensor x = b.fill.activation(*be, {rows, s.n_in});
      Tensor out = be->alloc(DType::kBF16, {rows, s.n_out});
      b.run(*be, b.rows_batch(rows), c, [&] { be->linear({.x = x, .w = &w, .out = out}); });
    }
  }
}

// Time per call of a decode step of `calls` calls recorded as one CUDA graph by
// Backend::run_step (as a decode step is) and replayed many times, by the host's clock:
// no flush, no host launch cost; the gaps between the graph's kernels are counted.
Timing replayed(Bench& b, ops::Backend& be, const ops::BatchMeta& batch, int calls,
                const std::function<Tensor()>& step) {
  for (int i = 0; i < 3; ++i) be.run_step(batch, 1, step);  // eager, record, replay
  be.synchronize();
  const int replays = std::max(10, b.iters() * 5);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < replays; ++i) be.run_step(batch, 1, step);
  be.synchronize();
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / double(replays * calls);
  return Timing{.us = us, .iters = b.iters()};
}

// A decode step's projections at 1-64 rows: `layers` weights of the shape (together over
// 4 x a 50 MB L2, so each comes from DRAM) one after the other in a replayed step, as the
// layers of a model run (the bf16 GEMV to 8 rows, cuBLASLt beyond; KILN_BF16_GEMV=0 or
// =experts: cuBLASLt at every row count).
void bench_linear_graph(Bench& b) {
  for (const LinearShape& s : kLinearShapes) {
    if (s.n_in * s.n_out > (int64_t(64) << 20)) continue;  // an lm_head: one a step
    const std::string shape = label(s);
    if (!any_wanted(b, "linear (graph)", shape, {1, 2, 4, 8, 16, 32, 64})) continue;
    auto be = b.backend();
    const int layers = int(std::clamp(std::ceil(200e6 / weight_bytes(s)), 2.0, 64.0));
    std::vector<ops::Weight> ws(static_cast<size_t>(layers));
    for (ops::Weight& w : ws) {
      w.data = b.fill.weight(*be, {s.n_out, s.n_in});
      if (s.bias) w.bias = b.fill.vector(*be, s.n_out, -0.1f, 0.1f);
    }
    for (int64_t rows : {1, 2, 4, 8, 16, 32, 64}) {
      Case c{.op = "linear (graph)", .shape = shape, .rows = rows,
             .bytes = weight_bytes(s) + 2.0 * double(rows) * double(s.n_in + s.n_out)};
      c.note = str(layers) + " weights per graph";
      if (!b.wanted(c)) continue;
      Tensor x = b.fill.activation(*be, {rows, s.n_in});
      Tensor out = be->alloc(DType::kBF16, {rows, s.n_out});
      const auto step = [&] {
        for (const ops::Weight& w : ws) be->linear({.x = x, .w = &w, .out = out});
        return out;
      };
      b.report(c, replayed(b, *be, paged_batch(int(rows), 16, 1, 16, b.fill.rng()), layers, step));
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

// A decode layer's attention prologue as one launch: Qwen3's per-head q / k norms, RoPE,
// and k and v into a bf16 cache (q and k read and written, k and v also stored).
void bench_qk_norm_rope(Bench& b, ops::Backend& be) {
  constexpr int64_t kHeads = 32, kKvHeads = 4, kDHead = 128;
  ops::RopeTable table{.d_rot = int(kDHead)};
  for (int i = 0; i < table.d_rot / 2; ++i)
    table.inv_freq.push_back(float(std::pow(1000000.0, -2.0 * i / double(table.d_rot))));
  const std::string shape = "Qwen3-30B 32 + 4 heads x 128, norms, bf16 cache store";
  if (!any_wanted(b, "qk_norm_rope", shape, {1, 64, kPrefillRows})) return;
  Tensor q_norm = b.fill.vector(be, kDHead, 0.5f, 1.5f), k_norm = b.fill.vector(be, kDHead, 0.5f, 1.5f);
  for (int64_t rows : {1, 64, kPrefillRows}) {
    const double q_bytes = 2.0 * double(rows * kHeads * kDHead), kv_bytes = 2.0 * double(rows * kKvHeads * kDHead);
    const Case c{.op = "qk_norm_rope", .shape = shape, .rows = rows, .bytes = 2.0 * q_bytes + 5.0 * kv_bytes};
    if (!b.wanted(c)) continue;
    const ops::BatchMeta batch = b.rows_batch(rows, 4096);  // one sequence: its blocks are the cache
    Tensor q = b.fill.activation(be, {rows, kHeads, kDHead});
    Tensor k = b.fill.activation(be, {rows, kKvHeads, kDHead});
    Tensor v = b.fill.activation(be, {rows, kKvHeads, kDHead});
    const Shape cache{batch.max_blocks_per_seq, batch.block_size, kKvHeads, kDHead};
    Tensor k_cache = be.alloc(DType::kBF16, cache), v_cache = be.alloc(DType::kBF16, cache);
    const ops::KvStoreArgs store{.k = k, .v = v, .k_cache = k_cache, .v_cache = v_cache, .batch = &batch};
    b.run(be, batch, c, [&] {
      be.qk_norm_rope({.q = q, .k = k, .q_norm = q_norm, .k_norm = k_norm, .eps = 1e-6f, .batch = &batch,
                       .table = &table, .store = &store});
    });
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
    for (int64_t rows : {1, 8, 64}) {
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
  bool rank_part = false;  // one rank's part of a model (bf16 cases only)
  int64_t n_local = 0;     // expert parallelism: experts [0, n_local) here (0: all)
};

const ops::RouterParams kQwen3Routing{.kind = ops::RouterKind::kSoftmaxTopK, .n_experts = 128, .top_k = 8,
                                      .norm_topk_prob = true};

const MoeModel kMoeModels[] = {
    {"gpt-oss-120b", 128, 4, 2880, 2880, true, true, false,
     {.kind = ops::RouterKind::kTopKSoftmax, .n_experts = 128, .top_k = 4},
     {.kind = ops::GluKind::kGptOssClamp}},
    {"gpt-oss-20b", 32, 4, 2880, 2880, true, true, false,
     {.kind = ops::RouterKind::kTopKSoftmax, .n_experts = 32, .top_k = 4},
     {.kind = ops::GluKind::kGptOssClamp}},
    {"Qwen3-30B-A3B", 128, 8, 2048, 768, false, false, false, kQwen3Routing, {.kind = ops::GluKind::kSilu}},
    // One rank's part of it under tensor parallelism (every expert's d_ff split) and under
    // expert parallelism (half the experts whole): what a TP2 / TP4 / TP2+EP decode step
    // asks of one GPU's MoE kernels (docs/perf/multi-gpu.md).
    {"Qwen3-30B-A3B TP2 rank", 128, 8, 2048, 384, false, false, false, kQwen3Routing, {.kind = ops::GluKind::kSilu},
     true},
    {"Qwen3-30B-A3B TP4 rank", 128, 8, 2048, 192, false, false, false, kQwen3Routing, {.kind = ops::GluKind::kSilu},
     true},
    {"Qwen3-30B-A3B EP2 rank", 128, 8, 2048, 768, false, false, false, kQwen3Routing, {.kind = ops::GluKind::kSilu},
     true, 64},
    {"Qwen3.5-35B-A3B", 256, 8, 2048, 512, false, false, false,
     {.kind = ops::RouterKind::kSoftmaxTopK, .n_experts = 256, .top_k = 8, .norm_topk_prob = true},
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
                         const ops::RouterParams& r, int64_t n_local) {
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
    cpu::route(logits.data(), correction.empty() ? nullptr : correction.data(), r, chosen.data(),
                     weights.data());
    for (int32_t e : chosen)
      if (e < n_local) used.insert(e);
  }
  return int64_t(used.size());
}

void bench_moe_model(Bench& b, const MoeModel& m) {
  const std::string shape = std::string(m.name) + ": " + str(m.n_experts) + " experts top-" + str(m.top_k) +
                            ", d_model " + str(m.d_model) + ", d_ff " + str(m.d_ff);
  if (!any_wanted(b, "moe", shape, {1, 8, 64, 512, kPrefillRows, 4 * kPrefillRows})) return;
  const double expert_gb = 3.0 * 2.0 * double(m.n_experts * m.d_model * m.d_ff) / 1e9;
  std::fprintf(stderr, "kiln bench op: building %s experts (%.1f GB)\n", m.name, expert_gb);
  auto be = b.backend();  // the expert set is freed with it, before the next model's
  const int64_t E = m.n_local > 0 ? m.n_local : m.n_experts, d = m.d_model, f = m.d_ff;
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
  const int64_t all = m.n_experts;  // the router is whole under expert parallelism
  ops::Weight router{.data = b.fill.weight(*be, {all, d})};  // (n_experts, d_model)
  if (m.router_bias) router.bias = b.fill.vector(*be, all, -0.1f, 0.1f, &router_bias_host);
  const Tensor correction = m.correction_bias ? b.fill.vector(*be, all, -0.05f, 0.05f, &correction_host) : Tensor{};
  // What one expert's GEMVs read (the kernels read biases as fp32 copies).
  const double expert_bytes = 2.0 * 3.0 * double(d * f) + (m.gpt_oss_layout ? 4.0 * double(2 * f + d) : 0.0);
  const double router_bytes = 2.0 * double(all * d) + (m.router_bias ? 4.0 * double(all) : 0.0);

  // 64 rows: a decode step of 64 streams; 512: one with a prompt chunk in it.
  for (int64_t rows : {1, 8, 64, 512, kPrefillRows, 4 * kPrefillRows}) {
    Case c{.op = "moe", .shape = shape, .rows = rows};
    if (!b.wanted(c)) continue;
    Tensor x = b.fill.activation(*be, {rows, d});
    Tensor out = be->alloc(DType::kBF16, {rows, d});
    if (rows <= 64) {
      const int64_t n_used = distinct_experts(*be, x, router, router_bias_host, correction_host, m.routing, E);
      c.bytes = double(n_used) * expert_bytes + router_bytes + 2.0 * 2.0 * double(rows * d);
      c.note = str(n_used) + " distinct experts here (host routing; bound " + str(std::min(E, rows * m.top_k)) + ")";
    } else {
      c.flops = 2.0 * double(rows) * double(m.top_k) * 3.0 * double(d) * double(f) * double(E) / double(all);
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
  formats::QuantKind kind;
  int bits, group, scale_bytes;
  DType scale_dtype;
  uint8_t scale_byte;  // memset value of every scale
};

constexpr QuantFormatCase kQuantFormats[] = {
    {"mxfp4", formats::QuantKind::kMxfp4, 4, 32, 1, DType::kE8M0, 0x7a},         // 2^-5
    {"nvfp4", formats::QuantKind::kNvfp4, 4, 16, 1, DType::kF8E4M3, 0x38},       // 1.0 (x scale2)
    {"int4 g32", formats::QuantKind::kInt4Group, 4, 32, 2, DType::kBF16, 0x3c},  // 0.0115
    {"fp8 block", formats::QuantKind::kFp8Block, 8, 128, 4, DType::kF32, 0x3c},  // 0.0115
};

// n_experts packed [n_out, n_in] weights in one device allocation (views per expert),
// as CudaBackend::upload_quantized lays them out (backends/cuda/quant_pack.h).
std::vector<formats::QuantizedTensor> packed_experts(Bench& b, ops::Backend& be, const QuantFormatCase& f,
                                                     int64_t n_experts, int64_t n_out, int64_t n_in,
                                                     double* bytes_per_expert) {
  const cuda::QuantFormat qf{.value = f.bits == 8 ? 2 : 0, .scale_bytes = f.scale_bytes, .group = f.group};
  const int64_t code_row = qf.code_row_bytes(n_in), scale_row = qf.scale_row_bytes(n_in);
  const int64_t rows = cuda::quant_rows_padded(n_out);  // stored rows (whole 16-row units)
  // Codes: random bytes from the weight pool (a bf16 tensor of the same bytes).
  Tensor codes = b.fill.weight(be, {n_experts, rows, code_row / 2});
  Tensor scales = be.alloc(DType::kU8, {n_experts, rows, scale_row});
  KILN_CUDA_CHECK(cudaMemset(scales.data, f.scale_byte, scales.nbytes()));
  Tensor scale2;
  if (f.kind == formats::QuantKind::kNvfp4) scale2 = b.fill.vector(be, 1, 1.0f / 64, 1.0f / 64);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<formats::QuantizedTensor> out;
  for (int64_t e = 0; e < n_experts; ++e) {
    formats::QuantizedTensor q{.kind = f.kind, .n_out = n_out, .n_in = n_in, .block_n = 128, .block_k = f.group};
    q.packed_group = f.group;
    q.data = Tensor{.data = static_cast<char*>(codes.data) + e * rows * code_row, .dtype = DType::kU8,
                    .shape = {rows, code_row}, .device = Device::kCuda, .owner = codes.owner};
    q.scale = Tensor{.data = static_cast<char*>(scales.data) + e * rows * scale_row, .dtype = f.scale_dtype,
                     .shape = {rows, scale_row / f.scale_bytes}, .device = Device::kCuda,
                     .owner = scales.owner};
    q.scale2 = scale2;
    out.push_back(std::move(q));
  }
  *bytes_per_expert = double(n_out * (code_row + scale_row));
  return out;
}

// ---- FP8 linears at prefill (W8A8 against W8A16) --------------------------------------
//
// Block-128 FP8 weights (DeepSeek-V3's own format) at that model's shapes and 2048 /
// 8192 rows: the W8A8 GEMMs (e4m3 activations quantized per 128 inputs by a pre-pass,
// e4m3 mma.sync: against the e4m3 peak; the pre-pass is in the time) and, on the same
// weights, W8A16 (the dequantizing bf16 tiles: against the bf16 peak).
void bench_fp8_linear(Bench& b) {
  constexpr LinearShape kShapes[] = {
      {"Kimi-K2/DeepSeek-V3", "q_b", 1536, 24576, false},
      {"Kimi-K2/DeepSeek-V3", "o", 16384, 7168, false},
      {"DeepSeek-V3", "dense gate_up", 7168, 36864, false},  // layers 0-2: 2 x 18432
      {"DeepSeek-V3", "dense down", 18432, 7168, false},
  };
  const QuantFormatCase& f = kQuantFormats[3];
  static_assert(kQuantFormats[3].kind == formats::QuantKind::kFp8Block);
  auto be = b.backend();
  auto* cuda_be = dynamic_cast<cuda::CudaBackend*>(be.get());
  KILN_CHECK(cuda_be != nullptr) << "kiln bench op: the FP8 cases need the CUDA backend";
  const cuda::QuantFormat qf{.value = 2, .scale_kind = 4, .scale_bytes = 4, .group = 128};
  for (const LinearShape& s : kShapes) {
    const std::string shape = label(s);
    for (const bool w8a8 : {true, false}) {
      const std::string op = w8a8 ? "linear fp8 block W8A8" : "linear fp8 block W8A16";
      if (w8a8 && !cuda::quant_w8a8_supported(qf, cuda_be->info().cc())) continue;
      if (!any_wanted(b, op, shape, {kPrefillRows, 4 * kPrefillRows})) continue;
      double bytes = 0.0;
      const ops::Weight w{.quant = packed_experts(b, *be, f, 1, s.n_out, s.n_in, &bytes)[0]};
      cuda_be->set_w8a8(w8a8);
      for (int64_t rows : {kPrefillRows, 4 * kPrefillRows}) {
        Case c{.op = op, .shape = shape, .rows = rows, .flops = 2.0 * double(rows) * double(s.n_in) * double(s.n_out),
               .e4m3 = w8a8};
        if (!b.wanted(c)) continue;
        Tensor x = b.fill.activation(*be, {rows, s.n_in});
        Tensor out = be->alloc(DType::kBF16, {rows, s.n_out});
        b.run(*be, b.rows_batch(rows), c, [&] { be->linear({.x = x, .w = &w, .out = out}); });
      }
      cuda_be->set_w8a8(true);
    }
  }
}

// ---- quantized dense linears at decode rows (tiles against GEMV passes) ----------------
//
// GLM-4.5-Air's attention projections (96 q + 2 x 8 kv heads of 128; o from 12,288
// inputs), whole and one TP2 rank's part, in FP8 block (its FP8 release) and NVFP4, at
// decode batch sizes: the GEMV takes up to quant_gemv_max_rows(n_in) rows (5 at 4,096
// inputs, 3 at 12,288), the decode tiles the rest below 32. "GEMV passes" rows run the
// same call with the GEMV in passes of that many rows (set_quant_gemv_rows), reading the
// weight once a pass; bytes count the weight once either way (what a step must read).
void bench_quant_linear_decode(Bench& b) {
  constexpr LinearShape kShapes[] = {
      {"GLM-4.5-Air", "qkv", 4096, 14336, false},
      {"GLM-4.5-Air", "o", 12288, 4096, false},
      {"GLM-4.5-Air TP2 rank", "qkv", 4096, 7168, false},
      {"GLM-4.5-Air TP2 rank", "o", 6144, 4096, false},
  };
  auto be = b.backend();
  auto* cuda_be = dynamic_cast<cuda::CudaBackend*>(be.get());
  KILN_CHECK(cuda_be != nullptr) << "kiln bench op: the quantized linear cases need the CUDA backend";
  for (const QuantFormatCase* f : {&kQuantFormats[3], &kQuantFormats[1]}) {
    for (const LinearShape& s : kShapes) {
      const std::string base = std::string(s.model) + " " + s.name + " " + f->name + " " + str(s.n_in) + "->" +
                               str(s.n_out);
      for (const bool passes : {false, true}) {
        const std::string shape = base + (passes ? " [GEMV passes]" : "");
        if (!any_wanted(b, "linear (quantized, decode rows)", shape, {1, 4, 8, 16, 24, 31})) continue;
        double bytes = 0.0;
        const ops::Weight w{.quant = packed_experts(b, *be, *f, 1, s.n_out, s.n_in, &bytes)[0]};
        cuda_be->set_quant_gemv_rows(passes ? 31 : 0);
        const int64_t pass = cuda::quant_gemv_max_rows(s.n_in);
        for (const int64_t rows : {1, 4, 8, 16, 24, 31}) {
          if (passes && rows <= pass) continue;  // one pass: the same call as without
          Case c{.op = "linear (quantized, decode rows)", .shape = shape, .rows = rows,
                 .bytes = bytes + 2.0 * double(rows) * double(s.n_in + s.n_out)};
          c.note = rows <= pass ? "GEMV"
                   : passes     ? str((rows + pass - 1) / pass) + " GEMV passes of " + str(pass) + " rows"
                                : "decode tiles";
          if (!b.wanted(c)) continue;
          Tensor x = b.fill.activation(*be, {rows, s.n_in});
          Tensor out = be->alloc(DType::kBF16, {rows, s.n_out});
          b.run(*be, b.rows_batch(rows), c, [&] { be->linear({.x = x, .w = &w, .out = out}); });
        }
        cuda_be->set_quant_gemv_rows(0);
      }
    }
  }
}

void bench_quant_moe(Bench& b, const MoeModel& m, const QuantFormatCase& f) {
  const std::string shape = std::string(m.name) + " " + f.name + ": " + str(m.n_experts) + " experts top-" +
                            str(m.top_k) + ", d_model " + str(m.d_model) + ", d_ff " + str(m.d_ff);
  if (!any_wanted(b, "moe (quantized, graph)", shape, {1, 8, 32, 64, 128, 256}) &&
      !any_wanted(b, "moe (quantized, prefill)", shape, {kPrefillRows, 4 * kPrefillRows}))
    return;
  auto be = b.backend();
  const int64_t E = m.n_experts, d = m.d_model, ff = m.d_ff;
  const double per_param = (f.bits + 8.0 * f.scale_bytes / f.group) / 8.0;
  const double set_gb = per_param * 3.0 * double(E * d * ff) / 1e9;
  // Layers: enough that one step's experts exceed 4 x a 50 MB L2 even at one row.
  const double one_row_bytes = per_param * 3.0 * double(d * ff) * double(m.top_k);
  const bool decode_rows = any_wanted(b, "moe (quantized, graph)", shape, {1, 8, 32, 64, 128, 256});
  const int layers = decode_rows ? int(std::clamp(std::ceil(200e6 / one_row_bytes), 2.0, 16.0)) : 1;
  std::fprintf(stderr, "kiln bench op: building %d layers of %s %s experts (%.1f GB each)\n", layers, m.name, f.name,
               set_gb);
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
  for (int64_t rows : {1, 8, 32, 64, 128, 256}) {
    Case c{.op = "moe (quantized, graph)", .shape = shape, .rows = rows};
    if (!b.wanted(c)) continue;
    Tensor x = b.fill.activation(*be, {rows, d});
    std::vector<Tensor> outs;
    for (int l = 0; l < layers; ++l) outs.push_back(be->alloc(DType::kBF16, {rows, d}));
    const int64_t n_used = distinct_experts(*be, x, router, router_bias_host, correction_host, m.routing, m.n_experts);
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
    b.report(c, replayed(b, *be, batch, layers, step));
  }
  // FP8 block experts at prefill run W8A8 where the device has e4m3 mma.sync, else W8A16.
  const auto* cuda_be = dynamic_cast<const cuda::CudaBackend*>(be.get());
  const bool w8a8 = cuda_be != nullptr &&
                    cuda_be->use_w8a8({.value = 2, .scale_kind = 4, .scale_bytes = 4, .group = 128});
  // Prefill-shaped: one layer's grouped GEMMs (quant_gemm.cu's tiles; FP8 block: W8A8
  // where the device has e4m3 mma) against the bf16 (e4m3) mma.sync peak; FLOPs of the
  // experts' products only (router and combine are small).
  for (int64_t rows : {kPrefillRows, 4 * kPrefillRows}) {
    Case c{.op = "moe (quantized, prefill)", .shape = shape, .rows = rows,
           .flops = 2.0 * double(rows * m.top_k) * 3.0 * double(d * ff),
           .e4m3 = f.kind == formats::QuantKind::kFp8Block && w8a8};
    if (!b.wanted(c)) continue;
    Tensor x = b.fill.activation(*be, {rows, d});
    Tensor out = be->alloc(DType::kBF16, {rows, d});
    b.run(*be, b.rows_batch(rows), c, [&] {
      be->moe({.x = x, .router = &router, .correction_bias = correction, .experts = &sets[0], .routing = m.routing,
               .glu = m.glu, .out = out});
    });
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


// ---- DeepSeek sparse attention decode against dense MLA --------------------------------
// DeepSeek-V3.2's attention at one decode token per sequence over long contexts: MLA over
// every cached position (what an engine without DSA runs, kiln's KILN_DSA=dense) against
// DSA (the indexer's dsa_select over the index cache, then MLA over the top_k selected
// rows), and dsa_select alone. Bytes: the cache rows each must read (dense: context latent
// rows; DSA: context index keys + min(context, top_k) latent rows), kv_b, q and out; the
// indexer's score scratch (4 bytes per position, written and read) is not counted.
void bench_dsa(Bench& b) {
  constexpr int64_t kHeads = 128, kDNope = 128, kDRope = 64, kDV = 128, kDLatent = 512;
  constexpr int64_t kIndexHeads = 64, kDIndex = 128, kTopK = 2048;
  constexpr int kBlock = 64;
  struct Step { int n_seqs, context; };
  const Step steps[] = {{1, 8192}, {8, 8192}, {1, 32768}, {8, 32768}};
  const auto where = [](const Step& s) {
    return str(s.n_seqs) + (s.n_seqs == 1 ? " seq" : " seqs") + " x context " + str(s.context);
  };
  const std::string dense_shape = "DeepSeek-V3.2 dense MLA (KILN_DSA=dense), 128 heads, d_latent 512 + rope 64, ";
  const std::string dsa_shape = "DeepSeek-V3.2 DSA: dsa_select (64 x 128 indexer, top-2048) + MLA over the selection, ";
  const std::string select_shape = "DeepSeek-V3.2 indexer 64 heads x 128, top-2048, ";
  bool any = false;
  for (const Step& s : steps) {
    any = any || b.wanted(Case{.op = "mla_attention", .shape = dense_shape + where(s), .rows = s.n_seqs}) ||
          b.wanted(Case{.op = "mla_attention", .shape = dsa_shape + where(s), .rows = s.n_seqs}) ||
          b.wanted(Case{.op = "dsa_select", .shape = select_shape + where(s), .rows = s.n_seqs});
  }
  if (!any) return;
  auto be = b.backend();
  const ops::Weight kv_b{.data = b.fill.weight(*be, {kHeads * (kDNope + kDV), kDLatent})};
  const float scale = 1.0f / std::sqrt(float(kDNope + kDRope));
  for (const Step& s : steps) {
    const int64_t n = s.n_seqs;
    const ops::BatchMeta batch = paged_batch(s.n_seqs, s.context, 1, kBlock, b.fill.rng());
    const int64_t n_blocks = int64_t(batch.block_table.size());
    Tensor cache = b.fill.activation(*be, {n_blocks, kBlock, kDLatent + kDRope});
    Tensor index_cache = b.fill.activation(*be, {n_blocks, kBlock, kDIndex});
    Tensor q_nope = b.fill.activation(*be, {n, kHeads, kDNope});
    Tensor q_rope = b.fill.activation(*be, {n, kHeads, kDRope});
    Tensor iq = b.fill.activation(*be, {n, kIndexHeads, kDIndex});
    Tensor iw = b.fill.activation(*be, {n, kIndexHeads});
    Tensor selected = be->alloc(DType::kI32, {n, kTopK});
    Tensor out = be->alloc(DType::kBF16, {n, kHeads, kDV});
    const double qo = 2.0 * double(n * kHeads * (kDNope + kDRope + kDV));
    const double select_bytes = 2.0 * double(n) * s.context * kDIndex + 2.0 * double(n * kIndexHeads * (kDIndex + 1)) +
                                4.0 * double(n * kTopK);
    const auto mla = [&](const Tensor& sel) {
      be->mla_attention({.q_nope = q_nope, .q_rope = q_rope, .latent_cache = cache, .kv_b = &kv_b, .out = out,
                         .batch = &batch, .scale = scale, .selected = sel});
    };
    const auto select = [&] {
      be->dsa_select({.q = iq, .weights = iw, .index_cache = index_cache, .selected = selected, .batch = &batch,
                      .scale = 1.0f / std::sqrt(float(kDIndex)), .weight_scale = 1.0f / std::sqrt(float(kIndexHeads))});
    };
    Case dense{.op = "mla_attention", .shape = dense_shape + where(s), .rows = n};
    dense.bytes = 2.0 * double(n) * s.context * double(kDLatent + kDRope) + double(kv_b.nbytes()) + qo;
    b.run(*be, batch, dense, [&] { mla(Tensor{}); });
    Case sel{.op = "dsa_select", .shape = select_shape + where(s), .rows = n};
    sel.bytes = select_bytes;
    b.run(*be, batch, sel, select);
    Case dsa{.op = "mla_attention", .shape = dsa_shape + where(s), .rows = n};
    dsa.bytes = select_bytes + 2.0 * double(n) * double(std::min<int64_t>(s.context, kTopK)) * (kDLatent + kDRope) +
                double(kv_b.nbytes()) + qo;
    b.run(*be, batch, dsa, [&] {
      select();
      mla(selected);
    });
  }
}

// ---- gated_delta_net -------------------------------------------------------------------
// Qwen3.5-35B-A3B's linear-attention layer (16 key / 32 value heads of 128, a 4-tap
// convolution, flat projections): decode rows against their state's bytes, prompts as
// the token-serial recurrence and as the chunked form, against the chunked form's FLOPs.
void bench_gdn(Bench& b) {
  constexpr int64_t kNk = 16, kNv = 32, kDk = 128, kDv = 128, kConv = 4;
  constexpr int64_t kKeyDim = kNk * kDk, kValueDim = kNv * kDv, kChannels = 2 * kKeyDim + kValueDim;
  struct Step { int n_seqs, context, n_query; };
  const Step steps[] = {{1, 1024, 1}, {64, 1024, 1}, {1, 64, 64}, {1, 512, 512}, {1, 4096, 4096}, {4, 1024, 1024}};
  const auto shape_of = [](const Step& s, bool chunked) {
    return "Qwen3.5-35B-A3B 16 k / 32 v heads of 128, " + str(s.n_seqs) + (s.n_seqs == 1 ? " seq" : " seqs") +
           " x " + str(s.n_query) + (s.n_query == s.context ? " from position 0" : " at " + str(s.context - 1)) +
           (chunked ? ", chunked" : ", recurrent");
  };
  bool any = false;
  for (const Step& s : steps)
    for (bool chunked : {false, true})
      any = any || b.wanted(Case{.op = "gated_delta_net", .shape = shape_of(s, chunked), .rows = s.n_seqs * s.n_query});
  if (!any) return;
  auto be = b.backend();
  auto* cuda_be = static_cast<cuda::CudaBackend*>(be.get());
  const Tensor conv_w = b.fill.weight(*be, {kChannels, kConv});
  const Tensor a_log = b.fill.vector(*be, kNv, -1.0f, 1.0f), dt_bias = b.fill.vector(*be, kNv, -1.0f, 1.0f);
  const Tensor norm_w = b.fill.vector(*be, kDv, 0.5f, 1.5f);
  for (const Step& s : steps) {
    const int64_t rows = int64_t(s.n_seqs) * s.n_query;
    ops::BatchMeta batch = paged_batch(s.n_seqs, s.context, s.n_query, 16, b.fill.rng());
    for (int i = 0; i < s.n_seqs; ++i) batch.state_slots.push_back(i);
    Tensor qkv = b.fill.activation(*be, {rows, kChannels}), z = b.fill.activation(*be, {rows, kValueDim});
    Tensor bb = b.fill.activation(*be, {rows, kNv}), a = b.fill.activation(*be, {rows, kNv});
    Tensor out = be->alloc(DType::kBF16, {rows, kValueDim});
    Tensor conv_state = be->alloc(DType::kBF16, {s.n_seqs, kChannels, kConv - 1});
    Tensor state = be->alloc(DType::kF32, {s.n_seqs, kNv, kDk, kDv});
    be->synchronize();
    KILN_CUDA_CHECK(cudaMemset(conv_state.data, 0, size_t(conv_state.nbytes())));
    KILN_CUDA_CHECK(cudaMemset(state.data, 0, size_t(state.nbytes())));
    for (bool chunked : {false, true}) {
      if (chunked && s.n_query < cuda::kGdnChunkMinTokens) continue;
      Case c{.op = "gated_delta_net", .shape = shape_of(s, chunked), .rows = rows};
      if (!b.wanted(c)) continue;
      if (s.n_query == 1) {
        // The recurrent state read and written, the conv state likewise, the row's inputs and output.
        c.bytes = double(s.n_seqs) * (2.0 * 4.0 * kNv * kDk * kDv + 2.0 * 2.0 * kChannels * (kConv - 1)) +
                  2.0 * double(rows) * double(kChannels + 2 * kValueDim + 2 * kNv);
      } else {
        // Per row and value head, the chunked form's multiply-adds: w S, q S and the state
        // update (dk dv each), k k^T, q k^T and w (64 dk each), u and P v' (64 dv each).
        c.flops = 2.0 * double(rows) * kNv * (3.0 * kDk * kDv + 64.0 * (3.0 * kDk + 2.0 * kDv));
        c.note = "fp32 CUDA cores, against the bf16 mma peak";
      }
      cuda_be->set_gdn_chunk_min_tokens(chunked ? cuda::kGdnChunkMinTokens : INT32_MAX);
      b.run(*be, batch, c, [&] {
        be->gated_delta_net({.qkv = qkv, .z = z, .b = bb, .a = a, .conv_weight = conv_w, .a_log = a_log,
                             .dt_bias = dt_bias, .norm_weight = norm_w, .norm_eps = 1e-6f, .conv_state = conv_state,
                             .recurrent_state = state, .out = out, .batch = &batch, .n_k_heads = kNk,
                             .n_v_heads = kNv, .d_k = kDk, .d_v = kDv});
      });
    }
    cuda_be->set_gdn_chunk_min_tokens(cuda::kGdnChunkMinTokens);
  }
}

}  // namespace

void run_all_cases(Bench& b) {
  bench_linear(b);
  bench_linear_graph(b);
  {
    auto be = b.backend();
    bench_rms_norm(b, *be);
    bench_rope(b, *be);
    bench_qk_norm_rope(b, *be);
    bench_glu(b, *be);
    bench_add(b, *be);
    bench_embedding(b, *be);
    bench_slice_columns(b, *be);
    bench_sample(b, *be);
  }
  for (const MoeModel& m : kMoeModels) bench_moe_model(b, m);
  // (A rank's part only when asked by name: --only "TP2 rank", say.)
  for (const MoeModel& m : kMoeModels)
    for (const QuantFormatCase& f : kQuantFormats)
      if (!m.rank_part || b.filtered()) bench_quant_moe(b, m, f);
  bench_fp8_linear(b);
  bench_quant_linear_decode(b);
  bench_mla(b, "DeepSeek-V3", 128);
  bench_mla(b, "Kimi-K2", 64);
  bench_dsa(b);
  bench_gdn(b);
}

}  // namespace kiln::cli::op_bench
#endif  // KILN_HAVE_CUDA
