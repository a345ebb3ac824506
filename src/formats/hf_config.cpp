#include "formats/hf_config.h"

#include "core/json_bounded.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace kiln::formats {
namespace {

using nlohmann::json;

// Typed access with a clear error naming the key and the file.
class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  Status get_int(const char* key, int64_t* out, bool required = false) const {
    if (!has(key)) return required ? missing(key) : Status::Ok();
    const json& v = j_[key];
    if (v.is_number_integer() || v.is_number_unsigned()) {
      *out = v.get<int64_t>();
      return Status::Ok();
    }
    if (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>()))) {
      *out = int64_t(v.get<double>());
      return Status::Ok();
    }
    return wrong_type(key, "an integer");
  }
  Status get_double(const char* key, double* out) const {
    if (!has(key)) return Status::Ok();
    if (!j_[key].is_number()) return wrong_type(key, "a number");
    *out = j_[key].get<double>();
    return Status::Ok();
  }
  Status get_opt_double(const char* key, std::optional<double>* out) const {
    if (!has(key)) return Status::Ok();
    if (!j_[key].is_number()) return wrong_type(key, "a number");
    *out = j_[key].get<double>();
    return Status::Ok();
  }
  Status get_bool(const char* key, bool* out) const {
    if (!has(key)) return Status::Ok();
    if (!j_[key].is_boolean()) return wrong_type(key, "true or false");
    *out = j_[key].get<bool>();
    return Status::Ok();
  }
  Status get_string(const char* key, std::string* out) const {
    if (!has(key)) return Status::Ok();
    if (!j_[key].is_string()) return wrong_type(key, "a string");
    *out = j_[key].get<std::string>();
    return Status::Ok();
  }
  // An int or a list of ints (eos_token_id).
  Status get_int_list(const char* key, std::vector<int64_t>* out) const {
    if (!has(key)) return Status::Ok();
    const json& v = j_[key];
    if (v.is_number_integer()) {
      out->assign(1, v.get<int64_t>());
      return Status::Ok();
    }
    if (!v.is_array()) return wrong_type(key, "an integer or a list of integers");
    out->clear();
    for (const json& e : v) {
      if (!e.is_number_integer()) return wrong_type(key, "a list of integers");
      out->push_back(e.get<int64_t>());
    }
    return Status::Ok();
  }
  Status get_string_list(const char* key, std::vector<std::string>* out) const {
    if (!has(key)) return Status::Ok();
    if (!j_[key].is_array()) return wrong_type(key, "a list of strings");
    out->clear();
    for (const json& e : j_[key]) {
      if (!e.is_string()) return wrong_type(key, "a list of strings");
      out->push_back(e.get<std::string>());
    }
    return Status::Ok();
  }

  Status missing(const char* key) const {
    return corrupt(source_ + ": required key \"" + key + "\" is missing");
  }
  Status wrong_type(const char* key, const char* expected) const {
    return corrupt(source_ + ": key \"" + key + "\" should be " + expected + ", got " +
                   j_[key].dump());
  }

 private:
  const json& j_;
  const std::string& source_;
};

