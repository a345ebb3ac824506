// Quantized weights stay quantized in memory: loading an INT4 checkpoint and
// running it must not grow resident memory past 1.15x the checkpoint's size on
// disk (dequantizing it at load would take about 7x: 4-byte floats for 0.56-byte
// weights).
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Resident set size of this process, bytes (/proc/self/status VmRSS).
int64_t resident_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// A Llama-shaped INT4 (compressed-tensors pack-quantized, group 32) checkpoint of
// about 50 MB with random packed weights and small scales.
std::string write_int4_checkpoint(const fs::path& dir) {
  constexpr int64_t kD = 1024, kFf = 4096, kVocab = 4096, kLayers = 4;
  fs::create_directories(dir);
  nlohmann::json cfg = {
      {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", kVocab}, {"hidden_size", kD},
      {"intermediate_size", kFf}, {"num_hidden_layers", kLayers}, {"num_attention_heads", 8},
      {"num_key_value_heads", 8}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
      {"quantization_config",
       {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
        {"config_groups", {{"group_0", {{"targets", {"Linear"}},
                                        {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", true},
                                                     {"strategy", "group"}, {"group_size", 32}}}}}}},
        {"ignore", {"lm_head"}}}}};
  std::ofstream(dir / "config.json") << cfg.dump();
  std::mt19937 rng(7);
  auto random_bytes = [&](DType dt, Shape s) {
    Tensor t = host_tensor(dt, s);
    for (size_t i = 0; i < t.nbytes(); ++i) static_cast<uint8_t*>(t.data)[i] = uint8_t(rng());
    return t;
  };
  auto bf16_values = [&](Shape s, float v) {
    Tensor t = host_tensor(DType::kBF16, s);
    for (int64_t i = 0; i < t.numel(); ++i) t.as<uint16_t>()[i] = f32_to_bf16(v * (1.0f + float(rng() % 7) / 7));
    return t;
  };
  std::vector<std::pair<std::string, Tensor>> t;
  t.emplace_back("model.embed_tokens.weight", bf16_values({kVocab, kD}, 0.02f));
  t.emplace_back("lm_head.weight", bf16_values({kVocab, kD}, 0.02f));
  t.emplace_back("model.norm.weight", bf16_values({kD}, 1.0f));
  auto int4 = [&](const std::string& p, int64_t n_out, int64_t n_in) {
    t.emplace_back(p + ".weight_packed", random_bytes(DType::kI32, {n_out, n_in / 8}));
    t.emplace_back(p + ".weight_scale", bf16_values({n_out, n_in / 32}, 0.002f));
  };
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    t.emplace_back(p + ".input_layernorm.weight", bf16_values({kD}, 1.0f));
    t.emplace_back(p + ".post_attention_layernorm.weight", bf16_values({kD}, 1.0f));
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) int4(p + ".self_attn." + proj, kD, kD);
    int4(p + ".mlp.gate_proj", kFf, kD);
    int4(p + ".mlp.up_proj", kFf, kD);
    int4(p + ".mlp.down_proj", kD, kFf);
  }
  EXPECT_TRUE(formats::write_safetensors((dir / "model.safetensors").string(), t).ok());
  return dir.string();
}

TEST(Memory, QuantizedWeightsAreNotExpandedAtLoad) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory and quarantine inflate the resident set; "
                  "this bound is checked in the normal build";
#endif
  const fs::path dir = fs::temp_directory_path() / ("kiln_memory_" + std::to_string(::getpid()));
  const std::string model = write_int4_checkpoint(dir);
  const int64_t disk = int64_t(fs::file_size(dir / "model.safetensors"));
  ASSERT_GT(disk, 40 << 20);

  const int64_t before = resident_bytes();
  {
    // One 16-token sequence of KV cache: the test measures the weights.
    auto engine = runtime::Engine::load(model, cpu::make_cpu_backend(2), {.max_model_len = 16, .max_num_seqs = 1});
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    auto logits = (*engine)->logits({1, 2, 3, 4});  // touches every weight page
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    const int64_t grown = resident_bytes() - before;
    RecordProperty("disk_bytes", std::to_string(disk));
    RecordProperty("resident_growth_bytes", std::to_string(grown));
    EXPECT_LE(double(grown), 1.15 * double(disk)) << "resident memory grew by " << grown << " bytes for a "
                                                  << disk << "-byte checkpoint";
    EXPECT_GE(double(grown), 0.5 * double(disk)) << "the forward pass should have read the weights";
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
