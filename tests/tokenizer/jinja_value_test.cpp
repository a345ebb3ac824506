// The JavaScript conversions behind the Jinja engine's values, and the JavaScript string
// semantics over UTF-8 (jinja_value.h, jinja_unicode.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tokenizer/jinja_unicode.h"
#include "tokenizer/jinja_value.h"

namespace kiln::jinja {
namespace {

TEST(JinjaValue, NumbersPrintLikeJavaScript) {
  EXPECT_EQ(js_number_to_string(0), "0");
  EXPECT_EQ(js_number_to_string(-0.0), "0");
  EXPECT_EQ(js_number_to_string(42), "42");
  EXPECT_EQ(js_number_to_string(-1.5), "-1.5");
  EXPECT_EQ(js_number_to_string(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(js_number_to_string(1e20), "100000000000000000000");
  EXPECT_EQ(js_number_to_string(1e21), "1e+21");
  EXPECT_EQ(js_number_to_string(std::pow(2.0, 70)), "1.1805916207174113e+21");
  EXPECT_EQ(js_number_to_string(0.000001), "0.000001");
  EXPECT_EQ(js_number_to_string(1.5e-7), "1.5e-7");
  EXPECT_EQ(js_number_to_string(12345678901234567890.0), "12345678901234567000");
  EXPECT_EQ(js_number_to_string(NAN), "NaN");
  EXPECT_EQ(js_number_to_string(-INFINITY), "-Infinity");
}

TEST(JinjaValue, FloatsPrintWithADecimalPoint) {
  EXPECT_EQ(to_display_string(Value::floating(1)), "1.0");
  EXPECT_EQ(to_display_string(Value::floating(-0.0)), "-0.0");
  EXPECT_EQ(to_display_string(Value::floating(2.5)), "2.5");
  EXPECT_EQ(to_display_string(Value::floating(1e21)), "1e+21");
  EXPECT_EQ(to_display_string(Value::floating(INFINITY)), "Infinity");
  EXPECT_EQ(to_display_string(Value::integer(3)), "3");
  // String(x) (`~`, `+`) drops it: 1.0 ~ '' is "1".
  EXPECT_EQ(to_raw_string(Value::floating(1)), "1");
}

TEST(JinjaValue, JsonMatchesTheReference) {
  Heap heap(1 << 20);
  const Value v =
      from_json(nlohmann::ordered_json::parse(R"({"b": [1, 2.5, null, "q\"\n\u0001"], "a": {}})"), heap);
  EXPECT_EQ(to_json(v, {}), R"({"b": [1, 2.5, null, "q\"\n\u0001"], "a": {}})");
  JsonOptions indented;
  indented.indent = 2;
  EXPECT_EQ(to_json(v, indented),
            "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    \"q\\\"\\n\\u0001\"\n  ],\n  \"a\": {}\n}");
  JsonOptions ascii;
  ascii.ensure_ascii = true;
  EXPECT_EQ(to_json(Value::str("\xC3\xA9\xF0\x9F\x98\x80"), ascii), R"("\u00e9\ud83d\ude00")");
  EXPECT_EQ(json_quote("\x7f\xE2\x80\xA8"), "\"\x7f\xE2\x80\xA8\"");  // JSON.stringify leaves these
}

TEST(JinjaValue, LooseEqualityIsJavaScripts) {
  Heap heap(1 << 20);
  const Value list = heap.array({Value::integer(1), Value::integer(2)});
  EXPECT_TRUE(loose_equals(Value::str("1"), Value::integer(1)));
  EXPECT_TRUE(loose_equals(Value::str(" "), Value::integer(0)));
  EXPECT_TRUE(loose_equals(Value::boolean_value(true), Value::integer(1)));
  EXPECT_TRUE(loose_equals(Value::null(), Value::undefined()));
  EXPECT_FALSE(loose_equals(Value::null(), Value::boolean_value(false)));
  EXPECT_TRUE(loose_equals(list, list));
  EXPECT_FALSE(loose_equals(list, heap.array({Value::integer(1), Value::integer(2)})));
  EXPECT_TRUE(loose_equals(list, Value::str("1,2")));
  EXPECT_TRUE(loose_equals(Value::str("0x10"), Value::integer(16)));
  EXPECT_FALSE(loose_equals(Value::floating(NAN), Value::floating(NAN)));
  EXPECT_TRUE(strict_equals(Value::integer(1), Value::floating(1)));
  EXPECT_FALSE(strict_equals(Value::str("1"), Value::integer(1)));
}

TEST(JinjaUnicode, Utf16LengthsAndIndexing) {
  EXPECT_EQ(utf16_length("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"), 5u);  // a é 中 😀
  EXPECT_EQ(utf16_at("a\xF0\x9F\x98\x80", 1).value(), "\xED\xA0\xBD");   // high surrogate D83D
  EXPECT_EQ(utf16_at("a\xF0\x9F\x98\x80", 2).value(), "\xED\xB8\x80");   // low surrogate DE00
  EXPECT_EQ(utf16_at("a\xF0\x9F\x98\x80", -3).value(), "a");
  EXPECT_FALSE(utf16_at("ab", 2).has_value());
  EXPECT_EQ(code_points("a\xF0\x9F\x98\x80").size(), 2u);
}

TEST(JinjaUnicode, LoneSurrogatesMergeAndBecomeReplacementCharacters) {
  std::string s = "x\xED\xA0\xBD\xED\xB8\x80y";  // D83D DE00 as two WTF-8 halves
  merge_surrogate_pairs(s);
  EXPECT_EQ(s, "x\xF0\x9F\x98\x80y");
  EXPECT_EQ(to_well_formed("\xED\xB8\x80"
                           "a\xED\xA0\xBD"),
            "\xEF\xBF\xBD"
            "a\xEF\xBF\xBD");
  EXPECT_EQ(json_quote("\xED\xB8\x80"), "\"\\ude00\"");
  EXPECT_EQ(Value::str("\xED\xA0\xBD"
                       "\xED\xB8\x80")
                .text(),
            "\xF0\x9F\x98\x80");
}

TEST(JinjaUnicode, ComparesByUtf16CodeUnits) {
  // U+1F600 is D83D DE00 in UTF-16, below U+FFFD; UTF-8 byte order says the opposite.
  EXPECT_LT(compare_utf16("\xF0\x9F\x98\x80", "\xEF\xBF\xBD"), 0);
  EXPECT_LT(compare_utf16("a", "b"), 0);
  EXPECT_GT(compare_utf16("ab", "a"), 0);
  EXPECT_EQ(compare_utf16("x", "x"), 0);
}

TEST(JinjaUnicode, CaseMappingIsFull) {
  EXPECT_EQ(js_to_upper("stra\xC3\x9F"
                        "e"),
            "STRASSE");
  EXPECT_EQ(js_to_upper("\xEF\xAC\x81"), "FI");                                    // ﬁ ligature
  EXPECT_EQ(js_to_lower("\xCE\xA3\xCE\x91\xCE\xA3"), "\xCF\x83\xCE\xB1\xCF\x82");  // ΣΑΣ -> σας
  EXPECT_EQ(js_to_lower("\xCE\xA3"), "\xCF\x83");                                  // a lone Σ is not final
  EXPECT_EQ(js_to_lower("\xC4\xB0"), "i\xCC\x87");                                 // İ -> i + dot above
  EXPECT_EQ(js_to_upper("\xF0\x90\x90\xA8"), "\xF0\x90\x90\x80");                  // Deseret, outside the BMP
}

TEST(JinjaUnicode, TrimsJavaScriptWhitespace) {
  EXPECT_EQ(js_trim("\xE3\x80\x80 \t\n x \xC2\xA0\xEF\xBB\xBF"), "x");
  EXPECT_EQ(js_trim_start("  x "), "x ");
  EXPECT_EQ(js_trim_end("  x \xE2\x80\xA8"), "  x");
  EXPECT_EQ(js_trim("\xE2\x80\x8B"), "\xE2\x80\x8B");  // zero width space is not whitespace
}

TEST(JinjaUnicode, LocaleCompareOrdersAsciiLikeIcu) {
  EXPECT_LT(locale_compare("a", "A"), 0);
  EXPECT_LT(locale_compare("A", "b"), 0);
  EXPECT_LT(locale_compare("_x", "1"), 0);
  EXPECT_LT(locale_compare("1", "a"), 0);
  EXPECT_LT(locale_compare("a_b", "a-b"), 0);
  EXPECT_LT(locale_compare("a-b", "a1"), 0);
  EXPECT_EQ(locale_compare("same", "same"), 0);
}

}  // namespace
}  // namespace kiln::jinja
