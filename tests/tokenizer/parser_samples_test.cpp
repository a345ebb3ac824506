// The output parsers against tests/data/parsers/samples_*.json, and the streaming
// property: whatever the split of a sample into deltas (every byte split point, byte by
// byte, random multi-splits, token-like chunks, and every truncation), the concatenated
// events equal the one-shot parse. Each sample file: {"format", "options", "samples":
// [{"name", "text", "content", "reasoning", "tool_calls": [{"id", "name", "arguments"}],
// "options"?}]}; a sample's "options" replaces the file's.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "core/check.h"
#include "tokenizer/parser_output.h"

namespace kiln::tokenizer {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

struct Sample {
  std::string file;
  std::string name;
  ToolFormat format = ToolFormat::kNone;
  ParserOptions options;
  std::string text;
  ParsedOutput expected;
};

ParserOptions options_from_json(const Json& j) {
  ParserOptions o;
  if (j.contains("reasoning")) {
    const Json& r = j["reasoning"];
    o.reasoning.enabled = r.value("enabled", false);
    o.reasoning.starts_in_reasoning = r.value("starts_in_reasoning", false);
    o.reasoning.unclosed = r.value("unclosed", "reasoning") == "content"
                               ? UnclosedReasoning::kContent
                               : UnclosedReasoning::kReasoning;
  }
  if (j.contains("tools")) o.tools = j["tools"];
  if (j.contains("tool_call_id_prefix")) o.tool_call_id_prefix = j["tool_call_id_prefix"];
  return o;
}

const std::vector<Sample>& samples() {
  static const std::vector<Sample> all = [] {
    std::vector<Sample> out;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(fs::path(KILN_TEST_DATA) / "parsers"))
      if (e.path().filename().string().starts_with("samples_")) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& path : files) {
      std::ifstream in(path);
      Json doc = Json::parse(in);
      Result<ToolFormat> format = parse_tool_format(doc["format"].get<std::string>());
      KILN_CHECK(format.ok()) << format.status().to_string();
      for (const Json& s : doc["samples"]) {
        Sample sample{
            .file = path.filename().string(),
            .name = s["name"],
            .format = *format,
            .options = options_from_json(s.contains("options") ? s["options"] : doc["options"]),
            .text = s["text"]};
        sample.expected.content = s["content"];
        sample.expected.reasoning = s["reasoning"];
        for (const Json& c : s["tool_calls"])
          sample.expected.tool_calls.push_back(
              {.id = c["id"], .name = c["name"], .arguments_json = c["arguments"]});
        out.push_back(std::move(sample));
      }
    }
    return out;
  }();
  return all;
}

std::string describe(const ParsedOutput& p) {
  std::ostringstream os;
  auto quoted = [](const std::string& t) {
    return Json(t).dump(-1, ' ', false, Json::error_handler_t::replace);
  };
  os << "content=" << quoted(p.content) << " reasoning=" << quoted(p.reasoning);
  for (const ToolCall& c : p.tool_calls)
    os << " call{" << c.id << ", " << c.name << ", " << c.arguments_json << "}";
  return os.str();
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// Feeds `chunks` and checks the events on the way: text events are non-empty and, when the
// input is valid UTF-8, whole UTF-8 (a cut never splits a character across events); each
// call is Begin, Args, End (apply_event aborts on a call out of order).
ParsedOutput run(const Sample& s, const std::vector<std::string_view>& chunks) {
  auto parser = make_output_parser(s.format, s.options);
  std::vector<ParseEvent> events;
  std::string input;
  for (std::string_view c : chunks) {
    parser->feed(c, events);
    input += c;
  }
  parser->finish(events);
  bool check_utf8 = valid_utf8(input);
  ParsedOutput out;
  for (const ParseEvent& e : events) {
    if (e.kind == ParseEventKind::kContent || e.kind == ParseEventKind::kReasoning) {
      EXPECT_FALSE(e.text.empty());
      if (check_utf8) {
        EXPECT_TRUE(valid_utf8(e.text)) << s.name;
      }
    }
    apply_event(e, out);
  }
  return out;
}

std::vector<std::string_view> split_at(std::string_view text, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::string_view> out;
  size_t prev = 0;
  for (size_t c : cuts) {
    out.push_back(text.substr(prev, c - prev));
    prev = c;
  }
  out.push_back(text.substr(prev));
  return out;
}

// Roughly what a tokenizer yields: special tokens whole, words with their leading space.
std::vector<std::string_view> token_like(std::string_view text) {
  static const std::vector<std::string_view> kTags = {"<think>",      "</think>",    "<tool_call>",
                                                      "</tool_call>", "<arg_key>",   "</arg_key>",
                                                      "<arg_value>",  "</arg_value>"};
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = std::string_view::npos;
    if (text.substr(i).starts_with("<|")) {
      size_t close = text.find("|>", i + 2);
      if (close != std::string_view::npos) end = close + 2;
    } else if (text.substr(i).starts_with("<｜")) {
      size_t close = text.find("｜>", i);
      if (close != std::string_view::npos) end = close + std::string_view("｜>").size();
    } else {
      for (std::string_view tag : kTags)
        if (text.substr(i).starts_with(tag)) end = i + tag.size();
    }
    if (end == std::string_view::npos) {
      end = text.find_first_of(" \n<", i + 1);
      if (end == std::string_view::npos) end = text.size();
    }
    out.push_back(text.substr(i, end - i));
    i = end;
  }
  return out;
}

