#include "tokenizer/deepseek_v32.h"

#include <string_view>
#include <vector>

#include "core/json_bounded.h"
#include "tokenizer/harmony.h"

namespace kiln::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
#define KILN_DSML "｜DSML｜"

// The encoder's TOOLS_SYSTEM_TEMPLATE, its {dsml_token} and think tokens filled in; the
// function schemas follow, one JSON object a line, then kToolsEnd.
constexpr std::string_view kToolsBegin =
    "## Tools\n"
    "\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<" KILN_DSML "function_calls>\" block like the following as part of "
    "your reply to the user:\n"
    "<" KILN_DSML "function_calls>\n"
    "<" KILN_DSML "invoke name=\"$FUNCTION_NAME\">\n"
    "<" KILN_DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" KILN_DSML
    "parameter>\n"
    "...\n"
    "</" KILN_DSML "invoke>\n"
    "<" KILN_DSML "invoke name=\"$FUNCTION_NAME2\">\n"
    "...\n"
    "</" KILN_DSML "invoke>\n"
    "</" KILN_DSML "function_calls>\n"
    "\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, while lists and "
    "objects should use JSON format. The \"string\" attribute should be set to \"true\" for string type "
    "parameters and \"false\" for other types (numbers, booleans, arrays, objects).\n"
    "\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider outputting a "
    "thinking block. Here is an example:\n"
    "\n"
    "<" KILN_DSML "function_calls>\n"
    "...\n"
    "</" KILN_DSML "function_calls>\n"
    "\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n"
    "\n"
    "<think>...thinking about results</think>\n"
    "\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n";
constexpr std::string_view kToolsEnd = "\n</functions>\n";
constexpr std::string_view kResponseFormat =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";
constexpr std::string_view kCallsBegin = "<" KILN_DSML "function_calls>\n";
constexpr std::string_view kCallsEnd = "\n</" KILN_DSML "function_calls>";
constexpr std::string_view kInvokeBegin = "<" KILN_DSML "invoke name=\"";
constexpr std::string_view kInvokeEnd = "\n</" KILN_DSML "invoke>";
constexpr std::string_view kParamBegin = "<" KILN_DSML "parameter name=\"";
constexpr std::string_view kParamEnd = "</" KILN_DSML "parameter>";
#undef KILN_DSML

const Json* field(const Json& m, const char* key) {
  auto it = m.find(key);
  return it == m.end() || it->is_null() ? nullptr : &*it;
}

std::string role_of(const Json& m) {
  const Json* r = field(m, "role");
  return r != nullptr && r->is_string() ? r->get<std::string>() : std::string();
}

// Python truthiness of a message field: absent, null, "", [] and {} are false.
bool truthy(const Json* v) {
  if (v == nullptr) return false;
  if (v->is_string()) return !v->get_ref<const std::string&>().empty();
  if (v->is_array() || v->is_object()) return !v->empty();
  if (v->is_boolean()) return v->get<bool>();
  return true;
}

std::string text_of(const Json* v) {
  if (v == nullptr) return "";
  if (v->is_string()) return v->get<std::string>();
  return python_json_dumps(*v);
}

std::string render_tools(const Json& tools) {
  std::string out(kToolsBegin);
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    if (i > 0) out += '\n';
    out += python_json_dumps(t.is_object() && t.contains("function") ? t["function"] : t);
  }
  out += kToolsEnd;
  return out;
}

// The system-prompt sections a system or developer message carries: tools, response format.
std::string extras(const Json& m) {
  std::string out;
  if (const Json* tools = field(m, "tools"); truthy(tools) && tools->is_array()) out += "\n\n" + render_tools(*tools);
  if (const Json* rf = field(m, "response_format"); truthy(rf)) {
    out += "\n\n";
    out += kResponseFormat;
    out += python_json_dumps(*rf);
  }
  return out;
}

Result<std::string> render_call(const Json& call) {
  const Json& fn = call.contains("function") ? call["function"] : call;
  const Json* name = field(fn, "name");
  if (name == nullptr || !name->is_string()) return invalid_argument("DeepSeek-V3.2: a tool call without a name");
  Json args = fn.contains("arguments") ? fn["arguments"] : Json::object();
  if (args.is_string()) args = parse_json_bounded<Json>(args.get<std::string>());
  if (!args.is_object()) {
    return invalid_argument("DeepSeek-V3.2: the arguments of tool call '" + name->get<std::string>() +
                            "' are not a JSON object");
  }
  std::string out(kInvokeBegin);
  out += name->get<std::string>();
  out += "\">\n";
  bool first = true;
  for (const auto& [key, value] : args.items()) {
    if (!first) out += '\n';
    first = false;
    out += kParamBegin;
    out += key;
    out += value.is_string() ? "\" string=\"true\">" : "\" string=\"false\">";
    out += value.is_string() ? value.get<std::string>() : python_json_dumps(value);
    out += kParamEnd;
  }
  out += kInvokeEnd;
  return out;
}

