// Structured output's chat grammars (server/structured_output.h): tool calls in every
// family's syntax are accepted exactly when they are well formed and their arguments
// follow the schemas, and what they accept is what that family's output parser reads back
// as the same calls; the reasoning frames leave the reasoning free and constrain what
// follows it; the request fields become grammars or 400s.
#include "server/structured_output.h"

#include <gtest/gtest.h>

#include <random>

#include "../grammar/json_instances.h"
#include "grammar/matcher.h"

namespace kiln::server {
namespace {

using grammar::testing::InstanceGenerator;
using tokenizer::ToolFormat;

const ordered_json kTools = ordered_json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "add", "strict": true, "parameters": {"type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}, "required": ["a", "b"],
    "additionalProperties": false}}}
])");

bool accepts(const grammar::Grammar& g, const std::string& text) {
  auto compiled = grammar::CompiledGrammar::compile(g);
  EXPECT_TRUE(compiled.ok()) << compiled.status().message();
  grammar::Matcher m(*compiled);
  return m.accept(text) && m.is_complete();
}

// One call in the family's syntax, as its chat template writes it.
std::string call_text(const ToolSyntax& s, const std::string& name, const std::string& args, int index) {
  switch (s.format) {
    case ToolFormat::kHermes: return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>";
    case ToolFormat::kGlm45: {
      std::string out = "<tool_call>" + name + "\n";
      const ordered_json parsed = ordered_json::parse(args);
      for (const auto& [k, v] : parsed.items())
        out += "<arg_key>" + k + "</arg_key>\n<arg_value>" + (v.is_string() ? v.get<std::string>() : v.dump()) +
               "</arg_value>\n";
      return out + "</tool_call>";
    }
    case ToolFormat::kKimiK2:
      return "<|tool_call_begin|>functions." + name + ":" + std::to_string(index) + "<|tool_call_argument_begin|>" +
             args + "<|tool_call_end|>";
    case ToolFormat::kDeepSeekV3:
      return s.deepseek_fenced ? "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n" + args +
                                     "\n```<｜tool▁call▁end｜>"
                               : "<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>" + args + "<｜tool▁call▁end｜>";
    case ToolFormat::kDeepSeekV32: {
      std::string out = "<｜DSML｜invoke name=\"" + name + "\">\n";
      const ordered_json parsed = ordered_json::parse(args);
      for (const auto& [k, v] : parsed.items())
        out += "<｜DSML｜parameter name=\"" + k + "\" string=\"" + (v.is_string() ? "true" : "false") + "\">" +
               (v.is_string() ? v.get<std::string>() : v.dump()) + "</｜DSML｜parameter>\n";
      return out + "</｜DSML｜invoke>";
    }
    case ToolFormat::kHarmony:
      return "<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>" + args + "<|call|>";
    case ToolFormat::kNone: break;
  }
  return {};
}

std::string block_text(const ToolSyntax& s, const std::vector<std::string>& calls) {
  std::string inner;
  for (size_t i = 0; i < calls.size(); ++i) {
    const bool lines =
        s.format == ToolFormat::kHermes || s.format == ToolFormat::kGlm45 || s.format == ToolFormat::kDeepSeekV32;
    inner += (i > 0 && lines ? "\n" : "") + calls[i];
  }
  if (s.format == ToolFormat::kKimiK2) return "<|tool_calls_section_begin|>" + inner + "<|tool_calls_section_end|>";
  if (s.format == ToolFormat::kDeepSeekV3) return "<｜tool▁calls▁begin｜>" + inner + "<｜tool▁calls▁end｜>";
  if (s.format == ToolFormat::kDeepSeekV32) return "<｜DSML｜function_calls>\n" + inner + "\n</｜DSML｜function_calls>";
  return inner;
}

const ToolSyntax kSyntaxes[] = {{ToolFormat::kHermes},     {ToolFormat::kGlm45},
                                {ToolFormat::kKimiK2},     {ToolFormat::kDeepSeekV3, true},
                                {ToolFormat::kDeepSeekV3, false}, {ToolFormat::kDeepSeekV32},
                                {ToolFormat::kHarmony}};

class ToolGrammar : public ::testing::TestWithParam<ToolSyntax> {};

