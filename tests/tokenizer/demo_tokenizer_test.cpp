// The demo model's tokenizer and chat template (src/cli/demo_tokenizer.cpp) at the vocabulary
// sizes that matter: 320 (the test fixtures'), 2048 (the demo model's) and 4096. kiln's ids
// are checked against @lenml/tokenizers (peers/encode_dir.mjs) and the chat template's
// renders against @huggingface/jinja (peers/render.mjs); `kiln demo-model` against both files.
#include "cli/demo_tokenizer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/peer_util.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

using kiln::testing::node_modules;
using kiln::testing::read_text;
using kiln::testing::run_command;

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;
using tokenizer::ChatRequest;
using tokenizer::ChatTemplate;
using tokenizer::Tokenizer;

// A fresh directory under /tmp, removed with the object.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    static int n = 0;
    path = fs::temp_directory_path() / ("kiln_demo_tok_" + tag + "_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};




std::string ascii(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
}

Tokenizer load_demo(const TempDir& dir, int64_t vocab_size) {
  const Status written = cli::write_demo_tokenizer(dir.str(), vocab_size);
  EXPECT_TRUE(written.ok()) << written.to_string();
  auto tok = Tokenizer::load(dir.str());
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return std::move(tok).value();
}

const std::vector<std::string> kAddedTokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                               "<think>",       "</think>",     "<tool_call>",
                                               "</tool_call>",  "<tool_response>", "</tool_response>"};

const std::string kProse =
    "The history of the city begins with a small village on the river, where people lived by "
    "fishing and farming. Over the years, the village grew into a market town, and merchants "
    "from many countries came to buy and sell their goods. Today it is known for its old "
    "bridges, its university and the music that fills the streets on summer evenings.";

// English, code, punctuation, digits, non-ASCII and the added tokens, alone and in context.
const std::vector<std::string> kCorpus = {
    kProse,
    "Hello, world! How are you today?",
    "I don't think they'll be here before 10:30 a.m., but we've asked them twice.",
    "Language models predict the next token; the tokenizer turns text into ids and back.",
    "  leading spaces, trailing spaces   ",
    "Line one\nLine two\n\n\tTabbed line\r\nWindows line",
    "int main(int argc, char** argv) {\n    std::printf(\"%d\\n\", argc);\n    return 0;\n}\n",
    "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n    return a + b  # simple\n",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2, 3]}}",
    "if (x != y && y >= 0 || z == -1) { a += b; } // done",
    "!@#$%^&*()_+-=[]{}|;':\",./<>?`~ ... -- --- ***",
    "0 1 12 123 1234 12345 3.14159 -42 1e-9 0x7fff 2024-07-09",
    "café naïve résumé Zürich São Paulo Ærøskøbing é e\u0301",
    "中文句子里没有空格，所以切分很重要。",
    "日本語とEnglishの混在 한국어 Привет мир Γειά σου",
    "emoji: 😀 🤖 👍🏽 👩‍💻 👨‍👩‍👧‍👦 🇯🇵 ❤️",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nEasy.\n</think>\n\n4<|im_end|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><tool_response>\nok\n</tool_response>",
    "<|endoftext|><|endoftext|>text<|im_end|>",
    "look-alikes: <|im_start <|im_end|| <think > </ think> <tool_call",
    "",
    " ",
    "\n",
    "a",
};

// --- the generator's contract -------------------------------------------------------------

TEST(DemoTokenizer, RejectsVocabulariesOutsideItsRange) {
  TempDir dir("range");
  for (int64_t v : {int64_t(0), int64_t(264), int64_t(265), cli::kDemoMinVocab - 1, cli::kDemoMaxVocab + 1}) {
    const Status s = cli::write_demo_tokenizer(dir.str(), v);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << v;
    EXPECT_NE(s.message().find(std::to_string(v)), std::string::npos) << s.message();
  }
  EXPECT_FALSE(fs::exists(dir.path / "tokenizer.json"));
  const Tokenizer tok = load_demo(dir, cli::kDemoMinVocab);
  EXPECT_EQ(tok.vocab_size(), cli::kDemoMinVocab);
}

