// From one sample's token ids to what a client sees, as they arrive:
//
//   token -> incremental detokenizer -> stop strings (text that may begin one is held
//     back until it is resolved) -> output parser (chat: content / reasoning / tool
//     calls) -> deltas
//
// The sample's final end-of-sequence or stop token is not turned into text. A matched
// stop string ends the sample (the caller cancels it in the engine).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/async_engine.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/parser_output.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

// Holds back text that may be the start of a stop string.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // The text that is final after `text` arrives; sets matched() when a stop string
  // completes (the returned text then ends where it begins, or after it when
  // include_stop is set).
  std::string push(std::string_view text, bool include_stop);
  // End of the sample: everything held back (nothing after a match).
  std::string flush();
  const std::optional<std::string>& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::optional<std::string> matched_;
};

struct TokenLogprob {
  std::string token;  // the token's text
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;
};

// Why a sample ended, as the APIs distinguish it.
enum class EndReason {
  kNone,
  kEos,         // the model's end of sequence (or end of turn)
  kStopString,  // a stop string; stop_string() says which
  kStopToken,   // one of the request's stop token ids
  kLength,      // max_tokens or the context length
  kAbort,       // cancelled by the server (overloaded, shutting down)
};
// "eos", "stop_string", "stop_token", "length", "abort" ("none" while running): for logs.
const char* end_reason_name(EndReason r);

struct SampleOptions {
  bool skip_special_tokens = true;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  // Chat: the reply's parser (content, reasoning, tool calls). Completions: none.
  std::optional<tokenizer::ToolFormat> parser;
  tokenizer::ParserOptions parser_options;
  bool logprobs = false;
  // vLLM's return_tokens_as_token_ids: logprob entries name tokens as "token_id:N" (exact
  // where several ids decode to the same text, e.g. partial UTF-8 bytes).
  bool tokens_as_ids = false;
};

// What one engine event added to a sample.
struct SampleDelta {
  std::string text;                              // completions: raw text
  std::vector<tokenizer::ParseEvent> events;     // chat: parsed events
  std::vector<TokenLogprob> logprobs;            // one per token that arrived
  bool ended = false;                            // this delta ends the sample
};

class SampleText {
 public:
  SampleText(const tokenizer::Tokenizer& tok, const SampleOptions& options);
  // Folds one engine event into `out` (appending). Events after the end are ignored.
  void on_event(const runtime::StreamEvent& e, SampleDelta& out);
  bool ended() const { return end_ != EndReason::kNone; }
  EndReason end_reason() const { return end_; }
  const std::optional<std::string>& stop_string() const { return stops_.matched(); }
  int32_t n_tokens() const { return n_tokens_; }  // generated tokens that arrived
  bool any_tool_call() const { return any_tool_call_; }

 private:
  void emit(std::string text, SampleDelta& out);
  void end(EndReason reason, SampleDelta& out);
  std::string token_text(int32_t id) const;

  const tokenizer::Tokenizer& tok_;
  SampleOptions options_;
  tokenizer::IncrementalDetokenizer detok_;
  StopMatcher stops_;
  std::unique_ptr<tokenizer::OutputParser> parser_;
  EndReason end_ = EndReason::kNone;
  int32_t n_tokens_ = 0;
  bool any_tool_call_ = false;
};

}  // namespace kiln::server
