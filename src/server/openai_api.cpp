#include "server/openai_api.h"

#include <algorithm>
#include <set>

#include "core/json_bounded.h"
#include "server/structured_output.h"

namespace kiln::server::openai {
namespace {

using tokenizer::ParseEvent;
using tokenizer::ParseEventKind;

std::string sse(const ordered_json& j) { return "data: " + j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n\n"; }

ordered_json bytes_of(const std::string& s) {
  ordered_json b = ordered_json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

std::string finish_reason(const SampleText& s) {
  switch (s.end_reason()) {
    case EndReason::kEos:
    case EndReason::kStopToken: return s.any_tool_call() ? "tool_calls" : "stop";
    case EndReason::kStopString: return "stop";
    case EndReason::kLength: return "length";
    case EndReason::kAbort: return "abort";
    case EndReason::kNone: break;
  }
  return "stop";
}

ordered_json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

// The end of an OpenAI stream: the usage chunk when asked for, then [DONE].
std::string stream_end(const ordered_json& head, bool include_usage, const Usage& usage) {
  std::string out;
  if (include_usage) {
    ordered_json chunk = head;
    chunk["choices"] = ordered_json::array();
    chunk["usage"] = usage_json(usage);
    out = sse(chunk);
  }
  return out + "data: [DONE]\n\n";
}

// Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]} entries.
ordered_json chat_logprob_entries(const std::vector<TokenLogprob>& lps) {
  ordered_json out = ordered_json::array();
  for (const TokenLogprob& lp : lps) {
    ordered_json top = ordered_json::array();
    for (const auto& [tok, v] : lp.top) top.push_back({{"token", tok}, {"logprob", v}, {"bytes", bytes_of(tok)}});
    out.push_back({{"token", lp.token}, {"logprob", lp.logprob}, {"bytes", bytes_of(lp.token)}, {"top_logprobs", top}});
  }
  return out;
}

// The fields both endpoints read the same way; sets the job's sample options.
void read_common(Fields& f, const PlanContext& ctx, runtime::Request& r, SampleOptions& so, bool& stream,
                 bool& include_usage) {
  read_sampling(f, r, ctx);
  if (auto v = f.integer("n", 1, ctx.max_n)) r.n = int32_t(*v);
  if (auto v = f.strings("stop", 16)) so.stop = *v;
  if (auto v = f.boolean("skip_special_tokens")) so.skip_special_tokens = *v;
  if (auto v = f.boolean("include_stop_str_in_output")) so.include_stop_str_in_output = *v;
  if (auto v = f.boolean("return_tokens_as_token_ids")) so.tokens_as_ids = *v;
  if (auto v = f.boolean("stream")) stream = *v;
  if (const ordered_json* o = f.object("stream_options")) {
    Fields so_f(*o, "stream_options.");
    if (auto v = so_f.boolean("include_usage")) include_usage = *v;
    if (so_f.failed()) f.fail(so_f.error().message, "stream_options");
  }
  if (f.has("logit_bias")) {
    const ordered_json* lb = f.object("logit_bias");
    if (lb != nullptr && !lb->empty()) f.fail("'logit_bias' is not supported by this server", "logit_bias");
  }
  if (f.has("best_of")) {
    if (auto v = f.integer("best_of", 1, ctx.max_n); v && *v != r.n)
      f.fail("'best_of' other than n is not supported by this server", "best_of");
  }
}

// ---- chat ---------------------------------------------------------------------------

ApiResult<ordered_json> chat_messages(const ordered_json& messages) {
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad_request(at + " must be an object", "messages");
    if (!m.contains("role") || !m["role"].is_string()) return bad_request(at + ".role must be a string", "messages");
    const std::string role = m["role"].get<std::string>();
    if (kRoles.count(role) == 0) {
      return bad_request(at + ".role must be one of system, developer, user, assistant, tool; got " +
                             json_excerpt(m["role"]),
                         "messages");
    }
    ordered_json msg = {{"role", role}};
    if (role != "assistant" && !m.contains("content")) return bad_request(at + ".content is required", "messages");
    auto text = content_text(m.contains("content") ? m["content"] : ordered_json(), at + ".content");
    if (auto* e = std::get_if<ApiError>(&text)) {
      e->param = "messages";
      return *e;
    }
    msg["content"] = std::get<std::string>(text);
    for (const char* key : {"name", "tool_call_id", "reasoning_content"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string()) return bad_request(at + "." + key + " must be a string", "messages");
      msg[key] = m[key];
    }
    if (role == "assistant" && m.contains("reasoning") && m["reasoning"].is_string() && !msg.contains("reasoning_content"))
      msg["reasoning_content"] = m["reasoning"];
    if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const ordered_json& calls = m["tool_calls"];
      if (!calls.is_array()) return bad_request(at + ".tool_calls must be a list", "messages");
      ordered_json norm = ordered_json::array();
      for (size_t k = 0; k < calls.size(); ++k) {
        const ordered_json& c = calls[k];
        const std::string cat = at + ".tool_calls[" + std::to_string(k) + "]";
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
          return bad_request(cat + " must be an object with a 'function'", "messages");
        const ordered_json& fn = c["function"];
        if (!fn.contains("name") || !fn["name"].is_string()) return bad_request(cat + ".function.name must be a string", "messages");
        ordered_json args = fn.contains("arguments") ? fn["arguments"] : ordered_json::object();
        // Templates expect the arguments as an object (as vLLM passes them).
        if (args.is_string()) {
          ordered_json parsed = parse_json_bounded<ordered_json>(args.get<std::string>());
          if (!parsed.is_discarded() && parsed.is_object()) args = std::move(parsed);
        } else if (!args.is_object()) {
          return bad_request(cat + ".function.arguments must be a JSON string or an object", "messages");
        }
        ordered_json call = {{"type", "function"}, {"function", {{"name", fn["name"]}, {"arguments", args}}}};
        if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
        norm.push_back(std::move(call));
      }
      msg["tool_calls"] = std::move(norm);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

ApiResult<ordered_json> chat_tools(const ordered_json& tools) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || t["type"] != "function") {
      return bad_request(at + " must be {\"type\": \"function\", \"function\": {...}}", "tools");
    }
    if (!t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string() || t["function"]["name"].get_ref<const std::string&>().empty()) {
      return bad_request(at + ".function.name must be a non-empty string", "tools");
    }
    if (t["function"].contains("parameters") && !t["function"]["parameters"].is_null() &&
        !t["function"]["parameters"].is_object()) {
      return bad_request(at + ".function.parameters must be a JSON Schema object", "tools");
    }
  }
  return tools;
}

class ChatWriter final : public ResponseWriter {
 public:
  const std::string& id() const override { return id_; }
  ChatWriter(std::string model, bool stream, bool include_usage, bool logprobs, int32_t n_choices)
      : id_(random_id("chatcmpl-")), model_(std::move(model)), created_(unix_time()), stream_(stream),
        include_usage_(include_usage), logprobs_(logprobs), choices_(size_t(n_choices)) {}

