// The Anthropic Messages API: /v1/messages and /v1/messages/count_tokens. A Messages
// request becomes the same chat prompt as an OpenAI one (system, user / assistant turns,
// tool_use -> tool calls, tool_result -> tool messages, thinking -> reasoning), and the
// reply comes back as content blocks (thinking, text, tool_use), streamed as Anthropic's
// events (message_start, content_block_start / delta / stop, message_delta, message_stop).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/job.h"
#include "server/plan.h"

namespace kiln::server::anthropic {

ApiResult<Job> plan_messages(const ordered_json& body, const PlanContext& ctx);
// {"input_tokens": N} for the prompt the same body would make.
ApiResult<ordered_json> count_tokens(const ordered_json& body, const PlanContext& ctx);

// {"type": "error", "error": {"type", "message"}}.
std::string error_body(const ApiError& e);

}  // namespace kiln::server::anthropic
