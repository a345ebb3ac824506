#include "tokenizer/harmony.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>
#include <string_view>

#include "core/json_bounded.h"

namespace kiln::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

// ---- Jinja / Python value semantics the template relies on ----

const Json* attr(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

// Jinja truthiness; an absent attribute (nullptr) is undefined, hence false.
bool truthy(const Json* v) {
  if (v == nullptr || v->is_null()) return false;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_string()) return !v->get_ref<const std::string&>().empty();
  if (v->is_array() || v->is_object()) return !v->empty();
  if (v->is_number_float()) return v->get<double>() != 0.0;
  return v->get<int64_t>() != 0;
}

bool is_str(const Json* v, std::string_view s) {
  return v != nullptr && v->is_string() && v->get_ref<const std::string&>() == s;
}

// `x in list` for the template's `(spec.required or [])`.
bool contains(const Json* list, std::string_view s) {
  if (!truthy(list) || !list->is_array()) return false;
  for (const Json& e : *list)
    if (is_str(&e, s)) return true;
  return false;
}

std::string python_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  // Shortest round-trip digits, laid out as Python's repr: fixed for 1e-4 <= |v| < 1e16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string_view s(buf, res.ptr - buf);  // "-1.25e+03"
  std::string out;
  if (s.starts_with('-')) {
    out = "-";
    s.remove_prefix(1);
  }
  size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  int exp = std::stoi(std::string(s.substr(e + 1)));
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      int_part.append(exp + 1 - int_part.size(), '0');
      std::string frac = digits.size() > size_t(exp + 1) ? digits.substr(exp + 1) : "0";
      out += int_part + "." + frac;
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    std::string e_digits = std::to_string(std::abs(exp));
    if (e_digits.size() < 2) e_digits = "0" + e_digits;
    out += e_digits;
  }
  return out;
}

void append_python_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof(hex), "\\u%04x", c);
          out += hex;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void append_python_json(std::string& out, const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      out += "null";
      break;
    case Json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case Json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case Json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case Json::value_t::number_float:
      out += python_float(v.get<double>());
      break;
    case Json::value_t::string:
      append_python_string(out, v.get_ref<const std::string&>());
      break;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const Json& e : v) {
        if (!first) out += ", ";
        first = false;
        append_python_json(out, e);
      }
      out += ']';
      break;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        append_python_string(out, it.key());
        out += ": ";
        append_python_json(out, it.value());
      }
      out += '}';
      break;
    }
    default:
      out += "null";
      break;  // binary / discarded: not produced by JSON input
  }
}

// Jinja's str(): strings as they are, Python spellings for the scalars.
std::string str_of(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return python_json_dumps(v);
}

std::string join(const Json& list, std::string_view sep) {
  std::string out;
  if (!list.is_array()) return str_of(list);
  for (size_t i = 0; i < list.size(); ++i) {
    if (i > 0) out += sep;
    out += str_of(list[i]);
  }
  return out;
}

size_t code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// Message text: a string; null or absent is "" (the template would raise); a list of
// content parts is the concatenation of its text parts (the template would print the list).
std::string text_of(const Json* v) {
  if (v == nullptr || v->is_null()) return "";
  if (v->is_string()) return v->get<std::string>();
  if (v->is_array()) {
    std::string out;
    for (const Json& part : *v)
      if (const Json* t = attr(part, "text"); t != nullptr && t->is_string())
        out += t->get<std::string>();
    return out;
  }
  return str_of(*v);
}

// ---- Tool declarations: the template's render_typescript_type / render_tool_namespace ----

