#include "tokenizer/parser_harmony.h"

#include <algorithm>
#include <utility>

namespace kiln::tokenizer::detail {
namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
// A header is a role, a channel, a recipient and a content type: far below this. Longer,
// or spanning a newline, it is not a header but text from a model ignoring the format.
constexpr size_t kMaxHeaderBytes = 256;

const Markers kHeaderStops = {"<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|start|>"};
const Markers kBodyEnds = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};
const Markers kOpeners = {"<|start|>", "<|channel|>"};

// The word after `key` in a header: up to a space, a special token or the end.
std::string_view word_after(std::string_view header, size_t pos) {
  std::string_view rest = header.substr(pos);
  return rest.substr(0, rest.find_first_of(" <"));
}

std::string_view recipient_of(std::string_view header) {
  for (size_t i = header.find("to="); i != std::string_view::npos; i = header.find("to=", i + 1)) {
    if (i == 0 || header[i - 1] == ' ' || header[i - 1] == '>') return word_after(header, i + 3);
  }
  return {};
}

}  // namespace

HarmonyParser::HarmonyParser(std::string id_prefix)
    : id_prefix_(std::move(id_prefix)),
      content_(ParseEventKind::kContent, "", false, false),
      reasoning_(ParseEventKind::kReasoning, "", false, false) {}

void HarmonyParser::feed(std::string_view delta, std::vector<ParseEvent>& out) {
  buf_.append(delta);
  process(/*final=*/false, out);
}

void HarmonyParser::finish(std::vector<ParseEvent>& out) {
  process(/*final=*/true, out);
  switch (state_) {
    case State::kHeader:  // cut inside a header: it names a role and channel, no text
      raw_.clear();
      header_.clear();
      break;
    case State::kBody:
      if (route_ == Route::kToolCall) close_message("", out);
      break;
    case State::kBetween:
      between_ws_.clear();
      break;
  }
  content_.end_segment(/*drop_edges=*/false, out);
  reasoning_.end_segment(/*drop_edges=*/false, out);
}

bool HarmonyParser::header_plausible() const {
  if (header_.find('\n') != std::string::npos || header_.size() > kMaxHeaderBytes) return false;
  if (after_start_) return true;  // "<|start|>" then a role
  // The first message of the output follows "<|start|>assistant" in the prompt: the
  // generation begins with a channel or a recipient.
  std::string_view h = header_;
  h.remove_prefix(std::min(h.size(), h.find_first_not_of(' ')));
  for (std::string_view opener : {kChannel, std::string_view("to=")})
    if (h.starts_with(opener) || opener.starts_with(h)) return true;
  return false;
}

void HarmonyParser::start_header(std::string_view opener) {
  raw_ = opener;
  header_ = opener == kChannel ? std::string(opener) : std::string();
  after_start_ = opener == kStart;
  state_ = State::kHeader;
}

void HarmonyParser::open_body() {
  std::string_view h = header_;
  std::string_view role = "assistant";
  if (after_start_) role = h.substr(0, h.find_first_of(" <"));
  std::string_view channel;
  if (size_t c = h.find(kChannel); c != std::string_view::npos)
    channel = word_after(h, c + kChannel.size());
  std::string_view recipient = recipient_of(h);

  if (!recipient.empty() && recipient != "assistant" && recipient != "user" && recipient != "all") {
    route_ = Route::kToolCall;
    if (recipient.starts_with("functions."))
      recipient.remove_prefix(std::string_view("functions.").size());
    tool_name_ = recipient;
    return;  // raw_ is kept until the call parses
  }
  route_ = role == "assistant" && channel == "analysis" ? Route::kReasoning : Route::kContent;
  raw_.clear();
}

