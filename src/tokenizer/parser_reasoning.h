// ReasoningSplitter: the <think>...</think> stage that runs before a tool-call parser.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/parser_output.h"
#include "tokenizer/parser_text.h"

namespace kiln::tokenizer::detail {

// Splits the start of an output into reasoning (emitted as kReasoning events) and passes
// the rest on as content text for the next stage. Semantics: ReasoningOptions.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(const ReasoningOptions& options);

  // Appends reasoning events to `out` and the content part of the text to `content`.
  void feed(std::string_view delta, std::vector<ParseEvent>& out, std::string& content);
  void finish(std::vector<ParseEvent>& out, std::string& content);

 private:
  enum class State { kStart, kReasoning, kContent };

  void process(bool final, std::vector<ParseEvent>& out, std::string& content);
  void add_reasoning(std::string_view text, std::vector<ParseEvent>& out);

  ReasoningOptions options_;
  bool hold_ = false;  // options_.unclosed == kContent: reasoning waits for </think>
  State state_ = State::kStart;
  std::string buf_;              // text not yet classified
  std::string raw_;              // hold_: the output so far, released as content if unclosed
  std::string held_reasoning_;   // hold_: reasoning text waiting for </think>
  bool strip_newlines_ = false;  // drop the newlines that follow </think>
  TextStream reasoning_;
};

}  // namespace kiln::tokenizer::detail