Status parse_rope(const json& root, const std::string& source, RopeConfig* rope) {
  Reader top(root, source);
  // Defaults from the legacy top-level keys; the rope dict overrides them.
  KILN_RETURN_IF_ERROR(top.get_double("rope_theta", &rope->theta));
  KILN_RETURN_IF_ERROR(top.get_double("partial_rotary_factor", &rope->partial_rotary_factor));
  int64_t max_pos = 0;
  KILN_RETURN_IF_ERROR(top.get_int("max_position_embeddings", &max_pos));
  rope->original_max_position_embeddings = max_pos;
  KILN_RETURN_IF_ERROR(
      top.get_int("original_max_position_embeddings", &rope->original_max_position_embeddings));

  const json* dict = nullptr;
  const char* dict_key = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (root.contains(key) && !root[key].is_null()) {
      dict = &root[key];
      dict_key = key;
      break;
    }
  }
  if (dict == nullptr) return Status::Ok();
  if (!dict->is_object()) {
    return corrupt(source + ": \"" + dict_key + "\" should be an object, got " + dict->dump());
  }
  if (dict->contains("full_attention") || dict->contains("sliding_attention")) {
    return unsupported(source + ": per-layer-type \"" + dict_key +
                       "\" is not supported by kiln's model families");
  }
  const std::string ctx = source + " (" + dict_key + ")";
  Reader r(*dict, ctx);
  std::string type;
  KILN_RETURN_IF_ERROR(r.get_string("rope_type", &type));
  if (type.empty()) KILN_RETURN_IF_ERROR(r.get_string("type", &type));
  if (!type.empty()) rope->type = type;
  KILN_RETURN_IF_ERROR(r.get_double("rope_theta", &rope->theta));
  KILN_RETURN_IF_ERROR(r.get_double("partial_rotary_factor", &rope->partial_rotary_factor));
  KILN_RETURN_IF_ERROR(r.get_double("factor", &rope->factor));
  KILN_RETURN_IF_ERROR(
      r.get_int("original_max_position_embeddings", &rope->original_max_position_embeddings));
  KILN_RETURN_IF_ERROR(r.get_double("low_freq_factor", &rope->low_freq_factor));
  KILN_RETURN_IF_ERROR(r.get_double("high_freq_factor", &rope->high_freq_factor));
  KILN_RETURN_IF_ERROR(r.get_opt_double("attention_factor", &rope->attention_factor));
  KILN_RETURN_IF_ERROR(r.get_double("beta_fast", &rope->beta_fast));
  KILN_RETURN_IF_ERROR(r.get_double("beta_slow", &rope->beta_slow));
  KILN_RETURN_IF_ERROR(r.get_opt_double("mscale", &rope->mscale));
  KILN_RETURN_IF_ERROR(r.get_opt_double("mscale_all_dim", &rope->mscale_all_dim));
  KILN_RETURN_IF_ERROR(r.get_bool("truncate", &rope->truncate));

  if (rope->type != "default" && rope->type != "linear" && rope->type != "llama3" &&
      rope->type != "yarn") {
    return unsupported(ctx + ": rope type \"" + rope->type +
                       "\" is not supported (supported: default, linear, llama3, yarn)");
  }
  if (rope->theta <= 0) return corrupt(ctx + ": rope_theta must be positive");
  if (rope->type != "default" && rope->factor <= 0) {
    return corrupt(ctx + ": rope factor must be positive");
  }
  if ((rope->type == "llama3" || rope->type == "yarn") && rope->original_max_position_embeddings <= 0) {
    return corrupt(ctx + ": " + rope->type + " rope needs original_max_position_embeddings");
  }
  return Status::Ok();
}

// The DSA indexer keys, and which layers run their own indexer (GlmMoeDsaConfig's
// __post_init__ in transformers 5.17: indexer_types, else index_topk_pattern, else layer
// i is "full" when max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0).
Status parse_indexer(const json& root, const Reader& r, const std::string& source, ModelConfig* c) {
  KILN_RETURN_IF_ERROR(r.get_int("index_topk", &c->index_topk));
  KILN_RETURN_IF_ERROR(r.get_int("index_head_dim", &c->d_index));
  KILN_RETURN_IF_ERROR(r.get_int("index_n_heads", &c->n_index_heads));
  if (c->index_topk <= 0) return Status::Ok();
  if (c->d_index <= 0 || c->n_index_heads <= 0) {
    return corrupt(source + ": index_topk needs positive index_head_dim and index_n_heads");
  }
  KILN_RETURN_IF_ERROR(r.get_string_list("indexer_types", &c->indexer_types));
  if (c->indexer_types.empty() && root.contains("index_topk_pattern") && !root["index_topk_pattern"].is_null()) {
    const json& pattern = root["index_topk_pattern"];
    if (pattern.is_string()) {
      for (char ch : pattern.get<std::string>()) {
        if (ch != 'F' && ch != 'S') return corrupt(source + ": index_topk_pattern has '" + std::string(1, ch) + "' (F or S expected)");
        c->indexer_types.push_back(ch == 'F' ? "full" : "shared");
      }
    } else {
      KILN_RETURN_IF_ERROR(r.get_string_list("index_topk_pattern", &c->indexer_types));
    }
  }
  if (c->indexer_types.empty()) {
    int64_t freq = 1, offset = 2;
    KILN_RETURN_IF_ERROR(r.get_int("index_topk_freq", &freq));
    KILN_RETURN_IF_ERROR(r.get_int("index_skip_topk_offset", &offset));
    freq = std::max<int64_t>(freq, 1);
    for (int64_t i = 0; i < c->n_layers; ++i)
      c->indexer_types.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
  }
  if (int64_t(c->indexer_types.size()) != c->n_layers) {
    return corrupt(source + ": indexer_types has " + std::to_string(c->indexer_types.size()) + " entries for " +
                   std::to_string(c->n_layers) + " layers");
  }
  for (const std::string& t : c->indexer_types) {
    if (t != "full" && t != "shared") return corrupt(source + ": indexer type \"" + t + "\" (full or shared expected)");
  }
  if (c->indexer_types[0] != "full") return corrupt(source + ": the first layer's indexer must be \"full\"");
  return Status::Ok();
}

}  // namespace