  std::string delta(int32_t choice, const SampleDelta& d, const SampleText& sample) override {
    Choice& c = choices_[size_t(choice)];
    if (!stream_) {
      for (const ParseEvent& e : d.events) tokenizer::apply_event(e, c.out);
      c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      return {};
    }
    std::string out;
    if (!c.started) {
      c.started = true;
      out += chunk(choice, {{"role", "assistant"}, {"content", ""}});
    }
    ordered_json lp = logprobs_ && !d.logprobs.empty() ? ordered_json{{"content", chat_logprob_entries(d.logprobs)}}
                                                       : ordered_json();
    for (const ParseEvent& e : d.events) {
      ordered_json delta;
      switch (e.kind) {
        case ParseEventKind::kContent: delta = {{"content", e.text}}; break;
        case ParseEventKind::kReasoning: delta = {{"reasoning_content", e.text}}; break;
        case ParseEventKind::kToolCallBegin:
          delta = {{"tool_calls",
                    {{{"index", e.tool_index}, {"id", e.id}, {"type", "function"},
                      {"function", {{"name", e.name}, {"arguments", ""}}}}}}};
          break;
        case ParseEventKind::kToolCallArgs:
          delta = {{"tool_calls", {{{"index", e.tool_index}, {"function", {{"arguments", e.text}}}}}}};
          break;
        case ParseEventKind::kToolCallEnd: continue;
      }
      out += chunk(choice, std::move(delta), std::exchange(lp, ordered_json()));
    }
    if (!lp.is_null()) out += chunk(choice, ordered_json::object(), std::move(lp));
    if (d.ended) out += chunk(choice, ordered_json::object(), ordered_json(), finish_reason(sample));
    return out;
  }

