// JinjaTemplate: parse / render, error reporting (line and column, status codes,
// raise_exception messages) and the guards against runaway templates.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja_template.h"

namespace kiln::jinja {
namespace {

using json = nlohmann::ordered_json;

Result<std::string> render(const std::string& source, const json& context = json::object(),
                           const RenderOptions& options = {}) {
  auto t = JinjaTemplate::parse(source);
  if (!t.ok()) return t.status();
  return t->render(context, options);
}

std::string render_ok(const std::string& source, const json& context = json::object()) {
  auto r = render(source, context);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : "";
}

TEST(JinjaTemplate, RendersAChatLoop) {
  const json context = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}}},
      {"add_generation_prompt", true}};
  EXPECT_EQ(render_ok("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}",
                      context),
            "<user>hi\n<assistant>yo\n<assistant>");
}

TEST(JinjaTemplate, ParseErrorsNameLineAndColumn) {
  auto t = JinjaTemplate::parse("line one\nline two\n  {{ x | }}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(t.status().message(), "line 3, column 10: Unexpected token: CloseExpression");

  t = JinjaTemplate::parse("{% if x %}\nnever closed");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "line 2, column 13: Unexpected end of template: missing {% endif %}");
}

TEST(JinjaTemplate, UnsupportedConstructsAreUnsupported) {
  auto t = JinjaTemplate::parse("ok\n{% raw %}{{ x }}{% endraw %}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(t.status().message(), "line 2, column 4: Unknown statement type: raw");

  auto r = render("{{ 'x' | nosuch }}");
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(r.status().message(), "line 1, column 8: Unknown StringValue filter: nosuch");
  r = render("{{ 4 is divisibleby }}");
  EXPECT_EQ(r.status().message(), "line 1, column 6: Unknown test: divisibleby");
}

TEST(JinjaTemplate, RuntimeErrorsNameTheInnermostNode) {
  const json context = {{"messages", {{{"role", "user"}, {"content", nullptr}}}}};
  auto r = render("{% for m in messages %}\n  {{ m.content.strip() }}\n{% endfor %}", context);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "line 2, column 6: Cannot call something that is not a function: got UndefinedValue");

  r = render("{% macro m(x) %}\n{{ x + none }}\n{% endmacro %}{{ m(1) }}");
  EXPECT_EQ(r.status().message(), "line 2, column 6: Cannot perform operation on null values");
}

TEST(JinjaTemplate, RaiseExceptionMessageIsExact) {
  auto r = render("{% if messages[0].role != 'user' %}{{ raise_exception('Roles must alternate') }}{% endif %}",
                  {{"messages", {{{"role", "assistant"}}}}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "Roles must alternate");
  EXPECT_EQ(render("{{ raise_exception() }}").status().message(), "");
  EXPECT_EQ(render("{{ raise_exception('n=' ~ 3, 'ignored') }}").status().message(), "n=3");
}

TEST(JinjaTemplate, BreakOutsideALoopIsAnError) {
  auto r = render("a\n{% break %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "line 2, column 4: {% break %} outside of a for loop");
}

TEST(JinjaTemplate, InfiniteRecursionIsAnErrorNotACrash) {
  auto r = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("recursion exceeds depth 500"), std::string::npos) << r.status().message();
  // Bounded recursion within the limit works.
  EXPECT_EQ(
      render_ok(
          "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ n }}{% endif %}{% endmacro %}{{ f(30) | length }}"),
      "51");
}

TEST(JinjaTemplate, EvaluationStepsAreBounded) {
  RenderOptions options;
  options.max_steps = 100'000;
  auto r = render("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}", json::object(),
                  options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("100000 evaluation steps"), std::string::npos);
}

TEST(JinjaTemplate, OutputSizeIsBounded) {
  RenderOptions options;
  options.max_output_bytes = 1 << 20;
  auto r =
      render("{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
             json::object(), options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  r = render("{{ range(100000000) | length }}");
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

TEST(JinjaTemplate, ParseNestingIsBounded) {
  const std::string deep = "{{ " + std::string(2000, '(') + "1" + std::string(2000, ')') + " }}";
  auto t = JinjaTemplate::parse(deep);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kResourceExhausted);
  const std::string fine = "{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}";
  EXPECT_EQ(render_ok(fine), "1");
}

TEST(JinjaTemplate, StrftimeNowUsesTheInjectedClock) {
  RenderOptions options;
  options.now = DateTime{.year = 2025, .month = 3, .day = 7, .hour = 9, .minute = 5};
  auto r = render("{{ strftime_now('%d %b %Y, %B %H:%M %% %A') }}", json::object(), options);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value(), "07 Mar 2025, March 09:05 % %A");
}

TEST(JinjaTemplate, ContextFollowsJavaScriptSemantics) {
  // Integer-like keys come first, as in a JavaScript object; integral floats are integers.
  const json context = json::parse(R"({"d": {"b": 1, "2": 2, "1": 3}, "x": 2.0, "y": 2.5})");
  EXPECT_EQ(render_ok("{% for k in d %}{{ k }}{% endfor %} {{ x }} {{ x is integer }} {{ y }} {{ 2.0 }}", context),
            "12b 2 true 2.5 2.0");
  auto r = render("{{ 1 }}", {{"true", 1}});
  EXPECT_EQ(r.status().message(), "Variable already declared: true");
  r = render("{{ 1 }}", json::array());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(render_ok("{{ 1 }}", nullptr), "1");
}

TEST(JinjaTemplate, RejectsInvalidUtf8) {
  auto t = JinjaTemplate::parse("bad \xff byte");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorrupt);
}

TEST(JinjaTemplate, TemplatesAreReusableAndCopyable) {
  auto t = JinjaTemplate::parse("{% set ns = namespace(n=0) %}{% set ns.n = ns.n + x %}{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  const JinjaTemplate copy = t.value();
  EXPECT_EQ(t->render({{"x", 1}}).value(), "1");
  EXPECT_EQ(t->render({{"x", 2}}).value(), "2");
  EXPECT_EQ(copy.render({{"x", 3}}).value(), "3");
}

TEST(JinjaTemplate, StringsFollowUtf16Semantics) {
  EXPECT_EQ(render_ok("{{ s | length }} {{ s[1] }} {{ s[-1] }} {{ s[::-1] }}", {{"s", "a\U0001F600b"}}),
            "4 \uFFFD b b\U0001F600a");
}

TEST(JinjaTemplate, DescribesPositionsInCodePoints) {
  const std::string source = "a\xC3\xA9\nxyz";  // "aé\nxyz"
  EXPECT_EQ(describe_position(source, 0), "line 1, column 1");
  EXPECT_EQ(describe_position(source, 3), "line 1, column 3");
  EXPECT_EQ(describe_position(source, 6), "line 2, column 3");
  EXPECT_EQ(describe_position(source, 100), "line 2, column 4");
}

}  // namespace
}  // namespace kiln::jinja
