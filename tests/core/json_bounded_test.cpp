// JSON from clients and models parsed without building deep values (core/json_bounded.h):
// a text nested 1,000,000 deep comes back discarded (or, asked for, with its depth and the
// deep parts left out) and the value can be copied, dumped and destroyed safely; a model's
// files and a schema's text say why they are refused.
#include "core/json_bounded.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <random>
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

// Objects of many members, repeated keys among them, come out as nlohmann's parse gives
// them: members in first-seen order, a repeated key's last value in its first place (the
// builder looks keys up linearly up to 16 members and through a hash after).
TEST(JsonBounded, ManyMembersAndRepeatedKeysAsNlohmannParses) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const int n = int(rng() % 60) + 1;
    std::string text = "{";
    for (int i = 0; i < n; ++i) {
      text += (i ? "," : "") + ("\"k" + std::to_string(rng() % 40) + "\":") +
              (rng() % 4 == 0 ? "{\"x\":[1,{\"k1\":2,\"k1\":3}]}" : std::to_string(i));
    }
    text += "}";
    EXPECT_EQ(parse_json_bounded<Json>(text), Json::parse(text)) << text;
    EXPECT_EQ(parse_json_bounded<nlohmann::json>(text), nlohmann::json::parse(text)) << text;
  }
}

// 300,000 members in order, then a repeat of the first: each member in its place (an
// ordered_json parse looks up every key among the members before it, ~n^2 / 2 string
// compares: 50,000 keys took 3.3 s).
TEST(JsonBounded, AnObjectOfManyKeysKeepsItsOrder) {
  const int n = 300000;
  std::string text = "{";
  for (int i = 0; i < n; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  text += ",\"k0\":-1}";
  const Json j = parse_json_bounded<Json>(text);
  ASSERT_EQ(j.size(), size_t(n));
  int i = 0;
  for (const auto& [key, value] : j.items()) {
    ASSERT_EQ(key, "k" + std::to_string(i)) << i;
    ASSERT_EQ(value, i == 0 ? -1 : i) << key;
    ++i;
  }
}

// parse_json_explained (a model's files, a schema's text): the value with no reason, or the
// reason alone: where the text stops being JSON, or how deep it nests.
TEST(JsonBounded, ExplainedParseSaysWhyItRefuses) {
  std::string why = "stale";
  const std::string good = R"({"eos_token_id": [1, 2], "x": {"y": null}})";
  EXPECT_EQ(parse_json_explained<Json>(good, &why), Json::parse(good));
  EXPECT_EQ(why, "");
  EXPECT_TRUE(parse_json_explained<Json>("{\"a\": }", &why).is_discarded());
  EXPECT_EQ(why,
            "not valid JSON at line 1, column 7: syntax error while parsing value - unexpected '}'; expected '[', '{', "
            "or a literal");
  const std::string deep = "{\"eos_token_id\": " + nested(200000) + ", \"x\": 1}";
  EXPECT_TRUE(parse_json_explained<Json>(deep, &why).is_discarded());
  EXPECT_EQ(why, "JSON nested 200000 levels deep (kiln reads at most 128)");
  const std::string at = std::string(128, '[') + "1" + std::string(128, ']');
  EXPECT_EQ(parse_json_explained<Json>(at, &why), Json::parse(at));
  EXPECT_EQ(why, "");
}

}  // namespace
}  // namespace kiln