// Random valid calls (arguments generated from the schemas) are accepted and parse back,
// by the family's own parser, into the same names and arguments.
TEST_P(ToolGrammar, RandomValidCallsAreAcceptedAndParseBack) {
  const ToolSyntax s = GetParam();
  auto g = tool_call_grammar(s, kTools, {});
  ASSERT_TRUE(g.ok()) << g.status().message();
  tokenizer::ParserOptions options;
  options.tools = kTools;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = s.format == ToolFormat::kHarmony ? 1 : 1 + int(rng() % 3);
    std::vector<std::string> calls;
    std::vector<std::pair<std::string, ordered_json>> want;
    for (int i = 0; i < n; ++i) {
      const ordered_json& fn = kTools[rng() % 2]["function"];
      InstanceGenerator gen(fn["parameters"], uint64_t(trial * 10 + i));
      ordered_json args = gen.generate(fn["parameters"]);
      // GLM and DSML write string values raw: keep them free of their markers and of edge
      // spaces the template would not produce.
      const bool raw = s.format == ToolFormat::kGlm45 || s.format == ToolFormat::kDeepSeekV32;
      if (raw && args.contains("city")) args["city"] = "Paris " + std::to_string(trial);
      calls.push_back(call_text(s, fn["name"], raw ? args.dump() : gen.serialize(args), i));
      want.emplace_back(fn["name"], args);
    }
    const std::string text = block_text(s, calls);
    const grammar::Grammar reply = after_reasoning(*g, ReasoningFrame::kNone, true);
    ASSERT_TRUE(accepts(reply, text)) << text;
    const tokenizer::ParsedOutput parsed = tokenizer::parse_all(s.format, options, text);
    ASSERT_EQ(parsed.tool_calls.size(), want.size()) << text;
    EXPECT_EQ(parsed.content, "") << text;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(parsed.tool_calls[i].name, want[i].first);
      EXPECT_EQ(ordered_json::parse(parsed.tool_calls[i].arguments_json), want[i].second) << text;
    }
  }
}

TEST_P(ToolGrammar, RejectsWhatTheRuleOrTheSchemaForbids) {
  const ToolSyntax s = GetParam();
  auto any = tool_call_grammar(s, kTools, {});
  auto named = tool_call_grammar(s, kTools, {.name = "add", .parallel = false});
  ASSERT_TRUE(any.ok() && named.ok());
  const std::string add = call_text(s, "add", std::string(R"({"a":1,"b":2.5})"), 0);
  const std::string weather = call_text(s, "get_weather", std::string(R"({"city":"Oslo","days":3})"), 1);
  EXPECT_TRUE(accepts(*any, block_text(s, {add})));
  EXPECT_TRUE(accepts(*named, block_text(s, {add})));
  EXPECT_FALSE(accepts(*named, block_text(s, {weather}))) << "the named rule allows only 'add'";
  EXPECT_FALSE(accepts(*named, block_text(s, {add, add}))) << "one call only";
  EXPECT_FALSE(accepts(*any, block_text(s, {call_text(s, "remove", std::string(R"({"a":1,"b":2})"), 0)})));
  EXPECT_FALSE(accepts(*any, block_text(s, {call_text(s, "add", std::string(R"({"a":1})"), 0)}))) << "b is required";
  EXPECT_FALSE(accepts(*any, block_text(s, {call_text(s, "get_weather", std::string(R"({"city":"Oslo","days":9})"), 0)})))
      << "days <= 7";
  EXPECT_FALSE(accepts(*any, "")) << "a call is required";
  EXPECT_FALSE(accepts(*any, "Sure! " + block_text(s, {add}))) << "nothing before the calls";
}

INSTANTIATE_TEST_SUITE_P(Families, ToolGrammar, ::testing::ValuesIn(kSyntaxes), [](const auto& info) {
  std::string name(tokenizer::tool_format_name(info.param.format));
  if (info.param.format == ToolFormat::kDeepSeekV3) name += info.param.deepseek_fenced ? "_fenced" : "_v31";
  return name;
});