int64_t ModelConfig::sliding_window_of_layer(int64_t i) const {
  if (!sliding_window || *sliding_window <= 0) return 0;
  if (layer_types.empty()) return *sliding_window;
  if (i < 0 || size_t(i) >= layer_types.size()) return 0;  // an MTP layer after a --num-layers cut
  return layer_types[size_t(i)] == "sliding_attention" ? *sliding_window : 0;
}

Result<ModelConfig> parse_config(const std::string& json_text, const std::string& source) {
  std::string why;
  json root = parse_json_explained<json>(json_text, &why);
  if (!why.empty()) return corrupt(source + ": " + why);
  if (!root.is_object()) return corrupt(source + ": top level should be a JSON object");

  ModelConfig c;
  Reader r(root, source);
  if (root.contains("architectures") && root["architectures"].is_array() &&
      !root["architectures"].empty() && root["architectures"][0].is_string()) {
    c.architecture = root["architectures"][0].get<std::string>();
  } else {
    return corrupt(source + ": \"architectures\" should be a non-empty list of strings");
  }
  // A vision-language checkpoint: its language model is what a text server runs.
  if (root.contains("text_config") && root["text_config"].is_object() &&
      c.architecture.ends_with("ForConditionalGeneration")) {
    json text = root["text_config"];
    text["architectures"] = root["architectures"];
    if (!text.contains("tie_word_embeddings") && root.contains("tie_word_embeddings"))
      text["tie_word_embeddings"] = root["tie_word_embeddings"];
    KILN_ASSIGN_OR_RETURN(ModelConfig lm, parse_config(text.dump(), source + " (text_config)"));
    lm.language_model_prefix = "model.language_model.";
    lm.raw = std::move(root);  // quantization_config and the like stay at the top
    return lm;
  }
  KILN_RETURN_IF_ERROR(r.get_string("model_type", &c.model_type));
  KILN_RETURN_IF_ERROR(r.get_int("vocab_size", &c.vocab_size, true));
  KILN_RETURN_IF_ERROR(r.get_int("hidden_size", &c.d_model, true));
  KILN_RETURN_IF_ERROR(r.get_int("num_hidden_layers", &c.n_layers, true));
  KILN_RETURN_IF_ERROR(r.get_int("num_nextn_predict_layers", &c.n_mtp_layers));
  if (c.n_mtp_layers == 0) KILN_RETURN_IF_ERROR(r.get_int("mtp_num_hidden_layers", &c.n_mtp_layers));  // Qwen3-Next, Qwen3.5
  if (c.n_mtp_layers < 0) return corrupt(source + ": num_nextn_predict_layers must not be negative");
  c.mtp_first_layer = c.n_layers;
  KILN_RETURN_IF_ERROR(r.get_int("num_attention_heads", &c.n_heads, true));
  c.n_kv_heads = c.n_heads;
  KILN_RETURN_IF_ERROR(r.get_int("num_key_value_heads", &c.n_kv_heads));
  if (c.n_heads <= 0 || c.d_model <= 0 || c.n_layers <= 0 || c.vocab_size <= 0 || c.n_kv_heads <= 0) {
    return corrupt(source + ": hidden_size, num_hidden_layers, num_attention_heads, "
                   "num_key_value_heads and vocab_size must be positive");
  }
  c.d_head = c.d_model / c.n_heads;
  KILN_RETURN_IF_ERROR(r.get_int("head_dim", &c.d_head));
  KILN_RETURN_IF_ERROR(r.get_int("intermediate_size", &c.d_ff));
  KILN_RETURN_IF_ERROR(r.get_int("max_position_embeddings", &c.max_position_embeddings));
  KILN_RETURN_IF_ERROR(r.get_double("rms_norm_eps", &c.rms_norm_eps));
  KILN_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &c.tie_word_embeddings));
  KILN_RETURN_IF_ERROR(r.get_bool("attention_bias", &c.attention_bias));
  KILN_RETURN_IF_ERROR(r.get_bool("mlp_bias", &c.mlp_bias));
  KILN_RETURN_IF_ERROR(r.get_bool("use_qk_norm", &c.use_qk_norm));
  KILN_RETURN_IF_ERROR(parse_rope(root, source, &c.rope));

  int64_t window = 0;
  KILN_RETURN_IF_ERROR(r.get_int("sliding_window", &window));
  bool use_sliding = true;  // Qwen2/3 gate the window with use_sliding_window
  KILN_RETURN_IF_ERROR(r.get_bool("use_sliding_window", &use_sliding));
  if (window > 0 && use_sliding) c.sliding_window = window;
  KILN_RETURN_IF_ERROR(r.get_string_list("layer_types", &c.layer_types));
  if (!c.layer_types.empty() && int64_t(c.layer_types.size()) != c.n_layers) {
    return corrupt(source + ": layer_types has " + std::to_string(c.layer_types.size()) +
                   " entries for " + std::to_string(c.n_layers) + " layers");
  }

  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    if (c.n_experts == 0) KILN_RETURN_IF_ERROR(r.get_int(key, &c.n_experts));
  }
  KILN_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", &c.n_experts_active));
  KILN_RETURN_IF_ERROR(r.get_int("moe_intermediate_size", &c.d_ff_expert));
  KILN_RETURN_IF_ERROR(r.get_int("n_shared_experts", &c.n_shared_experts));
  KILN_RETURN_IF_ERROR(r.get_int("first_k_dense_replace", &c.first_k_dense_replace));
  KILN_RETURN_IF_ERROR(r.get_int("decoder_sparse_step", &c.decoder_sparse_step));
  KILN_RETURN_IF_ERROR(r.get_int("moe_layer_freq", &c.moe_layer_freq));
  KILN_RETURN_IF_ERROR(r.get_int_list("mlp_only_layers", &c.mlp_only_layers));
  KILN_RETURN_IF_ERROR(r.get_int("n_group", &c.n_group));
  KILN_RETURN_IF_ERROR(r.get_int("topk_group", &c.topk_group));
  KILN_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", &c.norm_topk_prob));
  KILN_RETURN_IF_ERROR(r.get_double("routed_scaling_factor", &c.routed_scaling_factor));
  if (c.n_experts < 0 || c.n_experts_active < 0 || c.n_experts_active > c.n_experts) {
    return corrupt(source + ": num_experts_per_tok (" + std::to_string(c.n_experts_active) +
                   ") must be between 0 and the number of experts (" + std::to_string(c.n_experts) + ")");
  }
  if (c.n_group <= 0 || c.topk_group <= 0 || c.topk_group > c.n_group ||
      (c.n_experts > 0 && c.n_experts % c.n_group != 0)) {
    return corrupt(source + ": n_group / topk_group do not divide the experts (" +
                   std::to_string(c.n_experts) + " experts, n_group " + std::to_string(c.n_group) +
                   ", topk_group " + std::to_string(c.topk_group) + ")");
  }

  // MLA (DeepSeek, Kimi, GLM-5) and Gated DeltaNet (Qwen3-Next, Qwen3.5) widths.
  const std::pair<const char*, int64_t*> widths[] = {
      {"q_lora_rank", &c.q_lora_rank},
      {"kv_lora_rank", &c.d_latent},
      {"qk_nope_head_dim", &c.d_nope},
      {"qk_rope_head_dim", &c.d_rope},
      {"v_head_dim", &c.d_v},
      {"linear_num_key_heads", &c.linear_n_k_heads},
      {"linear_num_value_heads", &c.linear_n_v_heads},
      {"linear_key_head_dim", &c.linear_d_k},
      {"linear_value_head_dim", &c.linear_d_v},
      {"linear_conv_kernel_dim", &c.linear_conv_kernel},
      {"shared_expert_intermediate_size", &c.d_ff_shared_expert},
  };
  for (const auto& [key, field] : widths) KILN_RETURN_IF_ERROR(r.get_int(key, field));
  KILN_RETURN_IF_ERROR(r.get_bool("rope_interleave", &c.rope_interleave));
  KILN_RETURN_IF_ERROR(parse_indexer(root, r, source, &c));
  KILN_RETURN_IF_ERROR(r.get_string_list("mlp_layer_types", &c.mlp_layer_types));
  if (!c.mlp_layer_types.empty() && int64_t(c.mlp_layer_types.size()) != c.n_layers) {
    return corrupt(source + ": mlp_layer_types has " + std::to_string(c.mlp_layer_types.size()) +
                   " entries for " + std::to_string(c.n_layers) + " layers");
  }

  int64_t bos = -1;
  KILN_RETURN_IF_ERROR(r.get_int("bos_token_id", &bos));
  if (bos >= 0) c.bos_token_id = bos;
  KILN_RETURN_IF_ERROR(r.get_int_list("eos_token_id", &c.eos_token_ids));

  c.raw = std::move(root);
  return c;
}

Result<ModelConfig> load_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream f(path);
  if (!f) return not_found("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  KILN_ASSIGN_OR_RETURN(ModelConfig c, parse_config(ss.str(), path));
  const std::string gen_path = dir + "/generation_config.json";
  std::ifstream g(gen_path);
  if (!g) return c;
  std::stringstream gs;
  gs << g.rdbuf();
  std::string why;
  const json gen = parse_json_explained<json>(gs.str(), &why);
  if (!why.empty()) return corrupt(gen_path + ": " + why);
  if (!gen.is_object()) return corrupt(gen_path + " is not a JSON object");
  KILN_RETURN_IF_ERROR(Reader(gen, gen_path).get_int_list("eos_token_id", &c.generation_eos_token_ids));
  return c;
}

}  // namespace kiln::formats
