// Where a text stops being JSON: line and column, for config.json, tokenizer.json and request bodies.
#include "core/json_error.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(JsonError, PositionCountsLinesAndColumnsFromOne) {
  EXPECT_EQ(text_position("abc", 1), "line 1, column 1");
  EXPECT_EQ(text_position("abc", 3), "line 1, column 3");
  EXPECT_EQ(text_position("ab\ncd", 4), "line 2, column 1");
  EXPECT_EQ(text_position("ab\ncd\nef", 8), "line 3, column 2");
  EXPECT_EQ(text_position("", 1), "line 1, column 1");  // the end of an empty input
  EXPECT_EQ(text_position("ab", 9), "line 1, column 3");  // past the end: the end
}

TEST(JsonError, NamesTheLineAndColumnOfTheFirstError) {
  EXPECT_EQ(json_error("{\"a\": 1}"), "");
  const std::string e = json_error("{\n  \"a\": 1,\n  \"b\": }\n");
  EXPECT_EQ(e.rfind("line 3, column 8: ", 0), 0u) << e;
  EXPECT_NE(e.find("unexpected '}'"), std::string::npos) << e;
  const std::string cut = json_error("{\"a\": [1, 2");
  EXPECT_EQ(cut.rfind("line 1, column 12: ", 0), 0u) << cut;
  EXPECT_NE(cut.find("end of input"), std::string::npos) << cut;
  EXPECT_EQ(json_error("").rfind("line 1, column 1: ", 0), 0u) << json_error("");
}

TEST(JsonError, ReasonIsShortForAHugeBadToken) {
  const std::string e = json_error("{\"a\": \"" + std::string(100000, 'x') + "\x01\"}");
  EXPECT_LT(e.size(), 200u) << e;
  EXPECT_EQ(e.rfind("line 1, column 100008: ", 0), 0u) << e;
}

}  // namespace
}  // namespace kiln
