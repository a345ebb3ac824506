// HarmonyParser: the GPT-OSS output parser (the text generated after "<|start|>assistant").
//
//   [<|start|>ROLE][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][
//   TYPE|<|constrain|>TYPE]<|message|>BODY END
//
// END is <|end|>, <|return|> or <|call|>; a message may follow (<|start|>assistant...).
// The recipient may sit before or after the channel: the chat template renders
// "assistant to=functions.f<|channel|>commentary json", the harmony library and the model
// usually "<|channel|>commentary to=functions.f <|constrain|>json".
//
// Routing: a message with a recipient other than assistant/user/all is a tool call (name:
// the recipient without "functions."; other recipients, such as "browser.search", keep
// their full name), whatever its channel; its body must be a JSON object, else the whole
// message, markers included, is content. Otherwise the analysis channel is reasoning,
// and final, commentary (preambles) and anything else are content. Messages of one
// generation are concatenated per kind, without separators.
//
// At finish, an open tool call whose body parses is complete (<|call|> is a stop token a
// server may not forward); a header cut short is dropped (it holds no text, only role and
// channel). Output that does not start like a harmony header (plain text from a model
// that ignores the format) is content.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/parser_output.h"
#include "tokenizer/parser_text.h"

namespace kiln::tokenizer::detail {

class HarmonyParser final : public OutputParser {
 public:
  explicit HarmonyParser(std::string id_prefix);

  void feed(std::string_view delta, std::vector<ParseEvent>& out) override;
  void finish(std::vector<ParseEvent>& out) override;

 private:
  enum class State { kHeader, kBody, kBetween };
  enum class Route { kContent, kReasoning, kToolCall };

  void process(bool final, std::vector<ParseEvent>& out);
  bool header_plausible() const;
  void open_body();
  void close_message(std::string_view end_marker, std::vector<ParseEvent>& out);
  void start_header(std::string_view opener);

  std::string id_prefix_;
  State state_ = State::kHeader;
  std::string buf_;           // text not yet scanned past
  std::string header_;        // the open header (after "<|start|>" when after_start_)
  std::string raw_;           // the open message as generated, for the malformed fallback
  std::string body_;          // tool-call body
  std::string between_ws_;    // whitespace between messages, dropped unless text follows
  bool after_start_ = false;  // the header opened with <|start|>, so it begins with a role
  Route route_ = Route::kContent;
  std::string tool_name_;
  int n_calls_ = 0;
  TextStream content_;
  TextStream reasoning_;
};

}  // namespace kiln::tokenizer::detail
