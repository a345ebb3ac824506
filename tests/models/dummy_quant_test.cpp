// --load-format dummy in the quantized formats: a config.json with a quantization_config
// gives a model whose quantized linears are really quantized, in the checkpoint layout
// (FP8 block / channel / tensor, NVFP4, INT4, gpt-oss MXFP4 experts), with dequantized
// weights of standard deviation 1/sqrt(n_in) like the bf16 dummy's; it generates, and its
// MoE layers route tokens to many experts. Tensor-parallel ranks get their cut.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "backends/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "delegating_backend.h"
#include "fixture.h"
#include "formats/hf_config.h"
#include "formats/quant_config.h"
#include "model/dummy_quant.h"
#include "models/registry.h"
#include "runtime/engine.h"

namespace kiln {
namespace {

using formats::QuantKind;
using runtime::LoadFormat;

// A quantized fixture's config.json, or (for "llama_fp8_tensor", which no checkpoint
// fixture has) llama_fp8_channel's with the per-tensor strategy, written to a temp file.
std::string config_path(const std::string& name) {
  if (name != "llama_fp8_tensor") return testing::fixture_dir(name) + "/config.json";
  nlohmann::json c = testing::read_json(testing::fixture_dir("llama_fp8_channel") + "/config.json");
  c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "tensor";
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_dummy_fp8_tensor.json").string();
  std::ofstream(path) << c.dump(2);
  return path;
}

struct Model {
  formats::ModelConfig config;
  formats::QuantConfig quant;
  std::unique_ptr<ops::Backend> backend;
  model::CausalLM lm;
};

// The model as WeightLoader::dummy builds it on the CPU backend (one rank or `shard`).
std::unique_ptr<Model> build(const std::string& name, const model::Shard& shard = {}) {
  auto m = std::make_unique<Model>();
  const std::string path = config_path(name);
  const std::string text = testing::read_text_file(path);
  auto config = formats::parse_config(text, path);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  auto quant = formats::parse_quant_config(text, "", path);
  EXPECT_TRUE(quant.ok()) << quant.status().to_string();
  if (!config.ok() || !quant.ok()) return nullptr;
  m->config = *config;
  m->quant = *quant;
  m->backend = cpu::make_cpu_backend(2);
  model::WeightLoader loader = model::WeightLoader::dummy(*m->backend, 20261123, m->quant);
  loader.set_shard(shard);
  auto lm = models::build_model(m->config, loader);
  EXPECT_TRUE(lm.ok()) << lm.status().to_string();
  if (!lm.ok()) return nullptr;
  m->lm = std::move(lm).value();
  return m;
}

// Every linear of the model with its checkpoint name (routers left out: some families
// never quantize them). gpt-oss fused experts are named by their module, "...mlp.experts".
std::vector<std::pair<std::string, const ops::Weight*>> linears(const model::CausalLM& lm) {
  std::vector<std::pair<std::string, const ops::Weight*>> out;
  for (size_t i = 0; i < lm.layers.size(); ++i) {
    const std::string p = "model.layers." + std::to_string(lm.first_layer + int64_t(i));
    const model::DecoderLayer& l = lm.layers[i];
    if (const auto* a = std::get_if<model::Attention>(&l.attn)) {
      for (const auto& [n, w] : {std::pair{"q", &a->q}, {"k", &a->k}, {"v", &a->v}, {"o", &a->o}})
        out.emplace_back(p + ".self_attn." + n + "_proj", w);
    } else {
      const auto& m = std::get<model::Mla>(l.attn);
      const std::pair<const char*, const ops::Weight*> mla[] = {
          {"q_proj", &m.q},       {"q_a_proj", &m.q_a},  {"q_b_proj", &m.q_b},
          {"kv_a_proj_with_mqa", &m.kv_a}, {"kv_b_proj", &m.kv_b}, {"o_proj", &m.o}};
      for (const auto& [n, w] : mla)
        if (w->defined()) out.emplace_back(p + ".self_attn." + n, w);
    }
    const auto add_mlp = [&](const std::string& q, const model::Mlp& m) {
      out.emplace_back(q + ".gate_proj", &m.gate);
      out.emplace_back(q + ".up_proj", &m.up);
      out.emplace_back(q + ".down_proj", &m.down);
    };
    if (const auto* m = std::get_if<model::Mlp>(&l.ffn)) {
      add_mlp(p + ".mlp", *m);
      continue;
    }
    const auto& moe = std::get<model::Moe>(l.ffn);
    const ops::MoeExperts& x = moe.experts;
    for (int32_t e = 0; e < x.n_local(); ++e) {
      const std::string q = p + ".mlp.experts." + std::to_string(x.first_expert + e);
      if (!x.gate_up.empty()) {  // gpt-oss
        out.emplace_back(p + ".mlp.experts", &x.gate_up[size_t(e)]);
        out.emplace_back(p + ".mlp.experts", &x.down[size_t(e)]);
      } else {
        out.emplace_back(q + ".gate_proj", &x.gate[size_t(e)]);
        out.emplace_back(q + ".up_proj", &x.up[size_t(e)]);
        out.emplace_back(q + ".down_proj", &x.down[size_t(e)]);
      }
    }
    if (moe.shared) add_mlp(p + ".mlp.shared_experts", *moe.shared);
  }
  return out;
}

// The standard deviation of the dequantized weight (formats::dequantize_row).
double dequantized_stddev(const formats::QuantizedTensor& q) {
  std::vector<float> row(size_t(q.n_in));
  double sum = 0.0, sq = 0.0;
  for (int64_t o = 0; o < q.n_out; ++o) {
    formats::dequantize_row(q, o, row.data());
    for (float v : row) {
      EXPECT_TRUE(std::isfinite(v));
      sum += v;
      sq += double(v) * v;
    }
  }
  const double n = double(q.n_out * q.n_in), mean = sum / n;
  return std::sqrt(sq / n - mean * mean);
}

const std::vector<std::string> kConfigs = {
    "llama_fp8_block",  "llama_fp8_channel", "llama_fp8_tensor",     "llama_nvfp4",    "llama_int4",
    "deepseek_v3_fp8_block", "deepseek_v3_int4", "glm4_moe_fp8_channel", "glm4_moe_nvfp4", "gpt_oss_mxfp4"};

class DummyQuant : public ::testing::TestWithParam<std::string> {};

TEST_P(DummyQuant, QuantizedLinearsAreQuantizedWithTheBf16DummysSpread) {
  auto m = build(GetParam());
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->quant.quantized());
  int n_quantized = 0;
  for (const auto& [name, w] : linears(m->lm)) {
    // MXFP4 (gpt-oss) quantizes the experts only; the loader reads other linears dense.
    const bool want = m->quant.is_quantized(name) &&
                      (m->quant.kind != QuantKind::kMxfp4 || name.ends_with(".mlp.experts"));
    ASSERT_EQ(w->quantized(), want) << name;
    if (!want) continue;
    ++n_quantized;
    const formats::QuantizedTensor& q = w->quant;
    EXPECT_EQ(q.kind, m->quant.kind) << name;
    const double want_sd = 1.0 / std::sqrt(double(q.n_in));
    const double sd = dequantized_stddev(q);
    EXPECT_NEAR(sd / want_sd, 1.0, 0.2) << name << " [" << q.n_out << ", " << q.n_in << "]: " << sd;
  }
  EXPECT_GT(n_quantized, 0);
}

// The CPU reference, recording which experts each MoE layer routes tokens to: for every
// expert e the layer also runs with e alone held (as an expert-parallel rank holding
// only e would), and a token whose output is not zero there was routed to e.
struct Routing {
  std::map<const ops::Weight*, std::set<int32_t>> experts;  // per router (layer)
  int n_quantized_uploads = 0;
};

class RoutingProbe final : public testing::DelegatingBackend {
 public:
  explicit RoutingProbe(Routing& r) : DelegatingBackend(cpu::make_cpu_backend(2)), r_(r) {}
  std::string name() const override { return "routing-probe-cpu"; }
  Result<formats::QuantizedTensor> upload_quantized(const formats::QuantizedTensor& q) override {
    ++r_.n_quantized_uploads;
    return inner_->upload_quantized(q);
  }
  void moe(const ops::MoeArgs& a) override {
    const int64_t n_tokens = a.x.dim(0), d = a.out.dim(1);
    std::vector<float> y(size_t(n_tokens * d));
    for (int32_t e = 0; e < a.experts->n_local(); ++e) {
      ops::MoeExperts one = *a.experts;
      for (auto* v : {&one.gate_up, &one.gate, &one.up, &one.down})
        if (!v->empty()) *v = {(*v)[size_t(e)]};
      one.first_expert = a.experts->first_expert + e;
      ops::MoeArgs only = a;
      only.experts = &one;
      only.out = inner_->alloc(a.out.dtype, a.out.shape);
      inner_->moe(only);
      inner_->to_host_f32(only.out, y.data());
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t i = 0; i < d; ++i)
          if (y[size_t(t * d + i)] != 0.0f) {
            r_.experts[a.router].insert(one.first_expert);
            break;
          }
    }
    inner_->moe(a);
  }