std::string typescript_type(const Json& spec) {
  const Json* type = attr(spec, "type");
  const Json* nullable = attr(spec, "nullable");
  if (is_str(type, "array")) {
    std::string out = "any[]";
    if (const Json* items = attr(spec, "items")) {
      const Json* item_type = attr(*items, "type");
      if (is_str(item_type, "string")) {
        out = "string[]";
      } else if (is_str(item_type, "number") || is_str(item_type, "integer")) {
        out = "number[]";
      } else if (is_str(item_type, "boolean")) {
        out = "boolean[]";
      } else {
        std::string inner = typescript_type(*items);
        out = inner == "object | object" || code_points(inner) > 50 ? "any[]" : inner + "[]";
      }
    }
    if (truthy(nullable)) out += " | null";
    return out;
  }
  if (type != nullptr && type->is_array() && !type->empty()) return join(*type, " | ");
  if (const Json* one_of = attr(spec, "oneOf"); truthy(one_of)) {
    // The template's has_object_variants is set inside a for loop, and a Jinja `set` in a
    // loop does not outlive it: the "any" branch is never taken. Likewise the stray
    // whitespace: 20 spaces before "// default:", " | \n" between variants.
    std::string out;
    if (!one_of->is_array()) return out;
    for (size_t i = 0; i < one_of->size(); ++i) {
      const Json& variant = (*one_of)[i];
      out += typescript_type(variant);
      if (const Json* d = attr(variant, "description"); truthy(d)) out += "// " + str_of(*d);
      if (const Json* d = attr(variant, "default"))
        out += std::string(20, ' ') + "// default: " + python_json_dumps(*d);
      if (i + 1 < one_of->size()) out += " | \n";
    }
    return out;
  }
  if (is_str(type, "string")) {
    if (const Json* e = attr(spec, "enum"); truthy(e)) return "\"" + join(*e, "\" | \"") + "\"";
    return truthy(nullable) ? "string | null" : "string";
  }
  if (is_str(type, "number") || is_str(type, "integer")) return "number";
  if (is_str(type, "boolean")) return "boolean";
  if (is_str(type, "object")) {
    const Json* props = attr(spec, "properties");
    if (!truthy(props) || !props->is_object()) return "object";
    // `{{- ": " }}` is followed by a newline and 16 spaces of indentation before
    // `{{ render_typescript_type(...) }}`, which strips nothing: they are output.
    const Json* required = attr(spec, "required");
    std::string out = "{\n";
    size_t i = 0;
    for (auto it = props->begin(); it != props->end(); ++it, ++i) {
      out += it.key();
      if (!contains(required, it.key())) out += "?";
      out += ": \n" + std::string(16, ' ') + typescript_type(it.value());
      if (i + 1 < props->size()) out += ", ";
    }
    return out + "}";
  }
  return "any";
}

// `"..." + value` in the template: a string as is; anything else would raise there.
std::string concat_str(const Json& v) {
  return v.is_string() ? v.get<std::string>() : python_json_dumps(v);
}

Result<std::string> tool_namespace(const Json& tools) {
  std::string out = "## functions\n\nnamespace functions {\n\n";
  for (const Json& tool : tools) {
    const Json* fn_ptr = attr(tool, "function");
    const Json& fn = fn_ptr != nullptr ? *fn_ptr : tool;  // a bare function object is accepted
    const Json* name = attr(fn, "name");
    if (name == nullptr || !name->is_string()) return invalid_argument("tool without a name");
    // The template always writes "// " + description; OpenAI makes it optional.
    if (const Json* d = attr(fn, "description"); d != nullptr && !d->is_null())
      out += "// " + str_of(*d) + "\n";
    out += "type " + name->get<std::string>() + " = ";
    const Json* params = attr(fn, "parameters");
    const Json* props = params != nullptr ? attr(*params, "properties") : nullptr;
    if (!truthy(params) || !truthy(props) || !props->is_object()) {
      out += "() => any;\n\n";
      continue;
    }
    const Json* required = attr(*params, "required");
    out += "(_: {\n";
    for (auto it = props->begin(); it != props->end(); ++it) {
      const Json& spec = it.value();
      if (const Json* d = attr(spec, "description"); truthy(d)) out += "// " + str_of(*d) + "\n";
      out += it.key();
      if (!contains(required, it.key())) out += "?";
      out += ": " + typescript_type(spec);
      if (const Json* d = attr(spec, "default")) {
        if (truthy(attr(spec, "enum"))) {
          out += ", // default: " + concat_str(*d);
        } else if (truthy(attr(spec, "oneOf"))) {
          out += "// default: " + concat_str(*d);
        } else {
          out += ", // default: " + python_json_dumps(*d);
        }
      }
      out += ",\n";
    }
    out += "}) => any;\n\n";
  }
  return out + "} // namespace functions";
}

constexpr std::string_view kBrowserTool =
    "## browser\n\n"
    "// Tool for browsing.\n"
    "// The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n"
    "// Cite information from the tool using the following format:\n"
    "// `【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.\n"
    "// Do not quote more than 10 words directly from the tool output.\n"
    "// sources=web (default: web)\n"
    "namespace browser {\n\n"
    "// Searches for information related to `query` and displays `topn` results.\n"
    "type search = (_: {\n"
    "query: string,\n"
    "topn?: number, // default: 10\n"
    "source?: string,\n"
    "}) => any;\n\n"
    "// Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, "
    "showing `num_lines` lines.\n"
    "// Valid link ids are displayed with the formatting: `【{id}†.*】`.\n"
    "// If `cursor` is not provided, the most recent page is implied.\n"
    "// If `id` is a string, it is treated as a fully qualified URL associated with `source`.\n"
    "// If `loc` is not provided, the viewport will be positioned at the beginning of the "
    "document or centered on the most relevant passage, if available.\n"
    "// Use this function without `id` to scroll to a new location of an opened page.\n"
    "type open = (_: {\n"
    "id?: number | string, // default: -1\n"
    "cursor?: number, // default: -1\n"
    "loc?: number, // default: -1\n"
    "num_lines?: number, // default: -1\n"
    "view_source?: boolean, // default: false\n"
    "source?: string,\n"
    "}) => any;\n\n"
    "// Finds exact matches of `pattern` in the current page, or the page given by `cursor`.\n"
    "type find = (_: {\n"
    "pattern: string,\n"
    "cursor?: number, // default: -1\n"
    "}) => any;\n\n"
    "} // namespace browser\n\n";