  std::string finish(const Usage& usage, const std::vector<SampleText>& samples) override {
    if (stream_) {
      return stream_end({{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", model_}},
                        include_usage_, usage);
    }
    ordered_json choices = ordered_json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      ordered_json msg = {{"role", "assistant"}};
      msg["content"] = c.out.content.empty() && !c.out.tool_calls.empty() ? ordered_json() : ordered_json(c.out.content);
      if (!c.out.reasoning.empty()) msg["reasoning_content"] = c.out.reasoning;
      if (!c.out.tool_calls.empty()) {
        ordered_json calls = ordered_json::array();
        for (const tokenizer::ToolCall& t : c.out.tool_calls)
          calls.push_back({{"id", t.id}, {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments_json}}}});
        msg["tool_calls"] = std::move(calls);
      }
      choices.push_back({{"index", i},
                         {"message", std::move(msg)},
                         {"logprobs", logprobs_ ? ordered_json{{"content", chat_logprob_entries(c.logprobs)}} : ordered_json()},
                         {"finish_reason", finish_reason(samples[i])}});
    }
    return ordered_json{{"id", id_}, {"object", "chat.completion"}, {"created", created_}, {"model", model_},
                        {"choices", std::move(choices)}, {"usage", usage_json(usage)}}
        .dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  }

 private:
  struct Choice {
    bool started = false;
    tokenizer::ParsedOutput out;
    std::vector<TokenLogprob> logprobs;
  };
  std::string chunk(int32_t choice, ordered_json delta, ordered_json logprobs = ordered_json(),
                    const std::string& finish = {}) {
    ordered_json c = {{"index", choice}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)},
                      {"finish_reason", finish.empty() ? ordered_json() : ordered_json(finish)}};
    return sse({{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", model_},
                {"choices", ordered_json::array({std::move(c)})}});
  }

  std::string id_, model_;
  int64_t created_;
  bool stream_, include_usage_, logprobs_;
  std::vector<Choice> choices_;
};

// ---- completions --------------------------------------------------------------------

class CompletionWriter final : public ResponseWriter {
 public:
  const std::string& id() const override { return id_; }
  CompletionWriter(std::string model, bool stream, bool include_usage, int32_t logprobs, int32_t n,
                   std::vector<std::string> echo)
      : id_(random_id("cmpl-")), model_(std::move(model)), created_(unix_time()), stream_(stream),
        include_usage_(include_usage), logprobs_(logprobs), n_(n), echo_(std::move(echo)),
        choices_(echo_.size() * size_t(n)) {}