TEST(ToolGrammar, AStrictFunctionWithASchemaKilnCannotEnforceIsRefusedALooseOneIsAnyObject) {
  ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters":
    {"type": "object", "patternProperties": {"^x": {"type": "string"}}}}}])");
  auto loose = tool_call_grammar({ToolFormat::kHermes}, tools, {});
  ASSERT_TRUE(loose.ok()) << loose.status().message();
  EXPECT_TRUE(accepts(*loose, R"(<tool_call>
{"name": "f", "arguments": {"anything": [1, 2]}}
</tool_call>)"));
  tools[0]["function"]["strict"] = true;
  auto strict = tool_call_grammar({ToolFormat::kHermes}, tools, {});
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("patternProperties"), std::string::npos) << strict.status().message();
  EXPECT_NE(strict.status().message().find("'f'"), std::string::npos) << strict.status().message();
  auto missing = tool_call_grammar({ToolFormat::kHermes}, tools, {.name = "g"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'g'"), std::string::npos);
  EXPECT_FALSE(tool_call_grammar({ToolFormat::kNone}, kTools, {}).ok()) << "no syntax to write calls in";
}

// tool_choice auto with strict functions: free text, and a tool-call block at the marker
// held to the schemas; harmony has no marker in text (no lazy grammar).
TEST(ToolGrammar, LazyCallsAreFreeTextUntilTheMarker) {
  for (const ToolSyntax& s : {ToolSyntax{ToolFormat::kHermes}, ToolSyntax{ToolFormat::kGlm45},
                              ToolSyntax{ToolFormat::kKimiK2}, ToolSyntax{ToolFormat::kDeepSeekV3, true},
                              ToolSyntax{ToolFormat::kDeepSeekV32}}) {
    SCOPED_TRACE(std::string(tokenizer::tool_format_name(s.format)));
    auto calls = tool_call_grammar(s, kTools, {});
    ASSERT_TRUE(calls.ok());
    const std::optional<grammar::Grammar> g = lazy_tool_call_grammar(s, *calls);
    ASSERT_TRUE(g.has_value());
    const std::string add = call_text(s, "add", R"({"a":1,"b":2})", 0);
    EXPECT_TRUE(accepts(*g, "No tool needed: 2 + 2 = 4. <b>html</b> {\"json\": 1}"));
    EXPECT_TRUE(accepts(*g, ""));
    EXPECT_TRUE(accepts(*g, "Let me add them.\n\n" + block_text(s, {add})));
    EXPECT_TRUE(accepts(*g, block_text(s, {add, call_text(s, "get_weather", R"({"city":"Rome","days":2})", 1)})));
    EXPECT_FALSE(accepts(*g, "Adding.\n" + block_text(s, {call_text(s, "add", R"({"a":1})", 0)}))) << "b is required";
    EXPECT_FALSE(accepts(*g, block_text(s, {add}) + " and some text after"));
  }
  auto harmony = tool_call_grammar({ToolFormat::kHarmony}, kTools, {});
  ASSERT_TRUE(harmony.ok());
  EXPECT_FALSE(lazy_tool_call_grammar({ToolFormat::kHarmony}, *harmony).has_value());
  EXPECT_FALSE(lazy_tool_call_grammar({ToolFormat::kNone}, *harmony).has_value());
}

TEST(ReasoningFrame, TheReasoningIsFreeAndTheBodyFollowsIt) {
  const ordered_json request = ordered_json::parse(R"({"response_format": {"type": "json_schema", "json_schema":
    {"schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}})");
  Fields f(request);
  const std::optional<grammar::Grammar> body = read_output_format(f, false);
  ASSERT_TRUE(body.has_value() && !f.failed());
  const grammar::Grammar open = after_reasoning(*body, ReasoningFrame::kThinkOpen, false);
  EXPECT_TRUE(accepts(open, "Let me think: {\"ok\": maybe} </thinking> <b>\n</think>\n\n{\"ok\": true}"));
  EXPECT_TRUE(accepts(open, "</think>{\"ok\":false}"));
  EXPECT_FALSE(accepts(open, "{\"ok\": true}")) << "the prompt opened the block: it must close first";
  EXPECT_FALSE(accepts(open, "a</think>b</think>{\"ok\": true}")) << "the body starts after the first </think>";
  EXPECT_FALSE(accepts(open, "done</think>\n\nSure: {\"ok\": true}"));
  const grammar::Grammar optional = after_reasoning(*body, ReasoningFrame::kThinkOptional, false);
  EXPECT_TRUE(accepts(optional, "{\"ok\": true}"));
  EXPECT_TRUE(accepts(optional, "<think>\nhmm\n</think>\n\n{\"ok\": true}"));
  EXPECT_FALSE(accepts(optional, "hmm</think>{\"ok\": true}"));
  const grammar::Grammar harmony = after_reasoning(*body, ReasoningFrame::kHarmony, false);
  EXPECT_TRUE(accepts(harmony, "<|channel|>final<|message|>{\"ok\": true}"));
  EXPECT_TRUE(accepts(harmony,
                      "<|channel|>analysis<|message|>Need JSON. {x} <b>|</b><|end|><|start|>assistant"
                      "<|channel|>final<|message|>{\"ok\": false}"));
  EXPECT_FALSE(accepts(harmony, "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>"
                                "{\"ok\": 1}"));
  EXPECT_FALSE(accepts(harmony, "<|channel|>commentary<|message|>{\"ok\": true}"));
  // Harmony tool calls carry their own channel header.
  auto calls = tool_call_grammar({ToolFormat::kHarmony}, kTools, {.name = "add"});
  ASSERT_TRUE(calls.ok());
  const std::string call = R"(<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a":1,"b":2}<|call|>)";
  const grammar::Grammar tool_reply = after_reasoning(*calls, ReasoningFrame::kHarmony, true);
  EXPECT_TRUE(accepts(tool_reply, call));
  EXPECT_TRUE(accepts(tool_reply, "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant" + call));
  tokenizer::ParserOptions options;
  const tokenizer::ParsedOutput parsed = tokenizer::parse_all(
      ToolFormat::kHarmony, options, "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant" + call);
  ASSERT_EQ(parsed.tool_calls.size(), 1u);
  EXPECT_EQ(parsed.tool_calls[0].name, "add");
  EXPECT_EQ(parsed.reasoning, "Add them.");
}

