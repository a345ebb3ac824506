#include "tokenizer/parser_reasoning.h"

namespace kiln::tokenizer::detail {
namespace {

constexpr std::string_view kThinkBegin = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

const Markers& think_end_markers() {
  static const Markers kMarkers{std::string(kThinkEnd)};
  return kMarkers;
}

}  // namespace

ReasoningSplitter::ReasoningSplitter(const ReasoningOptions& options)
    : options_(options),
      hold_(options.unclosed == UnclosedReasoning::kContent),
      state_(options.enabled ? State::kStart : State::kContent),
      reasoning_(ParseEventKind::kReasoning, kNewlines, /*strip_leading=*/true,
                 /*hold_trailing=*/true) {}

void ReasoningSplitter::feed(std::string_view delta, std::vector<ParseEvent>& out,
                             std::string& content) {
  buf_.append(delta);
  process(/*final=*/false, out, content);
}

void ReasoningSplitter::finish(std::vector<ParseEvent>& out, std::string& content) {
  process(/*final=*/true, out, content);
  if (state_ != State::kReasoning) return;
  if (hold_) {
    content += raw_;  // never closed: the whole output, tags included, is content
    raw_.clear();
    held_reasoning_.clear();
    state_ = State::kContent;
  } else {
    reasoning_.end_segment(/*drop_edges=*/true, out);
  }
}

void ReasoningSplitter::add_reasoning(std::string_view text, std::vector<ParseEvent>& out) {
  if (hold_) {
    held_reasoning_.append(text);
  } else {
    reasoning_.append(text, out);
  }
}

void ReasoningSplitter::process(bool final, std::vector<ParseEvent>& out, std::string& content) {
  while (true) {
    switch (state_) {
      case State::kStart: {
        // Whitespace, then "<think>" opens the block; anything else decides the mode.
        size_t first = buf_.find_first_not_of(kWhitespace);
        std::string_view rest =
            first == std::string::npos ? std::string_view() : std::string_view(buf_).substr(first);
        if (rest.starts_with(kThinkBegin)) {
          size_t n = first + kThinkBegin.size();
          if (hold_) raw_.append(buf_, 0, n);
          buf_.erase(0, n);
          state_ = State::kReasoning;
          continue;
        }
        if (!final && kThinkBegin.starts_with(rest)) return;  // could still become "<think>"
        state_ = options_.starts_in_reasoning ? State::kReasoning : State::kContent;
        continue;
      }
      case State::kReasoning: {
        size_t end = buf_.find(kThinkEnd);
        if (end == std::string::npos) {
          size_t keep = final ? 0 : partial_marker_length(buf_, think_end_markers());
          size_t n = buf_.size() - keep;
          add_reasoning(std::string_view(buf_).substr(0, n), out);
          if (hold_) raw_.append(buf_, 0, n);
          buf_.erase(0, n);
          return;
        }
        add_reasoning(std::string_view(buf_).substr(0, end), out);
        buf_.erase(0, end + kThinkEnd.size());
        if (hold_) {
          reasoning_.append(held_reasoning_, out);
          held_reasoning_.clear();
          raw_.clear();
        }
        reasoning_.end_segment(/*drop_edges=*/true, out);
        state_ = State::kContent;
        strip_newlines_ = true;
        continue;
      }
      case State::kContent: {
        size_t begin = 0;
        if (strip_newlines_) {
          begin = buf_.find_first_not_of(kNewlines);
          if (begin == std::string::npos) begin = buf_.size();
          if (begin < buf_.size()) strip_newlines_ = false;
        }
        content.append(buf_, begin);
        buf_.clear();
        return;
      }
    }
  }
}

}  // namespace kiln::tokenizer::detail