constexpr std::string_view kPythonTool =
    "## python\n\n"
    "Use this tool to execute Python code in your chain of thought. The code will not be shown "
    "to the user. This tool should be used for internal reasoning, but not for code that is "
    "intended to be visible to the user (e.g. when creating plots, tables, or files).\n\n"
    "When you send a message containing Python code to python, it will be executed in a "
    "stateful Jupyter notebook environment. python will respond with the output of the "
    "execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to save "
    "and persist user files. Internet access for this session is UNKNOWN. Depends on the "
    "cluster.\n\n";

std::string today() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", &local);
  return buf;
}

std::string system_message(const HarmonyConversation& c) {
  std::string out = c.model_identity + "\n";
  out += "Knowledge cutoff: 2024-06\n";
  out += "Current date: " + (c.current_date.empty() ? today() : c.current_date) + "\n\n";
  out += "Reasoning: " + c.reasoning_effort + "\n\n";
  if (!c.builtin_tools.empty()) {
    out += "# Tools\n\n";
    auto has = [&](std::string_view t) {
      for (const std::string& b : c.builtin_tools)
        if (b == t) return true;
      return false;
    };
    if (has("browser")) out += kBrowserTool;
    if (has("python")) out += kPythonTool;
  }
  out +=
      "# Valid channels: analysis, commentary, final. Channel must be included for every message.";
  if (truthy(&c.tools))
    out += "\nCalls to these tools must go to the commentary channel: 'functions'.";
  return out;
}

bool has_channel_tags(const Json* v) {
  if (v == nullptr || !v->is_string()) return false;
  const std::string& s = v->get_ref<const std::string&>();
  return s.find("<|channel|>analysis<|message|>") != std::string::npos ||
         s.find("<|channel|>final<|message|>") != std::string::npos;
}

const Json* present(const Json& msg, std::string_view key) {
  const Json* v = attr(msg, key);
  return v != nullptr && !v->is_null() ? v : nullptr;  // null is treated as absent
}

bool has_tool_calls(const Json& msg) {
  const Json* calls = present(msg, "tool_calls");
  return calls != nullptr && calls->is_array() && !calls->empty();
}

// `tool_call.arguments|tojson`. OpenAI clients send arguments as a JSON string; it is
// parsed first (vLLM does the same before applying templates) so it is not double-encoded.
std::string render_arguments(const Json* args) {
  if (args == nullptr) return "null";
  if (args->is_string()) {
    const std::string& s = args->get_ref<const std::string&>();
    Json parsed = parse_json_bounded<Json>(s);
    if (!parsed.is_discarded()) return python_json_dumps(parsed);
  }
  return python_json_dumps(*args);
}

constexpr std::string_view kChannelTagsError =
    "You have passed a message containing <|channel|> tags in the {} field. Instead of doing "
    "this, you should pass analysis messages (the string between '<|message|>' and '<|end|>') "
    "in the 'thinking' field, and final messages (the string between '<|message|>' and "
    "'<|end|>') in the 'content' field.";

Status channel_tags_error(std::string_view field) {
  std::string m(kChannelTagsError);
  m.replace(m.find("{}"), 2, field);
  return invalid_argument(m);
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  append_python_json(out, value);
  return out;
}

Result<HarmonyConversation> harmony_conversation_from_json(const nlohmann::ordered_json& input) {
  HarmonyConversation c;
  if (!input.is_object()) return invalid_argument("harmony input: expected an object");
  const Json* messages = attr(input, "messages");
  if (messages == nullptr || !messages->is_array())
    return invalid_argument("harmony input: 'messages' must be an array");
  c.messages = *messages;
  if (const Json* tools = present(input, "tools")) {
    if (!tools->is_array()) return invalid_argument("harmony input: 'tools' must be an array");
    c.tools = *tools;
  }
  auto read_string = [&](std::string_view key, std::string& field) -> Status {
    if (const Json* v = present(input, key)) {
      if (!v->is_string())
        return invalid_argument("harmony input: '" + std::string(key) + "' must be a string");
      field = v->get<std::string>();
    }
    return Status::Ok();
  };
  KILN_RETURN_IF_ERROR(read_string("model_identity", c.model_identity));
  KILN_RETURN_IF_ERROR(read_string("reasoning_effort", c.reasoning_effort));
  KILN_RETURN_IF_ERROR(read_string("current_date", c.current_date));
  if (const Json* b = present(input, "builtin_tools")) {
    if (!b->is_array()) return invalid_argument("harmony input: 'builtin_tools' must be an array");
    for (const Json& t : *b)
      if (t.is_string()) c.builtin_tools.push_back(t.get<std::string>());
  }
  if (const Json* g = present(input, "add_generation_prompt")) {
    if (!g->is_boolean())
      return invalid_argument("harmony input: 'add_generation_prompt' must be a boolean");
    c.add_generation_prompt = g->get<bool>();
  }
  return c;
}

