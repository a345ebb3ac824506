// Paged attention on real model shapes, against the roofline of the machine:
// decode (split-KV) as GB/s of K/V read vs the H100's measured 3.03 TB/s copy
// bandwidth, prefill (FlashAttention-2) as TFLOP/s vs its measured 642 TFLOP/s
// mma.sync bf16 peak. The warp kernel (the reference path) is timed beside them,
// and so is each path with per-launch cudaMallocAsync scratch instead of the
// caller's (the backend's allocator). Prefill lists every FA2 tile variant.
// Shapes: gpt-oss (64 q heads / 8 kv heads, d 64, sinks), Qwen3-30B-A3B (32 / 4,
// d 128) and the gated full attention of Qwen3.5 / Qwen3-Next (16 / 2, d 256); the
// block table scatters blocks over the cache. The L2 is
// flushed before every timed launch, so decode reads come from DRAM.
//
//   build-gpu/bin/attention_bench [--smem-cap 101376] [--iters 20] [--no-warp] [--sweep-splits] [--fp8]
// --sweep-splits: also time decode at forced KV split counts (tunes the
// split heuristic in attention_decode.cu). --fp8: an e4m3 cache with a scale per
// (slot, kv head) (--kv-cache-dtype fp8); decode bytes count the codes and scales.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backends/cuda/kernels/kernels.h"

namespace {

using kiln::cuda::AttentionPath;
using kiln::cuda::bf16;
using kiln::cuda::DeviceBatch;

constexpr double kCopyBandwidthGBs = 3030.0;  // H100 device-to-device copy, read + write (docs/PERF.md)
constexpr double kMmaPeakTflops = 642.0;      // H100 mma.sync bf16, fp32 accumulate (docs/PERF.md)

#define CHECK_CUDA(expr)                                                                     \
  do {                                                                                       \
    const cudaError_t e_ = (expr);                                                           \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

struct ModelShape {
  const char* name;
  int n_heads, n_kv_heads, d_head;
  bool sinks;
};

template <typename T>
T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, v.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// Random bf16 in [-1, 1] over n elements (a 1 Mi-element pattern, repeated).
bf16* device_random(size_t n, std::mt19937& rng) {
  const size_t pattern = std::min<size_t>(n, size_t(1) << 20);
  std::vector<uint16_t> host(pattern);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (auto& h : host) {
    const float f = d(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = uint16_t(bits >> 16);
  }
  bf16* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(bf16)));
  for (size_t off = 0; off < n; off += pattern)
    CHECK_CUDA(cudaMemcpy(p + off, host.data(), std::min(pattern, n - off) * sizeof(bf16), cudaMemcpyHostToDevice));
  return p;
}

// Random e4m3 codes over n bytes (no NaN code), and scales near 1 / 448 over n_scales.
void* device_random_e4m3(size_t n, std::mt19937& rng) {
  const size_t pattern = std::min<size_t>(n, size_t(1) << 20);
  std::vector<uint8_t> host(pattern);
  for (auto& h : host) h = uint8_t(rng() % 0x7f) | uint8_t(rng() % 2 ? 0x80 : 0);
  uint8_t* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n));
  for (size_t off = 0; off < n; off += pattern)
    CHECK_CUDA(cudaMemcpy(p + off, host.data(), std::min(pattern, n - off), cudaMemcpyHostToDevice));
  return p;
}
float* device_scales(size_t n, std::mt19937& rng) {
  std::vector<float> host(n);
  for (auto& h : host) h = std::uniform_real_distribution<float>(0.5f, 1.0f)(rng) / 448.0f;
  return device_copy(host);
}

struct Problem {
  DeviceBatch b;
  std::vector<void*> owned;
  bf16 *q = nullptr, *out = nullptr;
  kiln::cuda::KvCacheView kv;
  float* sinks = nullptr;
  ~Problem() {
    for (void* p : owned) cudaFree(p);
  }
};

