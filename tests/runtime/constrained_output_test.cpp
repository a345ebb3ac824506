// Structured output in the engine (Request::constraint): the built-in demo model, its own
// tokenizer's token bytes and a JSON schema compiled by src/grammar, sampled at temperature
// 1 over several seeds with n = 2 beside unconstrained requests. Every constrained sample is
// a document of the schema (parsed and checked field by field here, not by the grammar
// engine), ends with finish reason kGrammar, and the unconstrained requests give what they
// give alone.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine_test_util.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "runtime/speculative.h"
#include "tokenizer/tokenizer.h"

namespace kiln::runtime {
namespace {

using nlohmann::ordered_json;

const char* const kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "age", "tags", "ok"],
  "additionalProperties": false
})";

std::shared_ptr<const OutputConstraint> constraint_for(const tokenizer::Tokenizer& tok, const ordered_json& schema) {
  auto g = grammar::json_schema_to_grammar(schema);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return nullptr;
  auto compiled = grammar::CompiledGrammar::compile(*g);
  EXPECT_TRUE(compiled.ok()) << compiled.status().to_string();
  if (!compiled.ok()) return nullptr;
  auto bytes = std::make_shared<std::vector<std::string>>();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) bytes->push_back(tok.token_bytes(id).value_or(""));
  auto c = std::make_shared<OutputConstraint>();
  c->grammar = std::move(compiled).value();
  c->masker = std::make_shared<grammar::TokenMasker>(*bytes, std::nullopt);
  c->token_bytes = std::move(bytes);
  return c;
}

// A fixture's tokenizer and the constraint of kSchema over its vocabulary.
struct SchemaFixture {
  std::optional<tokenizer::Tokenizer> tok;
  std::shared_ptr<const OutputConstraint> constraint;
};
SchemaFixture schema_fixture(const std::string& name) {
  auto tok = tokenizer::Tokenizer::load(testing::fixture_dir(name));
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  if (!tok.ok()) return {};
  SchemaFixture f{.tok = std::move(tok).value()};
  f.constraint = constraint_for(*f.tok, ordered_json::parse(kSchema));
  return f;
}

// The schema above, checked by hand on the parsed document.
void expect_document(const std::string& text, const std::string& what) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << what << ": not JSON: " << text;
  ASSERT_TRUE(j.is_object()) << what << ": " << text;
  EXPECT_EQ(j.size(), 4u) << what << ": " << text;
  ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << what << ": " << text;
  // maxLength counts characters: the demo vocabulary's bytes decode as UTF-8 here.
  size_t chars = 0;
  for (unsigned char c : j["name"].get<std::string>()) chars += (c & 0xC0) != 0x80;
  EXPECT_LE(chars, 12u) << what << ": " << text;
  ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << what << ": " << text;
  EXPECT_GE(j["age"].get<int64_t>(), 0) << what;
  EXPECT_LE(j["age"].get<int64_t>(), 120) << what;
  ASSERT_TRUE(j.contains("tags") && j["tags"].is_array()) << what << ": " << text;
  EXPECT_LE(j["tags"].size(), 3u) << what;
  for (const auto& t : j["tags"])
    EXPECT_TRUE(t == "red" || t == "green" || t == "blue") << what << ": tag " << t.dump();
  EXPECT_TRUE(j.contains("ok") && j["ok"].is_boolean()) << what << ": " << text;
}

