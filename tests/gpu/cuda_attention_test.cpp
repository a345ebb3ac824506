// The tensor-core attention paths (FlashAttention-2 prefill, split-KV decode)
// against the CPU reference and against the warp kernel, on batches that mix a
// long prefill over a scattered block table, a chunked prefill continuing at
// position 200, partial query tiles (1, 3, 17 tokens) and decode rows at
// contexts 1, 17, 1000 and 4000; head sizes 64 and 128, GQA 1, 4 and 8 (and
// 12, which does not divide a tile), with and without a 128-token sliding
// window and sinks; every FA2 tile variant and forced KV split counts. Each case runs
// over a bf16 cache and over an e4m3 cache (--kv-cache-dtype fp8): that one is filled
// by kv_store on both backends, which must write the same codes and scales bit for bit
// (ops/kv_quant.h), from values spread over 2^-16 .. 1 within each row, so subnormal
// codes occur; the CPU reference then reads its own e4m3 cache.
//
// Tolerance as in cuda_ops_test.cpp: inputs are bf16-representable, every path
// accumulates in fp32 and rounds to bf16 once at its output, so each path is
// within two bf16 half-ulps of the largest reference value:
//   |cuda - cpu| <= 2 * 2^-8 * max|cpu|,
// and two paths within twice that of each other. (P is rounded to bf16 before
// the P V mma, as in FlashAttention-2; its error averages over the keys and
// stays well inside the bound, which the measured errors below confirm.) The
// e4m3 paths read the same cached values as the CPU (codes and scales equal), and
// their kernels round the same things (P times the V scale instead of P), so the
// same bound applies. Outputs are poisoned with NaN before each launch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/kernels.h"
#include "gpu/gpu_test_util.h"

namespace kiln {
namespace {

using gpu_testing::bf16_round;
using gpu_testing::kBf16Tol;
using gpu_testing::smem_cap;

// Device copy of a host vector, freed at scope exit.
template <typename T>
struct DeviceVec {
  T* ptr = nullptr;
  explicit DeviceVec(const std::vector<T>& host) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(1, host.size()) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceVec(const DeviceVec&) = delete;
  ~DeviceVec() { cudaFree(ptr); }
};

struct Seq {
  int n_query, context;
};

struct Shape4 {
  int n_heads, n_kv_heads, d_head, window;
  bool sinks;
};

// Sequences -> batch metadata over a block table that scatters every
// sequence's blocks over the cache in random order. Entries past a sequence's
// last block hold an id far outside the cache, so a kernel that reads past a
// sequence faults instead of passing silently.
ops::BatchMeta make_batch(const std::vector<Seq>& seqs, std::mt19937& rng, int& n_blocks) {
  constexpr int kBs = 16;
  ops::BatchMeta b;
  b.block_size = kBs;
  int max_blocks = 0;
  n_blocks = 0;
  for (const Seq& s : seqs) {
    max_blocks = std::max(max_blocks, (s.context + kBs - 1) / kBs);
    n_blocks += (s.context + kBs - 1) / kBs;
  }
  b.max_blocks_per_seq = max_blocks;
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  b.q_start.push_back(0);
  for (const Seq& s : seqs) {
    const int used = (s.context + kBs - 1) / kBs;
    for (int i = 0; i < max_blocks; ++i) b.block_table.push_back(i < used ? perm[next++] : (1 << 26));
    b.context_len.push_back(s.context);
  }
  for (size_t si = 0; si < seqs.size(); ++si) {
    for (int p = seqs[si].context - seqs[si].n_query; p < seqs[si].context; ++p) {
      b.positions.push_back(p);
      b.slot_mapping.push_back(int32_t(b.slot(int32_t(si), p)));
    }
    b.q_start.push_back(int32_t(b.positions.size()));
  }
  return b;
}

// The whole ops::BatchMeta of a cache of n_blocks blocks: one sequence owning every
// block in order, so kv_store over it writes every slot.
ops::BatchMeta fill_batch(int n_blocks, int block_size) {
  ops::BatchMeta b;
  b.block_size = block_size;
  b.max_blocks_per_seq = n_blocks;
  for (int i = 0; i < n_blocks; ++i) b.block_table.push_back(i);
  b.context_len.push_back(n_blocks * block_size);
  b.q_start = {0, n_blocks * block_size};
  for (int p = 0; p < n_blocks * block_size; ++p) {
    b.positions.push_back(p);
    b.slot_mapping.push_back(p);
  }
  return b;
}

// Parametrised by the cache: bf16 (false) or e4m3 (true).
class CudaAttention : public gpu_testing::GpuTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    rng_.seed(4321);
  }