// n_seqs sequences of `context` cached tokens, each querying its last n_query.
void build(Problem& pr, const ModelShape& m, int n_seqs, int context, int n_query, bool fp8, std::mt19937& rng) {
  constexpr int kBs = 16;
  const int blocks_per_seq = (context + kBs - 1) / kBs, n_blocks = n_seqs * blocks_per_seq;
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> positions, slots, seq_of;
  for (int s = 0; s < n_seqs; ++s) {
    for (int p = context - n_query; p < context; ++p) {
      positions.push_back(p);
      slots.push_back(perm[size_t(s) * blocks_per_seq + p / kBs] * kBs + p % kBs);
      seq_of.push_back(s);
    }
  }
  const int n_tokens = int(positions.size());
  int32_t* d_pos = device_copy(positions);
  int32_t* d_slots = device_copy(slots);
  int32_t* d_seq = device_copy(seq_of);
  int32_t* d_table = device_copy(perm);
  pr.owned = {d_pos, d_slots, d_seq, d_table};
  pr.b = DeviceBatch{.positions = d_pos, .slot_mapping = d_slots, .seq_of_token = d_seq, .block_table = d_table,
                     .n_tokens = n_tokens, .n_seqs = n_seqs, .max_blocks = blocks_per_seq, .block_size = kBs};
  const size_t cache = size_t(n_blocks) * kBs * m.n_kv_heads * m.d_head;
  if (fp8) {
    const size_t rows = size_t(n_blocks) * kBs * m.n_kv_heads;
    pr.kv = {.k = device_random_e4m3(cache, rng), .v = device_random_e4m3(cache, rng),
             .k_scale = device_scales(rows, rng), .v_scale = device_scales(rows, rng), .fp8 = true};
    pr.owned.insert(pr.owned.end(), {const_cast<float*>(pr.kv.k_scale), const_cast<float*>(pr.kv.v_scale)});
  } else {
    pr.kv = {.k = device_random(cache, rng), .v = device_random(cache, rng)};
  }
  pr.q = device_random(size_t(n_tokens) * m.n_heads * m.d_head, rng);
  CHECK_CUDA(cudaMalloc(&pr.out, size_t(n_tokens) * m.n_heads * m.d_head * sizeof(bf16)));
  pr.owned.insert(pr.owned.end(), {const_cast<void*>(pr.kv.k), const_cast<void*>(pr.kv.v), pr.q, pr.out});
  if (m.sinks) {
    std::vector<float> s(size_t(m.n_heads));
    for (auto& x : s) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    pr.sinks = device_copy(s);
    pr.owned.push_back(pr.sinks);
  }
}

