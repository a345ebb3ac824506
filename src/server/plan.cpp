#include "server/plan.h"

#include <chrono>
#include <random>

namespace kiln::server {

std::optional<ApiError> check_model_name(const ordered_json& body, const ServedModel& model) {
  // Absent, null or "": the served model, as vLLM and llama.cpp's server take it.
  if (!body.contains("model") || body["model"].is_null()) return std::nullopt;
  if (!body["model"].is_string()) return bad_request("'model' must be a string, got " + json_excerpt(body["model"]), "model");
  const std::string& name = body["model"].get_ref<const std::string&>();
  if (name.empty()) return std::nullopt;
  if (name != model.name()) {
    return ApiError{.status = 404,
                    .message = "The model '" + name.substr(0, 200) + "' does not exist; this server serves '" +
                               model.name() + "'",
                    .param = "model"};
  }
  return std::nullopt;
}

void read_sampling(Fields& f, runtime::Request& r, const PlanContext& ctx) {
  const int64_t vocab = ctx.engine.config().vocab_size;
  runtime::SamplingParams& s = r.sampling;
  const SamplingDefaults& d = ctx.model.sampling_defaults();
  s.temperature = float(d.temperature);
  s.top_p = float(d.top_p);
  s.top_k = int32_t(std::min<int64_t>(d.top_k, vocab));
  s.min_p = float(d.min_p);
  s.repetition_penalty = float(d.repetition_penalty);
  if (auto v = f.number("temperature", 0.0, 100.0)) s.temperature = float(*v);
  if (auto v = f.number("top_p", 0.0, 1.0)) {
    if (*v <= 0.0) f.fail("'top_p' must be greater than 0 and at most 1", "top_p");
    s.top_p = float(*v);
  }
  if (auto v = f.integer("top_k", -1, vocab)) s.top_k = int32_t(std::max<int64_t>(*v, 0));  // -1 and 0: off
  if (auto v = f.number("min_p", 0.0, 1.0)) s.min_p = float(*v);
  if (auto v = f.number("presence_penalty", -2.0, 2.0)) s.presence_penalty = float(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0)) s.frequency_penalty = float(*v);
  if (auto v = f.number("repetition_penalty", 0.0, 10.0)) {
    if (*v <= 0.0) f.fail("'repetition_penalty' must be greater than 0", "repetition_penalty");
    s.repetition_penalty = float(*v);
  }
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) {
    s.seed = uint64_t(*v);
  } else {
    s.seed = std::random_device{}() * 0x100000001b3ull ^ std::random_device{}();
  }
  if (auto v = f.int_list("stop_token_ids", 256, 0, vocab - 1)) r.stop_token_ids = *v;
  if (auto v = f.boolean("ignore_eos")) r.ignore_eos = *v;
}

std::optional<ApiError> finish_request(runtime::Request& r, std::vector<int32_t> prompt,
                                       std::optional<int64_t> max_tokens, const PlanContext& ctx, bool add_eos_stop) {
  const int64_t limit = ctx.engine.max_model_len();
  const int64_t n_prompt = int64_t(prompt.size());
  if (n_prompt == 0) return bad_request("the prompt is empty");
  if (n_prompt >= limit) {
    return bad_request("This model's maximum context length is " + std::to_string(limit) + " tokens. However, your prompt has " +
                       std::to_string(n_prompt) + " tokens, which leaves no room to generate. Please reduce the length of the prompt.");
  }
  if (max_tokens && n_prompt + *max_tokens > limit) {
    return bad_request("This model's maximum context length is " + std::to_string(limit) + " tokens. However, you requested " +
                           std::to_string(n_prompt + *max_tokens) + " tokens (" + std::to_string(n_prompt) +
                           " in the prompt, " + std::to_string(*max_tokens) +
                           " for the completion). Please reduce the length of the prompt or the maximum tokens.",
                       "max_tokens");
  }
  r.max_tokens = int32_t(max_tokens ? *max_tokens : limit - n_prompt);
  r.prompt = std::move(prompt);
  if (add_eos_stop && !r.ignore_eos) {
    for (int32_t id : ctx.model.stop_token_ids())
      if (id < ctx.engine.config().vocab_size) r.stop_token_ids.push_back(id);
  }
  if (ctx.forced_output) r.forced_output = ctx.model.tokenizer().encode(*ctx.forced_output, false);
  if (Status s = ctx.engine.check_request(r); !s.ok()) return api_error_from(s);
  return std::nullopt;
}

ApiResult<std::string> content_text(const ordered_json& content, const std::string& where) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return bad_request(where + " must be a string or a list of content parts");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const ordered_json& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return bad_request(at + " must be an object with a 'type'");
    }
    const std::string& type = part["type"].get_ref<const std::string&>();
    if (type != "text") {
      return bad_request(at + " has type '" + type.substr(0, 60) + "': this model takes text only (parts of type 'text')");
    }
    if (!part.contains("text") || !part["text"].is_string()) return bad_request(at + ".text must be a string");
    if (!out.empty()) out += "\n";
    out += part["text"].get<std::string>();
  }
  return out;
}

std::string random_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* kHex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::optional<ApiError> constrain_chat(runtime::Request& r, const PlanContext& ctx, const Result<grammar::Grammar>& g,
                                       std::string_view prompt, bool tool_calls, const char* param) {
  if (!g.ok()) return bad_request(g.status().message(), param);
  auto c = ctx.model.chat_constraint(g.value(), prompt, tool_calls);
  if (!c.ok()) return api_error_from(c.status());
  r.constraint = std::move(c).value();
  return std::nullopt;
}

}  // namespace kiln::server
