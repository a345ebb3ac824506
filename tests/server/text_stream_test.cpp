// From token ids to what a client sees: stop strings held back until resolved (at every
// split of the text), the final end-of-sequence token kept out of the text, parsers fed
// the text with their markers, and the end reasons.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli/demo_tokenizer.h"
#include "server/text_stream.h"

namespace kiln::server {
namespace {

// Feeds `text` split at the given cut points; returns what was released in total.
std::string feed_split(StopMatcher& m, const std::string& text, const std::vector<size_t>& cuts, bool include) {
  std::string out;
  size_t at = 0;
  for (size_t c : cuts) {
    out += m.push(text.substr(at, c - at), include);
    at = c;
  }
  out += m.push(text.substr(at), include);
  return out + m.flush();
}

TEST(StopMatcher, EndsAtTheEarliestStopWhateverTheSplit) {
  const std::string text = "one two three four five";
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); b += 3) {
      StopMatcher m({"four", "three f"});
      EXPECT_EQ(feed_split(m, text, {a, b}, false), "one two ") << a << " " << b;
      ASSERT_TRUE(m.matched().has_value());
      EXPECT_EQ(*m.matched(), "three f");
      StopMatcher inc({"four"});
      EXPECT_EQ(feed_split(inc, text, {a, b}, true), "one two three four") << a << " " << b;
    }
  }
}

TEST(StopMatcher, HoldsBackOnlyWhatMayStartAStop) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abc S", false), "abc ");  // "S" may begin STOP
  EXPECT_EQ(m.push("T", false), "");          // "ST" still may
  EXPECT_EQ(m.push("x", false), "STx");       // it did not
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.push("ST", false), "");
  EXPECT_EQ(m.flush(), "ST");  // the end releases what was held
  StopMatcher none({});
  EXPECT_EQ(none.push("anything", false), "anything");
}

TEST(StopMatcher, MultiByteTextIsNeverCutInsideACharacter) {
  StopMatcher m({"é!"});
  EXPECT_EQ(m.push("café", false), "caf");  // "é" may begin "é!"
  EXPECT_EQ(m.push("?", false), "é?");
  EXPECT_EQ(m.push("é!", false), "");
  EXPECT_EQ(*m.matched(), "é!");
}

class SampleTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kiln_text_stream_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(cli::write_demo_tokenizer(dir_, 2048).ok());
    auto t = tokenizer::Tokenizer::load(dir_);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tok_.emplace(std::move(t).value());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `ids` through a SampleText as the engine would send them; the last event ends the
  // sample with `finish`.
  std::vector<SampleDelta> run(SampleText& s, const std::vector<int32_t>& ids, runtime::FinishReason finish) {
    std::vector<SampleDelta> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      runtime::StreamEvent e{.has_token = true, .token = {.token = ids[i], .logprob = -0.5f}};
      if (i + 1 == ids.size()) e.finish = finish;
      SampleDelta d;
      s.on_event(e, d);
      out.push_back(std::move(d));
    }
    return out;
  }
  static std::string text_of(const std::vector<SampleDelta>& ds) {
    std::string t;
    for (const auto& d : ds) t += d.text;
    return t;
  }

  std::filesystem::path dir_;
  std::optional<tokenizer::Tokenizer> tok_;
};

TEST_F(SampleTextTest, TheEosTokenIsNotText) {
  const auto ids = tok_->encode("Hello world.<|im_end|>", false);
  SampleText s(*tok_, {});
  const auto ds = run(s, ids, runtime::FinishReason::kEos);
  EXPECT_EQ(text_of(ds), "Hello world.");
  EXPECT_EQ(s.end_reason(), EndReason::kEos);
  EXPECT_EQ(s.n_tokens(), int32_t(ids.size()));
  EXPECT_TRUE(ds.back().ended);
}

TEST_F(SampleTextTest, AStopStringEndsTheSampleEarly) {
  const auto ids = tok_->encode("The answer is 42. Done here", false);
  SampleText s(*tok_, {.stop = {". D"}});
  const auto ds = run(s, ids, runtime::FinishReason::kLength);
  EXPECT_EQ(text_of(ds), "The answer is 42");
  EXPECT_EQ(s.end_reason(), EndReason::kStopString);
  EXPECT_EQ(*s.stop_string(), ". D");
  EXPECT_LT(s.n_tokens(), int32_t(ids.size()));  // the rest was ignored
}

TEST_F(SampleTextTest, ChatParsersSeeReasoningAndToolCalls) {
  const auto ids = tok_->encode(
      "<think>\nplan\n</think>\n\nOK.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>", false);
  SampleOptions o{.skip_special_tokens = false, .parser = tokenizer::ToolFormat::kHermes};
  o.parser_options.reasoning.enabled = true;
  SampleText s(*tok_, o);
  tokenizer::ParsedOutput out;
  for (const auto& d : run(s, ids, runtime::FinishReason::kEos))
    for (const auto& e : d.events) tokenizer::apply_event(e, out);
  EXPECT_EQ(out.reasoning, "plan");
  EXPECT_EQ(out.content, "OK.");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "f");
  EXPECT_EQ(out.tool_calls[0].arguments_json, "{\"x\":1}");
  EXPECT_TRUE(s.any_tool_call());
}

TEST_F(SampleTextTest, LogprobsCarryEachTokensText) {
  const auto ids = tok_->encode("a cat", false);
  SampleText s(*tok_, {.logprobs = true});
  std::string joined;
  for (const auto& d : run(s, ids, runtime::FinishReason::kLength))
    for (const auto& lp : d.logprobs) {
      joined += lp.token;
      EXPECT_EQ(lp.logprob, -0.5f);
    }
  EXPECT_EQ(joined, "a cat");
  EXPECT_EQ(s.end_reason(), EndReason::kLength);
}

TEST_F(SampleTextTest, ACancelledSampleEndsAsAbort) {
  SampleText s(*tok_, {});
  SampleDelta d;
  for (int32_t id : tok_->encode("Hi", false)) s.on_event({.has_token = true, .token = {.token = id}}, d);
  s.on_event({.finish = runtime::FinishReason::kCancelled}, d);
  EXPECT_EQ(s.end_reason(), EndReason::kAbort);
  EXPECT_EQ(d.text, "Hi");
  EXPECT_TRUE(d.ended);
}

}  // namespace
}  // namespace kiln::server
