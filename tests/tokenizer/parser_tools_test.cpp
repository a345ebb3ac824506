// Streaming behaviour of the tool-call parsers that the samples cannot show: what is
// emitted when (latency, hold-back), ids, options. Final results are covered by
// parser_samples_test.cpp.
#include <gtest/gtest.h>

#include "tokenizer/parser_output.h"

namespace kiln::tokenizer {
namespace {

// Feeds deltas one at a time and records what each feed released.
struct Stream {
  std::unique_ptr<OutputParser> parser;
  ParsedOutput total;

  Stream(ToolFormat format, ParserOptions options = {})
      : parser(make_output_parser(format, options)) {}

  std::vector<ParseEvent> feed(std::string_view delta) {
    std::vector<ParseEvent> events;
    parser->feed(delta, events);
    for (const ParseEvent& e : events) apply_event(e, total);
    return events;
  }
  std::vector<ParseEvent> finish() {
    std::vector<ParseEvent> events;
    parser->finish(events);
    for (const ParseEvent& e : events) apply_event(e, total);
    return events;
  }
};

std::string text_of(const std::vector<ParseEvent>& events, ParseEventKind kind) {
  std::string out;
  for (const ParseEvent& e : events)
    if (e.kind == kind) out += e.text;
  return out;
}

TEST(ParserApi, FormatNamesAndAliases) {
  EXPECT_EQ(parse_tool_format("qwen3").value(), ToolFormat::kHermes);
  EXPECT_EQ(parse_tool_format("glm47").value(), ToolFormat::kGlm45);
  EXPECT_EQ(parse_tool_format("deepseek_v31").value(), ToolFormat::kDeepSeekV3);
  EXPECT_EQ(parse_tool_format("gpt_oss").value(), ToolFormat::kHarmony);
  EXPECT_EQ(parse_tool_format("deepseek_v32").value(), ToolFormat::kDeepSeekV32);
  EXPECT_EQ(tool_format_name(ToolFormat::kDeepSeekV32), "deepseek_v32");
  EXPECT_EQ(tool_format_name(ToolFormat::kKimiK2), "kimi_k2");
  Result<ToolFormat> bad = parse_tool_format("llama4");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("hermes"), std::string::npos);
}

TEST(ToolCallHermes, ContentStreamsAndPartialMarkerWaits) {
  Stream s(ToolFormat::kHermes);
  EXPECT_EQ(text_of(s.feed("Hello wor"), ParseEventKind::kContent), "Hello wor");
  EXPECT_EQ(text_of(s.feed("ld <tool"), ParseEventKind::kContent),
            "ld");  // " <tool" may start a call
  EXPECT_EQ(text_of(s.feed("box> x"), ParseEventKind::kContent), " <toolbox> x");
  s.finish();
  EXPECT_EQ(s.total.content, "Hello world <toolbox> x");
}

TEST(ToolCallHermes, CallIsEmittedWhenItsEndMarkerArrives) {
  Stream s(ToolFormat::kHermes);
  EXPECT_TRUE(s.feed("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_").empty());
  std::vector<ParseEvent> events = s.feed("call>");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind, ParseEventKind::kToolCallBegin);
  EXPECT_EQ(events[0].name, "f");
  EXPECT_EQ(events[0].id, "call_0");
  EXPECT_EQ(events[1].kind, ParseEventKind::kToolCallArgs);
  EXPECT_EQ(events[1].text, R"({"a":1})");
  EXPECT_EQ(events[2].kind, ParseEventKind::kToolCallEnd);
  for (const ParseEvent& e : events) EXPECT_EQ(e.tool_index, 0);
  EXPECT_TRUE(s.finish().empty());
}

