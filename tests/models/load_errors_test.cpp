// Checkpoints that do not match their config, or that kiln cannot run, give an
// error naming the tensor (or key) and the problem: never a crash, never garbage.
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "delegating_backend.h"
#include "fixture.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class LoadErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_load_errors_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A copy of fixture `name` with config.json edited by `edit` and tensors
  // filtered/replaced by `tensors`.
  template <typename EditConfig, typename EditTensors>
  std::string variant(const std::string& name, EditConfig edit, EditTensors tensors) {
    const std::string src = testing::fixture_dir(name);
    nlohmann::json cfg = testing::read_json(src + "/config.json");
    edit(cfg);
    std::ofstream(dir_ / "config.json") << cfg.dump(2);
    auto file = formats::SafetensorsFile::open(src + "/model.safetensors");
    EXPECT_TRUE(file.ok());
    std::vector<std::pair<std::string, Tensor>> out;
    for (const formats::TensorInfo& info : (*file)->tensors()) {
      Tensor t = (*file)->get(info);
      if (tensors(info.name, t)) out.emplace_back(info.name, t);
    }
    EXPECT_TRUE(formats::write_safetensors((dir_ / "model.safetensors").string(), out).ok());
    return dir_.string();
  }

  Status load(const std::string& dir) {
    auto e = runtime::Engine::load(dir, cpu::make_cpu_backend(1), {});
    return e.ok() ? Status::Ok() : e.status();
  }

  fs::path dir_;
};

auto keep_config = [](nlohmann::json&) {};
auto keep_all = [](const std::string&, Tensor&) { return true; };

TEST_F(LoadErrors, MissingTensorIsNamed) {
  const std::string missing = "model.layers.2.mlp.experts.3.down_proj.weight";
  Status s = load(variant("qwen3_moe", keep_config,
                          [&](const std::string& n, Tensor&) { return n != missing; }));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(missing), std::string::npos) << s.message();
}

TEST_F(LoadErrors, ShapeMismatchWithConfigNamesTensorAndShapes) {
  Status s = load(variant("llama", [](nlohmann::json& c) { c["intermediate_size"] = 128; }, keep_all));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("128"), std::string::npos) << s.message();
}

TEST_F(LoadErrors, UnsupportedWeightDtypeIsNamed) {
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  Status s = load(variant("llama", keep_config, [&](const std::string& n, Tensor& t) {
    if (n == name) t.dtype = DType::kI16;  // same bytes, wrong type
    return true;
  }));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("i16"), std::string::npos) << s.message();
}

TEST_F(LoadErrors, UnknownArchitectureListsTheSupportedOnes) {
  Status s = load(variant("llama", [](nlohmann::json& c) { c["architectures"] = {"FooForCausalLM"}; },
                          keep_all));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("FooForCausalLM"), std::string::npos);
  EXPECT_NE(s.message().find("GptOssForCausalLM"), std::string::npos);
  EXPECT_NE(s.message().find("DeepseekV3ForCausalLM"), std::string::npos);
}

TEST_F(LoadErrors, MalformedConfigNamesTheKey) {
  Status s = load(variant("glm4_moe", [](nlohmann::json& c) { c["num_experts_per_tok"] = "two"; },
                          keep_all));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("num_experts_per_tok"), std::string::npos) << s.message();
}

TEST_F(LoadErrors, ConfigThatIsNotJsonIsReported) {
  variant("llama", keep_config, keep_all);
  std::ofstream(dir_ / "config.json") << "{\"architectures\": [\"LlamaForCausalLM\",";
  Status s = load(dir_.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("config.json"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("JSON"), std::string::npos) << s.message();
}

TEST_F(LoadErrors, UnsupportedRopeTypeIsReported) {
  Status s = load(variant("llama", [](nlohmann::json& c) { c["rope_scaling"]["rope_type"] = "longrope"; },
                          keep_all));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("longrope"), std::string::npos) << s.message();
}

// MiniMax-M2's hub config.json gives the rotary width as rotary_dim (not transformers'
// partial_rotary_factor) and names its variant in keys transformers ignores: the hub
// spelling gives the fixture's logits, and a contradiction or another variant is refused.
TEST_F(LoadErrors, MiniMaxM2HubKeysLoadAndOtherVariantsAreRefused) {
  const auto hub = [](nlohmann::json& c) {
    c.erase("rope_parameters");
    c["rope_theta"] = 5000000;
    c["rotary_dim"] = 8;  // head_dim 16 x 0.5
    c["qk_norm_type"] = "per_layer";
    c["scoring_func"] = "sigmoid";
    c["shared_intermediate_size"] = 0;
  };
  auto e = runtime::Engine::load(variant("minimax_m2", hub, keep_all), cpu::make_cpu_backend(1), {});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const auto prompt = testing::read_json(testing::fixture_dir("minimax_m2") + "/golden.json")["prompt_long"]
                          .get<std::vector<int32_t>>();
  auto got = (*e)->logits(prompt);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_LT(testing::relative_error(*got, testing::golden_logits("minimax_m2", "long")), 1e-4);

  const std::pair<std::function<void(nlohmann::json&)>, std::string> refused[] = {
      {[](nlohmann::json& c) { c["rotary_dim"] = 4; }, "disagrees with partial_rotary_factor"},
      {[](nlohmann::json& c) { c["qk_norm_type"] = "per_head"; }, "qk_norm_type"},
      {[](nlohmann::json& c) { c["scoring_func"] = "softmax"; }, "scoring_func"},
      {[](nlohmann::json& c) { c["shared_intermediate_size"] = 64; }, "shared experts"},
  };
  for (const auto& [edit, expect] : refused) {
    Status s = load(variant("minimax_m2", edit, keep_all));
    ASSERT_FALSE(s.ok()) << expect;
    EXPECT_NE(s.message().find(expect), std::string::npos) << s.message();
  }
}

