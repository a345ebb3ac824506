// JSON from clients and models parsed without building deep values (core/json_bounded.h):
// a text nested 1,000,000 deep comes back discarded (or, asked for, with its depth and the
// deep parts left out) and the value can be copied, dumped and destroyed safely.
#include "core/json_bounded.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "core/json_error.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

std::string nested(int levels) { return std::string(size_t(levels), '[') + std::string(size_t(levels), ']'); }

TEST(JsonBounded, ShallowTextParsesAsNlohmannParsesIt) {
  const std::string text = R"({"a": [1, {"b": null}], "c": "x", "d": 2.5})";
  int depth = -1;
  const Json j = parse_json_bounded<Json>(text, kMaxJsonDepth, &depth);
  EXPECT_EQ(j, Json::parse(text));
  EXPECT_EQ(depth, 3);  // the top-level members at 1, the array's object at 2, its member at 3
  EXPECT_EQ(parse_json_bounded<Json>(text), Json::parse(text));
  EXPECT_TRUE(parse_json_bounded<Json>("{\"a\": }").is_discarded());
  int bad_depth = -1;
  EXPECT_TRUE(parse_json_bounded<Json>("[[1,", kMaxJsonDepth, &bad_depth).is_discarded());
  EXPECT_EQ(bad_depth, 2);
}

TEST(JsonBounded, TheLimitIsInclusive) {
  // 128 levels of members: [[...[1]...]] with 128 brackets puts the 1 at level 128.
  const std::string at = std::string(128, '[') + "1" + std::string(128, ']');
  const std::string over = "[" + at + "]";
  EXPECT_EQ(parse_json_bounded<Json>(at), Json::parse(at));
  EXPECT_TRUE(parse_json_bounded<Json>(over).is_discarded());
  int depth = 0;
  const Json cut = parse_json_bounded<Json>(over, kMaxJsonDepth, &depth);
  EXPECT_EQ(depth, 129);
  EXPECT_FALSE(cut.is_discarded());
}

// Deep text of every shape (arrays, objects, a deep member before more members: the case
// that overflowed the stack) is read without building the deep part, so the result is
// shallow enough to copy, dump and compare.
TEST(JsonBounded, DeepTextNeverBuildsADeepValue) {
  const int levels = 1000000;
  std::string objects;
  for (int i = 0; i < levels; ++i) objects += "{\"a\":";
  objects += "1" + std::string(size_t(levels), '}');
  const std::string member_then_more = "{\"seed\": " + nested(levels) + ", \"stop\": \"x\"}";
  for (const std::string* text : std::initializer_list<const std::string*>{&objects, &member_then_more}) {
    int depth = 0;
    const Json j = parse_json_bounded<Json>(*text, kMaxJsonDepth, &depth);
    EXPECT_GE(depth, levels);
    ASSERT_FALSE(j.is_discarded());
    const Json copy = j;  // would recurse a million levels if the deep part were kept
    EXPECT_LT(copy.dump().size(), 2000u);
    EXPECT_TRUE(parse_json_bounded<Json>(*text).is_discarded());
  }
  int depth = 0;
  const Json kept = parse_json_bounded<Json>(member_then_more, kMaxJsonDepth, &depth);
  EXPECT_EQ(kept["stop"], "x");  // members after the deep one are still read
  EXPECT_TRUE(parse_json_bounded<Json>(nested(levels)).is_discarded());
}

// json_error reads a text of any depth without building it.
TEST(JsonBounded, JsonErrorExplainsDeepText) {
  EXPECT_EQ(json_error(nested(1000000)), "");
  const std::string e = json_error(std::string(1000000, '['));
  EXPECT_EQ(e.rfind("line 1, column 1000001: ", 0), 0u) << e;
}

}  // namespace
}  // namespace kiln