  // Activations spread over 2^-16 .. 1 within every row (bf16-representable).
  Tensor spread(Shape s) {
    Tensor t = random(s);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.as<float>()[i] = bf16_round(std::ldexp(t.as<float>()[i], -int(rng_() % 17)));
    return t;
  }

  // The K and V caches of both backends: bf16 random values (the CPU's as f32), or
  // e4m3 filled by each backend's kv_store from the same activations; checks that
  // both stored the same bytes.
  struct Caches {
    Tensor k_cpu, v_cpu, k_scale_cpu, v_scale_cpu, k_gpu, v_gpu, k_scale_gpu, v_scale_gpu;
  };
  Caches make_caches(int n_blocks, int block_size, int n_kv_heads, int d, bool fp8) {
    Caches c;
    const Shape shape{n_blocks, block_size, n_kv_heads, d};
    if (!fp8) {
      c.k_cpu = random(shape), c.v_cpu = random(shape);
      c.k_gpu = gpu_->upload(c.k_cpu), c.v_gpu = gpu_->upload(c.v_cpu);
      return c;
    }
    const ops::BatchMeta fill = fill_batch(n_blocks, block_size);
    const Shape rows{fill.n_tokens(), n_kv_heads, d}, scales{n_blocks, block_size, n_kv_heads};
    Tensor k = spread(rows), v = spread(rows);
    c.k_cpu = host_tensor(DType::kF8E4M3, shape), c.v_cpu = host_tensor(DType::kF8E4M3, shape);
    c.k_scale_cpu = host_tensor(DType::kF32, scales), c.v_scale_cpu = host_tensor(DType::kF32, scales);
    cpu_->kv_store({.k = k, .v = v, .k_cache = c.k_cpu, .v_cache = c.v_cpu, .k_scale = c.k_scale_cpu,
                    .v_scale = c.v_scale_cpu, .batch = &fill});
    c.k_gpu = gpu_->alloc(DType::kF8E4M3, shape), c.v_gpu = gpu_->alloc(DType::kF8E4M3, shape);
    c.k_scale_gpu = gpu_->alloc(DType::kF32, scales), c.v_scale_gpu = gpu_->alloc(DType::kF32, scales);
    gpu_->begin_step(fill);
    gpu_->kv_store({.k = to_gpu(k), .v = to_gpu(v), .k_cache = c.k_gpu, .v_cache = c.v_gpu,
                    .k_scale = c.k_scale_gpu, .v_scale = c.v_scale_gpu, .batch = &fill});
    gpu_->synchronize();
    for (const auto& [cpu, gpu, what] : {std::tuple{c.k_cpu, c.k_gpu, "k codes"}, {c.v_cpu, c.v_gpu, "v codes"},
                                         {c.k_scale_cpu, c.k_scale_gpu, "k scales"},
                                         {c.v_scale_cpu, c.v_scale_gpu, "v scales"}}) {
      std::vector<uint8_t> got(cpu.nbytes());
      EXPECT_EQ(cudaMemcpy(got.data(), gpu.data, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] != cpu.as<uint8_t>()[i];
      EXPECT_EQ(differ, 0u) << "kv_store: " << what << " differ from the CPU reference's in " << differ << " of "
                            << got.size() << " bytes";
    }
    return c;
  }

  // max |got - ref| / max |ref|; fails on an unwritten (NaN) element.
  static double rel_err(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what) {
    EXPECT_EQ(got.size(), ref.size()) << what;
    double max_ref = 0.0, max_err = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (std::isnan(got[i])) {
        ADD_FAILURE() << what << ": element " << i << " not written (or NaN)";
        return INFINITY;
      }
      max_ref = std::max(max_ref, double(std::abs(ref[i])));
      max_err = std::max(max_err, std::abs(double(got[i]) - double(ref[i])));
    }
    return max_err / max_ref;
  }

