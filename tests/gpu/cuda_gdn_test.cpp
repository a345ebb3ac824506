// The Gated DeltaNet ops (OptionalOp::kGatedDeltaNet) on the CUDA backend against the
// CPU reference, on random non-zero data with poisoned outputs: gated_delta_net (flat and
// grouped projections, r = nv / nk of 1 and 2, head sizes 128 and small odd ones),
// sigmoid_mul and copy_rows.
//
// Tolerances. Inputs are bf16-representable and both backends compute in fp32, so:
// out is rounded to bf16 once at the output: kBf16Tol (two bf16 half-ulps of max|ref|);
// the conv state holds raw bf16 inputs (the GPU keeps it in bf16, the model's layout):
// exact; the recurrent state is fp32 on both, differing by summation order and
// transcendentals (~6e-8 per operation over sums of dk terms and ~40 steps: ~1e-5 at
// most): 1e-4 of max|ref|. A wrong index, layout or state handling is off by O(1).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cuda/cuda_backend_impl.h"
#include "backends/cuda/selftest.h"
#include "gpu/gpu_test_util.h"

namespace kiln {
namespace {

using gpu_testing::kBf16Tol;

constexpr double kStateTol = 1e-4;

struct GdnCase {
  bool grouped;
  int64_t nk, nv, dk, dv;
};

class CudaGdn : public gpu_testing::GpuTest {
 protected:
  // max |got - ref| <= tol * max |ref|, every element written (not NaN); prints the error.
  void expect_close(const std::vector<float>& got, const Tensor& ref, double tol, const std::string& what) {
    ASSERT_EQ(int64_t(got.size()), ref.numel()) << what;
    double max_ref = 0.0, max_err = 0.0;
    int64_t worst = 0, nan_at = -1;
    for (int64_t i = 0; i < ref.numel(); ++i) max_ref = std::max(max_ref, double(std::abs(ref.as<float>()[i])));
    for (int64_t i = 0; i < ref.numel(); ++i) {
      if (std::isnan(got[size_t(i)]) && nan_at < 0) nan_at = i;
      const double e = std::abs(double(got[size_t(i)]) - ref.as<float>()[i]);
      if (e > max_err) max_err = e, worst = i;
    }
    std::printf("%s %s: max |err| %.4g at %lld (got %.6g, ref %.6g), max |ref| %.4g, rel %.4g (tol %.3g)\n",
                what.c_str(), shape_str(ref.shape).c_str(), max_err, (long long)worst, double(got[size_t(worst)]),
                double(ref.as<float>()[worst]), max_ref, max_err / std::max(max_ref, 1e-30), tol);
    EXPECT_LT(nan_at, 0) << what << ": element " << nan_at << " not written (or NaN)";
    EXPECT_GT(max_ref, 0.0) << what << ": a zero reference proves nothing";
    EXPECT_LE(max_err, tol * max_ref) << what << ": max error " << max_err << " at " << worst << " vs max |ref| "
                                      << max_ref;
  }
  static std::string shape_str(const Shape& s) {
    std::string r = "[";
    for (int i = 0; i < s.rank; ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }
  // An fp32 device tensor holding host values (upload would make a matrix bf16).
  Tensor to_gpu_f32(const Tensor& host) {
    Tensor t = gpu_->alloc(DType::kF32, host.shape);
    gpu_->synchronize();
    EXPECT_EQ(cudaMemcpy(t.data, host.data, size_t(host.nbytes()), cudaMemcpyHostToDevice), cudaSuccess);
    return t;
  }
  Tensor copy_of(const Tensor& host) {
    Tensor t = host_tensor(host.dtype, host.shape);
    std::memcpy(t.data, host.data, size_t(host.nbytes()));
    return t;
  }
  // The steps in order over `n_slots` state rows (all random and non-zero at the start),
  // for each case: out, conv state and recurrent state (every row) against the CPU's. A
  // sequence with at least chunk_min rows in a step takes the chunked form (where the
  // heads allow it: dk, dv <= kGdnChunkMaxHead), the others the token-serial recurrence.
  void run_steps(std::vector<ops::BatchMeta> steps, const std::vector<int32_t>& slots, int64_t n_slots,
                 int32_t chunk_min = INT32_MAX) {
    auto* cuda_gpu = static_cast<cuda::CudaBackend*>(gpu_.get());
    cuda_gpu->set_gdn_chunk_min_tokens(chunk_min);
    // The backend falls back to the recurrence where the form's shared memory is over the
    // cap: a chunked run would then compare the recurrence again and prove nothing.
    if (chunk_min != INT32_MAX) {
      ASSERT_LE(cuda::gdn_chunk_smem_bytes(int(cuda::kGdnChunkMaxHead)), cuda_gpu->smem_cap())
          << "the chunked form cannot run under this shared-memory cap";
    }
    std::printf("chunked form from %d rows\n", chunk_min);
    const int64_t kernel = 4;
    for (ops::BatchMeta& b : steps) b.state_slots = slots;
    for (const GdnCase c : {GdnCase{false, 2, 4, 128, 128}, GdnCase{true, 2, 4, 128, 128},
                            GdnCase{false, 3, 3, 20, 36}, GdnCase{true, 3, 6, 20, 12}, GdnCase{true, 1, 2, 192, 40}}) {
      const std::string name = std::string(c.grouped ? "grouped" : "flat") + " nk " + std::to_string(c.nk) +
                               " nv " + std::to_string(c.nv) + " dk " + std::to_string(c.dk) + " dv " +
                               std::to_string(c.dv);
      SCOPED_TRACE(name);
      const int64_t key_dim = c.nk * c.dk, value_dim = c.nv * c.dv, channels = 2 * key_dim + value_dim;
      const Tensor conv_w = as_bf16(random({channels, kernel}, 0.5f));
      const Tensor a_log = random({c.nv}), dt_bias = random({c.nv}), norm_w = random({c.dv});
      Tensor conv_cpu = random({n_slots, channels, kernel - 1});
      Tensor rec_cpu = random({n_slots, c.nv, c.dk, c.dv}, 0.5f);
      Tensor conv_gpu = to_gpu(conv_cpu), rec_gpu = to_gpu_f32(rec_cpu);
      const Tensor conv_wg = gpu_->upload(conv_w), a_log_g = gpu_->upload(a_log), dt_g = gpu_->upload(dt_bias),
                   norm_g = gpu_->upload(norm_w);
      for (size_t step = 0; step < steps.size(); ++step) {
        const ops::BatchMeta& b = steps[step];
        const int64_t t = b.n_tokens();
        const Tensor qkv = random({t, c.grouped ? channels + value_dim : channels});
        const Tensor bb = random({t, c.grouped ? 2 * c.nv : c.nv}, 2.0f);
        const Tensor z = c.grouped ? Tensor{} : random({t, value_dim});
        const Tensor a = c.grouped ? Tensor{} : random({t, c.nv}, 2.0f);
        Tensor ref = host_tensor(DType::kF32, {t, value_dim});
        cpu_->gated_delta_net({.qkv = qkv, .z = z, .b = bb, .a = a, .grouped = c.grouped, .conv_weight = conv_w,
                               .a_log = a_log, .dt_bias = dt_bias, .norm_weight = norm_w, .norm_eps = 1e-6f,
                               .conv_state = conv_cpu, .recurrent_state = rec_cpu, .out = ref, .batch = &b,
                               .n_k_heads = c.nk, .n_v_heads = c.nv, .d_k = c.dk, .d_v = c.dv});
        Tensor out = poisoned({t, value_dim});
        gpu_->begin_step(b);
        gpu_->gated_delta_net({.qkv = to_gpu(qkv), .z = c.grouped ? Tensor{} : to_gpu(z), .b = to_gpu(bb),
                               .a = c.grouped ? Tensor{} : to_gpu(a), .grouped = c.grouped, .conv_weight = conv_wg,
                               .a_log = a_log_g, .dt_bias = dt_g, .norm_weight = norm_g, .norm_eps = 1e-6f,
                               .conv_state = conv_gpu, .recurrent_state = rec_gpu, .out = out, .batch = &b,
                               .n_k_heads = c.nk, .n_v_heads = c.nv, .d_k = c.dk, .d_v = c.dv});
        const std::string at = name + " step " + std::to_string(step + 1);
        expect_close(from_gpu(out), ref, kBf16Tol, at + " out");
        expect_close(from_gpu(conv_gpu), conv_cpu, 0.0, at + " conv_state");
        expect_close(from_gpu(rec_gpu), rec_cpu, kStateTol, at + " recurrent_state");
      }
    }
  }
};

// Two steps over four state slots of five (slot 4 never used: it must stay as it was):
//   step 1: a 37-token prefill from position 0 (its stale slot ignored), a 1-token decode
//   at position 50, a 3-token chunk at 20..22, a 2-token prompt from position 0 (shorter
//   than the convolution's 3 state columns);
//   step 2: one decode token for each, reading the states step 1 wrote.
//   Once with the recurrence only, once with the chunked form for every sequence (a chunk
//   of 1, 2, 3 and 37 rows; the 37-row prefill's chunk from position 0).
TEST_F(CudaGdn, GatedDeltaNetMatchesCpuForPrefillDecodeAndChunks) {
  for (int32_t chunk_min : {INT32_MAX, 1})
    run_steps({cuda::scattered_batch({{37, 37}, {1, 51}, {3, 23}, {2, 2}}, 16, 4),
               cuda::scattered_batch({{1, 38}, {1, 52}, {1, 24}, {1, 3}}, 16, 4)},
              {3, 0, 2, 1}, 5, chunk_min);
}

// The chunked form (kernels/gated_delta_net.cu) over many chunks of 64, beside sequences
// that take the recurrence in the same step (the default threshold, kGdnChunkMinTokens):
//   step 1: a 150-row prompt from position 0 (chunks of 64, 64, 22), a decode row, a
//   64-row chunk at positions 36..99 (one whole chunk, from the old state), a 65-row
//   prompt (64 + 1);
//   step 2: the first prompt's next 130 rows (150..279, from the state step 1 left), a
//   decode row, 63 rows (below the threshold: the recurrence), 70 rows (chunked);
//   step 3: a decode row each.
TEST_F(CudaGdn, ChunkedFormMatchesCpuOverManyChunks) {
  ASSERT_EQ(cuda::kGdnChunkMinTokens, 64);
  run_steps({cuda::scattered_batch({{150, 150}, {1, 51}, {64, 100}, {65, 65}}, 16, 20),
             cuda::scattered_batch({{130, 280}, {1, 52}, {63, 163}, {70, 135}}, 16, 20),
             cuda::scattered_batch({{1, 281}, {1, 53}, {1, 164}, {1, 136}}, 16, 20)},
            {1, 3, 0, 2}, 4, cuda::kGdnChunkMinTokens);
}

// State snapshots (OptionalOp::kStateSnapshots): a verify step leaves the state after each
// marked row in its snapshot row, as the CPU does (the conv window and the recurrent state
// after that token). Slots 0-3, snapshot rows 4-12 (three a sequence), row 13 untouched.
// Step 1 prefills; step 2 verifies 3 drafts (4 rows, snapshots after rows 0-2), 1 draft
// (2 rows, after row 0), a decode row (none) and 2 drafts of a sequence whose first row
// is its prompt's position 1 (snapshots within the convolution's reach of the old state);
// step 3 decodes again from the slots (as after a rejection the engine copies a snapshot
// back: CopyRowsCopiesOneRowExactly).
TEST_F(CudaGdn, StateSnapshotsMatchCpu) {
  ASSERT_TRUE(gpu_->supports_op(ops::OptionalOp::kStateSnapshots).ok());
  std::vector<ops::BatchMeta> steps = {cuda::scattered_batch({{20, 20}, {9, 9}, {30, 30}, {1, 1}}, 16, 4),
                                       cuda::scattered_batch({{4, 24}, {2, 11}, {1, 31}, {3, 4}}, 16, 4),
                                       cuda::scattered_batch({{1, 25}, {1, 12}, {1, 32}, {1, 5}}, 16, 4)};
  steps[1].state_snapshots = {4, 5, 6, -1, 7, -1, -1, 10, 11, -1};
  run_steps(std::move(steps), {0, 1, 2, 3}, 14);
}

TEST_F(CudaGdn, SigmoidMulMatchesCpuWithAndWithoutBroadcastAndInPlace) {
  for (const auto& [rows, n, gn] : {std::tuple{7, 300, 300}, {7, 300, 1}, {1, 4096, 4096}, {33, 64, 1}}) {
    for (bool in_place : {false, true}) {
      const std::string what = "sigmoid_mul " + std::to_string(rows) + "x" + std::to_string(n) + " gate cols " +
                               std::to_string(gn) + (in_place ? " in place" : "");
      SCOPED_TRACE(what);
      const Tensor x = random({rows, n}, 4.0f), gate = random({rows, gn}, 6.0f);
      Tensor ref = host_tensor(DType::kF32, {rows, n});
      cpu_->sigmoid_mul({.x = x, .gate = gate, .out = ref});
      Tensor xg = to_gpu(x);
      Tensor out = in_place ? xg : poisoned({rows, n});
      gpu_->sigmoid_mul({.x = xg, .gate = to_gpu(gate), .out = out});
      expect_close(from_gpu(out), ref, kBf16Tol, what);
    }
  }
}

TEST_F(CudaGdn, CopyRowsCopiesOneRowExactly) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor host = random({4, 3, 5});
    Tensor t = dtype == DType::kF32 ? to_gpu_f32(host) : to_gpu(host);
    Tensor other = dtype == DType::kF32 ? to_gpu_f32(random({2, 3, 5})) : to_gpu(random({2, 3, 5}));
    Tensor want = copy_of(host);
    gpu_->copy_rows({.src = t, .src_row = 1, .dst = t, .dst_row = 3});  // within a tensor
    gpu_->copy_rows({.src = t, .src_row = 2, .dst = t, .dst_row = 2});  // onto itself: a no-op
    std::memcpy(want.as<float>() + 3 * 15, host.as<float>() + 1 * 15, 15 * sizeof(float));
    expect_close(from_gpu(t), want, 0.0, "copy_rows within " + std::string(dtype_name(dtype)));
    gpu_->copy_rows({.src = t, .src_row = 0, .dst = other, .dst_row = 1});  // into another tensor
    const std::vector<float> o = from_gpu(other);
    for (int i = 0; i < 15; ++i) EXPECT_EQ(o[size_t(15 + i)], host.as<float>()[i]) << "element " << i;
  }
}

}  // namespace
}  // namespace kiln