TEST(ConstrainedOutput, EverySampleIsADocumentOfTheSchemaAndTheOthersAreUnchanged) {
  const std::string dir = testing::fixture_dir("kiln_demo");
  auto tok = tokenizer::Tokenizer::load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const auto constraint = constraint_for(*tok, ordered_json::parse(kSchema));
  ASSERT_NE(constraint, nullptr);
  const EngineOptions options{.block_size = 16, .max_model_len = 512, .max_num_seqs = 16};
  auto engine = test::load_engine(dir, options);
  ASSERT_NE(engine, nullptr);

  const std::vector<int32_t> prompt = tok->encode("A person, as JSON:", true);
  std::vector<Request> requests;
  for (uint64_t seed = 10; seed <= 40; seed += 10) {  // sample i seeds with seed + i: 8 distinct
    Request r{.prompt = prompt, .sampling = {.temperature = 1.0f, .seed = seed}, .max_tokens = 200, .n = 2};
    r.constraint = constraint;
    requests.push_back(r);
  }
  const Request free_text{.prompt = prompt, .sampling = {.temperature = 1.0f, .seed = 99}, .max_tokens = 40};
  requests.push_back(free_text);
  const test::Outputs together = test::run_together(*engine, requests);

  int documents = 0;
  for (const auto& [key, out] : together) {
    if (key.first == requests.size() - 1) continue;  // the free-text request
    const std::string what = "request " + std::to_string(key.first) + " sample " + std::to_string(key.second);
    EXPECT_EQ(out.finish, FinishReason::kGrammar) << what;
    const std::string text = tok->decode(out.tokens);
    expect_document(text, what);
    std::printf("%s: %s (%zu tokens)\n", what.c_str(), text.c_str(), out.tokens.size());
    ++documents;
  }
  EXPECT_EQ(documents, 8);

  // The unconstrained request beside them is what it is alone (the determinism contract).
  const test::Outputs alone = test::run_together(*engine, {free_text}, 100);
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone.begin()->second.tokens, together.at({requests.size() - 1, 0}).tokens);
}

// A schema whose output may go on after it is complete (a bare integer: more digits may
// follow) ends at the model's end-of-sequence id, allowed only once the output is complete
// (or at kGrammar after "0", or kLength); with max_tokens short of a document the finish
// is kLength.
TEST(ConstrainedOutput, EndsAtEosWhereTheDocumentMayGoOnAndAtLengthWhenCut) {
  const std::string dir = testing::fixture_dir("kiln_demo");
  auto tok = tokenizer::Tokenizer::load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto engine = test::load_engine(dir, {.block_size = 16, .max_model_len = 512, .max_num_seqs = 8});
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> prompt = tok->encode("A number:", true);
  const auto integer = constraint_for(*tok, ordered_json::parse(R"({"type": "integer", "minimum": 0})"));
  const auto object = constraint_for(*tok, ordered_json::parse(kSchema));
  ASSERT_TRUE(integer && object);
  std::vector<Request> requests;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    Request r{.prompt = prompt, .sampling = {.temperature = 1.0f, .seed = seed}, .max_tokens = 64};
    r.constraint = integer;
    requests.push_back(r);
  }
  Request cut{.prompt = prompt, .sampling = {.temperature = 1.0f, .seed = 7}, .max_tokens = 3};
  cut.constraint = object;
  requests.push_back(cut);
  const test::Outputs out = test::run_together(*engine, requests);
  for (uint64_t i = 0; i < 3; ++i) {
    const test::SampleOut& s = out.at({i, 0});
    std::vector<int32_t> digits = s.tokens;
    if (s.finish == FinishReason::kEos) digits.pop_back();  // the end id is not text
    const std::string text = tok->decode(digits);
    // kGrammar only for "0", the one integer >= 0 that nothing may follow.
    if (s.finish == FinishReason::kGrammar) {
      EXPECT_EQ(text, "0") << "request " << i;
    } else if (s.finish != FinishReason::kEos) {
      EXPECT_EQ(s.finish, FinishReason::kLength) << "request " << i;
    }
    ASSERT_FALSE(text.empty()) << "request " << i;
    EXPECT_TRUE(std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
        << "request " << i << ": " << text;
    EXPECT_TRUE(text == "0" || text[0] != '0') << "request " << i << ": a leading zero in " << text;
  }
  const test::SampleOut& c = out.at({3, 0});
  EXPECT_EQ(c.finish, FinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), 3u);
  EXPECT_EQ(tok->decode(c.tokens).rfind("{\"", 0), 0u) << "a cut document starts as the schema's: "
                                                      << tok->decode(c.tokens);
}