  // Runs one problem through the backend (auto path) and through every path
  // directly; checks each against the CPU and the tensor-core paths against
  // the warp kernel; prints a one-line summary of the errors.
  // warp_only: head sizes only the warp kernel serves (the others are not tried).
  void check(const char* batch_name, const std::vector<Seq>& seqs, const Shape4& c,
             cuda::AttentionPath expected_auto, bool warp_only = false) {
    const bool fp8 = GetParam();
    int n_blocks = 0;
    const ops::BatchMeta b = make_batch(seqs, rng_, n_blocks);
    const int n_tokens = b.n_tokens(), D = c.d_head;
    const Caches kv = make_caches(n_blocks, b.block_size, c.n_kv_heads, D, fp8);
    Tensor q = random({n_tokens, c.n_heads, D});
    Tensor sinks = c.sinks ? random({c.n_heads}, 2.0f) : Tensor{};
    const float scale = 1.0f / std::sqrt(float(D));
    Tensor ref = host_tensor(DType::kF32, {n_tokens, c.n_heads, D});
    cpu_->attention({.q = q, .k_cache = kv.k_cpu, .v_cache = kv.v_cpu, .k_scale = kv.k_scale_cpu,
                     .v_scale = kv.v_scale_cpu, .out = ref, .sinks = sinks, .batch = &b, .scale = scale,
                     .sliding_window = c.window});
    const std::vector<float> ref_v(ref.as<float>(), ref.as<float>() + ref.numel());

    Tensor qg = to_gpu(q);
    Tensor sg = c.sinks ? gpu_->upload(sinks) : Tensor{};
    Tensor out = gpu_->alloc(DType::kBF16, ref.shape);

    std::string summary;
    auto record = [&](const std::string& path, double err, double tol) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.2e", path.c_str(), err);
      summary += buf;
      EXPECT_LE(err, tol) << path;
      RecordProperty(std::string(fp8 ? "fp8_" : "") + batch_name + "_d" + std::to_string(D) + "_g" +
                         std::to_string(c.n_heads / c.n_kv_heads) + (c.window ? "_window_sinks_" : "_") + path,
                     std::to_string(err));
    };

    // The backend's own dispatch (what the model runs).
    poison(out);
    gpu_->begin_step(b);
    gpu_->attention({.q = qg, .k_cache = kv.k_gpu, .v_cache = kv.v_gpu, .k_scale = kv.k_scale_gpu,
                     .v_scale = kv.v_scale_gpu, .out = out, .sinks = sg, .batch = &b, .scale = scale,
                     .sliding_window = c.window});
    record("backend", rel_err(from_gpu(out), ref_v, "backend"), kBf16Tol);

