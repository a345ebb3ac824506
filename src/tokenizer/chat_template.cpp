#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json_bounded.h"

namespace kiln::tokenizer {

namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

// The special tokens transformers.js passes to every chat template.
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

Result<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<json> read_json(const fs::path& path) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::string why;
  json j = parse_json_explained<json>(text, &why);
  if (!why.empty()) return corrupt(path.string() + ": " + why);
  return j;
}

// A "chat_template" value: a string, or a list of {"name", "template"}.
Result<std::vector<std::pair<std::string, std::string>>> template_sources(const json& value,
                                                                          const std::string& origin) {
  std::vector<std::pair<std::string, std::string>> out;
  if (value.is_string()) {
    out.emplace_back("default", value.get<std::string>());
    return out;
  }
  if (value.is_array()) {
    for (const json& entry : value) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string())
        return corrupt(origin +
                       ": chat_template must be a string or a list of objects with \"name\" and "
                       "\"template\" strings");
      out.emplace_back(entry["name"].get<std::string>(), entry["template"].get<std::string>());
    }
    if (!out.empty()) return out;
  }
  return corrupt(origin + ": chat_template must be a string or a non-empty list of {name, template}");
}

json special_tokens_of(const json& config) {
  json out = json::object();
  if (!config.is_object()) return out;
  for (const char* key : kSpecialTokens) {
    if (!config.contains(key)) continue;
    const json& v = config[key];
    if (v.is_string() && !v.get<std::string>().empty()) {
      out[key] = v;
    } else if (v.is_object() && v.contains("content") && v["content"].is_string() &&
               !v["content"].get<std::string>().empty()) {
      out[key] = v["content"];
    }
  }
  return out;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::load(const std::string& model_dir, const std::string& name) {
  const fs::path dir(model_dir);
  json config = json::object();
  if (fs::exists(dir / "tokenizer_config.json")) {
    KILN_ASSIGN_OR_RETURN(config, read_json(dir / "tokenizer_config.json"));
  }
  std::vector<std::pair<std::string, std::string>> sources;
  std::string origin;
  if (fs::exists(dir / "chat_template.jinja")) {
    origin = (dir / "chat_template.jinja").string();
    KILN_ASSIGN_OR_RETURN(std::string text, read_file(dir / "chat_template.jinja"));
    sources.emplace_back("default", std::move(text));
  } else if (fs::exists(dir / "chat_template.json")) {
    origin = (dir / "chat_template.json").string();
    KILN_ASSIGN_OR_RETURN(json j, read_json(dir / "chat_template.json"));
    if (!j.is_object() || !j.contains("chat_template")) return corrupt(origin + " has no \"chat_template\"");
    KILN_ASSIGN_OR_RETURN(sources, template_sources(j["chat_template"], origin));
  } else if (config.is_object() && config.contains("chat_template") && !config["chat_template"].is_null()) {
    origin = (dir / "tokenizer_config.json").string();
    KILN_ASSIGN_OR_RETURN(sources, template_sources(config["chat_template"], origin));
  } else {
    return not_found("no chat template in " + model_dir +
                     " (looked for chat_template.jinja, chat_template.json and \"chat_template\" in "
                     "tokenizer_config.json)");
  }

  std::vector<Named> templates;
  std::string available;
  for (auto& [template_name, text] : sources) {
    auto parsed = jinja::JinjaTemplate::parse(std::move(text));
    if (!parsed.ok()) return parsed.status().with_context(origin + ": chat template '" + template_name + "'");
    available += (available.empty() ? "" : ", ") + template_name;
    templates.push_back({template_name, std::move(parsed).value()});
  }
  const auto has = [&](const std::string& n) {
    for (const Named& t : templates)
      if (t.name == n) return true;
    return false;
  };
  if (!name.empty() && !has(name))
    return invalid_argument(origin + " has no chat template named '" + name + "' (available: " + available + ")");
  if (name.empty() && !has("default"))
    return invalid_argument(origin + " has no default chat template; choose one of: " + available);
  return ChatTemplate(std::move(templates), special_tokens_of(config), name);
}

Result<ChatTemplate> ChatTemplate::from_source(std::string source, json special_tokens) {
  auto parsed = jinja::JinjaTemplate::parse(std::move(source));
  if (!parsed.ok()) return parsed.status().with_context("chat template");
  std::vector<Named> templates;
  templates.push_back({"default", std::move(parsed).value()});
  return ChatTemplate(std::move(templates), special_tokens_of(special_tokens), "");
}

json ChatTemplate::build_context(const ChatRequest& request) const {
  json context = json::object();
  context["messages"] = request.messages;
  context["add_generation_prompt"] = request.add_generation_prompt;
  context["tools"] = request.tools ? *request.tools : json(nullptr);
  context["documents"] = nullptr;
  for (const auto& [key, value] : special_tokens_.items()) context[key] = value;
  if (request.kwargs.is_object())
    for (const auto& [key, value] : request.kwargs.items()) context[key] = value;
  return context;
}

const jinja::JinjaTemplate& ChatTemplate::select(const json& context) const {
  std::string wanted = fixed_name_;
  if (wanted.empty()) {
    const bool tools = context.is_object() && context.contains("tools") && !context["tools"].is_null();
    wanted = "default";
    if (tools)
      for (const Named& t : templates_)
        if (t.name == "tool_use") wanted = "tool_use";
  }
  for (const Named& t : templates_)
    if (t.name == wanted) return t.template_;
  return templates_.front().template_;  // load() guarantees the name exists
}

Result<std::string> ChatTemplate::render(const json& context, const jinja::RenderOptions& options) const {
  return select(context).render(context, options);
}

const std::string& ChatTemplate::source(const json& context) const { return select(context).source(); }

std::vector<std::string> ChatTemplate::names() const {
  std::vector<std::string> out;
  for (const Named& t : templates_) out.push_back(t.name);
  return out;
}

}  // namespace kiln::tokenizer