 private:
  Routing& r_;
};

TEST_P(DummyQuant, LoadsThroughTheEngineGeneratesAndRoutesOverManyExperts) {
  Routing routing;
  const runtime::EngineOptions options = {.max_model_len = 128, .max_num_seqs = 2, .load_format = LoadFormat::kDummy};
  auto e = runtime::Engine::load(config_path(GetParam()), std::make_unique<RoutingProbe>(routing), options);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_GT(routing.n_quantized_uploads, 0) << "the engine passes quantization_config to the dummy loader";
  const std::vector<int32_t> prompt = {5, 17, 100, 42, 7, 9, 200, 3};
  auto g = (*e)->generate(prompt, 32, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_EQ(g->tokens.size(), 32u);
  EXPECT_GT(std::set<int32_t>(g->tokens.begin(), g->tokens.end()).size(), 4u) << "varied tokens";
  const int64_t n_experts = (*e)->config().n_experts;
  if (n_experts > 0) {
    ASSERT_FALSE(routing.experts.empty());
    for (const auto& [router, experts] : routing.experts) {
      // 40 tokens over 4 experts, top-2 (grouped routers: top-1 of 2 groups of 2).
      EXPECT_GE(int64_t(experts.size()), n_experts - 1) << "a layer's tokens go to " << experts.size() << " of "
                                                         << n_experts << " experts";
    }
  }
  // The same seed, the same model: a second load gives the same logits.
  auto again = runtime::Engine::load(config_path(GetParam()), cpu::make_cpu_backend(2), options);
  ASSERT_TRUE(again.ok());
  auto la = (*e)->logits(prompt), lb = (*again)->logits(prompt);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);
}