// Preempted constrained sequences (a KV cache with room for about two of them) are
// recomputed from their tokens with their matchers where they stood: the same documents,
// token for token, as with a cache that never preempts, with and without prefix caching.
TEST(ConstrainedOutput, PreemptionKeepsTheMatcherAndTheOutputs) {
  const std::string dir = testing::fixture_dir("kiln_demo");
  const SchemaFixture f = schema_fixture("kiln_demo");
  ASSERT_NE(f.constraint, nullptr);
  const auto& tok = f.tok;
  const auto& constraint = f.constraint;
  const std::vector<int32_t> prompt = tok->encode("A person, as JSON:", true);
  std::vector<Request> requests;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    Request r{.prompt = prompt, .sampling = {.temperature = 1.0f, .seed = seed}, .max_tokens = 120};
    r.constraint = constraint;
    requests.push_back(r);
  }
  auto big = test::load_engine(dir, {.block_size = 16, .max_model_len = 256, .max_num_seqs = 8});
  ASSERT_NE(big, nullptr);
  const test::Outputs want = test::run_together(*big, requests);
  EXPECT_EQ(big->stats().preemptions, 0);
  const int64_t bytes_token = big->kv_cache_bytes() / big->kv_capacity_tokens();
  for (bool caching : {true, false}) {
    auto small = test::load_engine(dir, {.block_size = 16, .max_model_len = 256, .max_num_seqs = 8,
                                         .enable_prefix_caching = caching, .kv_cache_bytes = bytes_token * 256});
    ASSERT_NE(small, nullptr);
    const test::Outputs got = test::run_together(*small, requests);
    EXPECT_GT(small->stats().preemptions, 0) << "caching " << caching;
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [key, out] : want) {
      EXPECT_EQ(got.at(key).tokens, out.tokens) << "request " << key.first << ", caching " << caching;
      expect_document(tok->decode(got.at(key).tokens), "preempted request " + std::to_string(key.first));
    }
  }
}

// The masks the engine computes on worker threads (token_masks: each sampler with its own
// mask cache) equal the masker's uncached masks, row by row, along eight documents at once
// (samplers at different depths of the same grammar, one unconstrained row between them).
TEST(ConstrainedOutput, MasksOnWorkerThreadsEqualTheUncachedMasks) {
  auto tok = tokenizer::Tokenizer::load(testing::fixture_dir("kiln_demo"));
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const auto constraint = constraint_for(*tok, ordered_json::parse(kSchema));
  ASSERT_NE(constraint, nullptr);
  const std::vector<std::string> docs = {
      R"({"name": "Ann", "age": 31, "tags": ["red"], "ok": true})",
      R"({"name":"Bob Stone","age":7,"tags":[],"ok":false})",
      R"({"name": "\u00e9 \"x\"", "age": 120, "tags": ["blue", "green", "red"], "ok": true})",
      R"({"name": "", "age": 0, "tags": ["green"], "ok": false})"};
  std::vector<std::vector<int32_t>> tokens;
  for (int k = 0; k < 8; ++k) tokens.push_back(tok->encode(docs[size_t(k) % docs.size()], false));
  std::vector<Sampler> samplers;
  for (int k = 0; k < 9; ++k) samplers.emplace_back(SamplingParams{.temperature = 1.0f});
  for (int k = 0; k < 8; ++k) samplers[size_t(k < 4 ? k : k + 1)].constrain(constraint, {});  // row 4 free
  std::vector<Sampler*> rows;
  for (Sampler& s : samplers) rows.push_back(&s);
  const int64_t vocab = tok->vocab_size();
  const size_t words = size_t(ops::token_mask_words(vocab));
  std::vector<grammar::Matcher> shadow(8, grammar::Matcher(constraint->grammar));
  for (size_t step = 0;; ++step) {
    const std::vector<uint32_t> masks = token_masks(rows, vocab, /*max_threads=*/4);
    ASSERT_EQ(masks.size(), rows.size() * words);
    EXPECT_TRUE(std::all_of(masks.begin() + long(4 * words), masks.begin() + long(5 * words),
                            [](uint32_t w) { return w == ~0u; }))
        << "the unconstrained row is all ones";
    bool any = false;
    for (int k = 0; k < 8; ++k) {
      const size_t row = size_t(k < 4 ? k : k + 1);
      if (step >= tokens[size_t(k)].size()) continue;  // done (a finished sampler allows its end ids)
      std::vector<uint32_t> want(words, 0u);
      constraint->masker->fill_mask(shadow[size_t(k)], want.data());
      ASSERT_TRUE(std::equal(want.begin(), want.end(), masks.begin() + long(row * words))) << "doc " << k << " step " << step;
      const int32_t t = tokens[size_t(k)][step];
      EXPECT_TRUE(ops::token_allowed(std::span<const uint32_t>(want), t)) << "doc " << k << " step " << step;
      samplers[row].observe_generated(t);
      ASSERT_TRUE(shadow[size_t(k)].accept((*constraint->token_bytes)[size_t(t)])) << "doc " << k << " step " << step;
      any = true;
    }
    if (!any) break;
  }
}

}  // namespace
}  // namespace kiln::runtime

