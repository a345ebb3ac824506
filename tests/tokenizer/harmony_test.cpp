// render_harmony against golden prompts: tests/data/parsers/harmony_*.json (the template's
// inputs) and harmony_*.txt (the exact text, no trailing newline). The goldens follow the
// GPT-OSS chat_template.jinja logic, and were checked byte for byte against Jinja2 with the
// HF settings (tests/data/parsers/README.md); the Jinja engine is held to the same files.
#include "tokenizer/harmony.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kiln::tokenizer {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> golden_inputs() {
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(fs::path(KILN_TEST_DATA) / "parsers")) {
    std::string name = entry.path().filename().string();
    if (name.starts_with("harmony_") && entry.path().extension() == ".json")
      paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

Result<std::string> render_json(const Json& input) {
  KILN_ASSIGN_OR_RETURN(HarmonyConversation c, harmony_conversation_from_json(input));
  return render_harmony(c);
}

Result<std::string> render_text(std::string_view json_text) {
  return render_json(Json::parse(json_text));
}

TEST(HarmonyRender, MatchesEveryGolden) {
  std::vector<fs::path> inputs = golden_inputs();
  ASSERT_GE(inputs.size(), 8u);
  for (const fs::path& input : inputs) {
    SCOPED_TRACE(input.filename().string());
    fs::path golden = input;
    golden.replace_extension(".txt");
    ASSERT_TRUE(fs::exists(golden));
    Result<std::string> out = render_json(Json::parse(read_file(input)));
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(*out, read_file(golden));
  }
}

TEST(HarmonyRender, MinimalConversationSpelledOut) {
  auto out = render_text(R"({"current_date": "2025-01-02",
      "messages": [{"role": "user", "content": "Hi"}]})");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            "Knowledge cutoff: 2024-06\nCurrent date: 2025-01-02\n\nReasoning: medium\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every "
            "message.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant");
}

TEST(HarmonyRender, ToolCallWithArgumentsAsJsonStringIsNotDoubleEncoded) {
  auto from_string = render_text(R"({"current_date": "d", "messages": [
      {"role": "user", "content": "x"},
      {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": [1, 2]}"}}]},
      {"role": "tool", "content": "r"}]})");
  auto from_object = render_text(R"({"current_date": "d", "messages": [
      {"role": "user", "content": "x"},
      {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": [1, 2]}}}]},
      {"role": "tool", "content": "r"}]})");
  ASSERT_TRUE(from_string.ok() && from_object.ok());
  EXPECT_EQ(*from_string, *from_object);
  EXPECT_NE(from_string->find("<|start|>assistant to=functions.f<|channel|>commentary json"
                              "<|message|>{\"a\": [1, 2]}<|call|><|start|>functions.f to=assistant"
                              "<|channel|>commentary<|message|>\"r\"<|end|>"),
            std::string::npos);
}

TEST(HarmonyRender, NullContentAndEmptyToolCallsAreAbsent) {
  auto out = render_text(R"({"current_date": "d", "messages": [
      {"role": "user", "content": null},
      {"role": "assistant", "content": null, "tool_calls": []}]})");
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_NE(out->find("<|start|>user<|message|><|end|><|start|>assistant<|channel|>final<|message|>"
                      "<|end|><|start|>assistant"),
            std::string::npos);
}

TEST(HarmonyRender, ContentPartsAreJoined) {
  auto out = render_text(R"({"current_date": "d", "messages": [
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})");
  ASSERT_TRUE(out.ok());
  EXPECT_NE(out->find("<|start|>user<|message|>ab<|end|>"), std::string::npos);
}

TEST(HarmonyRender, TemplateErrorsAreInvalidArgument) {
  const char* cases[] = {
      R"({"messages": []})",
      R"({"messages": [{"role": "tool", "content": "orphan"}]})",
      R"({"messages": [{"role": "assistant", "content": "<|channel|>final<|message|>x"}]})",
      R"({"messages": [{"role": "assistant", "thinking": "<|channel|>analysis<|message|>x"}]})",
      R"({"messages": [{"role": "assistant", "content": "a", "thinking": "b",
                        "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]})",
      R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]})",
      R"({"messages": {"role": "user"}})",
  };
  for (const char* c : cases) {
    SCOPED_TRACE(c);
    auto out = render_text(c);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(HarmonyRender, ToolResultAfterFinalAnswerIsAnError) {
  // A final answer resets the tool the next "tool" message would answer.
  auto out = render_text(R"({"messages": [
      {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
      {"role": "assistant", "content": "done"},
      {"role": "tool", "content": "late"}]})");
  EXPECT_FALSE(out.ok());
}

TEST(HarmonyRender, PythonJsonDumpsMatchesPython) {
  // Expected strings are Python's json.dumps(ensure_ascii=False) of the same values.
  EXPECT_EQ(python_json_dumps(Json::parse(R"({"a": [1, 2.5, null, true], "b": {}})")),
            R"({"a": [1, 2.5, null, true], "b": {}})");
  EXPECT_EQ(python_json_dumps(Json(1e16)), "1e+16");
  EXPECT_EQ(python_json_dumps(Json(123456789012345.0)), "123456789012345.0");
  EXPECT_EQ(python_json_dumps(Json(0.0001)), "0.0001");
  EXPECT_EQ(python_json_dumps(Json(1e-05)), "1e-05");
  EXPECT_EQ(python_json_dumps(Json(-0.0)), "-0.0");
  EXPECT_EQ(python_json_dumps(Json(1.5e300)), "1.5e+300");
  EXPECT_EQ(python_json_dumps(Json(0.1)), "0.1");
  EXPECT_EQ(python_json_dumps(Json("é\u0001\x7f\"\\/")), "\"é\\u0001\x7f\\\"\\\\/\"");
}

}  // namespace
}  // namespace kiln::tokenizer