struct Timer {
  void* flush = nullptr;
  size_t flush_bytes = size_t(256) << 20;  // > the H100's 50 MB L2
  cudaEvent_t start, stop;
  Timer() {
    CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
  }
  ~Timer() { cudaFree(flush); }
  // Mean microseconds of `iters` launches, each after an L2 flush.
  template <typename F>
  double time_us(int iters, F&& launch) {
    launch();  // warm-up (and the cudaFuncSetAttribute calls)
    CHECK_CUDA(cudaDeviceSynchronize());
    double total_ms = 0.0;
    for (int i = 0; i < iters; ++i) {
      CHECK_CUDA(cudaMemsetAsync(flush, i & 0xff, flush_bytes, nullptr));
      CHECK_CUDA(cudaEventRecord(start, nullptr));
      launch();
      CHECK_CUDA(cudaEventRecord(stop, nullptr));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0.0f;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      total_ms += ms;
    }
    CHECK_CUDA(cudaGetLastError());
    return 1000.0 * total_ms / iters;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int smem_cap = 101376, iters = 20;
  bool warp = true, sweep = false, fp8 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smem-cap" && i + 1 < argc) smem_cap = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--no-warp") warp = false;
    else if (a == "--sweep-splits") sweep = true;
    else if (a == "--fp8") fp8 = true;
    else {
      std::fprintf(stderr, "usage: %s [--smem-cap BYTES] [--iters N] [--no-warp] [--sweep-splits] [--fp8]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (%d SMs), --smem-cap %d, %d iterations, L2 flushed before each, %s KV cache\n\n",
              prop.name, prop.multiProcessorCount, smem_cap, iters, fp8 ? "e4m3" : "bf16");
  const ModelShape shapes[] = {{"gpt-oss 64/8 d64 sinks", 64, 8, 64, true},
                               {"Qwen3-30B 32/4 d128", 32, 4, 128, false},
                               {"Qwen3.5 / Qwen3-Next 16/2 d256", 16, 2, 256, false}};
  std::mt19937 rng(7);
  Timer timer;

  // Scratch as the backend hands it over (its caching allocator): allocated once here.
  void* scratch = nullptr;
  const size_t scratch_cap = size_t(64) << 20;
  CHECK_CUDA(cudaMalloc(&scratch, scratch_cap));

  std::vector<std::string> sweep_lines;
  std::printf("| op | shape | seqs | context | path | time (us) | achieved | fraction of roofline | "
              "with cudaMallocAsync (us) | warp kernel (us) | speed-up vs warp |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const ModelShape& m : shapes) {
    for (int n_seqs : {1, 8}) {
      for (int context : {1024, 8192, 32768}) {
        Problem pr;
        build(pr, m, n_seqs, context, 1, fp8, rng);
        const float scale = 1.0f / std::sqrt(float(m.d_head));
        const AttentionPath path = kiln::cuda::choose_attention_path(pr.b, m.d_head, smem_cap, fp8);
        auto launch = [&](kiln::cuda::AttentionOptions o) {
          return [&, o] {
            kiln::cuda::launch_attention(pr.q, pr.kv, pr.out, pr.sinks, pr.b, m.n_heads, m.n_kv_heads, m.d_head,
                                         scale, 0, nullptr, smem_cap, o);
          };
        };
        const size_t need =
            kiln::cuda::attention_scratch_bytes(pr.b, m.n_heads, m.n_kv_heads, m.d_head, 0, smem_cap, fp8);
        if (need > scratch_cap) return std::fprintf(stderr, "scratch %zu > %zu\n", need, scratch_cap), 1;
        const double us = timer.time_us(iters, launch({.scratch = scratch}));
        const double malloc_us = timer.time_us(iters, launch({}));
        const double row_bytes = fp8 ? m.d_head + 4.0 /*codes + scale*/ : m.d_head * 2.0 /*bf16*/;
        const double bytes = double(n_seqs) * context * m.n_kv_heads * row_bytes * 2 /*K,V*/;
        const double gbs = bytes / (us * 1e3);
        const double warp_us =
            warp ? timer.time_us(std::max(1, iters / 10), launch({.path = AttentionPath::kWarp})) : 0.0;
        std::printf("| decode | %s | %d | %d | %s | %.1f | %.0f GB/s | %.1f%% of %.2f TB/s | %.1f | %.1f | %.1fx |\n",
                    m.name, n_seqs, context, kiln::cuda::attention_path_name(path), us, gbs,
                    100.0 * gbs / kCopyBandwidthGBs, kCopyBandwidthGBs / 1000.0, malloc_us, warp_us,
                    warp ? warp_us / us : 0.0);
        if (sweep) {
          std::string line = "splits (us):";
          for (int n = 1; n <= 256 && n * 64 <= context; n *= 2) {
            const double t = timer.time_us(iters, launch({.n_splits = n, .scratch = scratch}));
            line += " " + std::to_string(n) + ":" + std::to_string(int(t * 10) / 10.0).substr(0, 5);
          }
          sweep_lines.push_back(std::string(m.name) + " x" + std::to_string(n_seqs) + " ctx " +
                                std::to_string(context) + " " + line);
        }
      }
    }
  }
  for (const ModelShape& m : shapes) {
    for (int tokens : {2048, 8192}) {
      Problem pr;
      build(pr, m, 1, tokens, tokens, fp8, rng);
      const float scale = 1.0f / std::sqrt(float(m.d_head));
      auto launch = [&](kiln::cuda::AttentionOptions o) {
        return [&, o] {
          kiln::cuda::launch_attention(pr.q, pr.kv, pr.out, pr.sinks, pr.b, m.n_heads, m.n_kv_heads, m.d_head,
                                       scale, 0, nullptr, smem_cap, o);
        };
      };
      // Causal: query p sees p + 1 keys; QK^T and PV are 2 * d_head FLOP each per (query, key, head).
      const double flop = 4.0 * m.d_head * m.n_heads * (double(tokens) * (tokens + 1) / 2);
      const bool run_warp = warp && tokens <= 2048;
      const double warp_us = run_warp ? timer.time_us(1, launch({.path = AttentionPath::kWarp})) : 0.0;
      if (kiln::cuda::attention_fa2_smem_bytes(m.d_head, -1, fp8) == 0) continue;  // (e4m3 at 256: warp only)
      // Head size 256 has one variant (attention_fa2.cu): the default row alone.
      const int n_variants = m.d_head == 256 ? 0 : kiln::cuda::attention_fa2_variant_count();
      for (int v = -1; v < n_variants; ++v) {
        const kiln::cuda::AttentionOptions o{.path = AttentionPath::kFa2, .fa2_variant = v, .scratch = scratch};
        const double us = timer.time_us(std::max(3, iters / 2), launch(o));
        const double malloc_us = v < 0 ? timer.time_us(std::max(3, iters / 2), launch({.fa2_variant = v})) : 0.0;
        const double tflops = flop / (us * 1e6);
        const std::string name = v < 0 ? "fa2 (default)" : "fa2 variant " + std::to_string(v);
        const std::string smem = std::to_string(kiln::cuda::attention_fa2_smem_bytes(m.d_head, v, fp8)) + " B smem";
        std::printf("| prefill | %s | 1 | %d | %s, %s | %.1f | %.1f TFLOP/s | %.1f%% of %.0f TFLOP/s | %s | %s | %s |\n",
                    m.name, tokens, name.c_str(), smem.c_str(), us, tflops, 100.0 * tflops / kMmaPeakTflops,
                    kMmaPeakTflops, v < 0 ? std::to_string(int(malloc_us)).c_str() : "-",
                    run_warp && v < 0 ? std::to_string(int(warp_us)).c_str() : "-",
                    run_warp && v < 0 ? (std::to_string(int(warp_us / us)) + "x").c_str() : "-");
      }
    }
  }
  for (const std::string& l : sweep_lines) std::printf("%s\n", l.c_str());
  cudaFree(scratch);
  return 0;
}