TEST_P(DummyQuant, TensorParallelRanksLoadTheirCutAndGenerate) {
  std::vector<std::unique_ptr<ops::Backend>> backends;
  for (int r = 0; r < 2; ++r) backends.push_back(cpu::make_cpu_backend(1));
  auto e = runtime::Engine::load(config_path(GetParam()), std::move(backends),
                                 {.max_model_len = 64, .max_num_seqs = 1, .load_format = LoadFormat::kDummy,
                                  .parallel = {.tensor_parallel = 2}});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto g = (*e)->generate({1, 2, 3, 4}, 6, {.temperature = 0.0f}, /*ignore_eos=*/true);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->tokens.size(), 6u);

  // Rank 1's part: half the heads, MLP / expert columns split, at the whole matrix's spread.
  auto m = build(GetParam(), {.tp_rank = 1, .tp_size = 2});
  ASSERT_TRUE(m);
  auto whole = build(GetParam());
  ASSERT_TRUE(whole);
  const auto cut = linears(m->lm), full = linears(whole->lm);
  ASSERT_EQ(cut.size(), full.size());
  int n_halved = 0;
  for (size_t i = 0; i < cut.size(); ++i) {
    const ops::Weight& w = *cut[i].second;
    const ops::Weight& f = *full[i].second;
    ASSERT_EQ(w.quantized(), f.quantized()) << cut[i].first;
    // Halved, or whole on every rank (MLA's latent projections).
    const bool halved = w.n_out() * w.n_in() * 2 == f.n_out() * f.n_in();
    EXPECT_TRUE(halved || (w.n_out() == f.n_out() && w.n_in() == f.n_in())) << cut[i].first;
    n_halved += halved;
    if (!w.quantized()) continue;
    const double sd = dequantized_stddev(w.quant) * std::sqrt(double(f.n_in()));
    EXPECT_NEAR(sd, 1.0, 0.2) << cut[i].first;
  }
  EXPECT_GT(n_halved, 0);
}

INSTANTIATE_TEST_SUITE_P(Configs, DummyQuant, ::testing::ValuesIn(kConfigs),
                         [](const auto& info) { return info.param; });

