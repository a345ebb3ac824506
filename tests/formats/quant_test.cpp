// Scalar dequant references at the edges of each format (hand-computed values)
// and quantization_config parsing.
#include "formats/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "formats/quant_config.h"

namespace kiln::formats {
namespace {

Tensor bytes_tensor(DType dt, Shape s, std::initializer_list<uint8_t> bytes) {
  Tensor t = host_tensor(dt, s);
  std::memcpy(t.data, std::data(bytes), bytes.size());
  return t;
}

TEST(Dequant, Mxfp4NibbleOrderSignedZeroSixAndE8m0Extremes) {
  // One row of 64 values: two groups of 32 (16 bytes each), scales 2^0 and 2^127... and 2^-127.
  QuantizedTensor q{.kind = QuantKind::kMxfp4, .n_out = 2, .n_in = 64};
  q.data = host_tensor(DType::kU8, {2, 2, 16});
  uint8_t* d = q.data.as<uint8_t>();
  d[0] = 0x7f;   // k=0: 0xf = -6, k=1: 0x7 = +6 (low nibble is the even element)
  d[1] = 0x08;   // k=2: 0x8 = -0, k=3: 0x0 = +0
  d[16] = 0x21;  // group 1: k=32: 0x1 = 0.5, k=33: 0x2 = 1
  d[32] = 0x07;  // row 1, k=0: 6
  q.scale = bytes_tensor(DType::kU8, {2, 2}, {127, 254, 0, 127});
  float out[64];
  dequantize_row(q, 0, out);
  EXPECT_EQ(out[0], -6.0f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_TRUE(std::signbit(out[2]));
  EXPECT_FALSE(std::signbit(out[3]));
  EXPECT_EQ(out[32], 0.5f * std::ldexp(1.0f, 127));  // e8m0 254 = 2^127
  EXPECT_EQ(out[33], std::ldexp(1.0f, 127));
  dequantize_row(q, 1, out);
  EXPECT_EQ(out[0], 6.0f * std::ldexp(1.0f, -127));  // e8m0 0 = 2^-127 (subnormal in fp32)
}

TEST(Dequant, Nvfp4UsesBlockScaleTimesGlobalScale) {
  QuantizedTensor q{.kind = QuantKind::kNvfp4, .n_out = 1, .n_in = 32};
  q.data = host_tensor(DType::kU8, {1, 16});
  q.data.as<uint8_t>()[0] = 0x3f;   // k=0: -6, k=1: 1.5
  q.data.as<uint8_t>()[8] = 0x07;   // k=16: 6 (second block of 16)
  q.scale = bytes_tensor(DType::kF8E4M3, {1, 2}, {0x7e, 0x01});  // 448 and the smallest subnormal 2^-9
  q.scale2 = host_tensor(DType::kF32, {});
  q.scale2.as<float>()[0] = 0.25f;
  float out[32];
  dequantize_row(q, 0, out);
  EXPECT_EQ(out[0], -6.0f * 448.0f * 0.25f);
  EXPECT_EQ(out[1], 1.5f * 448.0f * 0.25f);
  EXPECT_EQ(out[16], 6.0f * std::ldexp(1.0f, -9) * 0.25f);
}

TEST(Dequant, Int4NibblesAreLsbFirstWithOffsetEight) {
  QuantizedTensor q{.kind = QuantKind::kInt4Group, .n_out = 1, .n_in = 64, .block_k = 32};
  q.data = host_tensor(DType::kI32, {1, 8});
  // word 0: nibbles (LSB first) 0, 15, 8, 9, ... -> q = -8, 7, 0, 1
  q.data.as<int32_t>()[0] = int32_t(0x000098f0u);
  q.data.as<int32_t>()[4] = int32_t(0xf0000000u);  // k=39: nibble 15 -> 7 (sign bit of the word set)
  q.scale = host_tensor(DType::kBF16, {1, 2});
  q.scale.as<uint16_t>()[0] = f32_to_bf16(0.5f);
  q.scale.as<uint16_t>()[1] = f32_to_bf16(-2.0f);
  float out[64];
  dequantize_row(q, 0, out);
  EXPECT_EQ(out[0], -4.0f);   // -8 * 0.5
  EXPECT_EQ(out[1], 3.5f);    // 7 * 0.5
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.5f);
  EXPECT_EQ(out[4], -4.0f);   // nibble 0 -> -8
  EXPECT_EQ(out[39], -14.0f); // 7 * -2 (second group)
}

TEST(Dequant, Fp8BlockHandlesPartialLastBlocksAndSubnormals) {
  // 3 x 5 weight with 2 x 2 blocks: block grid 2 x 3, the last row and column partial.
  QuantizedTensor q{.kind = QuantKind::kFp8Block, .n_out = 3, .n_in = 5, .block_n = 2, .block_k = 2};
  q.data = host_tensor(DType::kF8E4M3, {3, 5});
  uint8_t* d = q.data.as<uint8_t>();
  for (int i = 0; i < 15; ++i) d[i] = 0x38;  // 1.0
  d[4] = 0x7e;   // row 0, k=4: 448 (in the partial column block)
  d[14] = 0x01;  // row 2, k=4: 2^-9
  q.scale = host_tensor(DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) q.scale.as<float>()[i] = float(i + 1);
  float out[5];
  dequantize_row(q, 0, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[2], 2.0f);
  EXPECT_EQ(out[4], 448.0f * 3.0f);
  dequantize_row(q, 2, out);  // block row 1
  EXPECT_EQ(out[0], 4.0f);
  EXPECT_EQ(out[4], std::ldexp(1.0f, -9) * 6.0f);
}

TEST(Dequant, Fp8ChannelAndTensorScales) {
  QuantizedTensor ch{.kind = QuantKind::kFp8Channel, .n_out = 2, .n_in = 2};
  ch.data = bytes_tensor(DType::kF8E4M3, {2, 2}, {0x38, 0xb8, 0x40, 0x07});  // 1, -1, 2, 7*2^-9
  ch.scale = host_tensor(DType::kBF16, {2, 1});
  ch.scale.as<uint16_t>()[0] = f32_to_bf16(0.5f);
  ch.scale.as<uint16_t>()[1] = f32_to_bf16(4.0f);
  float out[2];
  dequantize_row(ch, 0, out);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -0.5f);
  dequantize_row(ch, 1, out);
  EXPECT_EQ(out[0], 8.0f);
  EXPECT_EQ(out[1], 7.0f * std::ldexp(1.0f, -9) * 4.0f);
  QuantizedTensor t = ch;
  t.kind = QuantKind::kFp8Tensor;
  t.scale = host_tensor(DType::kF32, {});
  t.scale.as<float>()[0] = 3.0f;
  dequantize_row(t, 1, out);
  EXPECT_EQ(out[0], 6.0f);
}

const char* kCfg = R"({"architectures": ["X"], "quantization_config": %s})";

Result<QuantConfig> parse(const std::string& qc, const std::string& hf_quant = "") {
  char buf[4096];
  std::snprintf(buf, sizeof buf, kCfg, qc.c_str());
  return parse_quant_config(buf, hf_quant, "config.json");
}

// The W8A8 activation rule: scale amax / 448 per block of 128, the block maximum on 448
// (0x7e), round to nearest even in between, an all-zero block with scale 1, a partial
// last block on its own, and which weights take it.
TEST(Fp8Activations, BlocksOf128WithScaleAmaxOver448) {
  float x[300];
  for (int i = 0; i < 300; ++i) x[i] = std::sin(0.37f * float(i)) * (i < 128 ? 3.0f : 0.01f);
  x[5] = -7.0f;  // block 0's maximum magnitude
  uint8_t codes[128];
  const float s = quantize_fp8_act_block(x, 128, codes);
  EXPECT_EQ(s, 7.0f / 448.0f);
  EXPECT_EQ(codes[5], 0xfe);  // -448
  for (int i = 0; i < 128; ++i) EXPECT_EQ(codes[i], f32_to_fp8_e4m3(x[i] / s)) << i;
  float zeros[7] = {}, out[300];
  EXPECT_EQ(quantize_fp8_act_block(zeros, 7, codes), 1.0f);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(codes[i], 0);
  fake_quantize_fp8_act(x, 300, out);
  EXPECT_EQ(out[5], -7.0f);
  for (int b = 0; b < 3; ++b) {  // blocks [0, 128), [128, 256), [256, 300)
    const int lo = 128 * b, n = std::min(128, 300 - lo);
    const float sb = quantize_fp8_act_block(x + lo, n, codes);
    float amax = 0.0f;
    for (int i = lo; i < lo + n; ++i) amax = std::max(amax, std::fabs(x[i]));
    EXPECT_EQ(sb, amax / 448.0f);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(out[lo + i], fp8_e4m3_to_f32(codes[i]) * sb);
      // e4m3: 3 mantissa bits, so at most half a step (2^-4 relative) from x in the normal
      // range, and a subnormal step (2^-9 of the scale) below it.
      EXPECT_LE(std::fabs(out[lo + i] - x[lo + i]), std::max(std::ldexp(std::fabs(x[lo + i]), -4), std::ldexp(sb, -10)))
          << lo + i;
    }
  }
  EXPECT_TRUE(fp8_w8a8_eligible({.kind = QuantKind::kFp8Block, .block_n = 128, .block_k = 128}));
  EXPECT_TRUE(fp8_w8a8_eligible({.kind = QuantKind::kFp8Block, .block_n = 128, .block_k = 256}));
  EXPECT_FALSE(fp8_w8a8_eligible({.kind = QuantKind::kFp8Block, .block_n = 64, .block_k = 64}));
  EXPECT_TRUE(fp8_w8a8_eligible({.kind = QuantKind::kFp8Channel}));
  EXPECT_TRUE(fp8_w8a8_eligible({.kind = QuantKind::kFp8Tensor}));
  EXPECT_FALSE(fp8_w8a8_eligible({.kind = QuantKind::kMxfp4}));
  EXPECT_FALSE(fp8_w8a8_eligible({.kind = QuantKind::kInt4Group, .block_k = 128}));
}

