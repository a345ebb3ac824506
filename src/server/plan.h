// What both APIs share when they turn a request body into a Job: the limits and the
// model they plan against, the sampling fields they read the same way, and the chat
// messages the templates expect.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/served_model.h"

namespace kiln::server {

struct PlanContext {
  const ServedModel& model;
  const runtime::Engine& engine;  // read-only: vocabulary, maximum length, eos ids
  // Tests only (the server's test hook): text every sample emits in place of what it samples.
  std::optional<std::string> forced_output;
  int32_t max_n = 64;             // parallel samples per request at most
};

// The model a request names must be the one served (404 otherwise); a request that names
// none ("model" absent, null or "") gets the served model.
std::optional<ApiError> check_model_name(const ordered_json& body, const ServedModel& model);

// Reads the sampling fields shared by the OpenAI endpoints (and Anthropic's subset):
// temperature, top_p, top_k, min_p, seed, the penalties, stop_token_ids, ignore_eos.
// Fields not given take the model's defaults; a request without a seed gets a random one.
void read_sampling(Fields& f, runtime::Request& r, const PlanContext& ctx);

// The prompt is tokenized; sets the request's prompt and max_tokens (given, else what
// the context has left), checking both against the maximum length.
std::optional<ApiError> finish_request(runtime::Request& r, std::vector<int32_t> prompt,
                                       std::optional<int64_t> max_tokens, const PlanContext& ctx,
                                       bool add_eos_stop);

// Structured output for a chat reply to `prompt`: `g` (a 400 on `param` when it is an
// error) framed by the model's reasoning and set as r's constraint.
std::optional<ApiError> constrain_chat(runtime::Request& r, const PlanContext& ctx, const Result<grammar::Grammar>& g,
                                       std::string_view prompt, bool tool_calls, const char* param);

// Content given as a string, null, or a list of text parts ({"type": "text", "text"}),
// as one string (parts joined with "\n"). Other part types are refused.
ApiResult<std::string> content_text(const ordered_json& content, const std::string& where);

// Unique response ids: prefix + 24 hex digits.
std::string random_id(const std::string& prefix);
int64_t unix_time();

}  // namespace kiln::server
