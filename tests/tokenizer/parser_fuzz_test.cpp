// Randomised streaming property: texts made of every format's markers, pieces of markers,
// JSON fragments, whitespace and multibyte characters, fed in random splits, must give
// the one-shot result for every format and reasoning mode. Deterministic (fixed seed).
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/parser_output.h"

namespace kiln::tokenizer {
namespace {

const std::vector<std::string> kPieces = {
    // markers of every format
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
    "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>",
    "<|call|>", "<|constrain|>", "<｜DSML｜function_calls>", "</｜DSML｜function_calls>", "<｜DSML｜invoke",
    "</｜DSML｜invoke>", "<｜DSML｜parameter", "</｜DSML｜parameter>",
    // pieces of markers and of their contents
    "<", "</", "<|", "|>", "<｜", "｜", "▁", "think", "tool_call", "<tool", "<|tool", "<｜tool",
    "assistant", "analysis", "final", "commentary", " to=functions.f", "to=", "json",
    "functions.f:0", "function", "get_weather", "```json\n", "```", "k", " name=\"f\">", " string=\"true\">",
    "｜DSML｜", "<｜DSML｜", "</｜DSML｜",
    // JSON
    "{", "}", "{}", "{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "{\"a\": \"é\"}", "\"", ":",
    ",", "1",
    // text
    " ", "\n", "\n\n", "x", "Hello", "é", "世界", "🌍",
    // whole calls and openings, so that the soup also holds calls that parse
    "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>",
    "<tool_call>f<arg_key>k</arg_key><arg_value>1</arg_value></tool_call>",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|"
    "tool_call_end|>",
    "<|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{\"b\": [2]}<|tool_call_end|>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
    "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{\"c\": null}<｜tool▁call▁end｜>",
    "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
    "<|start|>assistant<|channel|>final<|message|>",
    "<|start|>assistant<|channel|>analysis<|message|>",
    "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
    "string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n",
    "<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"s\" string=\"true\">é</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>"};

std::string random_text(std::mt19937& rng) {
  std::string out;
  int n = 1 + int(rng() % 24);
  for (int i = 0; i < n; ++i) out += kPieces[rng() % kPieces.size()];
  return out;
}

ParsedOutput stream(ToolFormat format, const ParserOptions& options, std::string_view text,
                    std::mt19937& rng) {
  auto parser = make_output_parser(format, options);
  std::vector<ParseEvent> events;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = 1 + rng() % 8;
    parser->feed(text.substr(pos, len), events);
    pos += std::min(len, text.size() - pos);
  }
  parser->finish(events);
  ParsedOutput out;
  for (const ParseEvent& e : events) apply_event(e, out);
  return out;
}

std::string describe(const ParsedOutput& p) {
  std::string s = "content=[" + p.content + "] reasoning=[" + p.reasoning + "]";
  for (const ToolCall& c : p.tool_calls)
    s += " call{" + c.id + "," + c.name + "," + c.arguments_json + "}";
  return s;
}

TEST(ParserProperty, RandomMarkerSoupStreamsLikeOneShot) {
  const ToolFormat formats[] = {ToolFormat::kNone,       ToolFormat::kHermes,      ToolFormat::kGlm45,
                                ToolFormat::kKimiK2,     ToolFormat::kDeepSeekV3,  ToolFormat::kDeepSeekV32,
                                ToolFormat::kHarmony};
  const ReasoningOptions modes[] = {
      {},
      {.enabled = true},
      {.enabled = true, .starts_in_reasoning = true},
      {.enabled = true, .unclosed = UnclosedReasoning::kContent},
  };
  std::mt19937 rng(7);
  int n_calls = 0;
  for (ToolFormat format : formats) {
    for (const ReasoningOptions& mode : modes) {
      ParserOptions options{.reasoning = mode};
      for (int i = 0; i < 300; ++i) {
        std::string text = random_text(rng);
        ParsedOutput whole = parse_all(format, options, text);
        n_calls += int(whole.tool_calls.size());
        for (int trial = 0; trial < 4; ++trial)
          ASSERT_EQ(describe(stream(format, options, text, rng)), describe(whole))
              << tool_format_name(format) << " text: " << text;
      }
    }
  }
  EXPECT_GT(n_calls, 50);  // the soup does produce parsed calls, not only fallbacks
}

TEST(ParserProperty, WithoutParsedCallsNoTextIsLost) {
  // When nothing parses as a call and no reasoning is configured, the content is the
  // output byte for byte: fallbacks keep markers, whitespace and all.
  const ToolFormat formats[] = {ToolFormat::kNone, ToolFormat::kHermes, ToolFormat::kGlm45,
                                ToolFormat::kKimiK2, ToolFormat::kDeepSeekV3, ToolFormat::kDeepSeekV32};
  std::mt19937 rng(11);
  for (ToolFormat format : formats) {
    for (int i = 0; i < 500; ++i) {
      std::string text = random_text(rng);
      ParsedOutput out = parse_all(format, {}, text);
      if (!out.tool_calls.empty()) continue;
      EXPECT_EQ(out.content, text) << tool_format_name(format);
      EXPECT_EQ(stream(format, {}, text, rng).content, text) << tool_format_name(format);
    }
  }
}

TEST(ParserProperty, LongOutputStreamsInLinearTime) {
  // 2 MB of reasoning then content, fed in 3-byte tokens: scanning must not restart
  // from the beginning on each delta (this would take minutes if it did).
  std::string text = "<think>" + std::string(1 << 20, 'r') + "</think><tool_call>" +
                     std::string(1 << 20, 'a') + "</tool_call>";
  ParserOptions options;
  options.reasoning.enabled = true;
  auto parser = make_output_parser(ToolFormat::kHermes, options);
  std::vector<ParseEvent> events;
  size_t reasoning_bytes = 0;
  for (size_t pos = 0; pos < text.size(); pos += 3) {
    events.clear();
    parser->feed(std::string_view(text).substr(pos, 3), events);
    for (const ParseEvent& e : events)
      if (e.kind == ParseEventKind::kReasoning) reasoning_bytes += e.text.size();
  }
  parser->finish(events);
  EXPECT_EQ(reasoning_bytes, size_t(1) << 20);
}

}  // namespace
}  // namespace kiln::tokenizer