TEST(QuantConfig, CompressedTensorsIgnoreUsesPythonReMatch) {
  auto c = parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
    "symmetric": true, "strategy": "group", "group_size": 32}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:model.layers.0.mlp"]})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->kind, QuantKind::kInt4Group);
  EXPECT_EQ(c->group_size, 32);
  EXPECT_FALSE(c->is_quantized("lm_head"));
  EXPECT_FALSE(c->is_quantized("model.layers.3.self_attn.q_proj"));
  EXPECT_FALSE(c->is_quantized("model.layers.0.mlp.gate_proj"));  // anchored at the start only
  EXPECT_TRUE(c->is_quantized("model.layers.1.mlp.experts.7.down_proj"));
}

TEST(QuantConfig, ModelOptGlobsAndHfQuantConfigFile) {
  auto c = parse("null", R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4",
    "group_size": 16, "exclude_modules": ["lm_head", "model.layers.*.self_attn"]}})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->kind, QuantKind::kNvfp4);
  EXPECT_FALSE(c->is_quantized("model.layers.12.self_attn.o_proj"));
  EXPECT_TRUE(c->is_quantized("model.layers.12.mlp.experts.3.up_proj"));
}

TEST(QuantConfig, Fp8BlockAndChannel) {
  auto block = parse(R"({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 64]})");
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->kind, QuantKind::kFp8Block);
  EXPECT_EQ(block->block_n, 128);
  EXPECT_EQ(block->block_k, 64);
  auto torch_name = parse(R"({"quant_method": "fp8", "fmt": "float8_e4m3fn", "weight_block_size": [128, 128]})");
  ASSERT_TRUE(torch_name.ok()) << torch_name.status().to_string();  // MiniMax-M2's spelling
  EXPECT_EQ(torch_name->kind, QuantKind::kFp8Block);
  auto e5m2 = parse(R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})");
  EXPECT_FALSE(e5m2.ok());
  auto ch = parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
    "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
    "strategy": "channel", "symmetric": true}}}, "ignore": ["lm_head"]})");
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ(ch->kind, QuantKind::kFp8Channel);
}

TEST(QuantConfig, UnsupportedOrMalformedConfigsNameTheProblem) {
  struct Case {
    std::string qc, expect;
  } cases[] = {
      {R"({"quant_method": "gptq", "bits": 4})", "quant_method \"gptq\""},
      {R"({"quant_method": "fp8"})", "weight_block_size"},
      {R"({"quant_method": "modelopt", "quant_algo": "FP8"})", "quant_algo \"FP8\""},
      {R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
          "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": false,
          "strategy": "group", "group_size": 32}}}})", "asymmetric"},
      {R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
          "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
          "group_size": 12}}}})", "group_size 12"},
      {R"({"quant_method": "compressed-tensors", "format": "naive-quantized", "config_groups": {"g": {
          "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}})",
       "naive-quantized"},
  };
  for (const Case& c : cases) {
    auto r = parse(c.qc);
    ASSERT_FALSE(r.ok()) << c.qc;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().message();
  }
}

TEST(QuantConfig, NoQuantizationConfigMeansDense) {
  auto c = parse_quant_config(R"({"architectures": ["X"]})", "", "config.json");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->quantized());
  EXPECT_FALSE(c->is_quantized("model.layers.0.mlp.gate_proj"));
}

}  // namespace
}  // namespace kiln::formats
