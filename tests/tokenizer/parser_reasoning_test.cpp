// Streaming behaviour of the <think> reasoning stage (final results: samples_reasoning.json).
#include <gtest/gtest.h>

#include "tokenizer/parser_output.h"

namespace kiln::tokenizer {
namespace {

struct Fed {
  std::string content, reasoning;
};

// What a parser releases after each delta (before finish), and in total after finish.
std::vector<Fed> feed_each(const ReasoningOptions& reasoning,
                           const std::vector<std::string>& deltas, Fed* total) {
  ParserOptions options;
  options.reasoning = reasoning;
  auto parser = make_output_parser(ToolFormat::kNone, options);
  std::vector<Fed> steps;
  ParsedOutput all;
  for (const std::string& d : deltas) {
    std::vector<ParseEvent> events;
    parser->feed(d, events);
    ParsedOutput step;
    for (const ParseEvent& e : events) {
      apply_event(e, step);
      apply_event(e, all);
    }
    steps.push_back({step.content, step.reasoning});
  }
  std::vector<ParseEvent> events;
  parser->finish(events);
  for (const ParseEvent& e : events) apply_event(e, all);
  *total = {all.content, all.reasoning};
  return steps;
}

TEST(ReasoningParser, ReasoningStreamsTokenByToken) {
  Fed total;
  auto steps =
      feed_each({.enabled = true},
                {"<think>", "\n", "Let", " me", " see", ".\n", "</think>", "\n\n", "Hi"}, &total);
  EXPECT_EQ(steps[2].reasoning, "Let");
  EXPECT_EQ(steps[4].reasoning, " see");
  EXPECT_EQ(steps[5].reasoning, ".");  // the newline waits: it may be the one before </think>
  EXPECT_EQ(steps[8].content, "Hi");
  EXPECT_EQ(total.reasoning, "Let me see.");
  EXPECT_EQ(total.content, "Hi");
}

TEST(ReasoningParser, NewlinesInsideReasoningSurvive) {
  Fed total;
  feed_each({.enabled = true}, {"<think>a\n", "\nb</think>c"}, &total);
  EXPECT_EQ(total.reasoning, "a\n\nb");
}

TEST(ReasoningParser, ContentStartsStreamingAsSoonAsItCannotBeThink) {
  Fed total;
  auto steps = feed_each({.enabled = true}, {"<", "b>bold</b>"}, &total);
  EXPECT_EQ(steps[0].content, "");  // "<" could open <think>
  EXPECT_EQ(steps[1].content, "<b>bold</b>");
}

TEST(ReasoningParser, StartsInReasoningWhenThePromptOpenedTheBlock) {
  Fed total;
  auto steps = feed_each({.enabled = true, .starts_in_reasoning = true},
                         {"Okay, ", "so</think>", "Answer"}, &total);
  EXPECT_EQ(steps[0].reasoning, "Okay, ");
  EXPECT_EQ(total.reasoning, "Okay, so");
  EXPECT_EQ(total.content, "Answer");
}

TEST(ReasoningParser, UnclosedAsContentHoldsReasoningUntilTheEndTag) {
  Fed total;
  ReasoningOptions hold{.enabled = true, .unclosed = UnclosedReasoning::kContent};
  auto steps = feed_each(hold, {"<think>abc", " def", "</think>", "x"}, &total);
  EXPECT_EQ(steps[0].reasoning, "");
  EXPECT_EQ(steps[1].reasoning, "");
  EXPECT_EQ(steps[2].reasoning, "abc def");
  EXPECT_EQ(total.content, "x");

  feed_each(hold, {"<think>abc", " def"}, &total);
  EXPECT_EQ(total.reasoning, "");
  EXPECT_EQ(total.content, "<think>abc def");
}

TEST(ReasoningParser, DisabledIsPlainContent) {
  Fed total;
  auto steps = feed_each({}, {"<think>", "x</think>"}, &total);
  EXPECT_EQ(steps[0].content, "<think>");
  EXPECT_EQ(total.content, "<think>x</think>");
}

}  // namespace
}  // namespace kiln::tokenizer
