#include "formats/hf_config.h"

#include <gtest/gtest.h>

namespace kiln::formats {
namespace {

ModelConfig parse(const std::string& text) {
  auto r = parse_config(text, "config.json");
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : ModelConfig{};
}

constexpr const char* kBase = R"("architectures": ["LlamaForCausalLM"], "vocab_size": 100,
  "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 4096)";

TEST(HfConfig, LegacyAndTransformers5RopeKeysGiveTheSameConfig) {
  const ModelConfig legacy = parse(std::string("{") + kBase + R"(, "rope_theta": 500000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                     "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16}})");
  const ModelConfig modern = parse(std::string("{") + kBase + R"(, "rope_parameters": {
    "rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0, "original_max_position_embeddings": 1024,
    "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16}})");
  for (const ModelConfig* c : {&legacy, &modern}) {
    EXPECT_EQ(c->rope.type, "yarn");
    EXPECT_EQ(c->rope.theta, 500000.0);
    EXPECT_EQ(c->rope.factor, 4.0);
    EXPECT_EQ(c->rope.original_max_position_embeddings, 1024);
    EXPECT_EQ(c->rope.mscale_all_dim.value_or(-1), 0.5);
    EXPECT_EQ(c->rope.beta_fast, 16.0);
    EXPECT_EQ(c->rope.beta_slow, 1.0);
    EXPECT_TRUE(c->rope.truncate);
  }
}

TEST(HfConfig, DefaultsAndDerivedFields) {
  const ModelConfig c = parse(std::string("{") + kBase + "}");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.n_kv_heads, 4);   // defaults to num_attention_heads
  EXPECT_EQ(c.d_head, 16);      // hidden_size / num_attention_heads
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_FALSE(c.sliding_window.has_value());
}

TEST(HfConfig, ExpertCountKeysOfEveryFamily) {
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    const ModelConfig c = parse(std::string("{") + kBase + ", \"" + key + "\": 8, \"num_experts_per_tok\": 2}");
    EXPECT_EQ(c.n_experts, 8) << key;
    EXPECT_EQ(c.n_experts_active, 2) << key;
  }
}

TEST(HfConfig, SlidingWindowFollowsLayerTypesAndUseSlidingWindow) {
  const ModelConfig oss = parse(std::string("{") + kBase +
                                R"(, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]})");
  EXPECT_EQ(oss.sliding_window_of_layer(0), 128);
  EXPECT_EQ(oss.sliding_window_of_layer(1), 0);
  const ModelConfig qwen = parse(std::string("{") + kBase + R"(, "sliding_window": 4096, "use_sliding_window": false})");
  EXPECT_EQ(qwen.sliding_window_of_layer(0), 0);
}

TEST(HfConfig, EosMayBeAnIntOrAList) {
  EXPECT_EQ(parse(std::string("{") + kBase + R"(, "eos_token_id": 7})").eos_token_ids, std::vector<int64_t>{7});
  EXPECT_EQ(parse(std::string("{") + kBase + R"(, "eos_token_id": [7, 9]})").eos_token_ids,
            (std::vector<int64_t>{7, 9}));
}

// DeepSeek sparse attention: GLM-5's per-layer indexer modes as GlmMoeDsaConfig derives
// them (indexer_types, else index_topk_pattern, else index_topk_freq and
// index_skip_topk_offset), over 6 layers.
TEST(HfConfig, DsaIndexerTypesFollowTransformers) {
  const std::string six = R"("architectures": ["GlmMoeDsaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
    "num_hidden_layers": 6, "num_attention_heads": 4, "index_topk": 8, "index_head_dim": 32, "index_n_heads": 4)";
  const std::vector<std::string> all_full(6, "full");
  const ModelConfig plain = parse("{" + six + "}");
  EXPECT_EQ(plain.index_topk, 8);
  EXPECT_EQ(plain.d_index, 32);
  EXPECT_EQ(plain.n_index_heads, 4);
  EXPECT_EQ(plain.indexer_types, all_full);  // freq 1
  // max(i - 2 + 1, 0) % 3 == 0: layers 0, 1, 4 full.
  EXPECT_EQ(parse("{" + six + R"(, "index_topk_freq": 3})").indexer_types,
            (std::vector<std::string>{"full", "full", "shared", "shared", "full", "shared"}));
  EXPECT_EQ(parse("{" + six + R"(, "index_topk_freq": 2, "index_skip_topk_offset": 1})").indexer_types,
            (std::vector<std::string>{"full", "shared", "full", "shared", "full", "shared"}));
  EXPECT_EQ(parse("{" + six + R"(, "index_topk_pattern": "FSSFFS"})").indexer_types,
            (std::vector<std::string>{"full", "shared", "shared", "full", "full", "shared"}));
  EXPECT_EQ(parse("{" + six + R"(, "index_topk_pattern": "FSSFFS", "indexer_types": ["full", "full", "full",
    "full", "full", "shared"]})").indexer_types.back(), "shared");
  EXPECT_TRUE(parse(std::string("{") + kBase + "}").indexer_types.empty()) << "no index_topk: dense";
  for (const std::string bad : {R"("index_topk_pattern": "FSX")", R"("index_topk_pattern": "FS")",
                                R"("index_topk_pattern": "SFFFFF")", R"("index_head_dim": 0)"}) {
    auto r = parse_config("{" + six + ", " + bad + "}", "config.json");
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(HfConfig, BadInputNamesTheProblem) {
  struct Case {
    std::string text, expect;
  } cases[] = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "JSON object"},
      {R"({"vocab_size": 1})", "architectures"},
      {std::string("{") + R"("architectures": ["X"], "vocab_size": 100, "hidden_size": 64, "num_attention_heads": 4})",
       "num_hidden_layers"},
      {std::string("{") + kBase + R"(, "num_experts_per_tok": "two"})", "num_experts_per_tok"},
      {std::string("{") + kBase + R"(, "rope_scaling": {"rope_type": "longrope"}})", "longrope"},
      {std::string("{") + kBase + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 0}})",
       "original_max_position_embeddings"},
      {std::string("{") + kBase + R"(, "n_routed_experts": 8, "num_experts_per_tok": 9})", "num_experts_per_tok"},
      {std::string("{") + kBase + R"(, "n_routed_experts": 8, "n_group": 3})", "n_group"},
      {std::string("{") + kBase + R"(, "layer_types": ["full_attention"]})", "layer_types"},
  };
  for (const Case& c : cases) {
    auto r = parse_config(c.text, "config.json");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("config.json"), std::string::npos) << r.status().message();
  }
}

TEST(HfConfig, ABrokenConfigSaysWhere) {
  auto r = parse_config("{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"vocab_size\": 10,,\n}", "/m/config.json");
  ASSERT_FALSE(r.ok());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("/m/config.json: not valid JSON at line 3, column 20"), std::string::npos) << m;
}

}  // namespace
}  // namespace kiln::formats