TEST(ToolCallHermes, IdPrefixOption) {
  ParserOptions options;
  options.tool_call_id_prefix = "call_req7_";
  ParsedOutput out =
      parse_all(ToolFormat::kHermes, options,
                "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].id, "call_req7_0");
  EXPECT_EQ(out.tool_calls[1].id, "call_req7_1");
}

TEST(ToolCallHermes, WhitespaceBeforeACallWaitsForTheCall) {
  Stream s(ToolFormat::kHermes);
  EXPECT_EQ(text_of(s.feed("Checking.\n\n"), ParseEventKind::kContent), "Checking.");
  EXPECT_TRUE(s.feed("<tool_call>{\"name\": \"f\"").empty());
  EXPECT_EQ(text_of(s.feed("}</tool_call>"), ParseEventKind::kContent), "");
  s.finish();
  EXPECT_EQ(s.total.content, "Checking.");
  ASSERT_EQ(s.total.tool_calls.size(), 1u);
}

TEST(ToolCallHermes, UnterminatedCallBecomesContentAtFinish) {
  Stream s(ToolFormat::kHermes);
  s.feed("Sure. <tool_call>{\"name\": \"f\", \"arguments\": {}}");
  EXPECT_EQ(s.total.content, "Sure.");
  s.finish();
  EXPECT_EQ(s.total.content, "Sure. <tool_call>{\"name\": \"f\", \"arguments\": {}}");
  EXPECT_TRUE(s.total.tool_calls.empty());
}

TEST(ToolCallHermes, MultibyteCharacterSplitAcrossDeltasIsNotSplitAcrossEvents) {
  Stream s(ToolFormat::kHermes);
  std::string text = "é🌍";
  EXPECT_TRUE(s.feed(text.substr(0, 1)).empty());
  EXPECT_EQ(text_of(s.feed(text.substr(1, 2)), ParseEventKind::kContent), "é");
  EXPECT_EQ(text_of(s.feed(text.substr(3)), ParseEventKind::kContent), "🌍");
}

TEST(ToolCallGlm, ValuesWithoutSchemaParseAsJsonWhenTheyCan) {
  ParsedOutput out = parse_all(ToolFormat::kGlm45, {},
                               "<tool_call>f<arg_key>n</arg_key><arg_value>123</arg_value>"
                               "<arg_key>s</arg_key><arg_value>abc</arg_value></tool_call>");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments_json, R"({"n":123,"s":"abc"})");
}

TEST(ToolCallGlm, SchemaStringTypeKeepsTheExactText) {
  ParserOptions options;
  options.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"n": {"type": "string"}}}}}])");
  ParsedOutput out =
      parse_all(ToolFormat::kGlm45, options,
                "<tool_call>f<arg_key>n</arg_key><arg_value> 0123 </arg_value></tool_call>");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments_json, R"({"n":" 0123 "})");
}

TEST(ToolCallKimi, KeepsTheModelsIdsAndStreamsCallByCall) {
  Stream s(ToolFormat::kKimiK2);
  s.feed(
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:3<|tool_call_argument_begin|"
      ">{}");
  EXPECT_TRUE(s.total.tool_calls.empty());
  std::vector<ParseEvent> first = s.feed("<|tool_call_end|><|tool_call_begin|>functions.open:4");
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].id, "functions.search:3");
  EXPECT_EQ(first[0].name, "search");
  s.feed("<|tool_call_argument_begin|>{\"url\": \"x\"}<|tool_call_end|><|tool_calls_section_end|>");
  s.finish();
  ASSERT_EQ(s.total.tool_calls.size(), 2u);
  EXPECT_EQ(s.total.tool_calls[1].id, "functions.open:4");
  EXPECT_EQ(s.total.content, "");
}

TEST(ToolCallDeepSeek, FullwidthMarkersArePrefixMatchedByteWise) {
  // "<｜" is 4 bytes; a delta may end inside the fullwidth bar itself.
  std::string text =
      "hi "
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><"
      "｜tool▁calls▁end｜>";
  Stream s(ToolFormat::kDeepSeekV3);
  EXPECT_EQ(text_of(s.feed(text.substr(0, 5)), ParseEventKind::kContent), "hi");
  s.feed(text.substr(5));
  s.finish();
  EXPECT_EQ(s.total.content, "hi");
  ASSERT_EQ(s.total.tool_calls.size(), 1u);
  EXPECT_EQ(s.total.tool_calls[0].name, "f");
}

TEST(ToolCallHermes, ReasoningThenCallsShareOneStream) {
  ParserOptions options;
  options.reasoning.enabled = true;
  Stream s(ToolFormat::kHermes, options);
  EXPECT_EQ(text_of(s.feed("<think>\nplan"), ParseEventKind::kReasoning), "plan");
  s.feed("\n</think>\n\n<tool_call>{\"name\": \"f\"}</tool_call>");
  s.finish();
  EXPECT_EQ(s.total.reasoning, "plan");
  EXPECT_EQ(s.total.content, "");
  ASSERT_EQ(s.total.tool_calls.size(), 1u);
}

}  // namespace
}  // namespace kiln::tokenizer