  std::string delta(int32_t choice, const SampleDelta& d, const SampleText& sample) override {
    Choice& c = choices_[size_t(choice)];
    std::string text;
    if (!c.started) {
      c.started = true;
      text = echo_[size_t(choice / n_)];
    }
    text += d.text;
    if (!stream_) {
      c.text += text;
      c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      return {};
    }
    std::string out;
    if (!text.empty() || !d.logprobs.empty() || d.ended) {
      ordered_json ch = {{"index", choice}, {"text", text},
                         {"logprobs", logprobs_ >= 0 ? logprob_json(d.logprobs, c.offset) : ordered_json()},
                         {"finish_reason", d.ended ? ordered_json(finish_reason(sample)) : ordered_json()}};
      c.offset += int64_t(text.size());
      out = sse({{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
                 {"choices", ordered_json::array({std::move(ch)})}});
    }
    return out;
  }

  std::string finish(const Usage& usage, const std::vector<SampleText>& samples) override {
    if (stream_) {
      return stream_end({{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_}},
                        include_usage_, usage);
    }
    ordered_json choices = ordered_json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      int64_t offset = 0;
      choices.push_back({{"index", i},
                         {"text", choices_[i].text},
                         {"logprobs", logprobs_ >= 0 ? logprob_json(choices_[i].logprobs, offset) : ordered_json()},
                         {"finish_reason", finish_reason(samples[i])}});
    }
    return ordered_json{{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
                        {"choices", std::move(choices)}, {"usage", usage_json(usage)}}
        .dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  }

 private:
  struct Choice {
    bool started = false;
    std::string text;
    std::vector<TokenLogprob> logprobs;
    int64_t offset = 0;
  };
  // {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
  static ordered_json logprob_json(const std::vector<TokenLogprob>& lps, int64_t& offset) {
    ordered_json tokens = ordered_json::array(), values = ordered_json::array(), tops = ordered_json::array(),
                 offsets = ordered_json::array();
    for (const TokenLogprob& lp : lps) {
      tokens.push_back(lp.token);
      values.push_back(lp.logprob);
      ordered_json top = ordered_json::object();
      for (const auto& [tok, v] : lp.top) top[tok] = v;
      tops.push_back(std::move(top));
      offsets.push_back(offset);
      offset += int64_t(lp.token.size());
    }
    return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  std::string id_, model_;
  int64_t created_;
  bool stream_, include_usage_;
  int32_t logprobs_, n_;
  std::vector<std::string> echo_;  // per prompt: its text when echo is on, else ""
  std::vector<Choice> choices_;
};

// The prompt field of /v1/completions: a string, a list of strings, a list of token
// ids, or a list of lists of token ids.
ApiResult<std::vector<std::vector<int32_t>>> completion_prompts(const ordered_json& p, const PlanContext& ctx,
                                                                std::vector<std::string>& texts) {
  constexpr size_t kMaxPrompts = 64;
  const int64_t vocab = ctx.engine.config().vocab_size;
  std::vector<std::vector<int32_t>> out;
  auto ids = [&](const ordered_json& list) -> ApiResult<std::vector<int32_t>> {
    std::vector<int32_t> v;
    for (const ordered_json& t : list) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        return bad_request("'prompt' token ids must be integers in [0, " + std::to_string(vocab) + "), got " + json_excerpt(t), "prompt");
      v.push_back(int32_t(t.get<int64_t>()));
    }
    return v;
  };
  auto text = [&](const std::string& s) {
    texts.push_back(s);
    out.push_back(ctx.model.tokenizer().encode(s, true));
  };
  if (p.is_string()) {
    text(p.get<std::string>());
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    auto v = ids(p);
    if (auto* e = std::get_if<ApiError>(&v)) return *e;
    out.push_back(std::get<std::vector<int32_t>>(v));
    texts.push_back(ctx.model.tokenizer().decode(out.back()));
  } else if (p.is_array() && !p.empty()) {
    if (p.size() > kMaxPrompts) return bad_request("'prompt' has " + std::to_string(p.size()) + " prompts; at most 64", "prompt");
    for (const ordered_json& e : p) {
      if (e.is_string()) {
        text(e.get<std::string>());
      } else if (e.is_array()) {
        auto v = ids(e);
        if (auto* err = std::get_if<ApiError>(&v)) return *err;
        out.push_back(std::get<std::vector<int32_t>>(v));
        texts.push_back(ctx.model.tokenizer().decode(out.back()));
      } else {
        return bad_request("'prompt' items must be strings or lists of token ids", "prompt");
      }
    }
  } else {
    return bad_request("'prompt' must be a string, a list of strings, or a list of token ids", "prompt");
  }
  return out;
}

}  // namespace