#define EXPECT_SAME_OUTPUT(actual, expected, how) \
  EXPECT_EQ(describe(actual), describe(expected)) << s.file << " / " << s.name << " / " << how

TEST(ParserSamples, EnoughSamplesPerFormat) {
  std::map<std::string, int> per_file;
  for (const Sample& s : samples()) ++per_file[s.file];
  EXPECT_EQ(per_file.size(), 7u);
  for (const auto& [file, n] : per_file) EXPECT_GE(n, 10) << file;
}

TEST(ParserSamples, OneShotMatchesExpected) {
  for (const Sample& s : samples())
    EXPECT_SAME_OUTPUT(parse_all(s.format, s.options, s.text), s.expected, "one-shot");
}

TEST(ParserProperty, EverySplitPointMatchesOneShot) {
  for (const Sample& s : samples()) {
    ParsedOutput whole = parse_all(s.format, s.options, s.text);
    for (size_t cut = 0; cut <= s.text.size(); ++cut)
      EXPECT_SAME_OUTPUT(run(s, split_at(s.text, {cut})), whole, "split at " << cut);
  }
}

TEST(ParserProperty, ByteByByteMatchesOneShot) {
  for (const Sample& s : samples()) {
    std::vector<std::string_view> bytes;
    for (size_t i = 0; i < s.text.size(); ++i)
      bytes.push_back(std::string_view(s.text).substr(i, 1));
    EXPECT_SAME_OUTPUT(run(s, bytes), parse_all(s.format, s.options, s.text), "byte by byte");
  }
}

TEST(ParserProperty, RandomMultiSplitsMatchOneShot) {
  std::mt19937 rng(20250805);
  for (const Sample& s : samples()) {
    ParsedOutput whole = parse_all(s.format, s.options, s.text);
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<size_t> cuts(1 + rng() % 12);
      for (size_t& c : cuts) c = s.text.empty() ? 0 : rng() % (s.text.size() + 1);
      EXPECT_SAME_OUTPUT(run(s, split_at(s.text, cuts)), whole, "random trial " << trial);
    }
  }
}

TEST(ParserProperty, TokenLikeChunksMatchOneShot) {
  for (const Sample& s : samples())
    EXPECT_SAME_OUTPUT(run(s, token_like(s.text)), parse_all(s.format, s.options, s.text),
                       "token-like");
}

// A generation can stop anywhere (max_tokens, a stop string): every prefix of every
// sample, streamed as tokens and split in two, parses as its one-shot parse does.
TEST(ParserProperty, EveryTruncationStreamsLikeOneShot) {
  for (const Sample& s : samples()) {
    for (size_t len = 0; len <= s.text.size(); ++len) {
      std::string_view prefix = std::string_view(s.text).substr(0, len);
      ParsedOutput whole = parse_all(s.format, s.options, prefix);
      EXPECT_SAME_OUTPUT(run(s, token_like(prefix)), whole,
                         "truncated at " << len << ", token-like");
      EXPECT_SAME_OUTPUT(run(s, split_at(prefix, {len / 2})), whole,
                         "truncated at " << len << ", halves");
    }
  }
}

}  // namespace
}  // namespace kiln::tokenizer
