// JSON schema -> grammar: each keyword accepted (and what it rejects), refused keywords
// with their path, and property tests: random valid instances accepted byte by byte,
// random corruptions rejected, left incomplete, or still valid.
#include "grammar/json_schema.h"

#include <gtest/gtest.h>

#include "grammar/json_instances.h"
#include "grammar/matcher.h"

namespace kiln::grammar {
namespace {

using testing::ojson;

std::shared_ptr<const CompiledGrammar> compile_schema(const std::string& schema) {
  auto g = json_schema_text_to_grammar(schema);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return nullptr;
  auto cg = CompiledGrammar::compile(*g);
  EXPECT_TRUE(cg.ok());
  return std::move(cg).value();
}

bool full_match(const std::shared_ptr<const CompiledGrammar>& g, std::string_view doc) {
  Matcher m(g);
  return m.accept(doc) && m.is_complete();
}

void expect_matches(const std::string& schema, std::initializer_list<const char*> good,
                    std::initializer_list<const char*> bad) {
  auto g = compile_schema(schema);
  ASSERT_TRUE(g);
  for (const char* d : good) EXPECT_TRUE(full_match(g, d)) << schema << "\n  should accept: " << d;
  for (const char* d : bad) EXPECT_FALSE(full_match(g, d)) << schema << "\n  should reject: " << d;
}

std::string error_of(const std::string& schema) {
  auto g = json_schema_text_to_grammar(schema);
  EXPECT_FALSE(g.ok()) << schema;
  return g.ok() ? "" : g.status().message();
}

TEST(JsonSchema, ObjectPropertiesInDeclaredOrderWithOptionalOnes) {
  expect_matches(R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"},"c":{"type":"boolean"}},
                     "required":["a"],"additionalProperties":false})",
                 {R"({"a":"x"})", R"({"b":1,"a":"x"})", R"({"b":1, "a":"x", "c":true})", R"({"a":"x","c":false})"},
                 {R"({})", R"({"a":"x","b":1})", R"({"b":1})", R"({"a":"x","d":1})", R"({"a":"x",})", R"({,"a":"x"})"});
}

TEST(JsonSchema, AdditionalProperties) {
  expect_matches(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})",
                 {R"({})", R"({"a":1})", R"({"a":1,"zz":"q"})", R"({"zz":"q","y":""})"}, {R"({"zz":1})"});
  // Known looseness (README.md): an extra member's key may repeat a declared one, {"a":"s"}.
  expect_matches(R"({"type":"object"})", {R"({})", R"({"k":[1,{"x":null}]})"}, {R"([])", R"({"k"})"});
  expect_matches(R"({"type":"object","properties":{"a":{"type":"integer"}}})", {R"({"a":1})"}, {R"({"b":1})"});
}

TEST(JsonSchema, Arrays) {
  expect_matches(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})",
                 {"[1]", "[1,2]", "[1, 2, 3]"}, {"[]", "[1,2,3,4]", "[1,]", "[\"a\"]"});
  expect_matches(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}]})",
                 {"[]", R"(["a"])", R"(["a",1])"}, {R"([1])", R"(["a",1,2])"});
  expect_matches(R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"null"},"minItems":2})",
                 {R"(["a",null])", R"(["a",null,null])"}, {R"(["a"])", R"([])", R"(["a",1])"});
  expect_matches(R"({"type":"array","items":{"type":"boolean"},"maxItems":0})", {"[]"}, {"[true]"});
  expect_matches(R"({"type":"array"})", {"[]", R"([1,"a",{}])"}, {"[1,]"});
}

TEST(JsonSchema, StringsLengthsEscapesAndUtf8) {
  expect_matches(R"({"type":"string","minLength":2,"maxLength":3})",
                 {R"("ab")", R"("abc")", R"("\n\"")", R"("日本")", R"("\u00e9x")", R"("\ud83d\ude00a")"},
                 {R"("a")", R"("abcd")", R"("\x")", "\"a\nb\"", "\"\xff\xfe\"", R"("\ud83dab")", "\"\xed\xa0\x80x\""});
  expect_matches(R"({"type":"string"})", {R"("")", R"("a\/b\\")", "\"\xf0\x9f\x98\x80\""}, {R"(")", "\"a\tb\"", "\"\xc0\x80\""});
}