ApiResult<Job> plan_chat(const ordered_json& body, const PlanContext& ctx) {
  if (!body.is_object()) return bad_request("the request body must be a JSON object");
  if (auto e = check_model_name(body, ctx.model)) return *e;
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return bad_request("'messages' must be a non-empty list of messages", "messages");
  }
  Job job;
  runtime::Request r;
  Fields f(body);
  bool include_usage = false;
  read_common(f, ctx, r, job.sample, job.stream, include_usage);
  std::optional<int64_t> max_tokens = f.integer("max_completion_tokens", 1, INT32_MAX);
  if (!max_tokens) max_tokens = f.integer("max_tokens", 1, INT32_MAX);
  const bool logprobs = f.boolean("logprobs").value_or(false);
  const int64_t top_logprobs = f.integer("top_logprobs", 0, ops::kMaxTopLogprobs).value_or(0);
  if (f.has("top_logprobs") && !logprobs && !f.failed()) f.fail("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  ordered_json kwargs = ordered_json::object();
  if (const ordered_json* k = f.object("chat_template_kwargs")) kwargs = *k;
  if (auto v = f.string("reasoning_effort")) kwargs["reasoning_effort"] = *v;
  std::optional<ordered_json> tools;
  if (const ordered_json* t = f.array("tools"); t != nullptr && !t->empty()) tools = *t;
  std::string tool_choice = "auto";
  ToolCallRule tool_rule;
  if (f.has("tool_choice")) {
    const ordered_json& tc = f.at("tool_choice");
    if (tc.is_string() && (tc == "none" || tc == "auto" || tc == "required")) {
      tool_choice = tc.get<std::string>();
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("function") &&
               tc["function"].is_object() && tc["function"].value("name", ordered_json()).is_string()) {
      tool_choice = "named";
      tool_rule.name = tc["function"]["name"].get<std::string>();
    } else {
      f.fail("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
             "{\"name\": ...}}",
             "tool_choice");
    }
  }
  tool_rule.parallel = f.boolean("parallel_tool_calls").value_or(true) && tool_choice != "named";
  const bool force_tools = tool_choice == "required" || tool_choice == "named";
  if (force_tools && !tools && !f.failed()) f.fail("tool_choice '" + tool_choice + "' needs 'tools'", "tool_choice");
  const std::optional<grammar::Grammar> format = read_output_format(f, /*llama_cpp_fields=*/false);
  if (f.failed()) return f.error();

  auto messages = chat_messages(body["messages"]);
  if (auto* e = std::get_if<ApiError>(&messages)) return *e;
  if (tools) {
    auto checked = chat_tools(*tools);
    if (auto* e = std::get_if<ApiError>(&checked)) return *e;
  }
  if (tool_choice == "none") tools.reset();
  auto prompt = ctx.model.render_chat(std::get<ordered_json>(messages), tools, kwargs);
  if (!prompt.ok()) return api_error_from(prompt.status());
  r.sampling.logprobs = logprobs ? int32_t(top_logprobs) : -1;
  if (auto e = finish_request(r, ctx.model.tokenizer().encode(*prompt, false), max_tokens, ctx, true)) return *e;
  std::optional<ApiError> bad;
  if (force_tools) {  // the tool calls, whatever response_format says (it shapes a final answer)
    bad = constrain_chat(r, ctx, tool_call_grammar(ctx.model.tool_syntax(), *tools, tool_rule), *prompt, true,
                         "tool_choice");
  } else if (format) {
    bad = constrain_chat(r, ctx, *format, *prompt, false, "response_format");
  } else if (tools && std::any_of(tools->begin(), tools->end(), [](const ordered_json& t) {
               return t["function"].value("strict", false) == true;
             })) {
    // tool_choice auto with strict functions: free text, and any tool calls it makes
    // follow their schemas. A strict schema kiln cannot enforce is a 400.
    Result<grammar::Grammar> calls = tool_call_grammar(ctx.model.tool_syntax(), *tools, {.parallel = tool_rule.parallel});
    if (!calls.ok() && ctx.model.tool_syntax().format != tokenizer::ToolFormat::kNone)
      return bad_request(calls.status().message(), "tools");
    if (calls.ok())
      if (std::optional<grammar::Grammar> lazy = lazy_tool_call_grammar(ctx.model.tool_syntax(), *calls))
        bad = constrain_chat(r, ctx, *lazy, *prompt, true, "tools");
  }
  if (bad) return *bad;

  job.sample.parser = ctx.model.tool_format();
  job.sample.parser_options = ctx.model.parser_options(*prompt, tools ? *tools : ordered_json::array());
  job.sample.parser_options.tool_call_id_prefix = random_id("call_") + "_";
  if (!tools && job.sample.parser != tokenizer::ToolFormat::kHarmony) job.sample.parser = tokenizer::ToolFormat::kNone;
  // Markers the parser reads may be special tokens: keep them in the text it sees.
  if (*job.sample.parser != tokenizer::ToolFormat::kNone) job.sample.skip_special_tokens = false;
  job.sample.logprobs = logprobs;
  job.writer = std::make_unique<ChatWriter>(ctx.model.name(), job.stream, include_usage, logprobs, r.n);
  job.requests.push_back(std::move(r));
  return job;
}

