#include "formats/quant_config.h"

#include <filesystem>
#include <fnmatch.h>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_bounded.h"

namespace kiln::formats {
namespace {

using nlohmann::json;

std::vector<std::string> string_list(const json& j, const char* key) {
  std::vector<std::string> out;
  if (j.contains(key) && j[key].is_array())
    for (const json& e : j[key])
      if (e.is_string()) out.push_back(e.get<std::string>());
  return out;
}

bool matches(const std::string& pattern, const std::string& name) {
  if (pattern.rfind("re:", 0) == 0) {
    // compressed-tensors applies Python's re.match: anchored at the start only.
    try {
      return std::regex_search(name, std::regex(pattern.substr(3)), std::regex_constants::match_continuous);
    } catch (const std::regex_error&) {
      return false;  // validated at parse time
    }
  }
  if (pattern == name) return true;
  // Globs and module prefixes: "lm_head" covers "lm_head", "model.layers.*.self_attn"
  // covers "model.layers.0.self_attn.q_proj".
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0 ||
         fnmatch((pattern + ".*").c_str(), name.c_str(), 0) == 0;
}

Status parse_fp8(const json& q, const std::string& src, QuantConfig& c) {
  c.kind = QuantKind::kFp8Block;
  // MiniMax-M2 spells it with torch's dtype name.
  if (q.contains("fmt") && q["fmt"] != "e4m3" && q["fmt"] != "float8_e4m3fn") {
    return unsupported(src + ": fp8 fmt " + q["fmt"].dump() + " (only e4m3 is supported)");
  }
  const json bs = q.value("weight_block_size", json());
  if (!bs.is_array() || bs.size() != 2 || !bs[0].is_number_integer() || !bs[1].is_number_integer() ||
      bs[0].get<int>() <= 0 || bs[1].get<int>() <= 0) {
    return corrupt(src + ": fp8 quantization_config needs weight_block_size [n, k], got " + bs.dump());
  }
  c.block_n = bs[0].get<int32_t>();
  c.block_k = bs[1].get<int32_t>();
  c.ignore = string_list(q, "modules_to_not_convert");
  return Status::Ok();
}

Status parse_compressed_tensors(const json& q, const std::string& src, QuantConfig& c) {
  const std::string format = q.value("format", "");
  const json groups = q.value("config_groups", json());
  if (!groups.is_object() || groups.size() != 1) {
    return unsupported(src + ": compressed-tensors with " + std::to_string(groups.size()) +
                       " config_groups (kiln supports exactly one)");
  }
  const json g = groups.begin().value();  // a copy: GCC 13 flags a reference via the iterator as dangling
  c.targets = string_list(g, "targets");
  c.ignore = string_list(q, "ignore");
  const json w = g.value("weights", json());
  if (!w.is_object()) return corrupt(src + ": compressed-tensors group without \"weights\"");
  const int bits = w.value("num_bits", 0);
  const std::string type = w.value("type", ""), strategy = w.value("strategy", "");
  if (w.value("symmetric", true) == false) {
    return unsupported(src + ": asymmetric compressed-tensors weights (zero points) are not supported");
  }
  if (format == "float-quantized" && bits == 8 && type == "float") {
    if (strategy == "channel") {
      c.kind = QuantKind::kFp8Channel;
    } else if (strategy == "tensor") {
      c.kind = QuantKind::kFp8Tensor;
    } else if (strategy == "block") {
      const json bs = w.value("block_structure", json());
      if (!bs.is_array() || bs.size() != 2) return corrupt(src + ": block strategy needs block_structure [n, k]");
      c.kind = QuantKind::kFp8Block;
      c.block_n = bs[0].get<int32_t>();
      c.block_k = bs[1].get<int32_t>();
    } else {
      return unsupported(src + ": compressed-tensors FP8 strategy \"" + strategy + "\"");
    }
    return Status::Ok();
  }
  if (format == "pack-quantized" && bits == 4 && type == "int") {
    if (strategy != "group") {
      return unsupported(src + ": compressed-tensors INT4 strategy \"" + strategy + "\" (only group)");
    }
    c.kind = QuantKind::kInt4Group;
    c.group_size = w.value("group_size", 0);
    c.block_k = c.group_size;
    if (c.group_size <= 0 || c.group_size % 8 != 0) {
      return corrupt(src + ": INT4 group_size " + std::to_string(c.group_size) + " must be a positive multiple of 8");
    }
    return Status::Ok();
  }
  return unsupported(src + ": compressed-tensors format \"" + format + "\" with " + std::to_string(bits) +
                     "-bit " + type + " weights is not supported (supported: float-quantized FP8, "
                     "pack-quantized INT4)");
}

Status parse_modelopt(const json& q, const std::string& src, QuantConfig& c) {
  // Either transformers' flattened form or hf_quant_config.json's {"quantization": {...}}.
  const json& m = q.contains("quantization") ? q["quantization"] : q;
  const std::string algo = m.value("quant_algo", "");
  if (algo != "NVFP4") {
    return unsupported(src + ": ModelOpt quant_algo \"" + algo + "\" is not supported (supported: NVFP4)");
  }
  c.kind = QuantKind::kNvfp4;
  c.group_size = m.value("group_size", 16);
  if (c.group_size != 16) {
    return unsupported(src + ": NVFP4 group_size " + std::to_string(c.group_size) + " (the format fixes 16)");
  }
  c.ignore = string_list(m, "exclude_modules");
  return Status::Ok();
}

Result<json> read_json_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string why;
  json j = parse_json_explained<json>(ss.str(), &why);
  if (!why.empty()) return corrupt(path + ": " + why);
  return j;
}

}  // namespace

