// render_deepseek_v32 against DeepSeek-V3.2's own encoder test vectors
// (tests/data/parsers/dsv32_*, see the README there), and its replies read back by the
// DSML output parser.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/deepseek_v32.h"
#include "tokenizer/parser_output.h"

namespace kiln::tokenizer {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::string read_file(const std::string& name) {
  std::ifstream in(fs::path(KILN_TEST_DATA) / "parsers" / name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The reference test compares with the golden file .strip()ped.
std::string stripped(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

const DeepSeekV32Options kThinking{.thinking = true};

TEST(DeepSeekV32, RendersTheReferenceConversationByteForByte) {
  const Json input = Json::parse(read_file("dsv32_input.json"));
  Result<std::string> prompt = render_deepseek_v32(input["messages"], input["tools"], kThinking);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt, stripped(read_file("dsv32_output.txt")));
}

TEST(DeepSeekV32, RendersTheDeveloperSearchConversationByteForByte) {
  const Json input = Json::parse(read_file("dsv32_input_search_w_date.json"));
  Result<std::string> prompt = render_deepseek_v32(input["messages"], Json::array(), kThinking);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt, stripped(read_file("dsv32_output_search_w_date.txt")));
}

// The reference test's round trip: an assistant turn rendered after its context, parsed
// back, gives its reasoning, content and tool calls (turns 4 and 7 are the ones the
// reference test parses).
TEST(DeepSeekV32, ParsesItsOwnRenderedTurnsBack) {
  const Json input = Json::parse(read_file("dsv32_input.json"));
  const Json& messages = input["messages"];
  for (size_t index : {size_t(2), size_t(4), size_t(7), size_t(9), size_t(12)}) {
    SCOPED_TRACE("messages[" + std::to_string(index) + "]");
    Json context(messages.begin(), messages.begin() + std::ptrdiff_t(index));
    Json with_turn = context;
    with_turn.push_back(messages[index]);
    Result<std::string> before = render_deepseek_v32(context, input["tools"], kThinking);
    Result<std::string> after = render_deepseek_v32(with_turn, input["tools"], kThinking);
    ASSERT_TRUE(before.ok() && after.ok());
    ASSERT_TRUE(after->starts_with(*before));
    std::string reply = after->substr(before->size());
    const std::string eos = "<｜end▁of▁sentence｜>";
    ASSERT_TRUE(reply.ends_with(eos)) << reply;
    reply.resize(reply.size() - eos.size());  // a stop token: the parser never sees it

    ParserOptions options;
    options.reasoning = {.enabled = true, .starts_in_reasoning = true};
    const ParsedOutput parsed = parse_all(ToolFormat::kDeepSeekV32, options, reply);
    EXPECT_EQ(parsed.reasoning, messages[index]["reasoning_content"].get<std::string>());
    EXPECT_EQ(parsed.content, messages[index].value("content", ""));
    const Json calls = messages[index].value("tool_calls", Json::array());
    ASSERT_EQ(parsed.tool_calls.size(), calls.size()) << reply;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(parsed.tool_calls[i].name, calls[i]["function"]["name"].get<std::string>());
      EXPECT_EQ(Json::parse(parsed.tool_calls[i].arguments_json),
                Json::parse(calls[i]["function"]["arguments"].get<std::string>()));
    }
  }
}

TEST(DeepSeekV32, ChatModeClosesEveryThinkBlockAndDropsReasoning) {
  const Json messages = Json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
    {"role": "user", "content": "Bye"}])");
  Result<std::string> prompt = render_deepseek_v32(messages, Json::array(), {});
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt,
            "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>"
            "<｜User｜>Bye<｜Assistant｜></think>");
  // Thinking: the last user turn opens the block; earlier reasoning is not rendered.
  prompt = render_deepseek_v32(messages, Json::array(), kThinking);
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(*prompt,
            "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>"
            "<｜User｜>Bye<｜Assistant｜><think>");
}

TEST(DeepSeekV32, RequestToolsGoOnASystemMessageOfTheirOwnWhenNoneLeads) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  const Json messages = Json::parse(R"([{"role": "user", "content": "go"}])");
  Result<std::string> prompt = render_deepseek_v32(messages, tools, {});
  ASSERT_TRUE(prompt.ok());
  EXPECT_TRUE(prompt->starts_with("<｜begin▁of▁sentence｜>\n\n## Tools\n\n")) << *prompt;
  EXPECT_TRUE(prompt->ends_with("<functions>\n{\"name\": \"f\", \"parameters\": {}}\n</functions>\n"
                                "<｜User｜>go<｜Assistant｜></think>"))
      << *prompt;
}

TEST(DeepSeekV32, ToolResultsCloseWithTheThinkTagOfTheMode) {
  // Arguments as an object (kiln's server parses them) and a non-string value.
  const Json messages = Json::parse(R"([
    {"role": "user", "content": "add"},
    {"role": "assistant", "content": "", "reasoning_content": "r",
     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": [2]}}}]},
    {"role": "tool", "content": "3"}])");
  Result<std::string> prompt = render_deepseek_v32(messages, Json::array(), kThinking);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt,
            "<｜begin▁of▁sentence｜><｜User｜>add<｜Assistant｜><think>r</think>\n\n<｜DSML｜function_calls>\n"
            "<｜DSML｜invoke name=\"add\">\n"
            "<｜DSML｜parameter name=\"a\" string=\"false\">1</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"b\" string=\"false\">[2]</｜DSML｜parameter>\n"
            "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>\n\n<function_results>\n"
            "<result>3</result>\n</function_results>\n\n<think>");
  prompt = render_deepseek_v32(messages, Json::array(), {});
  ASSERT_TRUE(prompt.ok());
  EXPECT_TRUE(prompt->ends_with("</function_results>\n\n</think>")) << *prompt;
}

TEST(DeepSeekV32, RefusesWhatTheEncoderAsserts) {
  EXPECT_FALSE(render_deepseek_v32(Json::parse(R"([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}])"),
                                   Json::array(), {})
                   .ok());
  EXPECT_FALSE(render_deepseek_v32(Json::parse(R"([{"role": "developer", "content": ""}])"), Json::array(), {}).ok());
  EXPECT_FALSE(render_deepseek_v32(Json::parse(R"([{"role": "narrator", "content": "x"}])"), Json::array(), {}).ok());
  EXPECT_FALSE(render_deepseek_v32(Json::parse(R"([{"role": "assistant", "content": "",
      "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}])"),
                                   Json::array(), {})
                   .ok());
}

TEST(DeepSeekV32, ThinkingComesFromTheTemplateKwargs) {
  EXPECT_FALSE(deepseek_v32_options(Json::object()).thinking);
  EXPECT_TRUE(deepseek_v32_options(Json{{"thinking", true}}).thinking);
  EXPECT_TRUE(deepseek_v32_options(Json{{"enable_thinking", true}}).thinking);
  EXPECT_FALSE(deepseek_v32_options(Json{{"thinking", false}}).thinking);
}

}  // namespace
}  // namespace kiln::tokenizer
