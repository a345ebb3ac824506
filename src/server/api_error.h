// ApiError: a request's failure as a client sees it: an HTTP status and a message that
// says what was wrong. Each API renders it in its own error format (openai_api.h,
// anthropic_api.h).
#pragma once

#include <string>
#include <variant>

#include "core/status.h"

namespace kiln::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the offending request field, when there is one (OpenAI's "param")
};

inline ApiError bad_request(std::string message, std::string param = {}) {
  return {.status = 400, .message = std::move(message), .param = std::move(param)};
}

// A Status from below the server (engine, template, tokenizer) as the client's error:
// what the request can cause is a 4xx, the rest a 5xx.
inline ApiError api_error_from(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kCorrupt:
    case StatusCode::kUnsupported: return {.status = 400, .message = s.message()};
    case StatusCode::kNotFound: return {.status = 404, .message = s.message()};
    case StatusCode::kResourceExhausted: return {.status = 429, .message = s.message()};
    default: return {.status = 503, .message = s.message()};
  }
}

// A value or the ApiError that stopped it.
template <typename T>
using ApiResult = std::variant<T, ApiError>;

}  // namespace kiln::server