    // Each path directly, on a DeviceBatch of our own (stream 0, synchronised).
    std::vector<int32_t> seq_of(static_cast<size_t>(n_tokens));
    for (int s = 0; s < b.n_seqs(); ++s)
      for (int t = b.q_start[size_t(s)]; t < b.q_start[size_t(s) + 1]; ++t) seq_of[size_t(t)] = s;
    DeviceVec<int32_t> pos(b.positions), slots(b.slot_mapping), seqs_d(seq_of), table(b.block_table);
    const cuda::DeviceBatch db{.positions = pos.ptr, .slot_mapping = slots.ptr, .seq_of_token = seqs_d.ptr,
                               .block_table = table.ptr, .n_tokens = n_tokens, .n_seqs = b.n_seqs(),
                               .max_blocks = b.max_blocks_per_seq, .block_size = b.block_size};
    EXPECT_EQ(cuda::choose_attention_path(db, D, smem_cap(), fp8), expected_auto);
    const auto* qp = static_cast<const cuda::bf16*>(qg.data);
    const cuda::KvCacheView view{.k = kv.k_gpu.data, .v = kv.v_gpu.data,
                                 .k_scale = fp8 ? kv.k_scale_gpu.as<float>() : nullptr,
                                 .v_scale = fp8 ? kv.v_scale_gpu.as<float>() : nullptr, .fp8 = fp8};
    auto* op = static_cast<cuda::bf16*>(out.data);
    const float* sp = c.sinks ? sg.as<float>() : nullptr;
    auto run = [&](auto&& launch) {
      poison(out);
      launch();
      EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
      return from_gpu(out);
    };
    auto launch = [&](const cuda::AttentionOptions& o) {
      return run([&] {
        cuda::launch_attention(qp, view, op, sp, db, c.n_heads, c.n_kv_heads, D, scale, c.window, nullptr,
                               smem_cap(), o);
      });
    };
    const std::vector<float> warp = launch({.path = cuda::AttentionPath::kWarp});
    record("warp", rel_err(warp, ref_v, "warp"), kBf16Tol);
    if (warp_only) {
      std::printf("[attention %s] %-8s d %3d heads %2d/%d window %3d sinks %d:%s\n", fp8 ? "fp8" : "bf16", batch_name,
                  D, c.n_heads, c.n_kv_heads, c.window, int(c.sinks), summary.c_str());
      return;
    }
    for (int v = 0; v < cuda::attention_fa2_variant_count(); ++v) {
      const std::vector<float> fa2 = launch({.path = cuda::AttentionPath::kFa2, .fa2_variant = v});
      const std::string name = "fa2_v" + std::to_string(v);
      record(name, rel_err(fa2, ref_v, name), kBf16Tol);
      record(name + "_vs_warp", rel_err(fa2, warp, name + " vs warp"), 2 * kBf16Tol);
    }
    const std::vector<float> split = launch({.path = cuda::AttentionPath::kSplitKv});
    record("splitkv", rel_err(split, ref_v, "split-kv"), kBf16Tol);
    record("splitkv_vs_warp", rel_err(split, warp, "split-kv vs warp"), 2 * kBf16Tol);
    for (int n_splits : {1, 3, 16}) {
      const std::string name = "splitkv_n" + std::to_string(n_splits);
      record(name, rel_err(launch({.path = cuda::AttentionPath::kSplitKv, .n_splits = n_splits}), ref_v, name),
             kBf16Tol);
    }
    // The caller's scratch (what the backend's allocator would hand over).
    const cuda::AttentionOptions automatic{};
    const size_t bytes = cuda::attention_scratch_bytes(db, c.n_heads, c.n_kv_heads, D, c.window, smem_cap(), fp8);
    void* scratch = nullptr;
    ASSERT_EQ(cudaMalloc(&scratch, std::max<size_t>(bytes, 1)), cudaSuccess);
    cuda::AttentionOptions with_scratch = automatic;
    with_scratch.scratch = scratch;
    record("auto_caller_scratch", rel_err(launch(with_scratch), ref_v, "auto with caller scratch"), kBf16Tol);
    cudaFree(scratch);
    std::printf("[attention %s] %-8s d %3d heads %2d/%d window %3d sinks %d:%s\n", fp8 ? "fp8" : "bf16", batch_name,
                D, c.n_heads, c.n_kv_heads, c.window, int(c.sinks), summary.c_str());
  }

};

// A 300-token prefill (19 blocks), a chunk of 37 continuing at position 200,
// partial tiles of 1, 3 and 17 tokens, and decode rows at 17, 1000, 4000.
const std::vector<Seq> kPrefillMix = {{300, 300}, {37, 237}, {1, 1}, {3, 3}, {17, 17}, {1, 17}, {1, 1000}, {1, 4000}};
// Decode rows at contexts 1, 17, 1000, 4000 and short speculative chunks.
const std::vector<Seq> kDecode = {{1, 1}, {1, 17}, {1, 1000}, {1, 4000}, {3, 203}, {4, 77}};
// One query token per sequence: split-KV's grid without a tile table.
const std::vector<Seq> kDecodeOne = {{1, 4000}, {1, 1}, {1, 1000}, {1, 17}, {1, 129}};

