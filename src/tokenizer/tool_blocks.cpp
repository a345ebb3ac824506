#include "tokenizer/tool_blocks.h"

#include <utility>

namespace kiln::tokenizer::detail {

BlockToolParser::BlockToolParser(BlockSyntax syntax, std::string id_prefix)
    : syntax_(std::move(syntax)),
      id_prefix_(std::move(id_prefix)),
      content_(ParseEventKind::kContent, kWhitespace, /*strip_leading=*/false,
               /*hold_trailing=*/true) {}

void BlockToolParser::feed(std::string_view delta, std::vector<ParseEvent>& out) {
  buf_.append(delta);
  process(/*final=*/false, out);
}

void BlockToolParser::finish(std::vector<ParseEvent>& out) {
  process(/*final=*/true, out);
  switch (state_) {
    case State::kText:
      break;
    case State::kSection:  // no section end: a section with parsed calls loses only whitespace
      if (section_calls_ && !begin_pending_) {
        drop_pending();
      } else {
        flush_pending(out);
      }
      break;
    case State::kCall:  // an unterminated call is content, markers included
      content(pending_ + call_body_, out);
      pending_.clear();
      begin_pending_ = false;
      call_body_.clear();
      break;
  }
  state_ = State::kText;
  content_.end_segment(/*drop_edges=*/after_call_, out);
}

void BlockToolParser::content(std::string_view text, std::vector<ParseEvent>& out) {
  if (text.empty()) return;
  content_.append(text, out);
  if (!all_space(text)) after_call_ = false;
}

void BlockToolParser::flush_pending(std::vector<ParseEvent>& out) {
  if (begin_pending_) section_visible_ = true;
  begin_pending_ = false;
  content(pending_, out);
  pending_.clear();
}

void BlockToolParser::drop_pending() {
  begin_pending_ = false;
  pending_.clear();
}

// Text inside a section, outside calls: whitespace waits in pending_ for the next call
// (dropped if it parses), anything else is content along with what was pending.
void BlockToolParser::section_text(std::string_view text, std::vector<ParseEvent>& out) {
  size_t last = text.find_last_not_of(kWhitespace);
  if (last == std::string_view::npos) {
    pending_.append(text);
    return;
  }
  pending_.append(text.substr(0, last + 1));
  flush_pending(out);
  pending_.assign(text.substr(last + 1));
}

void BlockToolParser::end_call(std::string_view end_marker, std::vector<ParseEvent>& out) {
  std::optional<CallText> call = syntax_.parse_body(call_body_);
  if (call) {
    drop_pending();
    int index = n_calls_++;
    std::string id = call->id.empty() ? id_prefix_ + std::to_string(index) : call->id;
    out.push_back({.kind = ParseEventKind::kToolCallBegin,
                   .tool_index = index,
                   .id = std::move(id),
                   .name = std::move(call->name)});
    out.push_back({.kind = ParseEventKind::kToolCallArgs,
                   .text = std::move(call->arguments_json),
                   .tool_index = index});
    out.push_back({.kind = ParseEventKind::kToolCallEnd, .tool_index = index});
    after_call_ = true;
    if (state_ == State::kCall && has_sections()) section_calls_ = true;
  } else {
    pending_ += call_body_;
    pending_ += end_marker;
    flush_pending(out);
  }
  call_body_.clear();
}

void BlockToolParser::process(bool final, std::vector<ParseEvent>& out) {
  const BlockSyntax& s = syntax_;
  while (true) {
    switch (state_) {
      case State::kText: {
        const Markers& opener = has_sections() ? s.section_begin : s.call_begin;
        MarkerHit hit = find_marker(buf_, opener);
        if (!hit.found()) {
          size_t n = buf_.size() - (final ? 0 : partial_marker_length(buf_, opener));
          content(std::string_view(buf_).substr(0, n), out);
          buf_.erase(0, n);
          return;
        }
        content(std::string_view(buf_).substr(0, hit.pos), out);
        // Whitespace right before a call belongs to the call: dropped if it parses.
        pending_ = content_.take_held_edges(out);
        pending_.append(buf_, hit.pos, hit.length);
        buf_.erase(0, hit.pos + hit.length);
        if (has_sections()) {
          state_ = State::kSection;
          begin_pending_ = true;
          section_calls_ = false;
          section_visible_ = false;
        } else {
          state_ = State::kCall;
        }
        continue;
      }
      case State::kSection: {
        MarkerHit hit = find_marker(buf_, {&s.call_begin, &s.section_end});
        size_t n =
            hit.found()
                ? hit.pos
                : buf_.size() -
                      (final ? 0 : partial_marker_length(buf_, {&s.call_begin, &s.section_end}));
        section_text(std::string_view(buf_).substr(0, n), out);
        if (!hit.found()) {
          buf_.erase(0, n);
          return;
        }
        std::string marker = buf_.substr(hit.pos, hit.length);
        buf_.erase(0, hit.pos + hit.length);
        if (hit.index < s.call_begin.size()) {
          pending_ += marker;
          state_ = State::kCall;
        } else {
          if (section_calls_ && !section_visible_ && !begin_pending_) {
            drop_pending();  // the section parsed: its end marker is structure
          } else {
            pending_ += marker;
            flush_pending(out);
          }
          state_ = State::kText;
        }
        continue;
      }
      case State::kCall: {
        MarkerHit hit = find_marker(buf_, s.call_end);
        if (!hit.found()) {
          size_t n = buf_.size() - (final ? 0 : partial_marker_length(buf_, s.call_end));
          call_body_.append(buf_, 0, n);
          buf_.erase(0, n);
          return;
        }
        call_body_.append(buf_, 0, hit.pos);
        std::string marker = buf_.substr(hit.pos, hit.length);
        buf_.erase(0, hit.pos + hit.length);
        end_call(marker, out);
        state_ = has_sections() ? State::kSection : State::kText;
        continue;
      }
    }
  }
}

}  // namespace kiln::tokenizer::detail
