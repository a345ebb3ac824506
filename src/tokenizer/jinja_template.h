// kiln's Jinja engine: renders Hugging Face chat templates byte for byte as
// @huggingface/jinja 0.5.11 does (the engine of transformers.js), which is the oracle
// the tests compare against. The engine is split into:
//   jinja_lexer    preprocessing (trim_blocks, lstrip_blocks) and tokens
//   jinja_parser   the syntax tree (jinja_ast.h)
//   jinja_value    runtime values and the JavaScript conversions they need
//   jinja_interpreter / jinja_filters / jinja_builtins   evaluation
//   jinja_unicode  JavaScript string semantics over UTF-8
//
//   auto t = JinjaTemplate::parse(source);
//   auto text = t->render({{"messages", ...}, {"add_generation_prompt", true}});
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kiln::jinja {

struct Node;

// A local date and time for strftime_now (which formats %Y %m %d %b %B %H %M %%).
struct DateTime {
  int year = 1970;
  int month = 1;  // 1-12
  int day = 1;
  int hour = 0;
  int minute = 0;
};

struct RenderOptions {
  std::optional<DateTime> now;  // unset: the machine's local time at render
  // Guards against runaway templates; each is an error, never a hang or a crash.
  int64_t max_steps = 20'000'000;               // evaluated nodes, loop iterations, list items, KiB copied
  size_t max_output_bytes = size_t(256) << 20;  // any one string, the output included
  int max_depth = 500;                          // nested evaluation (macro recursion)
};

class JinjaTemplate {
 public:
  // Errors: the template does not parse (kCorrupt), or uses a construct the engine does
  // not support (kUnsupported). Messages name the template line and column.
  static Result<JinjaTemplate> parse(std::string source);

  // The context's top-level keys become template variables. Errors:
  //  - raise_exception(msg) in the template: kInvalidArgument with exactly `msg`;
  //  - evaluation errors: kInvalidArgument, "line L, column C: <message>" where <message>
  //    is the reference's own message;
  //  - an unknown filter or test: kUnsupported;
  //  - the guards of RenderOptions: kResourceExhausted.
  // const and thread-safe: one parsed template can serve concurrent renders.
  Result<std::string> render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  JinjaTemplate(std::string source, std::shared_ptr<const Node> program)
      : source_(std::move(source)), program_(std::move(program)) {}
  std::string source_;
  std::shared_ptr<const Node> program_;
};

// "line 3, column 14" (both 1-based, the column in code points) for a byte offset.
std::string describe_position(std::string_view source, int64_t offset);

}  // namespace kiln::jinja
