// The native SM120 MoE path (kernels/quant_gemm_sm120.cu) on the test GPU. Its block-
// scaled GEMMs cannot run on an H100 (their layout is checked on the CPU by
// tests/backends/cuda/quant_mma_sm120_test.cpp), but two parts can: the activation
// quantization pre-pass is portable code and must give the host's bytes exactly (the
// self-test's reference on SM120 depends on it), and off SM 12.x the path must be
// refused and reported "not applicable", never launched.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "backends/cuda/cuda_backend_impl.h"
#include "backends/cuda/kernels/quant_mma_sm120.h"
#include "backends/cuda/selftest.h"
#include "gpu/gpu_test_util.h"

namespace kiln {
namespace {

namespace sm = cuda::sm120;

class CudaQuantSm120 : public gpu_testing::GpuTest {};

TEST_F(CudaQuantSm120, ActivationQuantizationMatchesTheHostByteForByte) {
  // Row lengths off every block and tile boundary, gpt-oss's 2880, DeepSeek's 7168.
  for (auto [rows, k] : {std::pair<int64_t, int64_t>{37, 200}, {5, 2880}, {3, 7168}, {130, 8}}) {
    // Blocks spread over six decades, zero rows and blocks, outliers.
    Tensor x = random({rows, k});
    std::uniform_real_distribution<float> decade(-3.0f, 3.0f);
    for (int64_t b = 0; b < rows * k; b += 16) {
      const float amp = rng_() % 13 == 0 ? 0.0f : std::pow(10.0f, decade(rng_));
      for (int64_t i = b; i < std::min(rows * k, b + 16); ++i)
        x.as<float>()[i] = gpu_testing::bf16_round(x.as<float>()[i] * amp);
    }
    for (int64_t i = 0; i < k; ++i) x.as<float>()[i] = 0.0f;  // a zero row
    const Tensor xg = to_gpu(x);
    for (sm::ActFormat f : {sm::ActFormat::kE4m3, sm::ActFormat::kE2m1}) {
      SCOPED_TRACE(::testing::Message() << (f == sm::ActFormat::kE4m3 ? "e4m3 " : "e2m1 ") << rows << "x" << k);
      const size_t code_bytes = size_t(rows * sm::act_code_row_bytes(f, k));
      const size_t scale_bytes = size_t(rows * sm::act_scale_row_bytes(f, k));
      std::vector<uint8_t> codes(code_bytes), scales(scale_bytes);
      std::vector<float> row_scale(size_t(rows), 0.0f);
      sm::quantize_act_rows(f, x.as<float>(), rows, k, codes.data(), scales.data(), row_scale.data());

      Tensor buf = gpu_->alloc(DType::kU8, {int64_t(cuda::quant_act_bytes(int(f), rows, k))});
      const cuda::QuantActBuffers out = cuda::quant_act_buffers(int(f), buf.data, rows, k);
      gpu_->synchronize();
      ASSERT_EQ(cudaMemset(buf.data, 0xcd, buf.nbytes()), cudaSuccess);  // every byte must be written
      cuda::launch_quantize_act(int(f), xg.as<cuda::bf16>(), rows, k, out, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> got_codes(code_bytes), got_scales(scale_bytes);
      std::vector<float> got_row_scale(size_t(rows), 0.0f);
      ASSERT_EQ(cudaMemcpy(got_codes.data(), out.codes, code_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got_scales.data(), out.scales, scale_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      int64_t bad = 0;
      for (size_t i = 0; i < code_bytes; ++i)
        if (got_codes[i] != codes[i] && bad++ < 5) ADD_FAILURE() << "code byte " << i;
      for (size_t i = 0; i < scale_bytes; ++i)
        if (got_scales[i] != scales[i] && bad++ < 10) ADD_FAILURE() << "scale byte " << i;
      if (f == sm::ActFormat::kE2m1) {
        ASSERT_EQ(cudaMemcpy(got_row_scale.data(), out.row_scale, size_t(rows) * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(got_row_scale[size_t(r)], row_scale[size_t(r)]) << "row " << r;
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST_F(CudaQuantSm120, NativePathIsNotApplicableOffSm12x) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(gpu_.get());
  ASSERT_NE(cuda, nullptr);
  if (cuda->info().cc_major == 12) GTEST_SKIP() << "an SM 12.x device: the self-test runs the native path";
  EXPECT_FALSE(cuda::quant_sm120_native_available());
  int natives = 0;
  for (const cuda::PathResult& r : cuda::run_self_test(*gpu_)) {
    if (r.path.find("native") == std::string::npos) continue;
    ++natives;
    EXPECT_FALSE(r.applicable) << r.path;
    EXPECT_FALSE(r.required) << r.path;
    EXPECT_EQ(r.detail, "not applicable on sm_" + std::to_string(cuda->info().cc())) << r.path;
  }
  EXPECT_EQ(natives, 2) << "MXFP4 and NVFP4";
}

}  // namespace
}  // namespace kiln