ApiResult<Job> plan_completion(const ordered_json& body, const PlanContext& ctx) {
  if (!body.is_object()) return bad_request("the request body must be a JSON object");
  if (auto e = check_model_name(body, ctx.model)) return *e;
  if (!body.contains("prompt") || body["prompt"].is_null()) return bad_request("'prompt' is required", "prompt");
  Job job;
  runtime::Request base;
  Fields f(body);
  bool include_usage = false;
  read_common(f, ctx, base, job.sample, job.stream, include_usage);
  const std::optional<int64_t> max_tokens = f.integer("max_tokens", 1, INT32_MAX).value_or(16);
  const int64_t logprobs = f.integer("logprobs", 0, ops::kMaxTopLogprobs).value_or(-1);
  const bool echo = f.boolean("echo").value_or(false);
  if (auto s = f.string("suffix"); s && !s->empty()) f.fail("'suffix' is not supported by this server", "suffix");
  if (echo && logprobs >= 0 && !f.failed()) f.fail("'echo' with 'logprobs' is not supported by this server", "echo");
  const std::optional<grammar::Grammar> format = read_output_format(f, /*llama_cpp_fields=*/true);
  if (f.failed()) return f.error();
  std::shared_ptr<const runtime::OutputConstraint> constraint;
  if (format) {
    auto c = ctx.model.constraint(*format);
    if (!c.ok()) return api_error_from(c.status());
    constraint = std::move(c).value();
  }

  std::vector<std::string> texts;
  auto prompts = completion_prompts(body["prompt"], ctx, texts);
  if (auto* e = std::get_if<ApiError>(&prompts)) return *e;
  base.sampling.logprobs = int32_t(logprobs);
  for (std::vector<int32_t>& p : std::get<std::vector<std::vector<int32_t>>>(prompts)) {
    runtime::Request r = base;
    r.constraint = constraint;
    if (auto e = finish_request(r, std::move(p), max_tokens, ctx, false)) return *e;
    job.requests.push_back(std::move(r));
  }
  if (!echo)
    for (std::string& t : texts) t.clear();
  job.sample.logprobs = logprobs >= 0;
  job.writer = std::make_unique<CompletionWriter>(ctx.model.name(), job.stream, include_usage, int32_t(logprobs),
                                                  base.n, std::move(texts));
  return job;
}

ordered_json models(const ServedModel& model, int64_t max_model_len, int64_t created) {
  return {{"object", "list"},
          {"data", ordered_json::array({{{"id", model.name()},
                                         {"object", "model"},
                                         {"created", created},
                                         {"owned_by", "kiln"},
                                         {"root", model.name()},
                                         {"max_model_len", max_model_len}}})}};
}

std::string error_body(const ApiError& e) {
  std::string type = "invalid_request_error", code;
  switch (e.status) {
    case 401: type = "authentication_error", code = "invalid_api_key"; break;
    case 404: code = e.param == "model" ? "model_not_found" : "not_found"; break;
    case 413: code = "request_too_large"; break;
    case 429: type = "rate_limit_error", code = "rate_limit_exceeded"; break;
    default:
      if (e.status >= 500) type = "server_error";
  }
  ordered_json err = {{"message", e.message},
                      {"type", type},
                      {"param", e.param.empty() ? ordered_json() : ordered_json(e.param)},
                      {"code", code.empty() ? ordered_json() : ordered_json(code)}};
  return ordered_json{{"error", std::move(err)}}.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

}  // namespace kiln::server::openai