bool QuantConfig::is_quantized(const std::string& name) const {
  if (!quantized()) return false;
  for (const std::string& p : ignore)
    if (matches(p, name)) return false;
  if (targets.empty()) return true;
  for (const std::string& t : targets)
    if (t == "Linear" || matches(t, name)) return true;
  return false;
}

Result<QuantConfig> parse_quant_config(const std::string& config_json, const std::string& hf_quant_json,
                                       const std::string& source) {
  QuantConfig c;
  std::string why;
  json cfg = parse_json_explained<json>(config_json, &why);
  if (!why.empty()) return corrupt(source + ": " + why);
  if (!cfg.is_object()) return corrupt(source + ": top level should be a JSON object");
  json q = cfg.value("quantization_config", json());
  const std::string src = source + " (quantization_config)";
  if (q.is_null() && !hf_quant_json.empty()) {
    q = parse_json_explained<json>(hf_quant_json, &why);
    if (!why.empty()) return corrupt("hf_quant_config.json: " + why);
    if (!q.contains("quant_method")) q["quant_method"] = "modelopt";
  }
  if (q.is_null()) return c;
  if (!q.is_object()) return corrupt(src + ": should be an object");
  c.method = q.value("quant_method", "");
  Status s;
  if (c.method == "fp8") s = parse_fp8(q, src, c);
  else if (c.method == "compressed-tensors") s = parse_compressed_tensors(q, src, c);
  else if (c.method == "modelopt") s = parse_modelopt(q, src, c);
  else if (c.method == "mxfp4") {
    c.kind = QuantKind::kMxfp4;
    c.group_size = 32;
    c.ignore = string_list(q, "modules_to_not_convert");
  } else {
    return unsupported(src + ": quant_method \"" + c.method +
                       "\" is not supported (supported: fp8, compressed-tensors, modelopt, mxfp4)");
  }
  KILN_RETURN_IF_ERROR(s);
  for (const std::string& p : c.ignore) {
    if (p.rfind("re:", 0) != 0) continue;
    try {
      std::regex r(p.substr(3));
    } catch (const std::regex_error& e) {
      return corrupt(src + ": ignore pattern \"" + p + "\" is not a valid regex");
    }
  }
  return c;
}

Result<QuantConfig> load_quant_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream f(path);
  if (!f) return not_found("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string hf_quant;
  if (std::filesystem::exists(dir + "/hf_quant_config.json")) {
    KILN_ASSIGN_OR_RETURN(json j, read_json_file(dir + "/hf_quant_config.json"));
    hf_quant = j.dump();
  }
  return parse_quant_config(ss.str(), hf_quant, path);
}

}  // namespace kiln::formats
