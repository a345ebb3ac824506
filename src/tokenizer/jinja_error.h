// The error the Jinja engine throws internally. The engine is a port of
// @huggingface/jinja, which reports every problem by throwing from deep inside
// filters, tests and builtins; mirroring that with one exception type keeps the
// port comparable line by line with the reference. Nothing escapes the engine:
// JinjaTemplate::parse / render catch it and return a Status (jinja_template.h).
#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace kiln::jinja {

enum class ErrorKind {
  kSyntax,       // the template does not parse
  kUnsupported,  // a construct the engine (and @huggingface/jinja) does not implement
  kRuntime,      // evaluation failed (bad types, missing values, ...)
  kRaised,       // raise_exception(message) from the template itself
  kLimit,        // a guard against runaway templates (depth, steps, output size)
};

class JinjaError : public std::exception {
 public:
  JinjaError(ErrorKind kind, std::string message, int64_t offset = -1)
      : kind_(kind), message_(std::move(message)), offset_(offset) {}
  const char* what() const noexcept override { return message_.c_str(); }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  // Byte offset in the original template source, -1 until the innermost node that
  // was being evaluated (or the token being parsed) fills it in.
  int64_t offset() const { return offset_; }
  void set_offset(int64_t offset) { offset_ = offset; }

 private:
  ErrorKind kind_;
  std::string message_;
  int64_t offset_;
};

[[noreturn]] inline void fail(std::string message, ErrorKind kind = ErrorKind::kRuntime) {
  throw JinjaError(kind, std::move(message));
}

}  // namespace kiln::jinja
