// Streaming behaviour of the harmony (GPT-OSS) output parser (final results:
// samples_harmony.json).
#include <gtest/gtest.h>

#include "tokenizer/parser_output.h"

namespace kiln::tokenizer {
namespace {

struct Step {
  std::string content, reasoning;
  size_t n_calls = 0;
};

std::vector<Step> feed_each(const std::vector<std::string>& deltas, ParsedOutput* total) {
  auto parser = make_output_parser(ToolFormat::kHarmony, {});
  std::vector<Step> steps;
  *total = {};
  for (const std::string& d : deltas) {
    std::vector<ParseEvent> events;
    parser->feed(d, events);
    ParsedOutput step;
    for (const ParseEvent& e : events) {
      apply_event(e, *total);
      if (e.kind == ParseEventKind::kContent) step.content += e.text;
      if (e.kind == ParseEventKind::kReasoning) step.reasoning += e.text;
    }
    steps.push_back({step.content, step.reasoning, total->tool_calls.size()});
  }
  std::vector<ParseEvent> events;
  parser->finish(events);
  for (const ParseEvent& e : events) apply_event(e, *total);
  return steps;
}

TEST(HarmonyParser, ChannelsStreamAsTokensArrive) {
  ParsedOutput total;
  auto steps =
      feed_each({"<|channel|>", "analysis", "<|message|>", "Think", "ing", "<|end|>", "<|start|>",
                 "assistant", "<|channel|>", "final", "<|message|>", "Hi", "!", "<|return|>"},
                &total);
  EXPECT_EQ(steps[3].reasoning, "Think");
  EXPECT_EQ(steps[4].reasoning, "ing");
  EXPECT_EQ(steps[11].content, "Hi");
  EXPECT_EQ(steps[12].content, "!");
  EXPECT_EQ(total.reasoning, "Thinking");
  EXPECT_EQ(total.content, "Hi!");
}

TEST(HarmonyParser, ToolCallIsEmittedAtCall) {
  ParsedOutput total;
  auto steps = feed_each(
      {"<|channel|>", "commentary", " to", "=functions", ".get", "_weather", " ", "<|constrain|>",
       "json", "<|message|>", "{\"", "city", "\":\"", "Oslo", "\"}", "<|call|>"},
      &total);
  EXPECT_EQ(steps[14].n_calls, 0u);
  EXPECT_EQ(steps[15].n_calls, 1u);
  ASSERT_EQ(total.tool_calls.size(), 1u);
  EXPECT_EQ(total.tool_calls[0].name, "get_weather");
  EXPECT_EQ(total.tool_calls[0].arguments_json, R"({"city":"Oslo"})");
  EXPECT_EQ(total.content, "");
}

TEST(HarmonyParser, PlainTextStreamsOnceItCannotBeAHeader) {
  ParsedOutput total;
  auto steps = feed_each({"Hel", "lo", " world"}, &total);
  EXPECT_EQ(steps[0].content, "Hel");
  EXPECT_EQ(total.content, "Hello world");
}

TEST(HarmonyParser, RenderedPromptReplyRoundTrip) {
  // What render_harmony puts in the prompt for an assistant tool call parses back to it.
  ParsedOutput out = parse_all(ToolFormat::kHarmony, {},
                               " to=functions.get_weather<|channel|>commentary json<|message|>"
                               "{\"location\": \"Tokyo\", \"unit\": \"celsius\"}<|call|>");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments_json, R"({"location":"Tokyo","unit":"celsius"})");
}

}  // namespace
}  // namespace kiln::tokenizer