// ---- quantized checkpoints ----------------------------------------------------

TEST_F(LoadErrors, WrongScaleShapeNamesTheScaleTensor) {
  const std::string name = "model.layers.0.mlp.up_proj.weight_scale";
  Status s = load(variant("llama_int4", keep_config, [&](const std::string& n, Tensor& t) {
    if (n == name) t.shape = {t.dim(0) * 2, t.dim(1) / 2};  // same bytes, wrong shape
    return true;
  }));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("shape"), std::string::npos) << s.message();
}

TEST_F(LoadErrors, MissingScaleTensorIsNamed) {
  const std::string name = "model.layers.1.mlp.experts.2.gate_proj.weight_scale_inv";
  Status s = load(variant("deepseek_v3_fp8_block", keep_config,
                          [&](const std::string& n, Tensor&) { return n != name; }));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
}

TEST_F(LoadErrors, GroupSizeNotDividingTheInputSize) {
  Status s = load(variant("llama_int4", [](nlohmann::json& c) {
    c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 48;
  }, keep_all));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("group size 48 does not divide"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("model.layers.0"), std::string::npos) << s.message();
}

TEST_F(LoadErrors, UnknownQuantMethodIsReported) {
  Status s = load(variant("llama_nvfp4", [](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "awq"; },
                          keep_all));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("awq"), std::string::npos) << s.message();
}

TEST_F(LoadErrors, QuantizedTensorsWithoutQuantizationConfig) {
  Status s = load(variant("llama_fp8_channel", [](nlohmann::json& c) { c.erase("quantization_config"); },
                          keep_all));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.layers.0.self_attn.q_proj"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("no quantization_config"), std::string::npos) << s.message();
}

TEST_F(LoadErrors, WrongPackedDtypeIsNamed) {
  const std::string name = "model.layers.1.mlp.experts.down_proj_scales";
  Status s = load(variant("gpt_oss_mxfp4", keep_config, [&](const std::string& n, Tensor& t) {
    if (n == name) t.dtype = DType::kI8;
    return true;
  }));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("i8"), std::string::npos) << s.message();
}

TEST_F(LoadErrors, MissingIndexerTensorIsNamed) {
  const std::string name = "model.layers.1.self_attn.indexer.wk.weight";
  Status s = load(variant("deepseek_v32", keep_config, [&](const std::string& n, Tensor&) { return n != name; }));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
}

// A backend without DeepSeek sparse attention (supports_op(kDsa) not Ok) refuses such a model
// at load, naming the layer and what is missing, instead of running it densely.
class NoDsaBackend : public testing::DelegatingBackend {
 public:
  NoDsaBackend() : DelegatingBackend(cpu::make_cpu_backend(1)) {}
  Status supports_op(ops::OptionalOp op) const override { return ops::Backend::supports_op(op); }
};

TEST_F(LoadErrors, BackendWithoutSparseAttentionRefusesDsaModels) {
  for (const char* name : {"deepseek_v32", "glm_moe_dsa"}) {
    auto e = runtime::Engine::load(testing::fixture_dir(name), std::make_unique<NoDsaBackend>(), {});
    ASSERT_FALSE(e.ok()) << name;
    const std::string m = e.status().message();
    EXPECT_NE(m.find("layer 0 uses DeepSeek sparse attention"), std::string::npos) << m;
    EXPECT_NE(m.find("dsa_select"), std::string::npos) << m;
  }
  // Dense MLA is unaffected.
  EXPECT_TRUE(runtime::Engine::load(testing::fixture_dir("deepseek_v3"), std::make_unique<NoDsaBackend>(), {}).ok());
}

// Likewise a backend without the Gated DeltaNet ops refuses the hybrids, naming the first
// linear-attention layer and the ops.
TEST_F(LoadErrors, BackendWithoutGatedDeltaNetRefusesHybridModels) {
  for (const std::string& name : testing::hybrid_fixtures()) {
    auto e = runtime::Engine::load(testing::fixture_dir(name), std::make_unique<NoDsaBackend>(), {});
    ASSERT_FALSE(e.ok()) << name;
    const std::string m = e.status().message();
    EXPECT_NE(m.find("layer 0 is a Gated DeltaNet (linear attention) layer"), std::string::npos) << m;
    EXPECT_NE(m.find("gated_delta_net"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace kiln