std::vector<Shape4> shapes(int d_head) {
  std::vector<Shape4> out;
  for (int group : {1, 4, 8}) {
    out.push_back({2 * group, 2, d_head, 0, false});
    out.push_back({2 * group, 2, d_head, 128, true});
  }
  // Windows shorter than a key tile and than a 16-token KV block.
  out.push_back({8, 2, d_head, 16, true});
  out.push_back({8, 2, d_head, 5, false});
  return out;
}

TEST_P(CudaAttention, Fa2AndSplitKvMatchCpuAndWarpKernelAtHeadSize64) {
  for (const Shape4& c : shapes(64)) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.n_heads << "/" << c.n_kv_heads << " window " << c.window);
    check("prefill", kPrefillMix, c, cuda::AttentionPath::kFa2);
    check("decode", kDecode, c, cuda::AttentionPath::kSplitKv);
    check("decode1", kDecodeOne, c, cuda::AttentionPath::kSplitKv);
  }
}

TEST_P(CudaAttention, Fa2AndSplitKvMatchCpuAndWarpKernelAtHeadSize128) {
  for (const Shape4& c : shapes(128)) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.n_heads << "/" << c.n_kv_heads << " window " << c.window);
    check("prefill", kPrefillMix, c, cuda::AttentionPath::kFa2);
    check("decode", kDecode, c, cuda::AttentionPath::kSplitKv);
    check("decode1", kDecodeOne, c, cuda::AttentionPath::kSplitKv);
  }
}

// Head size 256, the gated full attention of Qwen3-Next and Qwen3.5 (16 / 2 heads): FA2's
// and split-KV's D = 256 instances on a bf16 cache (an e4m3 cache takes the warp kernel),
// with GQA groups of 8 and 4, a window with sinks, MQA.
TEST_P(CudaAttention, Fa2AndSplitKvMatchCpuAndWarpKernelAtHeadSize256) {
  const bool fp8 = GetParam();
  const auto path = [&](cuda::AttentionPath p) { return fp8 ? cuda::AttentionPath::kWarp : p; };
  for (const Shape4& c : {Shape4{16, 2, 256, 0, false}, Shape4{8, 2, 256, 128, true}, Shape4{4, 1, 256, 0, false}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.n_heads << "/" << c.n_kv_heads << " window " << c.window);
    check("prefill", kPrefillMix, c, path(cuda::AttentionPath::kFa2), /*warp_only=*/fp8);
    check("decode", kDecode, c, path(cuda::AttentionPath::kSplitKv), /*warp_only=*/fp8);
    check("decode1", kDecodeOne, c, path(cuda::AttentionPath::kSplitKv), /*warp_only=*/fp8);
  }
}

// Head sizes below 64 (the tiny fixtures': 16 and 32) run on the warp kernel only: a
// prefill, a chunk continuing at position 200 through the paged cache, and decode rows,
// with GQA, a window and sinks. (Added while the qwen3_next fixture, head size 16, differed
// from the CPU when prefilled in chunks: docs/GPU-TESTS.md.)
TEST_P(CudaAttention, WarpKernelMatchesCpuAtSmallHeadSizes) {
  for (int d : {16, 32}) {
    for (const Shape4& c : {Shape4{4, 1, d, 0, false}, Shape4{8, 2, d, 16, true}}) {
      SCOPED_TRACE(::testing::Message() << "d " << d << " heads " << c.n_heads << "/" << c.n_kv_heads);
      check("prefill", kPrefillMix, c, cuda::AttentionPath::kWarp, /*warp_only=*/true);
      check("decode", kDecode, c, cuda::AttentionPath::kWarp, /*warp_only=*/true);
    }
  }
}