std::string read_error(const char* body) {
  const ordered_json request = ordered_json::parse(body);
  Fields f(request);
  const std::optional<grammar::Grammar> g = read_output_format(f, true);
  return f.failed() ? f.error().param + ": " + f.error().message : (g ? "grammar" : "none");
}

TEST(OutputFormat, RequestFieldsBecomeGrammarsOrNameWhatIsWrong) {
  EXPECT_EQ(read_error(R"({})"), "none");
  EXPECT_EQ(read_error(R"({"response_format": {"type": "text"}})"), "none");
  EXPECT_EQ(read_error(R"({"response_format": {"type": "json_object"}})"), "grammar");
  EXPECT_EQ(read_error(R"({"structured_outputs": {"regex": "[0-9]{3}-[a-z]+"}})"), "grammar");
  EXPECT_EQ(read_error(R"({"structured_outputs": {"choice": ["yes", "no"]}})"), "grammar");
  EXPECT_EQ(read_error(R"({"structured_outputs": {"json": {"type": "integer"}}})"), "grammar");
  EXPECT_EQ(read_error(R"({"structured_outputs": {"json": "{\"type\": \"string\"}"}})"), "grammar");
  EXPECT_EQ(read_error(R"({"json_schema": {"type": "array"}})"), "grammar");
  EXPECT_EQ(read_error(R"({"structured_outputs": {"grammar": "root ::= \"a\" [0-9]+"}})"), "grammar");
  EXPECT_EQ(read_error(R"({"grammar": "root ::= \"yes\" | \"no\""})"), "grammar");
  EXPECT_NE(read_error(R"({"grammar": "root ::= item"})").find("grammar: 'grammar': GBNF grammar at line 1, column 10"),
            std::string::npos)
      << read_error(R"({"grammar": "root ::= item"})");
  EXPECT_NE(read_error(R"({"structured_outputs": {"structural_tag": {}}})").find("not supported"), std::string::npos);
  EXPECT_NE(read_error(R"({"structured_outputs": {"regex": "(a)\\1"}})").find("structured_outputs.regex"), std::string::npos);
  EXPECT_NE(read_error(R"({"structured_outputs": {"choice": []}})").find("non-empty"), std::string::npos);
  EXPECT_NE(read_error(R"({"structured_outputs": {"regex": "a", "choice": ["a"]}})").find("not both"), std::string::npos);
  EXPECT_NE(read_error(R"({"structured_outputs": {"jsn": {}}})").find("unknown field 'jsn'"), std::string::npos);
  EXPECT_NE(read_error(R"({"response_format": {"type": "json_object"}, "json_schema": {}})").find("not both"),
            std::string::npos);
  const std::string bad = read_error(
      R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "object", "patternProperties": {"x": {}}}}}}}})");
  EXPECT_NE(bad.find("response_format.json_schema.schema"), std::string::npos) << bad;
  EXPECT_NE(bad.find("/properties/a"), std::string::npos) << bad;
  // Accepted sentences: a choice is one of the strings, whole.
  const ordered_json request = ordered_json::parse(R"({"structured_outputs": {"choice": ["yes", "no"]}})");
  Fields f(request);
  const std::optional<grammar::Grammar> choice = read_output_format(f, false);
  ASSERT_TRUE(choice.has_value());
  EXPECT_TRUE(accepts(*choice, "yes"));
  EXPECT_FALSE(accepts(*choice, "ye"));
  EXPECT_FALSE(accepts(*choice, "yes no"));
}

}  // namespace
}  // namespace kiln::server