Result<std::string> render_harmony(const HarmonyConversation& c) {
  const Json& messages = c.messages;
  if (!messages.is_array() || messages.empty())
    return invalid_argument("harmony: a conversation needs at least one message");
  std::string out = "<|start|>system<|message|>" + system_message(c) + "<|end|>";

  // A leading system or developer message becomes the developer instructions.
  size_t first = 0;
  std::string developer;
  const Json* first_role = attr(messages[0], "role");
  if (is_str(first_role, "developer") || is_str(first_role, "system")) {
    developer = text_of(attr(messages[0], "content"));
    first = 1;
  }
  bool has_tools = truthy(&c.tools);
  if (!developer.empty() || has_tools) {
    out += "<|start|>developer<|message|>";
    if (!developer.empty()) out += "# Instructions\n\n" + developer + "\n\n";
    if (has_tools) {
      KILN_ASSIGN_OR_RETURN(std::string ns, tool_namespace(c.tools));
      out += "# Tools\n\n" + ns;
    }
    out += "<|end|>";
  }

  std::optional<std::string> last_tool_call;  // the tool a "tool" message answers
  for (size_t i = first; i < messages.size(); ++i) {
    const Json& msg = messages[i];
    const Json* role = attr(msg, "role");
    if (is_str(role, "assistant")) {
      const Json* content = present(msg, "content");
      const Json* thinking = present(msg, "thinking");
      if (has_channel_tags(content)) return channel_tags_error("content");
      if (has_channel_tags(thinking)) return channel_tags_error("thinking");
      if (has_tool_calls(msg)) {
        // The analysis before a tool call is kept only while no final answer follows.
        bool final_follows = false;
        for (size_t j = i + 1; j < messages.size(); ++j)
          if (is_str(attr(messages[j], "role"), "assistant") && !has_tool_calls(messages[j]))
            final_follows = true;
        const Json* call = &(*present(msg, "tool_calls"))[0];
        if (const Json* fn = attr(*call, "function"); truthy(fn)) call = fn;
        const Json* name = attr(*call, "name");
        if (name == nullptr || !name->is_string())
          return invalid_argument("harmony: tool call without a name");
        if (truthy(content) && truthy(thinking))
          return invalid_argument(
              "Cannot pass both content and thinking in an assistant message with tool calls! "
              "Put the analysis message in one or the other, but not both.");
        if (truthy(content) && !final_follows) {
          out += "<|start|>assistant<|channel|>analysis<|message|>" + text_of(content) + "<|end|>";
        } else if (truthy(thinking) && !final_follows) {
          out += "<|start|>assistant<|channel|>analysis<|message|>" + text_of(thinking) + "<|end|>";
        }
        const Json* content_type = attr(*call, "content_type");
        out += "<|start|>assistant to=functions." + name->get<std::string>() +
               "<|channel|>commentary " + (content_type ? str_of(*content_type) : "json") +
               "<|message|>" + render_arguments(attr(*call, "arguments")) + "<|call|>";
        last_tool_call = name->get<std::string>();
      } else if (i + 1 == messages.size() && !c.add_generation_prompt) {
        // A last assistant turn without generation prompt (training): keeps its analysis.
        if (thinking != nullptr)
          out += "<|start|>assistant<|channel|>analysis<|message|>" + text_of(thinking) + "<|end|>";
        out += "<|start|>assistant<|channel|>final<|message|>" + text_of(content) + "<|return|>";
      } else {
        out += "<|start|>assistant<|channel|>final<|message|>" + text_of(content) + "<|end|>";
        last_tool_call.reset();
      }
    } else if (is_str(role, "tool")) {
      if (!last_tool_call)
        return invalid_argument(
            "Message has tool role, but there was no previous assistant message with a tool call!");
      const Json* content = attr(msg, "content");
      out += "<|start|>functions." + *last_tool_call +
             " to=assistant<|channel|>commentary<|message|>" +
             (content ? python_json_dumps(*content) : "null") + "<|end|>";
    } else if (is_str(role, "user")) {
      out += "<|start|>user<|message|>" + text_of(attr(msg, "content")) + "<|end|>";
    }
    // Any other role (a system message after the first) is dropped, as in the template.
  }
  if (c.add_generation_prompt) out += "<|start|>assistant";
  return out;
}

}  // namespace kiln::tokenizer
