#include "cli/tokenize_commands.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/json_bounded.h"
#include "tokenizer/tokenizer.h"

namespace kiln::cli {
namespace {

using json = nlohmann::json;

int fail(std::ostream& err, const Status& s) {
  err << "kiln: error: " << s.to_string() << "\n";
  return 1;
}

Result<tokenizer::Tokenizer> open_tokenizer(const std::string& model) {
  if (model.empty()) return invalid_argument("--model is required (a directory with tokenizer.json)");
  return tokenizer::Tokenizer::load(model);
}

// "1,2,3" (spaces around ids allowed) -> ids; every id must be in [0, vocab_size).
Result<std::vector<int32_t>> parse_ids(const std::string& s, int32_t vocab_size) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    const std::string t = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    char* end = nullptr;
    errno = 0;
    const long long v = t.empty() ? -1 : std::strtoll(t.c_str(), &end, 10);
    if (t.empty() || errno != 0 || *end != '\0' || v < 0) {
      return invalid_argument("--ids: \"" + item + "\" is not a token id (expected e.g. 1,2,3)");
    }
    if (v >= vocab_size) {
      return invalid_argument("--ids: " + t + " is outside the vocabulary (size " +
                              std::to_string(vocab_size) + ")");
    }
    ids.push_back(int32_t(v));
  }
  return ids;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

int run_tokenize(const TokenizeOptions& o, std::ostream& out, std::ostream& err) {
  if (o.has_text == !o.file.empty()) {
    return fail(err, invalid_argument("tokenize needs exactly one of --text and --file"));
  }
  auto tok = open_tokenizer(o.model);
  if (!tok.ok()) return fail(err, tok.status());
  const bool special = !o.no_special;
  if (o.has_text) {
    out << dump(tok->encode(o.text, special)) << "\n";
    return 0;
  }
  std::ifstream f(o.file, std::ios::binary);
  if (!f) return fail(err, not_found(o.file + ": cannot open"));
  std::string result, line;
  for (size_t n = 1; std::getline(f, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const json j = parse_json_bounded<json>(line);
    if (!j.is_string()) {
      return fail(err, invalid_argument(o.file + ":" + std::to_string(n) +
                                        ": expected one JSON string per line"));
    }
    result += dump(tok->encode(j.get_ref<const std::string&>(), special));
    result += "\n";
  }
  out << result;  // all or nothing: no partial output before an error
  return 0;
}

int run_detokenize(const DetokenizeOptions& o, std::ostream& out, std::ostream& err) {
  auto tok = open_tokenizer(o.model);
  if (!tok.ok()) return fail(err, tok.status());
  auto ids = parse_ids(o.ids, tok->vocab_size());
  if (!ids.ok()) return fail(err, ids.status());
  out << dump(tok->decode(*ids, o.skip_special)) << "\n";
  return 0;
}

void add_tokenize_commands(CLI::App& app,
                           std::vector<std::pair<CLI::App*, std::function<int()>>>& commands) {
  auto t = std::make_shared<TokenizeOptions>();
  CLI::App* tokenize =
      app.add_subcommand("tokenize", "print the token ids of a text (tokenizer.json) as JSON");
  tokenize->add_option("--model", t->model,
                       "directory with tokenizer.json (+ tokenizer_config.json)");
  CLI::Option* text = tokenize->add_option("--text", t->text, "the text to encode");
  tokenize->add_option("--file", t->file, "a file with one JSON string per line");
  tokenize->add_flag("--no-special", t->no_special, "do not add the post-processor's special tokens");
  commands.emplace_back(tokenize, [t, text] {
    t->has_text = text->count() > 0;
    return run_tokenize(*t, std::cout, std::cerr);
  });

  auto d = std::make_shared<DetokenizeOptions>();
  CLI::App* detokenize =
      app.add_subcommand("detokenize", "print the text of token ids as a JSON string");
  detokenize->add_option("--model", d->model,
                         "directory with tokenizer.json (+ tokenizer_config.json)");
  detokenize->add_option("--ids", d->ids, "token ids, comma separated, e.g. 1,2,3")->required();
  detokenize->add_flag("--skip-special", d->skip_special, "leave special tokens out of the text");
  commands.emplace_back(detokenize, [d] { return run_detokenize(*d, std::cout, std::cerr); });
}

}  // namespace kiln::cli