TEST(JsonSchema, StringFormats) {
  expect_matches(R"({"type":"string","format":"date"})", {R"("2024-02-29")"}, {R"("2024-13-01")", R"("2024-1-01")", R"("x")"});
  expect_matches(R"({"type":"string","format":"time"})", {R"("23:59:59Z")", R"("08:30:00.123+05:30")"}, {R"("24:00:00Z")", R"("08:30")"});
  expect_matches(R"({"type":"string","format":"date-time"})", {R"("2024-01-02T03:04:05Z")"}, {R"("2024-01-02 03:04:05Z")"});
  expect_matches(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
                 {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
  expect_matches(R"({"type":"string","format":"email"})", {R"("a.b+c@ex-ample.co.uk")"}, {R"("a@b")", R"("@b.c")", R"("a b@c.d")"});
  expect_matches(R"({"type":"string","format":"ipv4"})", {R"("192.168.0.255")"}, {R"("256.1.1.1")", R"("01.1.1.1")"});
  expect_matches(R"({"type":"string","format":"uri"})", {R"("anything")"}, {});  // an annotation
}

TEST(JsonSchema, StringPatternAndEnumConst) {
  expect_matches(R"({"type":"string","pattern":"^[a-z]+-\\d{2}$"})", {R"("ab-12")"}, {R"("ab-1")", R"("Ab-12")", R"("ab-123")"});
  expect_matches(R"({"type":"string","pattern":"ab"})", {R"("ab")", R"("xaby")", R"("x\"ab")"}, {R"("a")", R"("xa")"});
  expect_matches(R"({"type":"string","pattern":"^a\"b$"})", {R"("a\"b")"}, {R"("a"b")"});
  expect_matches(R"({"enum":["red",1,null,{"a":[true]}]})", {R"("red")", "1", "null", R"({"a":[true]})"}, {R"("blue")", "2"});
  expect_matches(R"({"const":"x"})", {R"("x")"}, {R"("y")"});
}

TEST(JsonSchema, IntegerRangesAreExact) {
  const std::pair<std::string, std::pair<int64_t, int64_t>> cases[] = {
      {R"({"type":"integer","minimum":0,"maximum":150})", {0, 150}},
      {R"({"type":"integer","minimum":-37,"maximum":1205})", {-37, 1205}},
      {R"({"type":"integer","exclusiveMinimum":-100,"exclusiveMaximum":-9})", {-99, -10}},
      {R"({"type":"integer","minimum":7.5,"maximum":99.9})", {8, 99}},
  };
  for (const auto& [schema, range] : cases) {
    auto g = compile_schema(schema);
    ASSERT_TRUE(g);
    for (int64_t v = -1500; v <= 1500; ++v)
      EXPECT_EQ(full_match(g, std::to_string(v)), v >= range.first && v <= range.second) << schema << " " << v;
    EXPECT_FALSE(full_match(g, "007"));
    EXPECT_FALSE(full_match(g, "-0"));
  }
  // One-sided bounds: exact too.
  auto g = compile_schema(R"({"type":"integer","minimum":42})");
  for (int64_t v : {-1, 0, 41, 99, 420}) EXPECT_FALSE(full_match(g, std::to_string(v)) != (v >= 42)) << v;
  EXPECT_TRUE(full_match(g, "123456789012345"));
  g = compile_schema(R"({"type":"integer","maximum":-3})");
  for (int64_t v : {-1000000, -4, -3, -2, 0, 5}) EXPECT_EQ(full_match(g, std::to_string(v)), v <= -3) << v;
}

TEST(JsonSchema, NumbersBooleanNullAndTypeLists) {
  expect_matches(R"({"type":"number"})", {"0", "-1.5", "2e10", "1.0E-3", "-0"}, {"01", "1.", ".5", "+1", "1e", "NaN"});
  expect_matches(R"({"type":"number","minimum":0})", {"0", "3.5"}, {"-1"});
  expect_matches(R"({"type":"number","exclusiveMaximum":0})", {"-0.5"}, {"1", "0"});
  expect_matches(R"({"type":"boolean"})", {"true", "false"}, {"null", "1"});
  expect_matches(R"({"type":"null"})", {"null"}, {"nul"});
  expect_matches(R"({"type":["string","null"],"maxLength":1})", {"null", R"("a")"}, {R"("ab")", "1"});
}

TEST(JsonSchema, AnyOfOneOfAllOf) {
  expect_matches(R"({"anyOf":[{"type":"integer"},{"type":"string"}]})", {"1", R"("a")"}, {"null"});
  expect_matches(R"({"oneOf":[{"type":"boolean"},{"type":"null"}],"description":"d"})", {"true", "null"}, {"0"});
  expect_matches(R"({"allOf":[{"$ref":"#/$defs/A"},{"properties":{"b":{"type":"integer"}},"required":["b"]}],
                    "$defs":{"A":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}}})",
                 {R"({"a":"x","b":1})"}, {R"({"b":1,"a":"x"})", R"({"a":"x"})"});
  expect_matches(R"({"allOf":[{"type":"integer","maximum":3}]})", {"3"}, {"4"});
}