TEST_P(CudaAttention, GroupsThatDoNotDivideTheTileAreExact) {
  // GLM-4.5's 96 / 8 = 12 q heads per kv head: a 64-row tile holds 5 1/3 tokens.
  check("prefill", kPrefillMix, {24, 2, 128, 0, false}, cuda::AttentionPath::kFa2);
  check("decode", kDecode, {24, 2, 128, 128, true}, cuda::AttentionPath::kSplitKv);
  check("decode1", kDecodeOne, {24, 2, 64, 0, true}, cuda::AttentionPath::kSplitKv);
}

INSTANTIATE_TEST_SUITE_P(Cache, CudaAttention, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "fp8" : "bf16"; });

TEST(CudaAttentionDispatch, RespectsTheSharedMemoryCapAndHeadSize) {
  cuda::DeviceBatch decode{.n_tokens = 8, .n_seqs = 8, .max_blocks = 64, .block_size = 16};
  cuda::DeviceBatch prefill{.n_tokens = 300, .n_seqs = 2, .max_blocks = 64, .block_size = 16};
  EXPECT_EQ(cuda::choose_attention_path(decode, 128, 101376), cuda::AttentionPath::kSplitKv);
  EXPECT_EQ(cuda::choose_attention_path(prefill, 128, 101376), cuda::AttentionPath::kFa2);
  // 48 KiB: the D = 128 decode ring (98,304 B) does not fit; FA2 (49,152 B) does.
  EXPECT_EQ(cuda::choose_attention_path(decode, 128, 48 * 1024), cuda::AttentionPath::kFa2);
  EXPECT_EQ(cuda::choose_attention_path(decode, 128, 16 * 1024), cuda::AttentionPath::kWarp);
  EXPECT_EQ(cuda::choose_attention_path(prefill, 96, 101376), cuda::AttentionPath::kWarp);
  EXPECT_EQ(cuda::choose_attention_path(prefill, 256, 101376), cuda::AttentionPath::kFa2);
  EXPECT_EQ(cuda::choose_attention_path(prefill, 256, 101376, /*fp8_cache=*/true), cuda::AttentionPath::kWarp);
  EXPECT_EQ(cuda::choose_attention_path(decode, 256, 101376), cuda::AttentionPath::kSplitKv);
  EXPECT_EQ(cuda::choose_attention_path(decode, 256, 101376, /*fp8_cache=*/true), cuda::AttentionPath::kWarp);
  EXPECT_EQ(cuda::attention_fa2_smem_bytes(256, -1, false), 49152);
  EXPECT_EQ(cuda::attention_decode_smem_bytes(256, false), 98304);
  EXPECT_EQ(cuda::attention_decode_smem_bytes(256, true), 0);
  cuda::DeviceBatch odd_blocks = prefill;
  odd_blocks.block_size = 24;
  EXPECT_EQ(cuda::choose_attention_path(odd_blocks, 128, 101376), cuda::AttentionPath::kWarp);
  for (int d : {64, 128}) {
    for (bool fp8 : {false, true}) {
      for (int v = 0; v < cuda::attention_fa2_variant_count(); ++v)
        EXPECT_LE(cuda::attention_fa2_smem_bytes(d, v, fp8), 101376);
      EXPECT_LE(cuda::attention_decode_smem_bytes(d, fp8), 101376);
    }
    // An e4m3 tile is half a bf16 one (plus its scales).
    EXPECT_LT(cuda::attention_decode_smem_bytes(d, true), cuda::attention_decode_smem_bytes(d, false));
  }
  // With an e4m3 cache the D = 128 decode ring is 50,688 B: over a 48 KiB cap (FA2's
  // 41,216 B take it), under 64 KiB.
  EXPECT_EQ(cuda::choose_attention_path(decode, 128, 48 * 1024, true), cuda::AttentionPath::kFa2);
  EXPECT_EQ(cuda::choose_attention_path(decode, 128, 64 * 1024, true), cuda::AttentionPath::kSplitKv);
  EXPECT_LE(cuda::mla_mma_smem_bytes(true), 101376);
}

}  // namespace
}  // namespace kiln
