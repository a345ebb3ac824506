#include "server/text_stream.h"

#include <algorithm>

namespace kiln::server {

const char* end_reason_name(EndReason r) {
  switch (r) {
    case EndReason::kNone: return "none";
    case EndReason::kEos: return "eos";
    case EndReason::kStopString: return "stop_string";
    case EndReason::kStopToken: return "stop_token";
    case EndReason::kLength: return "length";
    case EndReason::kAbort: return "abort";
  }
  return "none";
}

std::string StopMatcher::push(std::string_view text, bool include_stop) {
  if (matched_) return {};
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, {});
  // The earliest complete stop string ends the text.
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > which->size()))) {
      best = at;
      which = &s;
    }
  }
  if (which != nullptr) {
    matched_ = *which;
    std::string out = held_.substr(0, include_stop ? best + which->size() : best);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of a stop string.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (matched_) return {};
  return std::exchange(held_, {});
}

SampleText::SampleText(const tokenizer::Tokenizer& tok, const SampleOptions& options)
    : tok_(tok),
      options_(options),
      detok_(tok, options.skip_special_tokens),
      stops_(options.stop) {
  if (options_.parser) parser_ = tokenizer::make_output_parser(*options_.parser, options_.parser_options);
}

void SampleText::emit(std::string text, SampleDelta& out) {
  if (text.empty()) return;
  if (!parser_) {
    out.text += text;
    return;
  }
  const size_t first = out.events.size();
  parser_->feed(text, out.events);
  for (size_t i = first; i < out.events.size(); ++i)
    any_tool_call_ = any_tool_call_ || out.events[i].kind == tokenizer::ParseEventKind::kToolCallBegin;
}

void SampleText::end(EndReason reason, SampleDelta& out) {
  end_ = reason;
  out.ended = true;
  if (reason != EndReason::kStopString) emit(stops_.flush(), out);
  if (parser_) {
    const size_t first = out.events.size();
    parser_->finish(out.events);
    for (size_t i = first; i < out.events.size(); ++i)
      any_tool_call_ = any_tool_call_ || out.events[i].kind == tokenizer::ParseEventKind::kToolCallBegin;
  }
}

std::string SampleText::token_text(int32_t id) const {
  if (options_.tokens_as_ids) return "token_id:" + std::to_string(id);
  return tok_.decode(std::span<const int32_t>(&id, 1));
}

void SampleText::on_event(const runtime::StreamEvent& e, SampleDelta& out) {
  if (ended()) return;
  using runtime::FinishReason;
  if (e.has_token) {
    ++n_tokens_;
    const int32_t id = e.token.token;
    if (options_.logprobs) {
      TokenLogprob lp{.token = token_text(id), .logprob = e.token.logprob};
      for (size_t i = 0; i < e.token.top_ids.size(); ++i) {
        const int32_t t = e.token.top_ids[i];
        lp.top.emplace_back(token_text(t), e.token.top_logprobs[i]);
      }
      out.logprobs.push_back(std::move(lp));
    }
    // The token that ends the sample at eos or a stop id is not part of the text.
    const bool final_marker = e.finish == FinishReason::kEos || e.finish == FinishReason::kStopToken;
    if (!final_marker) {
      std::string piece = detok_.push(id);
      emit(stops_.push(piece, options_.include_stop_str_in_output), out);
      if (stops_.matched()) {
        end(EndReason::kStopString, out);
        return;
      }
    }
  }
  if (e.finish == FinishReason::kNone) return;
  // Text held back by the detokenizer (an unfinished UTF-8 sequence) is final now.
  emit(stops_.push(detok_.flush(), options_.include_stop_str_in_output), out);
  if (stops_.matched()) {
    end(EndReason::kStopString, out);
    return;
  }
  switch (e.finish) {
    case FinishReason::kEos: end(EndReason::kEos, out); break;
    case FinishReason::kStopToken: end(EndReason::kStopToken, out); break;
    case FinishReason::kGrammar: end(EndReason::kEos, out); break;  // "stop"; its token was text
    case FinishReason::kLength: end(EndReason::kLength, out); break;
    default: end(EndReason::kAbort, out); break;
  }
}

}  // namespace kiln::server
