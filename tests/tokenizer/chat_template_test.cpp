// ChatTemplate: where a model directory keeps its template, named templates, special
// tokens, the context apply_chat_template renders with, and errors. (Byte-for-byte
// comparisons with @huggingface/jinja over real templates: jinja_oracle_test.cpp.)
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace kiln::tokenizer {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

class ChatTemplateDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_chat_template_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::string dir() const { return dir_.string(); }

  fs::path dir_;
};

const json kMessages =
    json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])");

TEST_F(ChatTemplateDir, LoadsAStringFromTokenizerConfig) {
  write("tokenizer_config.json",
        json({{"chat_template",
               "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}"
               "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"},
              {"bos_token", "<s>"},
              {"eos_token", {{"__type", "AddedToken"}, {"content", "</s>"}, {"lstrip", false}}},
              {"unk_token", nullptr},
              {"pad_token", ""}})
            .dump());
  auto chat = ChatTemplate::load(dir());
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  EXPECT_EQ(chat->special_tokens(), json({{"bos_token", "<s>"}, {"eos_token", "</s>"}}));
  EXPECT_EQ(chat->names(), std::vector<std::string>{"default"});
  auto prompt = chat->render(chat->build_context({.messages = kMessages}));
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt, "<s>[user]Hi</s>[assistant]Yo</s>[assistant]");
  prompt = chat->render(chat->build_context({.messages = kMessages, .add_generation_prompt = false}));
  EXPECT_EQ(*prompt, "<s>[user]Hi</s>[assistant]Yo</s>");
}

TEST_F(ChatTemplateDir, ChatTemplateJinjaTakesPrecedence) {
  write("tokenizer_config.json", R"({"chat_template": "from config", "bos_token": "<s>"})");
  write("chat_template.jinja", "from jinja file {{ bos_token }}\n");
  auto chat = ChatTemplate::load(dir());
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  EXPECT_EQ(chat->render(chat->build_context({})).value(), "from jinja file <s>");
}

TEST_F(ChatTemplateDir, LoadsChatTemplateJson) {
  write("chat_template.json", R"({"chat_template": "processor template"})");
  auto chat = ChatTemplate::load(dir());
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  EXPECT_EQ(chat->render(chat->build_context({})).value(), "processor template");
}

TEST_F(ChatTemplateDir, NamedTemplatesAndToolUseSelection) {
  write("tokenizer_config.json", R"({"chat_template": [
      {"name": "default", "template": "plain"},
      {"name": "tool_use", "template": "tools {{ tools | length }}"},
      {"name": "rag", "template": "rag"}]})");
  auto chat = ChatTemplate::load(dir());
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  EXPECT_EQ(chat->names(), (std::vector<std::string>{"default", "tool_use", "rag"}));
  EXPECT_EQ(chat->render(chat->build_context({})).value(), "plain");
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_EQ(chat->render(chat->build_context({.tools = tools})).value(), "tools 1");
  auto rag = ChatTemplate::load(dir(), "rag");
  ASSERT_TRUE(rag.ok());
  EXPECT_EQ(rag->render(rag->build_context({.tools = tools})).value(), "rag");
  auto missing = ChatTemplate::load(dir(), "nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("available: default, tool_use, rag"), std::string::npos);
}

TEST_F(ChatTemplateDir, ListWithoutDefaultNeedsAName) {
  write("tokenizer_config.json", R"({"chat_template": [{"name": "a", "template": "A"}]})");
  EXPECT_EQ(ChatTemplate::load(dir()).status().code(), StatusCode::kInvalidArgument);
  auto chat = ChatTemplate::load(dir(), "a");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->render(chat->build_context({})).value(), "A");
}

TEST_F(ChatTemplateDir, LoadErrors) {
  auto chat = ChatTemplate::load(dir());
  EXPECT_EQ(chat.status().code(), StatusCode::kNotFound);
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_EQ(ChatTemplate::load(dir()).status().code(), StatusCode::kNotFound);
  write("tokenizer_config.json", "{not json");
  EXPECT_EQ(ChatTemplate::load(dir()).status().code(), StatusCode::kCorrupt);
  write("tokenizer_config.json", R"({"chat_template": [{"name": 1}]})");
  EXPECT_EQ(ChatTemplate::load(dir()).status().code(), StatusCode::kCorrupt);
  write("tokenizer_config.json", R"({"chat_template": "ok\n{% for m in messages %}"})");
  chat = ChatTemplate::load(dir());
  ASSERT_FALSE(chat.ok());
  EXPECT_EQ(chat.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(chat.status().message().find("chat template 'default': line 2, column 24: Unexpected end of template"),
            std::string::npos)
      << chat.status().message();
}

TEST(ChatTemplate, ContextFollowsApplyChatTemplate) {
  auto chat = ChatTemplate::from_source("x", {{"eos_token", "</s>"}, {"bos_token", {{"content", "<s>"}}}});
  ASSERT_TRUE(chat.ok());
  const json context =
      chat->build_context({.messages = kMessages,
                           .add_generation_prompt = false,
                           .kwargs = {{"enable_thinking", false}, {"add_generation_prompt", true}}});
  std::vector<std::string> keys;
  for (const auto& [k, v] : context.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"messages", "add_generation_prompt", "tools", "documents", "bos_token",
                                            "eos_token", "enable_thinking"}));
  EXPECT_TRUE(context["tools"].is_null());
  EXPECT_EQ(context["add_generation_prompt"], true);  // kwargs override
  EXPECT_EQ(context["bos_token"], "<s>");
}

TEST(ChatTemplate, RaiseExceptionMessagePassesThroughExactly) {
  auto chat = ChatTemplate::from_source(
      "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% "
      "endfor %}");
  ASSERT_TRUE(chat.ok());
  auto r =
      chat->render(chat->build_context({.messages = json::parse(R"([{"role": "assistant", "content": "x"}])")}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "Conversation roles must alternate user/assistant/user/assistant/...");
}

TEST(ChatTemplate, StrftimeNowIsInjectable) {
  auto chat = ChatTemplate::from_source("Today Date: {{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(chat.ok());
  jinja::RenderOptions options;
  options.now = jinja::DateTime{.year = 2024, .month = 12, .day = 25};
  EXPECT_EQ(chat->render(chat->build_context({}), options).value(), "Today Date: 25 Dec 2024");
}

}  // namespace
}  // namespace kiln::tokenizer
