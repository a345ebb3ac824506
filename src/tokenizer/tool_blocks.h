// BlockToolParser: the streaming engine behind every marker-delimited tool-call format.
//
//   text  [section_begin]  call_begin BODY call_end  ... call_begin BODY call_end  [section_end]
//   text
//
// Formats differ in their markers and in how a BODY becomes a call (tool_formats.h);
// the engine does the streaming: content outside calls is emitted as it arrives, a call
// is buffered until its end marker and then emitted whole, or, if its body does not
// parse, emitted as content with its exact original text.
//
// Whitespace adjacent to a parsed call (before it, between calls, after the last one) is
// dropped: it is how templates separate calls, not content. Section markers are dropped
// when the section holds a parsed call; a section whose calls all fail is content, markers
// and all. Text inside a section that is neither whitespace nor a call is content.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/parser_output.h"
#include "tokenizer/parser_text.h"

namespace kiln::tokenizer::detail {

struct CallText {
  std::string id;  // empty: the engine assigns prefix + index
  std::string name;
  std::string arguments_json;
};

// Turns the text between a call's markers into a call; nullopt when it is malformed.
using CallBodyParser = std::function<std::optional<CallText>(std::string_view body)>;

struct BlockSyntax {
  Markers section_begin;  // empty: calls stand alone in the text
  Markers section_end;
  Markers call_begin;
  Markers call_end;
  CallBodyParser parse_body;
};

class BlockToolParser final : public OutputParser {
 public:
  BlockToolParser(BlockSyntax syntax, std::string id_prefix);

  void feed(std::string_view delta, std::vector<ParseEvent>& out) override;
  void finish(std::vector<ParseEvent>& out) override;

 private:
  enum class State { kText, kSection, kCall };

  bool has_sections() const { return !syntax_.section_begin.empty(); }
  void process(bool final, std::vector<ParseEvent>& out);
  void content(std::string_view text, std::vector<ParseEvent>& out);
  void section_text(std::string_view text, std::vector<ParseEvent>& out);
  void flush_pending(std::vector<ParseEvent>& out);
  void drop_pending();
  void end_call(std::string_view end_marker, std::vector<ParseEvent>& out);

  BlockSyntax syntax_;
  std::string id_prefix_;
  State state_ = State::kText;
  std::string buf_;               // text not yet scanned past
  std::string pending_;           // raw text whose fate hangs on the next call: markers, whitespace
  std::string call_body_;         // the open call's body so far
  bool begin_pending_ = false;    // the section-begin marker is still in pending_
  bool section_calls_ = false;    // the open section has a parsed call
  bool section_visible_ = false;  // the open section's begin marker went out as content
  bool after_call_ = false;       // nothing but whitespace since the last parsed call
  int n_calls_ = 0;
  TextStream content_;
};

}  // namespace kiln::tokenizer::detail