TEST(JsonSchema, RecursiveRef) {
  const std::string tree = R"({"$defs":{"Node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/Node"}}},"required":["v"],"additionalProperties":false}},
      "$ref":"#/$defs/Node"})";
  expect_matches(tree, {R"({"v":1})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]},{"v":4}]})"},
                 {R"({"v":1,"kids":[{"kids":[]}]})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}])"});
  // Mutual recursion through definitions and the root itself ("#").
  expect_matches(R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["next"]})",
                 {R"({"next":null})", R"({"next":{"next":{"next":null}}})"}, {R"({"next":{}})"});
}

TEST(JsonSchema, WhitespaceIsBoundedToOneSpaceAfterColonAndComma) {
  auto g = compile_schema(R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},"b":{}}})");
  EXPECT_TRUE(full_match(g, R"({"a": [1, 2], "b": {"x": 1}})"));
  EXPECT_TRUE(full_match(g, R"({"a":[1,2],"b":{"x":1}})"));
  for (const char* bad : {R"({"a":  [1]})", R"({ "a":[1]})", R"({"a" :[1]})", R"({"a":[1 ]})", R"({"a":[ 1]})",
                          R"( {"a":[1]})", "{\"a\":[1],\n\"b\":1}", R"({"a":[1],  "b":1})"})
    EXPECT_FALSE(full_match(g, bad)) << bad;
  Matcher m(g);
  ASSERT_TRUE(m.accept(R"({"a":[1]})"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.can_continue());  // nothing, not even a space, after the document
}

TEST(JsonSchema, JsonObjectModeAcceptsAnyObjectOnly) {
  auto cg = CompiledGrammar::compile(json_object_grammar());
  ASSERT_TRUE(cg.ok());
  for (const char* good : {"{}", R"({"a":[1,{"b":null}], "c":"d"})", R"({"x":-1.5e3})"}) EXPECT_TRUE(full_match(*cg, good)) << good;
  for (const char* bad : {"[]", "1", R"("s")", "{", R"({"a"})", R"({a:1})"}) EXPECT_FALSE(full_match(*cg, bad)) << bad;
}

TEST(JsonSchema, RefusedKeywordsNameTheKeywordAndPath) {
  EXPECT_EQ(error_of(R"({"type":"object","properties":{"a":{"type":"object","patternProperties":{}}}})"),
            "unsupported JSON schema keyword 'patternProperties' at /properties/a/patternProperties");
  EXPECT_NE(error_of(R"({"type":"array","uniqueItems":true})").find("'uniqueItems' at /uniqueItems"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"string","format":"date","maxLength":3})").find("'maxLength' at /maxLength"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref":"#/$defs/Missing"})").find("at /$ref"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"strin"})").find("/type: unknown type 'strin'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type":"array","items":{"minItems":-1}})").find("/items/minItems: must be a non-negative integer"),
            std::string::npos);
  EXPECT_NE(error_of(R"J({"properties":{"a/b":{"type":"string","pattern":"(?=x)"}}})J").find("/properties/a~1b/pattern"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type":"object","required":["x"]})").find("'required'"), std::string::npos);
  EXPECT_NE(error_of(R"({"allOf":[{"type":"string"},{"type":"integer"}]})").find("allOf"), std::string::npos);
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("false").find("matches no value"), std::string::npos);
}

// A schema's text nested past 128 levels is refused as it is read (never built: a deep value
// overflows the stack when copied); a schema whose counted lengths ask for more than 250,000
// rules is refused where the budget runs out.
TEST(JsonSchema, DeepTextAndLargeGrammarsAreRefused) {
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"type":"array","items":)";
  deep += "{}" + std::string(100000, '}');
  EXPECT_EQ(error_of(deep), "JSON schema: JSON nested 100000 levels deep (kiln reads at most 128)");
  // Strings of one length range share their counting rules; 30 different ranges of ~10,000
  // do not fit.
  const auto fields = [](bool same) {
    std::string s = R"({"type":"object","properties":{)";
    for (int i = 0; i < 30; ++i)
      s += (i ? "," : "") + ("\"p" + std::to_string(i)) + R"(":{"type":"string","maxLength":)" +
           std::to_string(same ? 10000 : 9970 + i) + "}";
    return s + "}}";
  };
  auto shared = json_schema_text_to_grammar(fields(true));
  ASSERT_TRUE(shared.ok()) << shared.status().message();
  EXPECT_LT(shared->rules().size(), 10200u);
  EXPECT_NE(error_of(fields(false)).find("at /properties/p25: the grammar is too large: more than 250000 rules"),
            std::string::npos)
      << error_of(fields(false));
  // A chain of references, each to the next definition, nests as deep as the chain is long.
  std::string chain = R"({"$ref":"#/$defs/d0","$defs":{)";
  for (int i = 0; i < 100000; ++i) chain += (i ? "," : "") + ("\"d" + std::to_string(i)) + R"(":{"$ref":"#/$defs/d)" + std::to_string(i + 1) + "\"}";
  chain += R"(,"d100000":{"type":"string"}}})";
  EXPECT_NE(error_of(chain).find(": nested deeper than 64"), std::string::npos) << error_of(chain).substr(0, 300);
}

