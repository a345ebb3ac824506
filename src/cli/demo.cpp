#include "cli/demo.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/demo_tokenizer.h"
#include "formats/safetensors.h"

namespace kiln::cli {
namespace {

// The demo's files: bump whenever any of them changes, so ensure_demo_model() rewrites a
// copy cached by an older kiln (1: weights + config only; 2: tokenizer, chat template, eos ids).
constexpr int kDemoVersion = 2;

constexpr int64_t kVocab = 2048, kDModel = 256, kLayers = 4, kHeads = 8, kKvHeads = 2,
                  kDHead = 32, kExperts = 16, kExpertsActive = 4, kDFf = 256, kWindow = 64;

Tensor random_bf16(std::mt19937& rng, Shape shape, float mean, float stddev) {
  Tensor t = host_tensor(DType::kBF16, shape);
  std::normal_distribution<float> dist(mean, stddev);
  auto* p = t.as<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(dist(rng));
  return t;
}

// End of sequence: the end of an assistant turn, then <|endoftext|> (Qwen3's order).
nlohmann::json demo_eos_ids() {
  const DemoSpecialIds ids = demo_special_ids(kVocab);
  return {ids.im_end, ids.endoftext};
}

nlohmann::json demo_config() {
  nlohmann::json layer_types = nlohmann::json::array();
  for (int64_t i = 0; i < kLayers; ++i) layer_types.push_back(i % 2 ? "full_attention" : "sliding_attention");
  return {
      {"architectures", {"GptOssForCausalLM"}},
      {"model_type", "gpt_oss"},
      {"vocab_size", kVocab},
      {"hidden_size", kDModel},
      {"num_hidden_layers", kLayers},
      {"num_attention_heads", kHeads},
      {"num_key_value_heads", kKvHeads},
      {"head_dim", kDHead},
      {"intermediate_size", kDFf},
      {"num_local_experts", kExperts},
      {"num_experts_per_tok", kExpertsActive},
      {"sliding_window", kWindow},
      {"layer_types", layer_types},
      {"attention_bias", true},
      {"rms_norm_eps", 1e-5},
      {"max_position_embeddings", 4096},
      {"tie_word_embeddings", false},
      {"bos_token_id", nullptr},
      {"eos_token_id", demo_eos_ids()},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                        {"truncate", false}, {"original_max_position_embeddings", 128}}},
      {"rope_theta", 150000.0},
      {"torch_dtype", "bfloat16"},
  };
}

// Writes to a temporary and renames, so a half-written file is never picked up.
Status write_json(const std::string& path, const nlohmann::json& j) {
  {
    std::ofstream f(path + ".tmp");
    f << j.dump(2) << "\n";
    if (!f) return internal_error("cannot write " + path);
  }
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
  if (ec) return internal_error("cannot write " + path + ": " + ec.message());
  return Status::Ok();
}

// A cached demo is current when every file is there and its stamp is this kiln's version.
bool demo_is_current(const std::string& dir) {
  for (const char* name : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json"}) {
    if (!std::filesystem::exists(dir + "/" + name)) return false;
  }
  std::ifstream f(dir + "/kiln-demo.json");
  const nlohmann::json stamp = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  return stamp.is_object() && stamp.contains("version") && stamp["version"] == kDemoVersion;
}

}  // namespace

std::string demo_model_dir() {
  std::string base;
  if (const char* v = std::getenv("KILN_CACHE_DIR"); v && *v) base = v;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) base = std::string(x) + "/kiln";
  else if (const char* h = std::getenv("HOME"); h && *h) base = std::string(h) + "/.cache/kiln";
  else base = "/tmp/kiln-cache";
  return base + "/demo-gpt-oss";
}