namespace kiln::runtime {
namespace {

// `requests` run together on an engine with options `o` (speculative drafts): every
// output the same as in `want` (tokens, logprobs, finish reason). Its outputs and stats.
std::pair<test::Outputs, EngineStats> same_outputs_with(const std::string& dir, const EngineOptions& o,
                                                        const std::vector<Request>& requests, const test::Outputs& want,
                                                        const std::string& what) {
  auto spec = test::load_engine(dir, o);
  EXPECT_NE(spec, nullptr) << what;
  if (spec == nullptr) return {};
  test::Outputs got = test::run_together(*spec, requests);
  EXPECT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, w] : want) {
    const std::string at = "request " + std::to_string(key.first) + " sample " + std::to_string(key.second) + what;
    if (!got.contains(key)) {
      ADD_FAILURE() << at << ": no output";
      continue;
    }
    EXPECT_EQ(got.at(key).tokens, w.tokens) << at;
    EXPECT_EQ(got.at(key).logprobs, w.logprobs) << at;
    EXPECT_EQ(got.at(key).finish, w.finish) << at;
  }
  return {std::move(got), spec->stats()};
}

// Speculative decoding of constrained sequences: n-gram drafts cut where the grammar
// stops taking them, each verify row masked as decoding would mask it (the matcher
// advanced over the drafts before it), and the matcher advanced only by the tokens that
// stand. A schema that repeats (three records of the same keys) gives the demo model's
// drafts something to find. Greedy and sampled (n = 2), fixed and adaptive depth: the
// documents equal those without speculation token for token, drafts were both accepted
// and rejected, every block is free at the end.
TEST(ConstrainedOutput, SpeculativeDraftsGiveTheSameDocuments) {
  const std::string dir = testing::fixture_dir("kiln_demo");
  auto tok = tokenizer::Tokenizer::load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const ordered_json record = ordered_json::parse(kSchema);
  const auto constraint = constraint_for(
      *tok, ordered_json{{"type", "array"}, {"items", record}, {"minItems", 3}, {"maxItems", 3}});
  ASSERT_NE(constraint, nullptr);
  const std::vector<int32_t> prompt = tok->encode("Three people, as JSON:", true);
  std::vector<Request> requests;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Request r{.prompt = prompt, .sampling = {.temperature = seed <= 2 ? 0.0f : 0.7f, .seed = seed, .logprobs = 1},
              .max_tokens = 240, .n = seed == 4 ? 2 : 1};
    r.constraint = constraint;
    requests.push_back(r);
  }
  requests.push_back({.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 30});  // unconstrained
  const EngineOptions base{.block_size = 16, .max_model_len = 512, .max_num_seqs = 8};
  auto plain = test::load_engine(dir, base);
  ASSERT_NE(plain, nullptr);
  const test::Outputs want = test::run_together(*plain, requests);
  for (bool adaptive : {false, true}) {
    EngineOptions o = base;
    o.speculative_method = SpeculativeMethod::kNgram;
    o.num_speculative_tokens = 3;
    o.speculative_adaptive = adaptive;
    const std::string what = adaptive ? ", adaptive" : ", fixed depth";
    const auto [got, s] = same_outputs_with(dir, o, requests, want, what);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [key, out] : got) {  // the constrained requests' documents
      if (key.first + 1 >= requests.size()) continue;
      const std::string text = tok->decode(out.tokens);
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(j.is_array() && j.size() == 3) << "request " << key.first << what << ": " << text;
      for (const auto& item : j) expect_document(item.dump(), "request " + std::to_string(key.first) + what);
    }
    std::printf("constrained drafts (%s): %lld of %lld accepted in %lld verifications\n",
                adaptive ? "adaptive" : "fixed depth 3", (long long)s.spec_accepted_tokens,
                (long long)s.spec_draft_tokens, (long long)s.spec_verified_seqs);
    EXPECT_EQ(s.kv_blocks_used, 0);
    if (!adaptive) {  // adaptive depth may learn that drafts do not pay on this machine
      EXPECT_GT(s.spec_accepted_tokens, 0);
      EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);
    }
  }
}

