// The OpenAI API: /v1/chat/completions, /v1/completions and /v1/models request bodies
// to Jobs, and Jobs' output to OpenAI's JSON (streamed as SSE chunks ending in
// "data: [DONE]", or one body). Also the vLLM extensions clients use with open models:
// top_k, min_p, repetition_penalty, seed, stop_token_ids, ignore_eos, skip_special_tokens,
// include_stop_str_in_output, chat_template_kwargs.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/job.h"
#include "server/plan.h"

namespace kiln::server::openai {

ApiResult<Job> plan_chat(const ordered_json& body, const PlanContext& ctx);
ApiResult<Job> plan_completion(const ordered_json& body, const PlanContext& ctx);

// GET /v1/models.
ordered_json models(const ServedModel& model, int64_t max_model_len, int64_t created);

// {"error": {"message", "type", "param", "code"}}.
std::string error_body(const ApiError& e);

}  // namespace kiln::server::openai