TEST(DemoTokenizer, SameVocabularySizeWritesTheSameBytes) {
  TempDir a("det_a"), b("det_b");
  ASSERT_TRUE(cli::write_demo_tokenizer(a.str(), 2048).ok());
  ASSERT_TRUE(cli::write_demo_tokenizer(b.str(), 2048).ok());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(read_text(a.path / f), read_text(b.path / f)) << f;
    EXPECT_FALSE(fs::exists(a.path / (std::string(f) + ".tmp"))) << f;
  }
}

TEST(DemoTokenizer, EnglishProseTakesFarFewerTokensThanBytes) {
  TempDir dir("prose");
  const Tokenizer tok = load_demo(dir, 2048);
  const size_t n_tokens = tok.encode(kProse, false).size();
  std::printf("[ demo     ] vocab 2048: %zu bytes of English prose -> %zu tokens (%.2f bytes per token)\n",
              kProse.size(), n_tokens, double(kProse.size()) / double(n_tokens));
  EXPECT_LT(n_tokens * 10, kProse.size() * 4);  // under 0.4 tokens per byte
  TempDir small("prose_320");
  EXPECT_LT(load_demo(small, 320).encode(kProse, false).size(), kProse.size());
}

class DemoTokenizerSize : public ::testing::TestWithParam<int64_t> {};

TEST_P(DemoTokenizerSize, FilesHaveTheQwenLayoutAndEveryMergeIsAToken) {
  const int64_t n = GetParam();
  TempDir dir("layout");
  ASSERT_TRUE(cli::write_demo_tokenizer(dir.str(), n).ok());
  const json t = json::parse(read_text(dir.path / "tokenizer.json"));
  EXPECT_TRUE(t["normalizer"].is_null());
  EXPECT_EQ(t["pre_tokenizer"]["pretokenizers"][1]["type"], "ByteLevel");
  EXPECT_EQ(t["decoder"]["type"], "ByteLevel");
  const json& vocab = t["model"]["vocab"];
  const json& merges = t["model"]["merges"];
  ASSERT_EQ(int64_t(vocab.size()), n - 9);
  ASSERT_EQ(int64_t(merges.size()), n - 265);
  // ids 0..255: GPT-2's byte order ('!' first, the remapped bytes from 188: NUL is 'Ā', space 'Ġ').
  EXPECT_EQ(vocab["!"], 0);
  EXPECT_EQ(vocab["\xC4\x80"], 188);
  EXPECT_EQ(vocab["\xC4\xA0"], 220);
  std::set<int64_t> ids;
  for (const auto& [token, id] : vocab.items()) ids.insert(id.get<int64_t>());
  EXPECT_EQ(int64_t(ids.size()), n - 9);
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin(), n - 10);
  // Merge i makes id 256 + i from two tokens of lower ids: priority order is creation order.
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string a = merges[i][0], b = merges[i][1];
    ASSERT_TRUE(vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) << i;
    EXPECT_EQ(vocab[a + b], int64_t(256 + i)) << a << " + " << b;
    EXPECT_LT(vocab[a].get<int64_t>(), int64_t(256 + i));
    EXPECT_LT(vocab[b].get<int64_t>(), int64_t(256 + i));
  }
  const json& added = t["added_tokens"];
  ASSERT_EQ(added.size(), 9u);
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(added[i]["id"], n - 9 + int64_t(i));
    EXPECT_EQ(added[i]["content"], kAddedTokens[i]);
    EXPECT_EQ(added[i]["special"], i < 3) << kAddedTokens[i];
  }
}

TEST_P(DemoTokenizerSize, EveryIdDecodesToText) {
  const int64_t n = GetParam();
  TempDir dir("ids");
  const Tokenizer tok = load_demo(dir, n);
  ASSERT_EQ(tok.vocab_size(), n);
  for (int32_t id = 0; id < n; ++id) {
    ASSERT_TRUE(tok.id_to_token(id).has_value()) << id;
    EXPECT_FALSE(tok.decode(std::vector<int32_t>{id}).empty()) << id;
  }
}

