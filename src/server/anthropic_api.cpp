#include "server/anthropic_api.h"

#include "core/json_bounded.h"

namespace kiln::server::anthropic {
namespace {

using tokenizer::ParseEvent;
using tokenizer::ParseEventKind;

std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }
std::string event(const char* type, const ordered_json& data) {
  return std::string("event: ") + type + "\ndata: " + dump(data) + "\n\n";
}

// Anthropic content: a string, or a list of blocks. Returns the OpenAI-shaped messages
// one Anthropic message becomes (tool results are tool messages before the user's text).
ApiResult<ordered_json> convert_message(const ordered_json& m, size_t index) {
  const std::string at = "messages[" + std::to_string(index) + "]";
  if (!m.is_object()) return bad_request(at + " must be an object", "messages");
  if (!m.contains("role") || !m["role"].is_string() || (m["role"] != "user" && m["role"] != "assistant"))
    return bad_request(at + ".role must be \"user\" or \"assistant\"", "messages");
  const std::string role = m["role"].get<std::string>();
  if (!m.contains("content")) return bad_request(at + ".content is required", "messages");
  const ordered_json& content = m["content"];
  ordered_json out = ordered_json::array();
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return out;
  }
  if (!content.is_array()) return bad_request(at + ".content must be a string or a list of content blocks", "messages");
  std::string text, thinking;
  ordered_json tool_calls = ordered_json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const ordered_json& b = content[i];
    const std::string bat = at + ".content[" + std::to_string(i) + "]";
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return bad_request(bat + " must be a content block with a 'type'", "messages");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) return bad_request(bat + ".text must be a string", "messages");
      if (!text.empty()) text += "\n";
      text += b["text"].get<std::string>();
    } else if (type == "thinking" && role == "assistant") {
      if (b.contains("thinking") && b["thinking"].is_string()) thinking += b["thinking"].get<std::string>();
    } else if (type == "redacted_thinking" && role == "assistant") {
      continue;
    } else if (type == "tool_use" && role == "assistant") {
      if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string())
        return bad_request(bat + " needs a string 'id' and 'name'", "messages");
      if (!b.contains("input") || !b["input"].is_object()) return bad_request(bat + ".input must be an object", "messages");
      tool_calls.push_back({{"id", b["id"]}, {"type", "function"},
                            {"function", {{"name", b["name"]}, {"arguments", b["input"]}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
        return bad_request(bat + ".tool_use_id must be a string", "messages");
      std::string result;
      if (b.contains("content") && !b["content"].is_null()) {
        auto r = content_text(b["content"], bat + ".content");
        if (auto* e = std::get_if<ApiError>(&r)) {
          e->param = "messages";
          return *e;
        }
        result = std::get<std::string>(r);
      }
      out.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
    } else {
      return bad_request(bat + " has type '" + type.substr(0, 60) + "', which a " + role +
                             " message cannot carry here (this model takes text, tool_use and tool_result blocks)",
                         "messages");
    }
  }
  if (role == "user") {
    if (!text.empty() || out.empty()) out.push_back({{"role", "user"}, {"content", text}});
    return out;
  }
  ordered_json msg = {{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!tool_calls.empty()) msg["tool_calls"] = std::move(tool_calls);
  out.push_back(std::move(msg));
  return out;
}

struct ChatInput {
  ordered_json messages = ordered_json::array();
  std::optional<ordered_json> tools;  // in OpenAI form
  ordered_json kwargs = ordered_json::object();
  std::optional<ToolCallRule> force_tools;  // tool_choice any / tool
};

ApiResult<ChatInput> chat_input(const ordered_json& body) {
  ChatInput in;
  if (body.contains("system") && !body["system"].is_null()) {
    auto sys = content_text(body["system"], "system");
    if (auto* e = std::get_if<ApiError>(&sys)) {
      e->param = "system";
      return *e;
    }
    in.messages.push_back({{"role", "system"}, {"content", std::get<std::string>(sys)}});
  }
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return bad_request("'messages' must be a non-empty list of messages", "messages");
  for (size_t i = 0; i < body["messages"].size(); ++i) {
    auto converted = convert_message(body["messages"][i], i);
    if (auto* e = std::get_if<ApiError>(&converted)) return *e;
    for (auto& m : std::get<ordered_json>(converted)) in.messages.push_back(std::move(m));
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ordered_json& tools = body["tools"];
    if (!tools.is_array()) return bad_request("'tools' must be a list", "tools");
    ordered_json out = ordered_json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const ordered_json& t = tools[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || t["name"].get_ref<const std::string&>().empty())
        return bad_request(at + ".name must be a non-empty string", "tools");
      if (t.contains("type") && t["type"].is_string() && t["type"] != "custom")
        return bad_request(at + " is a server tool ('" + t["type"].get<std::string>() + "'), which this server does not run", "tools");
      if (!t.contains("input_schema") || !t["input_schema"].is_object())
        return bad_request(at + ".input_schema must be a JSON Schema object", "tools");
      ordered_json fn = {{"name", t["name"]}};
      if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
      fn["parameters"] = t["input_schema"];
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    if (!out.empty()) in.tools = std::move(out);
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ordered_json& tc = body["tool_choice"];
    if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
      return bad_request("'tool_choice' must be an object with a 'type'", "tool_choice");
    const std::string type = tc["type"].get<std::string>();
    if (type == "none") {
      in.tools.reset();
    } else if (type == "any" || type == "tool") {
      if (!in.tools) return bad_request("tool_choice '" + type + "' needs 'tools'", "tool_choice");
      ToolCallRule rule;
      if (type == "tool") {
        if (!tc.contains("name") || !tc["name"].is_string())
          return bad_request("tool_choice 'tool' needs the tool's 'name'", "tool_choice");
        rule.name = tc["name"].get<std::string>();
      }
      if (tc.contains("disable_parallel_tool_use") && !tc["disable_parallel_tool_use"].is_boolean())
        return bad_request("'tool_choice.disable_parallel_tool_use' must be a boolean", "tool_choice");
      rule.parallel = !tc.value("disable_parallel_tool_use", false) && type == "any";
      in.force_tools = rule;
    } else if (type != "auto") {
      return bad_request("'tool_choice.type' must be auto, any, tool or none", "tool_choice");
    }
  }
  if (body.contains("thinking") && !body["thinking"].is_null()) {
    const ordered_json& th = body["thinking"];
    if (!th.is_object() || !th.contains("type") || !th["type"].is_string() ||
        (th["type"] != "enabled" && th["type"] != "disabled"))
      return bad_request("'thinking.type' must be \"enabled\" or \"disabled\"", "thinking");
    in.kwargs["enable_thinking"] = th["type"] == "enabled";
  }
  return in;
}

std::string stop_reason(const SampleText& s) {
  switch (s.end_reason()) {
    case EndReason::kStopString: return "stop_sequence";
    case EndReason::kLength: return "max_tokens";
    case EndReason::kEos:
    case EndReason::kStopToken: return s.any_tool_call() ? "tool_use" : "end_turn";
    case EndReason::kAbort:
    case EndReason::kNone: break;
  }
  return "end_turn";
}

// Content blocks in the order the parser's events open them; a change of kind closes
// the open block.
class MessagesWriter final : public ResponseWriter {
 public:
  const std::string& id() const override { return id_; }
  MessagesWriter(std::string model, bool stream, int64_t input_tokens)
      : id_(random_id("msg_")), model_(std::move(model)), stream_(stream), input_tokens_(input_tokens) {}

  std::string start() override {
    return event("message_start", {{"type", "message_start"},
                                   {"message", {{"id", id_}, {"type", "message"}, {"role", "assistant"},
                                                {"model", model_}, {"content", ordered_json::array()},
                                                {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                                                {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", 0}}}}}});
  }

  std::string delta(int32_t, const SampleDelta& d, const SampleText& sample) override {
    std::string out;
    for (const ParseEvent& e : d.events) {
      switch (e.kind) {
        case ParseEventKind::kContent:
          if (e.text.empty()) break;
          out += open("text", {{"type", "text"}, {"text", ""}});
          blocks_.back()["text"] = blocks_.back()["text"].get<std::string>() + e.text;
          out += delta_event({{"type", "text_delta"}, {"text", e.text}});
          break;
        case ParseEventKind::kReasoning:
          if (e.text.empty()) break;
          out += open("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
          blocks_.back()["thinking"] = blocks_.back()["thinking"].get<std::string>() + e.text;
          out += delta_event({{"type", "thinking_delta"}, {"thinking", e.text}});
          break;
        case ParseEventKind::kToolCallBegin:
          out += close();
          out += open("tool_use", {{"type", "tool_use"}, {"id", "toolu_" + e.id}, {"name", e.name},
                                   {"input", ordered_json::object()}});
          break;
        case ParseEventKind::kToolCallArgs: {
          ordered_json input = parse_json_bounded<ordered_json>(e.text);
          if (!input.is_discarded() && input.is_object()) blocks_.back()["input"] = std::move(input);
          out += delta_event({{"type", "input_json_delta"}, {"partial_json", e.text}});
          break;
        }
        case ParseEventKind::kToolCallEnd: out += close(); break;
      }
    }
    if (d.ended) {
      out += close();
      stop_reason_ = stop_reason(sample);
      if (sample.stop_string()) stop_sequence_ = *sample.stop_string();
    }
    return stream_ ? out : std::string();
  }

  std::string finish(const Usage& usage, const std::vector<SampleText>&) override {
    const ordered_json seq = stop_sequence_.empty() ? ordered_json() : ordered_json(stop_sequence_);
    if (stream_) {
      return event("message_delta", {{"type", "message_delta"},
                                     {"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", seq}}},
                                     {"usage", {{"output_tokens", usage.completion_tokens}}}}) +
             event("message_stop", {{"type", "message_stop"}});
    }
    return dump({{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_},
                 {"content", blocks_}, {"stop_reason", stop_reason_}, {"stop_sequence", seq},
                 {"usage", {{"input_tokens", usage.prompt_tokens}, {"output_tokens", usage.completion_tokens}}}});
  }

 private:
  // Opens a block of `kind` unless one is open.
  std::string open(const std::string& kind, ordered_json block) {
    if (open_ && open_kind_ == kind) return {};
    std::string out = close();
    blocks_.push_back(block);
    open_ = true;
    open_kind_ = kind;
    return out + event("content_block_start",
                       {{"type", "content_block_start"}, {"index", blocks_.size() - 1}, {"content_block", block}});
  }
  std::string close() {
    if (!open_) return {};
    open_ = false;
    return event("content_block_stop", {{"type", "content_block_stop"}, {"index", blocks_.size() - 1}});
  }
  std::string delta_event(ordered_json delta) {
    return event("content_block_delta",
                 {{"type", "content_block_delta"}, {"index", blocks_.size() - 1}, {"delta", std::move(delta)}});
  }

  std::string id_, model_;
  bool stream_;
  int64_t input_tokens_;
  ordered_json blocks_ = ordered_json::array();
  bool open_ = false;
  std::string open_kind_;
  std::string stop_reason_ = "end_turn", stop_sequence_;
};

// The prompt a messages body renders to, and the parser options for the reply.
ApiResult<std::string> render(const ordered_json& body, const PlanContext& ctx, ChatInput& in) {
  if (!body.is_object()) return bad_request("the request body must be a JSON object");
  if (auto e = check_model_name(body, ctx.model)) return *e;
  auto input = chat_input(body);
  if (auto* e = std::get_if<ApiError>(&input)) return *e;
  in = std::move(std::get<ChatInput>(input));
  auto prompt = ctx.model.render_chat(in.messages, in.tools, in.kwargs);
  if (!prompt.ok()) return api_error_from(prompt.status());
  return *prompt;
}

}  // namespace

ApiResult<Job> plan_messages(const ordered_json& body, const PlanContext& ctx) {
  ChatInput in;
  auto prompt = render(body, ctx, in);
  if (auto* e = std::get_if<ApiError>(&prompt)) return *e;
  Job job;
  runtime::Request r;
  Fields f(body);
  if (!f.has("max_tokens")) return bad_request("'max_tokens' is required", "max_tokens");
  const std::optional<int64_t> max_tokens = f.integer("max_tokens", 1, INT32_MAX);
  read_sampling(f, r, ctx);
  if (auto v = f.strings("stop_sequences", 16)) job.sample.stop = *v;
  if (auto v = f.boolean("stream")) job.stream = *v;
  if (f.failed()) return f.error();
  const std::string& text = std::get<std::string>(prompt);
  if (auto e = finish_request(r, ctx.model.tokenizer().encode(text, false), max_tokens, ctx, true)) return *e;
  if (in.force_tools) {
    if (auto e = constrain_chat(r, ctx, tool_call_grammar(ctx.model.tool_syntax(), *in.tools, *in.force_tools), text,
                                /*tool_calls=*/true, "tool_choice"))
      return *e;
  }
  job.sample.parser = ctx.model.tool_format();
  if (!in.tools && job.sample.parser != tokenizer::ToolFormat::kHarmony) job.sample.parser = tokenizer::ToolFormat::kNone;
  job.sample.parser_options = ctx.model.parser_options(text, in.tools ? *in.tools : ordered_json::array());
  job.sample.parser_options.tool_call_id_prefix = random_id("") + "_";
  if (*job.sample.parser != tokenizer::ToolFormat::kNone) job.sample.skip_special_tokens = false;
  job.writer = std::make_unique<MessagesWriter>(ctx.model.name(), job.stream, int64_t(r.prompt.size()));
  job.requests.push_back(std::move(r));
  return job;
}

ApiResult<ordered_json> count_tokens(const ordered_json& body, const PlanContext& ctx) {
  ChatInput in;
  auto prompt = render(body, ctx, in);
  if (auto* e = std::get_if<ApiError>(&prompt)) return *e;
  const auto ids = ctx.model.tokenizer().encode(std::get<std::string>(prompt), false);
  return ordered_json{{"input_tokens", ids.size()}};
}

std::string error_body(const ApiError& e) {
  std::string type = "invalid_request_error";
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default:
      if (e.status >= 500) type = "api_error";
  }
  return dump({{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}});
}

}  // namespace kiln::server::anthropic