void HarmonyParser::close_message(std::string_view end_marker, std::vector<ParseEvent>& out) {
  content_.end_segment(/*drop_edges=*/false, out);
  reasoning_.end_segment(/*drop_edges=*/false, out);
  if (route_ == Route::kToolCall) {
    std::optional<nlohmann::ordered_json> arguments = parse_json_object(body_);
    if (arguments && !tool_name_.empty()) {
      int index = n_calls_++;
      out.push_back({.kind = ParseEventKind::kToolCallBegin,
                     .tool_index = index,
                     .id = id_prefix_ + std::to_string(index),
                     .name = tool_name_});
      out.push_back({.kind = ParseEventKind::kToolCallArgs,
                     .text = dump_compact(*arguments),
                     .tool_index = index});
      out.push_back({.kind = ParseEventKind::kToolCallEnd, .tool_index = index});
    } else {
      raw_ += end_marker;
      content_.append(raw_, out);
      content_.end_segment(/*drop_edges=*/false, out);
    }
  }
  route_ = Route::kContent;
  raw_.clear();
  header_.clear();
  body_.clear();
  tool_name_.clear();
}

void HarmonyParser::process(bool final, std::vector<ParseEvent>& out) {
  while (true) {
    switch (state_) {
      case State::kHeader: {
        MarkerHit hit = find_marker(buf_, kHeaderStops);
        size_t n = hit.found()
                       ? hit.pos
                       : buf_.size() - (final ? 0 : partial_marker_length(buf_, kHeaderStops));
        header_.append(buf_, 0, n);
        raw_.append(buf_, 0, n);
        buf_.erase(0, n);
        if (!header_plausible()) {  // not a header after all: content, as generated
          content_.append(raw_, out);
          raw_.clear();
          header_.clear();
          route_ = Route::kContent;
          state_ = State::kBody;
          continue;
        }
        if (!hit.found()) return;
        std::string marker = buf_.substr(0, hit.length);
        buf_.erase(0, hit.length);
        if (marker == kMessage) {
          raw_ += marker;
          open_body();
          state_ = State::kBody;
        } else if (marker == kStart) {  // a header without a message: dropped, as a cut one
          start_header(kStart);
        } else {
          raw_.clear();
          header_.clear();
          state_ = State::kBetween;
        }
        continue;
      }
      case State::kBody: {
        MarkerHit hit = find_marker(buf_, kBodyEnds);
        size_t n = hit.found() ? hit.pos
                               : buf_.size() - (final ? 0 : partial_marker_length(buf_, kBodyEnds));
        std::string_view text = std::string_view(buf_).substr(0, n);
        switch (route_) {
          case Route::kContent:
            content_.append(text, out);
            break;
          case Route::kReasoning:
            reasoning_.append(text, out);
            break;
          case Route::kToolCall:
            body_.append(text);
            raw_.append(text);
            break;
        }
        buf_.erase(0, n);
        if (!hit.found()) return;
        std::string marker = buf_.substr(0, hit.length);
        buf_.erase(0, hit.length);
        if (marker == kStart) {  // the model skipped <|end|>: the next message begins
          close_message("", out);
          start_header(kStart);
        } else {
          close_message(marker, out);
          state_ = State::kBetween;
        }
        continue;
      }
      case State::kBetween: {
        // Only whitespace belongs between messages; other text is content.
        MarkerHit hit = find_marker(buf_, kOpeners);
        size_t n = hit.found() ? hit.pos
                               : buf_.size() - (final ? 0 : partial_marker_length(buf_, kOpeners));
        std::string_view text = std::string_view(buf_).substr(0, n);
        size_t last = text.find_last_not_of(kWhitespace);
        if (last == std::string_view::npos) {
          between_ws_.append(text);
        } else {
          between_ws_.append(text.substr(0, last + 1));
          content_.append(between_ws_, out);
          between_ws_.assign(text.substr(last + 1));
        }
        buf_.erase(0, n);
        if (!hit.found()) return;
        between_ws_.clear();
        std::string marker = buf_.substr(0, hit.length);
        buf_.erase(0, hit.length);
        start_header(marker);
        continue;
      }
    }
  }
}

}  // namespace kiln::tokenizer::detail
