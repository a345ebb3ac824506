// ServedModel's choice of prompt renderer and output syntax per checkpoint: the chat
// template's markers, or the architecture where the checkpoint ships no template
// (DeepSeek-V3.2's Python encoder).
#include "server/served_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli/demo.h"

namespace kiln::server {
namespace {

namespace fs = std::filesystem;

// A checkpoint directory with the demo model's tokenizer.json and nothing else.
std::string tokenizer_only_dir() {
  static const std::string dir = [] {
    const fs::path d = fs::temp_directory_path() / ("kiln_served_model_test_" + std::to_string(::getpid()));
    fs::create_directories(d);
    fs::copy_file(fs::path(cli::ensure_demo_model().value()) / "tokenizer.json", d / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
    return d.string();
  }();
  return dir;
}

TEST(ServedModel, DeepSeekV32WithoutATemplateGetsKilnsEncoderAndDsmlCalls) {
  auto model = ServedModel::load(tokenizer_only_dir(), {.name = "dsv32", .architecture = "DeepseekV32ForCausalLM"});
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const ServedModel& m = **model;
  EXPECT_TRUE(m.has_chat_template());
  EXPECT_EQ(m.tool_format(), tokenizer::ToolFormat::kDeepSeekV32);
  EXPECT_EQ(m.tool_syntax().format, tokenizer::ToolFormat::kDeepSeekV32);
  EXPECT_TRUE(m.reasoning());

  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  Result<std::string> chat = m.render_chat(messages, std::nullopt, ordered_json::object());
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  EXPECT_EQ(*chat, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_FALSE(m.parser_options(*chat, {}).reasoning.starts_in_reasoning);

  Result<std::string> thinking = m.render_chat(messages, std::nullopt, ordered_json{{"thinking", true}});
  ASSERT_TRUE(thinking.ok());
  EXPECT_EQ(*thinking, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>");
  EXPECT_TRUE(m.parser_options(*thinking, {}).reasoning.starts_in_reasoning);

  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  Result<std::string> with_tools = m.render_chat(messages, tools, ordered_json::object());
  ASSERT_TRUE(with_tools.ok());
  EXPECT_NE(with_tools->find("<functions>\n{\"name\": \"f\"}\n</functions>"), std::string::npos) << *with_tools;

  const tokenizer::ParsedOutput out = tokenizer::parse_all(
      m.tool_format(), m.parser_options(*thinking, tools),
      "Call f.</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" "
      "string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>");
  EXPECT_EQ(out.reasoning, "Call f.");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments_json, "{\"x\":1}");
}

TEST(ServedModel, OtherArchitecturesWithoutATemplateServeCompletionsOnly) {
  auto model = ServedModel::load(tokenizer_only_dir(), {.name = "x", .architecture = "DeepseekV3ForCausalLM"});
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_FALSE((*model)->has_chat_template());
  EXPECT_EQ((*model)->tool_format(), tokenizer::ToolFormat::kNone);
}

TEST(ServedModel, TemplateMarkersPickTheToolSyntax) {
  EXPECT_EQ(detect_tool_format("{{ '<｜DSML｜function_calls>' }}"), tokenizer::ToolFormat::kDeepSeekV32);
  EXPECT_EQ(detect_tool_format("<｜tool▁calls▁begin｜>"), tokenizer::ToolFormat::kDeepSeekV3);
  EXPECT_EQ(detect_tool_format("<tool_call>{{ name }}<arg_key>"), tokenizer::ToolFormat::kGlm45);
}

}  // namespace
}  // namespace kiln::server