// MTP drafts stay in the backend's memory until the next verify step has read them there;
// a grammar needs their values before (to cut them where it stops taking them), so
// constrained sequences fetch them first. Constrained and unconstrained requests in one
// batch with MTP drafts (the MTP demo model, K = 3): the outputs of decoding without them.
TEST(ConstrainedOutput, MtpDraftsGiveTheSameDocuments) {
  const std::string dir = testing::fixture_dir("kiln_mtp_demo");
  const SchemaFixture f = schema_fixture("kiln_mtp_demo");
  ASSERT_NE(f.constraint, nullptr);
  const std::vector<int32_t> prompt = f.tok->encode("A person, as JSON:", true);
  std::vector<Request> requests;  // even ids constrained, odd ones not
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    requests.push_back({.prompt = prompt, .sampling = {.temperature = seed == 1 ? 0.0f : 0.7f, .seed = seed, .logprobs = 1},
                        .max_tokens = 120, .constraint = f.constraint});
    requests.push_back({.prompt = prompt, .sampling = {.temperature = 0.0f, .seed = seed}, .max_tokens = 60 + 10 * int32_t(seed),
                        .ignore_eos = true});  // unconstrained
  }
  const EngineOptions base{.block_size = 16, .max_model_len = 512, .max_num_seqs = 8};
  auto plain = test::load_engine(dir, base);
  ASSERT_NE(plain, nullptr);
  const test::Outputs want = test::run_together(*plain, requests);
  EngineOptions o = base;
  o.speculative_method = SpeculativeMethod::kMtp;
  o.num_speculative_tokens = 3;
  o.speculative_adaptive = false;
  const auto [got, s] = same_outputs_with(dir, o, requests, want, "");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, out] : got)  // even ids constrained
    if (key.first % 2 == 0) expect_document(f.tok->decode(out.tokens), "request " + std::to_string(key.first));
  std::printf("constrained and unconstrained MTP drafts: %lld of %lld accepted in %lld verifications\n",
              (long long)s.spec_accepted_tokens, (long long)s.spec_draft_tokens, (long long)s.spec_verified_seqs);
  EXPECT_GT(s.spec_accepted_tokens, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

}  // namespace
}  // namespace kiln::runtime