TEST_P(DemoTokenizerSize, AddedTokensAreTheLastNineAndEncodeToOneId) {
  const int64_t n = GetParam();
  TempDir dir("added");
  const Tokenizer tok = load_demo(dir, n);
  for (size_t i = 0; i < kAddedTokens.size(); ++i) {
    const auto id = int32_t(n - 9 + int64_t(i));
    EXPECT_EQ(tok.token_to_id(kAddedTokens[i]), id) << kAddedTokens[i];
    EXPECT_EQ(tok.encode(kAddedTokens[i], false), std::vector<int32_t>{id}) << kAddedTokens[i];
    EXPECT_EQ(tok.is_special(id), i < 3) << kAddedTokens[i];
    const std::vector<int32_t> in_text = tok.encode("x" + kAddedTokens[i] + "y", false);
    EXPECT_EQ(in_text.size(), 3u) << kAddedTokens[i];
  }
  const cli::DemoSpecialIds special = cli::demo_special_ids(n);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), special.endoftext);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), special.im_start);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), special.im_end);
  EXPECT_EQ(tok.eos_id(), special.im_end);
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_EQ(tok.config().add_bos_token, false);
  EXPECT_EQ(tok.config().eos_token, "<|im_end|>");
  const json config = json::parse(read_text(dir.path / "tokenizer_config.json"));
  EXPECT_TRUE(config["bos_token"].is_null());
  EXPECT_EQ(config["pad_token"], "<|endoftext|>");
  EXPECT_EQ(config["added_tokens_decoder"][std::to_string(special.im_end)]["content"], "<|im_end|>");
  EXPECT_EQ(config["added_tokens_decoder"][std::to_string(n - 1)]["special"], false);
}

TEST_P(DemoTokenizerSize, DecodeOfEncodeGivesTheTextBack) {
  TempDir dir("roundtrip");
  const Tokenizer tok = load_demo(dir, GetParam());
  for (const std::string& s : kCorpus) EXPECT_EQ(tok.decode(tok.encode(s, false)), s) << ascii(s);
}

// kiln's ids equal @lenml/tokenizers' on kCorpus and on the oracle corpus (corpus.mjs).
TEST_P(DemoTokenizerSize, IdsMatchTheReference) {
  ASSERT_FALSE(node_modules().empty()) << "scripts/npm-peers printed nothing";
  TempDir dir("peer");
  const Tokenizer tok = load_demo(dir, GetParam());
  const fs::path texts = dir.path / "texts.json";
  std::ofstream(texts, std::ios::binary) << nlohmann::json(kCorpus).dump();
  int code = 0;
  const std::string out = run_command("NODE_PATH='" + node_modules() + "' node '" + KILN_SOURCE_DIR +
                                          "/tests/tokenizer/peers/encode_dir.mjs' '" + dir.str() + "' '" +
                                          texts.string() + "'",
                                      &code);
  ASSERT_EQ(code, 0) << out.substr(0, 2000);
  std::istringstream lines(out);
  std::string line;
  size_t compared = 0, mismatches = 0;
  while (std::getline(lines, line)) {
    const json r = json::parse(line);
    const std::string text = r["text"];
    const std::vector<int32_t> ids = tok.encode(text, false);
    ++compared;
    if (ids != r["ids"].get<std::vector<int32_t>>()) {
      if (++mismatches <= 5) ADD_FAILURE() << ascii(text) << "\n  reference: " << r["ids"].dump()
                                           << "\n  kiln:      " << nlohmann::json(ids).dump();
      continue;
    }
    EXPECT_EQ(tok.decode(ids), r["decoded"].get<std::string>()) << ascii(text);
  }
  std::printf("[ peers    ] demo vocab %lld: %zu strings compared, %zu mismatches\n",
              static_cast<long long>(GetParam()), compared, mismatches);
  EXPECT_GE(compared, kCorpus.size() + 2000);
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(Vocab, DemoTokenizerSize, ::testing::Values(320, 2048, 4096),
                         [](const ::testing::TestParamInfo<int64_t>& i) { return std::to_string(i.param); });

// --- the chat template ----------------------------------------------------------------------

ChatTemplate load_template(const TempDir& dir) {
  EXPECT_TRUE(cli::write_demo_tokenizer(dir.str(), 320).ok());
  auto chat = ChatTemplate::load(dir.str());
  EXPECT_TRUE(chat.ok()) << chat.status().to_string();
  return std::move(chat).value();
}

std::string render(const ChatTemplate& chat, const ChatRequest& request) {
  auto out = chat.render(chat.build_context(request));
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? out.value() : std::string();
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
])");