int last_user_index(const std::vector<Json>& messages) {
  for (int i = int(messages.size()) - 1; i >= 0; --i) {
    const std::string role = role_of(messages[size_t(i)]);
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

// The encoder's render_message.
Result<std::string> render_message(int index, const std::vector<Json>& messages, bool thinking) {
  const Json& m = messages[size_t(index)];
  const std::string role = role_of(m);
  const int last_user = last_user_index(messages);
  const std::string where = "DeepSeek-V3.2: messages[" + std::to_string(index) + "]";
  const Json* content = field(m, "content");
  const std::string_view think_or_not = index == last_user && thinking ? kThinkStart : kThinkEnd;
  std::string out;
  if (role == "system") {
    out += text_of(content);
    out += extras(m);
  } else if (role == "developer") {
    if (!truthy(content)) return invalid_argument(where + ": a developer message needs content");
    out += kUser;
    out += extras(m);
    out += "\n\n# The user's message is: " + text_of(content);
    out += kAssistant;
    out += think_or_not;
  } else if (role == "user") {
    out += kUser;
    out += text_of(content);
    out += kAssistant;
    out += think_or_not;
  } else if (role == "tool") {
    int prev = index - 1;
    while (prev >= 0 && role_of(messages[size_t(prev)]) == "tool") --prev;
    const Json* calls = prev >= 0 && role_of(messages[size_t(prev)]) == "assistant"
                            ? field(messages[size_t(prev)], "tool_calls")
                            : nullptr;
    const int order = index - prev;
    if (!truthy(calls) || !calls->is_array() || int(calls->size()) < order)
      return invalid_argument(where + ": a tool result without an assistant tool call it answers");
    if (order == 1) out += "\n\n<function_results>";
    out += "\n<result>" + text_of(content) + "</result>";
    if (order == int(calls->size())) {
      out += "\n</function_results>\n\n";
      out += index >= last_user && thinking ? kThinkStart : kThinkEnd;
    }
  } else if (role == "assistant") {
    std::string calls_text;
    if (const Json* calls = field(m, "tool_calls"); truthy(calls) && calls->is_array()) {
      calls_text += "\n\n";
      calls_text += kCallsBegin;
      for (size_t i = 0; i < calls->size(); ++i) {
        KILN_ASSIGN_OR_RETURN(std::string call, render_call((*calls)[i]));
        if (i > 0) calls_text += '\n';
        calls_text += call;
      }
      calls_text += kCallsEnd;
    }
    // The encoder asserts reasoning or tool calls here; a client that drops the
    // reasoning of its history gets the empty block the template would give.
    if (thinking && index > last_user) {
      out += text_of(field(m, "reasoning_content"));
      out += kThinkEnd;
    }
    out += text_of(content);
    out += calls_text;
    out += kEos;
  } else {
    return invalid_argument(where + ": unknown role '" + role + "'");
  }
  return out;
}

}  // namespace

DeepSeekV32Options deepseek_v32_options(const nlohmann::ordered_json& kwargs) {
  DeepSeekV32Options o;
  if (!kwargs.is_object()) return o;
  for (const char* key : {"thinking", "enable_thinking"}) {
    auto it = kwargs.find(key);
    if (it != kwargs.end() && it->is_boolean()) o.thinking = o.thinking || it->get<bool>();
  }
  return o;
}

Result<std::string> render_deepseek_v32(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                        const DeepSeekV32Options& options) {
  if (!messages.is_array()) return invalid_argument("DeepSeek-V3.2: messages must be a list");
  std::vector<Json> list(messages.begin(), messages.end());
  for (const Json& m : list)
    if (!m.is_object()) return invalid_argument("DeepSeek-V3.2: a message must be an object");
  if (tools.is_array() && !tools.empty()) {
    if (!list.empty() && role_of(list[0]) == "system" && !truthy(field(list[0], "tools"))) {
      list[0]["tools"] = tools;
    } else {
      list.insert(list.begin(), Json{{"role", "system"}, {"tools", tools}});
    }
  }
  if (options.thinking && options.drop_thinking) {
    // drop_thinking_messages: before the last user turn, assistant reasoning goes (it
    // would not render anyway) and so does any message that is not user, system or tool.
    const int last_user = last_user_index(list);
    std::vector<Json> kept;
    for (int i = 0; i < int(list.size()); ++i) {
      const std::string role = role_of(list[size_t(i)]);
      if (role == "user" || role == "system" || role == "tool" || i >= last_user) {
        kept.push_back(std::move(list[size_t(i)]));
      } else if (role == "assistant") {
        Json m = std::move(list[size_t(i)]);
        m.erase("reasoning_content");
        kept.push_back(std::move(m));
      }
    }
    list = std::move(kept);
  }
  std::string out = options.add_bos ? std::string(kBos) : std::string();
  for (int i = 0; i < int(list.size()); ++i) {
    KILN_ASSIGN_OR_RETURN(std::string text, render_message(i, list, options.thinking));
    out += text;
  }
  return out;
}

}  // namespace kiln::tokenizer
