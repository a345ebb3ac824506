#include "tokenizer/jinja_template.h"

#include <algorithm>
#include <new>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_unicode.h"

namespace kiln::jinja {

namespace {

// Offsets are 32-bit; a chat template is a few kilobytes.
constexpr size_t kMaxSourceBytes = size_t(64) << 20;

Status to_status(const JinjaError& e, std::string_view source) {
  if (e.kind() == ErrorKind::kRaised) return invalid_argument(e.message());
  std::string message = e.message();
  if (e.offset() >= 0) message = describe_position(source, e.offset()) + ": " + message;
  switch (e.kind()) {
    case ErrorKind::kSyntax: return corrupt(message);
    case ErrorKind::kUnsupported: return unsupported(message);
    case ErrorKind::kLimit: return {StatusCode::kResourceExhausted, message};
    default: return invalid_argument(message);
  }
}

}  // namespace

std::string describe_position(std::string_view source, int64_t offset) {
  const size_t end = std::min(size_t(std::max<int64_t>(offset, 0)), source.size());
  int64_t line = 1, column = 1;
  for (size_t i = 0; i < end; ++i) {
    const unsigned char c = source[i];
    if (c == '\n') {
      ++line;
      column = 1;
    } else if ((c >> 6) != 0x2) {
      ++column;  // count code points, not continuation bytes
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

Result<JinjaTemplate> JinjaTemplate::parse(std::string source) {
  if (source.size() > kMaxSourceBytes)
    return invalid_argument("template of " + std::to_string(source.size()) + " bytes is too large");
  if (!is_valid_utf8(source)) return corrupt("template is not valid UTF-8");
  std::shared_ptr<const Node> program;
  try {
    program = jinja::parse(tokenize(source), uint32_t(source.size()));
  } catch (const JinjaError& e) {
    return to_status(e, source);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, "out of memory parsing the template");
  }
  return JinjaTemplate(std::move(source), std::move(program));
}

Result<std::string> JinjaTemplate::render(const nlohmann::ordered_json& context,
                                          const RenderOptions& options) const {
  if (!context.is_object() && !context.is_null())
    return invalid_argument("the template context must be a JSON object");
  Heap heap(options.max_steps);
  try {
    Env* global = heap.env(nullptr);
    install_globals(global, heap);
    if (context.is_object()) {
      const Value values = from_json(context, heap);
      for (const auto& [name, value] : values.object->entries) {
        if (global->has_local(name)) return invalid_argument("Variable already declared: " + name);
        global->set(name, value);
      }
    }
    Interpreter interpreter(heap, options);
    return to_well_formed(interpreter.run(*program_, global));
  } catch (const JinjaError& e) {
    return to_status(e, source_);
  } catch (const BreakSignal& s) {
    return invalid_argument(describe_position(source_, s.offset) + ": {% break %} outside of a for loop");
  } catch (const ContinueSignal& s) {
    return invalid_argument(describe_position(source_, s.offset) + ": {% continue %} outside of a for loop");
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, "out of memory rendering the template");
  }
}

}  // namespace kiln::jinja