TEST(DummyQuant, CutsFollowTheCheckpointsScaleBlocks) {
  auto be = cpu::make_cpu_backend(1);
  // FP8 block: a cut through a 128 x 128 block refines the grid, as a checkpoint's would.
  const std::string fp8_path = config_path("llama_fp8_block");
  auto fp8 = formats::parse_quant_config(testing::read_text_file(fp8_path), "", fp8_path);
  ASSERT_TRUE(fp8.ok());
  model::WeightLoader a = model::WeightLoader::dummy(*be, 1, *fp8);
  auto w = a.linear("model.layers.0.mlp.down_proj", 256, 384, false, model::Part::cols(64, 64));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->quant.n_in, 64);
  EXPECT_EQ(w->quant.block_k, 64);
  EXPECT_EQ(w->quant.scale.dim(1), 1);
  // MXFP4: a cut inside a 32-input block is an error naming the weight.
  const std::string mx_path = config_path("gpt_oss_mxfp4");
  auto mx = formats::parse_quant_config(testing::read_text_file(mx_path), "", mx_path);
  ASSERT_TRUE(mx.ok());
  model::WeightLoader b = model::WeightLoader::dummy(*be, 1, *mx);
  auto bad = b.mxfp4_experts("model.layers.0.mlp.experts.down_proj", 4, 256, 256, 0, 4, model::Part::cols(16, 16));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cannot split model.layers.0.mlp.experts.down_proj"), std::string::npos)
      << bad.status().to_string();
  auto good = b.mxfp4_experts("model.layers.0.mlp.experts.down_proj", 4, 256, 256, 1, 2, model::Part::cols(128, 128));
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  ASSERT_EQ(good->size(), 2u);
  EXPECT_EQ((*good)[0].n_in, 128);
  EXPECT_EQ((*good)[0].data.dim(1), 4);
  EXPECT_NE(std::memcmp((*good)[0].data.data, (*good)[1].data.data, (*good)[0].data.nbytes()), 0)
      << "each expert its own values";
}

// configs/gpt-oss-20b.json is the release's (MXFP4 experts: a dummy load is MXFP4);
// gpt-oss-20b-bf16.json the same model without quantization_config (the bf16 baseline).
TEST(ShippedConfigs, GptOss20bComesInMxfp4AndBf16) {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/configs/";
  const std::string mx = testing::read_text_file(dir + "gpt-oss-20b.json");
  const std::string bf = testing::read_text_file(dir + "gpt-oss-20b-bf16.json");
  auto qm = formats::parse_quant_config(mx, "", "gpt-oss-20b.json");
  auto qb = formats::parse_quant_config(bf, "", "gpt-oss-20b-bf16.json");
  ASSERT_TRUE(qm.ok() && qb.ok());
  EXPECT_EQ(qm->kind, QuantKind::kMxfp4);
  EXPECT_TRUE(qm->is_quantized("model.layers.0.mlp.experts"));
  EXPECT_FALSE(qm->is_quantized("model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(qb->quantized());
  nlohmann::json a = nlohmann::json::parse(mx), b = nlohmann::json::parse(bf);
  a.erase("quantization_config");
  EXPECT_EQ(a, b) << "the same model otherwise";
}

// random_quantized at a full-size shape: the asked spread, zero mean, the same bytes
// whatever the threads.
TEST(RandomQuantized, SpreadAndDeterminismAtFullSize) {
  ThreadPool pool(4);
  const struct {
    QuantKind kind;
    int32_t block_n, block_k;
  } cases[] = {{QuantKind::kFp8Block, 128, 128}, {QuantKind::kFp8Channel, 0, 0}, {QuantKind::kFp8Tensor, 0, 0},
               {QuantKind::kMxfp4, 0, 0},        {QuantKind::kNvfp4, 0, 0},      {QuantKind::kInt4Group, 0, 32}};
  for (const auto& c : cases) {
    const model::RandomQuantArgs args = {.kind = c.kind, .n_out = 512, .n_in = 2880, .block_n = c.block_n,
                                         .block_k = c.block_k, .stddev = 0.0186f, .seed = 42};
    const formats::QuantizedTensor a = model::random_quantized(args, &pool);
    const formats::QuantizedTensor b = model::random_quantized(args, nullptr);
    const std::string what(formats::quant_kind_name(c.kind));
    ASSERT_EQ(a.data.nbytes(), b.data.nbytes()) << what;
    EXPECT_EQ(std::memcmp(a.data.data, b.data.data, a.data.nbytes()), 0) << what;
    EXPECT_EQ(std::memcmp(a.scale.data, b.scale.data, a.scale.nbytes()), 0) << what;
    EXPECT_NEAR(dequantized_stddev(a) / 0.0186, 1.0, 0.05) << what;
    double sum = 0.0;
    std::vector<float> row(2880);
    for (int64_t o = 0; o < a.n_out; ++o) {
      formats::dequantize_row(a, o, row.data());
      for (float v : row) sum += v;
    }
    EXPECT_LT(std::abs(sum / double(a.n_out * a.n_in)), 0.01 * 0.0186) << what << ": zero mean";
    EXPECT_GT(model::random_code_rms(c.kind), 0.0) << what;
  }
}

}  // namespace
}  // namespace kiln