Status write_demo_model(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return internal_error("cannot create " + dir + ": " + ec.message());

  std::mt19937 rng(20261122);
  std::vector<std::pair<std::string, Tensor>> t;
  t.emplace_back("model.embed_tokens.weight", random_bf16(rng, {kVocab, kDModel}, 0, 1.0f));
  t.emplace_back("lm_head.weight", random_bf16(rng, {kVocab, kDModel}, 0, 0.05f));
  t.emplace_back("model.norm.weight", random_bf16(rng, {kDModel}, 1, 0.1f));
  const float w = 1.0f / 16;  // ~1/sqrt(d_model): activations stay O(1)
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    t.emplace_back(p + ".input_layernorm.weight", random_bf16(rng, {kDModel}, 1, 0.1f));
    t.emplace_back(p + ".post_attention_layernorm.weight", random_bf16(rng, {kDModel}, 1, 0.1f));
    const std::string a = p + ".self_attn";
    t.emplace_back(a + ".q_proj.weight", random_bf16(rng, {kHeads * kDHead, kDModel}, 0, w));
    t.emplace_back(a + ".q_proj.bias", random_bf16(rng, {kHeads * kDHead}, 0, 0.1f));
    t.emplace_back(a + ".k_proj.weight", random_bf16(rng, {kKvHeads * kDHead, kDModel}, 0, w));
    t.emplace_back(a + ".k_proj.bias", random_bf16(rng, {kKvHeads * kDHead}, 0, 0.1f));
    t.emplace_back(a + ".v_proj.weight", random_bf16(rng, {kKvHeads * kDHead, kDModel}, 0, w));
    t.emplace_back(a + ".v_proj.bias", random_bf16(rng, {kKvHeads * kDHead}, 0, 0.1f));
    t.emplace_back(a + ".o_proj.weight", random_bf16(rng, {kDModel, kHeads * kDHead}, 0, w));
    t.emplace_back(a + ".o_proj.bias", random_bf16(rng, {kDModel}, 0, 0.1f));
    t.emplace_back(a + ".sinks", random_bf16(rng, {kHeads}, 0, 1.0f));
    const std::string m = p + ".mlp";
    t.emplace_back(m + ".router.weight", random_bf16(rng, {kExperts, kDModel}, 0, w));
    t.emplace_back(m + ".router.bias", random_bf16(rng, {kExperts}, 0, 0.1f));
    t.emplace_back(m + ".experts.gate_up_proj", random_bf16(rng, {kExperts, kDModel, 2 * kDFf}, 0, w));
    t.emplace_back(m + ".experts.gate_up_proj_bias", random_bf16(rng, {kExperts, 2 * kDFf}, 0, 0.1f));
    t.emplace_back(m + ".experts.down_proj", random_bf16(rng, {kExperts, kDFf, kDModel}, 0, w));
    t.emplace_back(m + ".experts.down_proj_bias", random_bf16(rng, {kExperts, kDModel}, 0, 0.1f));
  }
  // Write to temporaries and rename, so a half-written demo is never picked up; the version
  // stamp goes last, so an interrupted write is redone by ensure_demo_model().
  KILN_RETURN_IF_ERROR(formats::write_safetensors(dir + "/model.safetensors.tmp", t,
                                                  {{"format", "pt"}, {"kiln", "demo"}}));
  std::filesystem::rename(dir + "/model.safetensors.tmp", dir + "/model.safetensors", ec);
  if (ec) return internal_error("cannot finish writing the demo model in " + dir + ": " + ec.message());
  KILN_RETURN_IF_ERROR(write_json(dir + "/config.json", demo_config()));
  KILN_RETURN_IF_ERROR(write_json(dir + "/generation_config.json", {{"eos_token_id", demo_eos_ids()}}));
  KILN_RETURN_IF_ERROR(write_demo_tokenizer(dir, kVocab));
  return write_json(dir + "/kiln-demo.json", {{"version", kDemoVersion}});
}

Result<std::string> ensure_demo_model() {
  const std::string dir = demo_model_dir();
  if (demo_is_current(dir)) return dir;
  KILN_RETURN_IF_ERROR(write_demo_model(dir));
  return dir;
}

}  // namespace kiln::cli