// ---- property tests ----

const char* kPropertySchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":20},
        "age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","format":"email"},
        "tags":{"type":"array","items":{"type":"string"},"maxItems":4},
        "address":{"type":"object","properties":{"street":{"type":"string"},"zip":{"type":"string","maxLength":5}},
                   "required":["street"],"additionalProperties":false},
        "score":{"type":"number","minimum":0},"active":{"type":"boolean"},
        "nickname":{"anyOf":[{"type":"string"},{"type":"null"}]}},
        "required":["name","age"],"additionalProperties":false})",
    R"({"$defs":{"Node":{"type":"object","properties":{"value":{"type":"integer"},
        "children":{"type":"array","items":{"$ref":"#/$defs/Node"}}},"required":["value"],"additionalProperties":false}},
        "$ref":"#/$defs/Node"})",
    R"({"type":"object","properties":{"kind":{"enum":["a","b",3,null,{"x":1}]},"when":{"type":"string","format":"date-time"},
        "id":{"type":"string","format":"uuid"},"day":{"type":"string","format":"date"},"t":{"type":"string","format":"time"},
        "pair":{"type":"array","prefixItems":[{"type":"integer","minimum":-50,"maximum":-3},{"type":"string"}],"minItems":1},
        "n":{"type":["integer","null"],"exclusiveMinimum":5,"exclusiveMaximum":1234},"c":{"const":"fixed"},
        "extra":{"type":"object","additionalProperties":{"type":"integer"}}},"required":["kind","pair"]})",
    R"({"allOf":[{"$ref":"#/$defs/Base"},{"type":"object","properties":{"b":{"type":"boolean"}},"required":["b"]}],
        "$defs":{"Base":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}}})",
    R"({"type":"array","items":{"type":"integer","minimum":-1000000000000,"maximum":99999},"minItems":2,"maxItems":6})",
    R"({"type":"object"})",
};

TEST(JsonSchemaProperty, RandomInstancesAcceptedAndCorruptionsCaught) {
  int n_docs = 0, n_corrupt = 0, n_still_valid = 0;
  for (const char* text : kPropertySchemas) {
    const ojson schema = ojson::parse(text);
    auto g = compile_schema(text);
    ASSERT_TRUE(g);
    testing::InstanceGenerator gen(schema, 1234);
    for (int i = 0; i < 60; ++i) {
      const ojson v = gen.generate(schema);
      ASSERT_TRUE(testing::validate(v, schema, schema)) << v.dump();
      const std::string doc = gen.serialize(v);
      Matcher m(g);
      for (size_t b = 0; b < doc.size(); ++b)
        ASSERT_TRUE(m.accept(doc.substr(b, 1))) << text << "\n  doc " << doc << "\n  rejected at byte " << b;
      ASSERT_TRUE(m.is_complete()) << doc;
      ++n_docs;
      for (int c = 0; c < 20; ++c) {
        std::string bad = doc;
        const size_t at = gen.pick(bad.size());
        const char byte = static_cast<char>(gen.pick(256));
        switch (gen.pick(3)) {
          case 0: bad[at] = byte; break;
          case 1: bad.erase(at, 1); break;
          default: bad.insert(at, 1, byte); break;
        }
        if (bad == doc) continue;
        ++n_corrupt;
        Matcher mc(g);
        if (!mc.accept(bad) || !mc.is_complete()) continue;
        // Accepted: then it must be a valid instance (e.g. a digit changed within range).
        ojson parsed;
        try {
          parsed = ojson::parse(bad);
        } catch (const nlohmann::json::out_of_range&) {  // valid JSON, a number beyond double
          ++n_still_valid;
          continue;
        } catch (const std::exception& e) {
          FAIL() << "accepted invalid JSON: " << bad << " (" << e.what() << ")";
        }
        ASSERT_TRUE(testing::validate(parsed, schema, schema)) << text << "\n  accepted invalid instance: " << bad;
        ++n_still_valid;
      }
    }
  }
  std::printf("[ property ] %d documents accepted; %d corruptions, %d of them still valid instances\n", n_docs,
              n_corrupt, n_still_valid);
}

}  // namespace
}  // namespace kiln::grammar
