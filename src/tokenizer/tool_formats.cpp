#include "tokenizer/tool_formats.h"

#include <algorithm>

#include "core/json_bounded.h"

namespace kiln::tokenizer::detail {
namespace {

using Json = nlohmann::ordered_json;

bool valid_name(std::string_view name) {
  return !name.empty() && name.find_first_of(" \t\r\n<>{}\"") == std::string_view::npos;
}

// ---- Hermes / Qwen3 ----

std::optional<CallText> parse_hermes_body(std::string_view body) {
  std::optional<Json> call = parse_json_object(trim_space(body));
  if (!call) return std::nullopt;
  auto name = call->find("name");
  if (name == call->end() || !name->is_string() || !valid_name(name->get<std::string>()))
    return std::nullopt;
  auto args = call->find("arguments");
  if (args == call->end()) args = call->find("parameters");
  Json arguments = Json::object();
  if (args != call->end()) {
    if (args->is_object()) {
      arguments = *args;
    } else if (args->is_string()) {  // some fine-tunes double-encode the arguments
      std::optional<Json> inner = parse_json_object(args->get<std::string>());
      if (!inner) return std::nullopt;
      arguments = std::move(*inner);
    } else {
      return std::nullopt;
    }
  }
  return CallText{.name = name->get<std::string>(), .arguments_json = dump_compact(arguments)};
}

// ---- GLM-4.5 / 4.7 ----

// The JSON-schema "type" of parameter `key` of tool `name` in OpenAI tools; null if unknown.
const Json* parameter_type(const Json& tools, std::string_view name, std::string_view key) {
  if (!tools.is_array()) return nullptr;
  for (const Json& tool : tools) {
    const Json& fn = tool.contains("function") ? tool["function"] : tool;
    if (!fn.is_object() || fn.value("name", "") != name) continue;
    auto params = fn.find("parameters");
    if (params == fn.end() || !params->is_object()) return nullptr;
    auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return nullptr;
    auto prop = props->find(std::string(key));
    if (prop == props->end() || !prop->is_object()) return nullptr;
    auto type = prop->find("type");
    return type == prop->end() ? nullptr : &*type;
  }
  return nullptr;
}

bool is_string_type(const Json& type) {
  if (type.is_string()) return type.get<std::string>() == "string";
  if (type.is_array())
    return std::any_of(type.begin(), type.end(), [](const Json& t) { return t == "string"; });
  return false;
}

// GLM renders string arguments raw and others as JSON (its template: `v | tojson if v is
// not string else v`). So: a parameter the schema types as string keeps the exact text;
// otherwise the text is JSON if it parses as JSON, else a string (vLLM glm4_moe, minus
// its ast.literal_eval fallback for Python literals). Values are not trimmed.
Json glm_value(std::string_view text, const Json* type) {
  if (type != nullptr && is_string_type(*type)) return Json(std::string(text));
  Json value = parse_json_bounded<Json>(text);
  if (value.is_discarded()) return Json(std::string(text));
  return value;
}

std::optional<CallText> parse_glm_body(std::string_view body, const Json& tools) {
  constexpr std::string_view kKeyBegin = "<arg_key>", kKeyEnd = "</arg_key>";
  constexpr std::string_view kValueBegin = "<arg_value>", kValueEnd = "</arg_value>";
  size_t pos = body.find(kKeyBegin);
  std::string_view name = trim_space(body.substr(0, pos));
  if (pos == std::string_view::npos && name.starts_with('{')) return parse_hermes_body(body);
  if (!valid_name(name)) return std::nullopt;
  Json arguments = Json::object();
  auto skip_space = [&] {
    while (pos < body.size() && is_space(body[pos])) ++pos;
  };
  while (pos != std::string_view::npos && pos < body.size()) {
    skip_space();
    if (pos == body.size()) break;
    if (!starts_with_at(body, pos, kKeyBegin)) return std::nullopt;
    size_t key_end = body.find(kKeyEnd, pos);
    if (key_end == std::string_view::npos) return std::nullopt;
    std::string_view key =
        trim_space(body.substr(pos + kKeyBegin.size(), key_end - pos - kKeyBegin.size()));
    pos = key_end + kKeyEnd.size();
    skip_space();
    if (key.empty() || !starts_with_at(body, pos, kValueBegin)) return std::nullopt;
    size_t value_end = body.find(kValueEnd, pos);
    if (value_end == std::string_view::npos) return std::nullopt;
    std::string_view value =
        body.substr(pos + kValueBegin.size(), value_end - pos - kValueBegin.size());
    arguments[std::string(key)] = glm_value(value, parameter_type(tools, name, key));
    pos = value_end + kValueEnd.size();
  }
  return CallText{.name = std::string(name), .arguments_json = dump_compact(arguments)};
}

// ---- Kimi K2 ----

std::optional<CallText> parse_kimi_body(std::string_view body) {
  constexpr std::string_view kArgs = "<|tool_call_argument_begin|>";
  size_t sep = body.find(kArgs);
  if (sep == std::string_view::npos) return std::nullopt;
  std::string_view id = trim_space(body.substr(0, sep));
  // "functions.get_weather:0" -> "get_weather"
  std::string_view name = id;
  if (name.starts_with("functions.")) name.remove_prefix(std::string_view("functions.").size());
  size_t colon = name.rfind(':');
  if (colon != std::string_view::npos && colon + 1 < name.size() &&
      std::all_of(name.begin() + colon + 1, name.end(),
                  [](char c) { return c >= '0' && c <= '9'; }))
    name = name.substr(0, colon);
  if (!valid_name(name)) return std::nullopt;
  std::optional<Json> arguments = parse_json_object(body.substr(sep + kArgs.size()));
  if (!arguments) return std::nullopt;
  return CallText{
      .id = std::string(id), .name = std::string(name), .arguments_json = dump_compact(*arguments)};
}

// ---- DeepSeek-V3 / V3.1 ----

std::optional<CallText> parse_deepseek_body(std::string_view body) {
  constexpr std::string_view kSep = "<｜tool▁sep｜>";
  size_t sep = body.find(kSep);
  if (sep == std::string_view::npos) return std::nullopt;
  std::string_view left = trim_space(body.substr(0, sep));
  std::string_view right = body.substr(sep + kSep.size());
  // V3: "function" <sep> NAME "\n```json\n" JSON "\n```"
  size_t newline = right.find('\n');
  if (left == "function" && newline != std::string_view::npos) {
    std::string_view name = trim_space(right.substr(0, newline));
    std::string_view fenced = trim_space(right.substr(newline + 1));
    size_t fence_line = fenced.find('\n');
    if (fenced.size() >= 6 && fenced.starts_with("```") && fenced.ends_with("```") &&
        fence_line != std::string_view::npos && fence_line + 1 <= fenced.size() - 3) {
      std::string_view json = fenced.substr(fence_line + 1, fenced.size() - 3 - fence_line - 1);
      std::optional<Json> arguments = parse_json_object(json);
      if (arguments && valid_name(name))
        return CallText{.name = std::string(name), .arguments_json = dump_compact(*arguments)};
    }
  }
  // V3.1: NAME <sep> JSON
  std::optional<Json> arguments = parse_json_object(right);
  if (!arguments || !valid_name(left)) return std::nullopt;
  return CallText{.name = std::string(left), .arguments_json = dump_compact(*arguments)};
}

// ---- DeepSeek-V3.2 DSML ----

constexpr std::string_view kDsmlParameter = "<｜DSML｜parameter";
constexpr std::string_view kDsmlParameterEnd = "</｜DSML｜parameter>";

// Reads `attr="VALUE"` at pos (after optional spaces); pos moves past the closing quote.
std::optional<std::string_view> dsml_attribute(std::string_view body, size_t& pos, std::string_view attr) {
  while (pos < body.size() && is_space(body[pos])) ++pos;
  if (!starts_with_at(body, pos, attr) || !starts_with_at(body, pos + attr.size(), "=\"")) return std::nullopt;
  const size_t begin = pos + attr.size() + 2;
  const size_t end = body.find('"', begin);
  if (end == std::string_view::npos) return std::nullopt;
  pos = end + 1;
  return body.substr(begin, end - begin);
}

// The body after "<｜DSML｜invoke": ` name="NAME">` then the parameters.
std::optional<CallText> parse_dsml_body(std::string_view body) {
  size_t pos = 0;
  std::optional<std::string_view> name = dsml_attribute(body, pos, "name");
  if (!name || !valid_name(*name) || !starts_with_at(body, pos, ">")) return std::nullopt;
  ++pos;
  Json arguments = Json::object();
  while (true) {
    while (pos < body.size() && is_space(body[pos])) ++pos;
    if (pos == body.size()) break;
    if (!starts_with_at(body, pos, kDsmlParameter)) return std::nullopt;
    pos += kDsmlParameter.size();
    std::optional<std::string_view> key = dsml_attribute(body, pos, "name");
    if (!key || key->empty() || arguments.contains(std::string(*key))) return std::nullopt;
    size_t after_key = pos;
    std::optional<std::string_view> is_string = dsml_attribute(body, pos, "string");
    if (!is_string) pos = after_key;
    if (!starts_with_at(body, pos, ">")) return std::nullopt;
    ++pos;
    const size_t end = body.find(kDsmlParameterEnd, pos);
    if (end == std::string_view::npos) return std::nullopt;
    const std::string_view text = body.substr(pos, end - pos);
    pos = end + kDsmlParameterEnd.size();
    Json value;
    if (is_string && *is_string == "true") {
      value = std::string(text);
    } else {
      value = parse_json_bounded<Json>(text);
      if (value.is_discarded()) value = std::string(text);
    }
    arguments[std::string(*key)] = std::move(value);
  }
  return CallText{.name = std::string(*name), .arguments_json = dump_compact(arguments)};
}

}  // namespace

BlockSyntax hermes_syntax() {
  return {
      .call_begin = {"<tool_call>"}, .call_end = {"</tool_call>"}, .parse_body = parse_hermes_body};
}

BlockSyntax glm45_syntax(const nlohmann::ordered_json& tools) {
  return {.call_begin = {"<tool_call>"},
          .call_end = {"</tool_call>"},
          .parse_body = [tools](std::string_view body) { return parse_glm_body(body, tools); }};
}

BlockSyntax kimi_k2_syntax() {
  // Kimi checkpoints also emit the singular "tool_call_section" spelling (vLLM accepts both).
  return {.section_begin = {"<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"},
          .section_end = {"<|tool_calls_section_end|>", "<|tool_call_section_end|>"},
          .call_begin = {"<|tool_call_begin|>"},
          .call_end = {"<|tool_call_end|>"},
          .parse_body = parse_kimi_body};
}

BlockSyntax deepseek_v3_syntax() {
  return {.section_begin = {"<｜tool▁calls▁begin｜>"},
          .section_end = {"<｜tool▁calls▁end｜>"},
          .call_begin = {"<｜tool▁call▁begin｜>"},
          .call_end = {"<｜tool▁call▁end｜>"},
          .parse_body = parse_deepseek_body};
}

BlockSyntax dsml_syntax() {
  return {.section_begin = {"<｜DSML｜function_calls>"},
          .section_end = {"</｜DSML｜function_calls>"},
          .call_begin = {"<｜DSML｜invoke"},
          .call_end = {"</｜DSML｜invoke>"},
          .parse_body = parse_dsml_body};
}

}  // namespace kiln::tokenizer::detail
