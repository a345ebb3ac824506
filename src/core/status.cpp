#include "core/status.h"

#include <cstdio>
#include <cstdlib>

#include "core/check.h"

namespace kiln {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorrupt: return "corrupt";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

namespace detail {

CheckFailure::CheckFailure(const char* file, int line, const std::string& what) {
  os_ << file << ":" << line << ": " << what << " ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "kiln: fatal: %s\n", os_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace detail
}  // namespace kiln