// The conversations of the brief: plain, with a system message, tools with a call and its
// results, reasoning, and thinking switched off.
std::vector<std::pair<std::string, ChatRequest>> conversations() {
  std::vector<std::pair<std::string, ChatRequest>> c;
  c.push_back({"plain", {.messages = json::parse(R"([{"role": "user", "content": "Hello!"}])")}});
  c.push_back({"system", {.messages = json::parse(R"([
    {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}])")}});
  c.push_back({"tools", {.messages = json::parse(R"([
    {"role": "system", "content": "You help with travel."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp_c\": 21}"},
    {"role": "tool", "tool_call_id": "c2", "content": "14:05"},
    {"role": "assistant", "content": "It is 21 °C at 14:05."}])"),
                         .tools = kTools}});
  c.push_back({"tools_no_system", {.messages = json::parse(R"([{"role": "user", "content": "Time?"}])"),
                                   .tools = kTools, .add_generation_prompt = false}});
  c.push_back({"reasoning", {.messages = json::parse(R"([
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
    {"role": "user", "content": "Thanks"}])")}});
  c.push_back({"thinking_off", {.messages = json::parse(R"([{"role": "user", "content": "Quick one"}])"),
                                .kwargs = {{"enable_thinking", false}}}});
  c.push_back({"thinking_on", {.messages = json::parse(R"([{"role": "user", "content": "Quick one"}])"),
                               .kwargs = {{"enable_thinking", true}}}});
  return c;
}

TEST(DemoChatTemplate, RendersChatMl) {
  TempDir dir("chatml");
  const ChatTemplate chat = load_template(dir);
  const auto c = conversations();
  EXPECT_EQ(render(chat, c[0].second), "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(chat, c[1].second),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(chat, c[4].second),
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nTwo plus two is four.\n</think>\n\n"
            "4<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(chat, c[5].second),
            "<|im_start|>user\nQuick one<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(render(chat, c[6].second), "<|im_start|>user\nQuick one<|im_end|>\n<|im_start|>assistant\n");
}

TEST(DemoChatTemplate, RendersToolsCallsAndResults) {
  TempDir dir("tools");
  const ChatTemplate chat = load_template(dir);
  const std::string out = render(chat, conversations()[2].second);
  const std::string system =
      "<|im_start|>system\nYou help with travel.\n\n# Tools\n\nYou may call one or more functions to assist with "
      "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Current weather\", "
      "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
      "[\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": "
      "\"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function "
      "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
  const std::string turns =
      "<|im_start|>user\nWeather and time in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n{\"temp_c\": 21}\n</tool_response>\n<tool_response>\n14:05\n"
      "</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 21 °C at 14:05.<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(out, system + turns);
}

TEST(DemoChatTemplate, PromptEncodesWithTheAddedTokens) {
  TempDir dir("prompt");
  const ChatTemplate chat = load_template(dir);
  const Tokenizer tok = Tokenizer::load(dir.str()).value();
  const std::vector<int32_t> ids = tok.encode(render(chat, conversations()[2].second), false);
  const auto count = [&](const char* t) { return std::count(ids.begin(), ids.end(), *tok.token_to_id(t)); };
  EXPECT_EQ(count("<|im_start|>"), 6);
  EXPECT_EQ(count("<|im_end|>"), 5);
  EXPECT_EQ(count("<tool_call>"), 4);  // two in the instruction, then the two calls
  EXPECT_EQ(count("<tool_response>"), 2);
}

// kiln's renders equal @huggingface/jinja's, for the conversations above and every one of
// tests/data/jinja/conversations.json (some are invalid on purpose: then both must fail).
TEST(DemoChatTemplate, MatchesTheReference) {
  ASSERT_FALSE(node_modules().empty()) << "scripts/npm-peers printed nothing";
  TempDir dir("oracle");
  const ChatTemplate chat = load_template(dir);
  std::vector<std::pair<std::string, ChatRequest>> all = conversations();
  for (const json& c : json::parse(read_text(fs::path(KILN_TEST_DATA) / "jinja" / "conversations.json"))) {
    ChatRequest r{.messages = c["messages"], .add_generation_prompt = c["add_generation_prompt"].get<bool>()};
    if (c.contains("tools")) r.tools = c["tools"];
    if (c.contains("kwargs")) r.kwargs = c["kwargs"];
    all.push_back({c["name"].get<std::string>(), r});
  }
  json jobs = json::array();
  for (const auto& [name, request] : all) jobs.push_back({{"template", chat.source()}, {"context", chat.build_context(request)}});
  const fs::path jobs_file = dir.path / "jobs.json";
  std::ofstream(jobs_file, std::ios::binary) << jobs.dump();
  int code = 0;
  const std::string out = run_command("NODE_PATH='" + node_modules() + "' node '" + KILN_SOURCE_DIR +
                                          "/tests/tokenizer/peers/render.mjs' '" + jobs_file.string() + "'",
                                      &code);
  ASSERT_EQ(code, 0) << out.substr(0, 2000);
  std::istringstream lines(out);
  std::string line;
  size_t i = 0, rendered = 0;
  for (; std::getline(lines, line) && i < all.size(); ++i) {
    const json ref = json::parse(line);
    const Result<std::string> kiln = chat.render(jobs[i]["context"]);
    const std::string& name = all[i].first;
    if (ref["ok"].get<bool>()) {
      ++rendered;
      ASSERT_TRUE(kiln.ok()) << name << ": " << kiln.status().to_string();
      EXPECT_EQ(kiln.value(), ref["output"].get<std::string>()) << name;
    } else {
      EXPECT_FALSE(kiln.ok()) << name << ": the reference failed (" << ref["error"].get<std::string>() << ")";
    }
  }
  EXPECT_EQ(i, all.size());
  std::printf("[ oracle   ] demo chat template: %zu conversations, %zu rendered by both\n", i, rendered);
  EXPECT_GE(rendered, conversations().size() + 40);
}

// --- the built-in demo checkpoint (models/kiln-demo), through the kiln binary --------------

int kiln_cli(const std::string& env, const std::string& args) {
  int code = 0;
  run_command(env + " '" + std::string(KILN_BINARY) + "' " + args + " >/dev/null 2>&1", &code);
  return code;
}

// The trained demo's tokenizer speaks the same ChatML as the generated one: the same
// added tokens, the same chat template, and the eos ids of its configs.
TEST(DemoModel, CheckpointCarriesItsTokenizerTemplateAndEosIds) {
  TempDir dir("cli");
  ASSERT_EQ(kiln_cli("", "demo-model --out '" + dir.str() + "'"), 0);
  const Tokenizer tok = Tokenizer::load(dir.str()).value();
  const json config = json::parse(read_text(dir.path / "config.json"));
  EXPECT_EQ(tok.vocab_size(), config["vocab_size"].get<int32_t>());
  EXPECT_TRUE(config["bos_token_id"].is_null());
  const json eos = {*tok.token_to_id("<|im_end|>"), *tok.token_to_id("<|endoftext|>")};
  EXPECT_EQ(config["eos_token_id"], eos);
  EXPECT_EQ(json::parse(read_text(dir.path / "generation_config.json"))["eos_token_id"], eos);
  for (const char* t : {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}) {
    ASSERT_TRUE(tok.token_to_id(t).has_value()) << t;
    EXPECT_FALSE(tok.is_special(*tok.token_to_id(t))) << t;
    EXPECT_EQ(tok.encode(t, false).size(), 1u) << t;
  }
  // The chat template is the generated tokenizer's, byte for byte.
  TempDir ref("cli_ref");
  ASSERT_TRUE(cli::write_demo_tokenizer(ref.str(), 320).ok());
  EXPECT_EQ(json::parse(read_text(dir.path / "tokenizer_config.json"))["chat_template"],
            json::parse(read_text(ref.path / "tokenizer_config.json"))["chat_template"]);
  EXPECT_TRUE(ChatTemplate::load(dir.str()).ok());
  EXPECT_NE(kiln_cli("KILN_DEMO_MODEL=/nonexistent", "demo-model"), 0);
}

}  // namespace
}  // namespace kiln
