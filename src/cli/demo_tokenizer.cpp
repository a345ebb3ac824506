#include "cli/demo_tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

// How the merges are chosen: a small BPE trainer (the textbook algorithm: repeatedly merge
// the most frequent adjacent pair) over an embedded list of common English words and code
// pieces, each weighted by a Zipf-like frequency from its rank. Words appear as the
// pre-tokenizer cuts them out of running text: "Ġthe" (after a space) at full weight, then
// "ĠThe" and "The" (sentence and line starts) at lower weights. Ties go to the pair of the
// lower ids, so the merges are the same on every run. When every corpus word has become a
// single token and more ids are wanted, the trainer is out of pairs; the rest are filled by
// appending one letter to the existing tokens in id order ("Ġthe" + "y" -> "Ġthey"): real
// tokens, just never frequent. The merges list is in creation order, which is priority order.
//
// The pre-tokenizer and decoder are Qwen2/Qwen3's (its split regex, then ByteLevel without
// its own regex); no normalizer. The added tokens and their flags are Qwen3's.

namespace kiln::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

// Frequency order, most common first (the rank sets the weight). Written for kiln.
constexpr std::string_view kWords = R"(
the of and to a in is that for it as was with be by on not he I this are or his from at
which but have an had they you were her she there been one all we their has would when if
so can no more out do said what up its about into than them only other new some could time
these two may then first any my now such like our over man me even most made after also did
many before must through back years where much your way well down should because each just
those people how too little state good very make world still own see men work long get here
between both life being under never day same another know while last might us great old year
off come since against go came right used take three states himself few house use during
without again place around however home small found thought went say part once general high
upon school every does got left number course war until always away something fact though
water less public put think almost hand enough far took head yet government system better set
told nothing night end why called eyes find going look asked later knew point next program
city business give group toward young days let room president side social given present
several order national possible rather second face per among form important often things
looked early white case become large big need four within felt along children saw best church
ever least power development light thing seemed family interest want members mind country
area others done turned although open service certain kind problem began different door thus
help sense means whole matter perhaps itself times law human line above name example action
company hands local show whether five history gave today either act feet across taken past
quite anything seen having death experience body word half really week field car words
already themselves information tell together college shall money period held keep sure real
probably free seems political cannot behind question air office making brought whose special
major heard problems federal became study ago moment available known result street economic
boy position reason change south board individual job society areas west close turn love
community true court force full seem wife age policy voice center woman common control
necessary front six girl clear further land able feel mother music party provide university
effect level stood military run short town total outside rate art class million north
everything private future students type plan usually situation sound fire tax idea strong
black third value especially nature evidence data model read process trying early hard began
language learning machine computer network memory speed text file files code function return
input output string number list key user users assistant message messages chat tool tools
call result error request response server client token tokens model models weights layer
layers attention training inference batch tensor matrix vector size length index array table
query search answer answers write writing written reading simple example examples test tests
method methods class object objects library build version update support version default
option options value values true false null none main print import include const void int
float double char bool auto struct public static self def elif else while break continue
yield async await lambda lang http https www com org json html web page link image video
the following below above step steps first second final note please thanks hello world
morning evening today tomorrow yesterday week month summer winter spring water food coffee
tea bread dinner lunch breakfast friend friends brother sister father son daughter children
story stories book books letter paper news report question questions answer problem solution
small large short long high low early late young old new good bad best worst better worse
happy sad easy difficult simple complex quick slow fast strong weak rich poor hot cold warm
blue green red yellow color colors light dark white black gray river mountain sea ocean
island forest tree trees flower flowers garden road bridge city cities village country
countries market price prices cost costs pay paid buy bought sell sold money bank account
doctor hospital health medical patient patients disease care science scientific research
energy power electric oil gas climate weather rain snow wind sun moon star stars earth space
planet animal animals dog dogs cat cats bird birds fish horse horses cow king queen prince
game games play played player players team teams ball win won lose lost score match season
eat ate drink walk walked run ran sit sat stand stood sleep slept speak spoke talk talked
listen heard hear watch watched read wrote send sent receive received open opened close
closed start started stop stopped begin ended finish finished create created delete deleted
change changed move moved turn turned try tried want wanted need needed like liked love loved
hope hoped believe believed understand understood remember remembered forget forgot learn
learned teach taught explain explained describe described show showed shown allow allowed
include included contain contains provide provided require required produce produced
increase increased reduce reduced improve improved develop developed support supported
consider considered continue continued follow followed appear appeared become remain
remained return returned report reported decide decided expect expected suggest suggested
quickly slowly carefully simply easily finally actually really usually already often
always never sometimes perhaps maybe certainly clearly probably especially together
instead across behind beyond inside outside without within whether although unless
because however therefore otherwise meanwhile nevertheless indeed rather quite almost
nothing everything something anything someone everyone anyone nobody somewhere everywhere
ability account action activity address addition advice agreement amount analysis animal
answer approach argument article aspect attempt audience author balance basis beauty behavior
benefit birth blood budget camera capital career century chance chapter character choice
citizen climate collection comment condition conference connection content context contract
control culture customer decision degree demand design detail difference direction director
discussion distance district economy education effort election element employee energy
environment equipment event evidence exchange experience expert factor failure feature
feeling figure finger focus foreign freedom function future growth guide habit heart
history image impact income industry influence instance instruction interest internet
investment issue journey judge knowledge leader length level limit location machine
manager marriage material meaning measure media member memory method middle minute mistake
moment movement nation network notice object opinion opportunity organization owner parent
pattern performance period person picture piece player pleasure population position
possibility practice pressure principle priority process product profession profit project
property purpose quality quantity range reality reason recipe record region relation
relationship religion resource response responsibility result revenue role safety sample
scene schedule section security selection sense series session shape signal skill society
software solution source speech standard statement strategy structure student subject
success suggestion summary surface system target task teacher technology temperature theory
thought topic tradition traffic truth unit variety version video view village vision voice
warning wealth weight window winner worker writer
)";

// Pieces of code and punctuation as the split regex cuts them out of text, spelled in the
// byte alphabet (Ġ is a space, Ċ a newline) and separated by spaces.
constexpr std::string_view kCodePieces = R"(
. , Ċ ĊĊ .Ċ .ĊĊ ,Ċ Ġ( ) ); ;Ċ () ): ):Ċ Ġ{Ċ }Ċ Ġ} Ġ= Ġ== Ġ" ", ". Ġ' '. ': : Ġ: ? ! Ġ- Ġ+
Ġ* Ġ/ Ġ< Ġ> Ġ[ ], ]) ]. Ġ# Ġ// Ġ-> Ġ=> Ġ!= Ġ<= Ġ>= Ġ+= Ġ&& Ġ|| :: -> Ġ... ... Ġ| ĠĠĠ
ĠĠĠĠĠĠĠ ĠĠĠĠĠĠĠĠĠĠĠ ĠĠ ĊĠĠĠ ĊĠĠĠĠĠĠĠ ("  ") ")Ċ "Ċ '
's 't 're 've 'm 'll 'd Ġdon Ġdoesn Ġdidn Ġisn Ġwasn Ġaren Ġcouldn Ġwouldn Ġshouldn
Ġhaven Ġwon Ġcan Ġ` `` ``` ```Ċ `, `. Ġ** ** Ġ_ __ Ġ$ Ġ% Ġ@ Ġ\ Ġ~ Ġ^ Ġ& Ġ;
)";

// GPT-2's bytes_to_unicode: the 188 printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves; the other 68 (controls, space, DEL, NBSP, soft hyphen) map to U+0100 onwards in
// byte order (space -> U+0120 'Ġ', newline -> U+010A 'Ċ'). ids 0..255 follow GPT-2's and
// Qwen's vocab.json: the printable bytes in byte order, then the remapped ones.
bool printable_byte(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

// UTF-8 of a code point of the byte alphabet (all below U+0144, so one or two bytes).
std::string utf8(uint32_t cp) {
  if (cp < 0x80) return std::string(1, char(cp));
  return {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
}

// byte -> its byte-level character (UTF-8), and the byte of each of the ids 0..255.
struct ByteAlphabet {
  std::array<std::string, 256> chars;
  std::array<uint8_t, 256> byte_of_id{};
};

ByteAlphabet byte_alphabet() {
  ByteAlphabet a;
  int id = 0, remapped = 0;
  for (int b = 0; b < 256; ++b)
    if (printable_byte(b)) {
      a.chars[b] = utf8(uint32_t(b));
      a.byte_of_id[id++] = uint8_t(b);
    }
  for (int b = 0; b < 256; ++b)
    if (!printable_byte(b)) {
      a.chars[b] = utf8(uint32_t(256 + remapped++));
      a.byte_of_id[id++] = uint8_t(b);
    }
  return a;
}

using Pair = std::pair<int32_t, int32_t>;

// A corpus entry: a pre-token as byte-level symbols (token ids), and how often it occurs.
struct TrainWord {
  std::vector<int32_t> symbols;
  int64_t weight = 0;
};

// The vocabulary under construction: token strings by id, and the merges that made them.
class BpeBuilder {
 public:
  BpeBuilder() {
    const ByteAlphabet alphabet = byte_alphabet();
    for (uint8_t b : alphabet.byte_of_id) add_token(alphabet.chars[b]);
  }

  // A pre-token spelled in the byte alphabet ("Ġthe"), as the ids of its characters.
  std::vector<int32_t> symbols_of(std::string_view byte_level) const {
    std::vector<int32_t> out;
    for (size_t i = 0; i < byte_level.size();) {
      const size_t n = uint8_t(byte_level[i]) < 0x80 ? 1 : 2;  // see utf8()
      out.push_back(ids_.at(std::string(byte_level.substr(i, n))));
      i += n;
    }
    return out;
  }

  void train(std::vector<TrainWord> words, size_t n_merges);
  void fill(size_t n_merges);

  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<Pair>& merges() const { return merges_; }

 private:
  // Adds tok if new; returns its id, or -1 if it already existed.
  int32_t add_token(const std::string& tok) {
    if (ids_.count(tok)) return -1;
    ids_.emplace(tok, int32_t(tokens_.size()));
    tokens_.push_back(tok);
    return int32_t(tokens_.size() - 1);
  }

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<Pair> merges_;
};

// Pair counts kept up to date as words change: count[p] = sum of weight * occurrences.
class PairCounts {
 public:
  explicit PairCounts(std::vector<TrainWord>& words) : words_(words) {
    for (size_t w = 0; w < words_.size(); ++w) update(w, +1);
  }

  // The most frequent pair (lowest ids on a tie); false when no pair is left.
  bool best(Pair* out) const {
    int64_t best_count = 0;
    for (const auto& [p, c] : counts_)
      if (c > best_count) {
        best_count = c;
        *out = p;
      }
    return best_count > 0;
  }

  // A pair whose merged string is already a token (reached by another split, e.g. "Ġt"+"he"
  // after "Ġth"+"e"): it is never merged, so every merge makes a new id.
  void ban(Pair p) {
    banned_.insert(p);
    counts_.erase(p);
  }

  // Replaces every occurrence of p by id in the words that hold it.
  void merge(Pair p, int32_t id) {
    std::vector<size_t> holders = std::move(where_[p]);
    where_.erase(p);
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    for (size_t w : holders) {
      update(w, -1);
      std::vector<int32_t>& s = words_[w].symbols;
      std::vector<int32_t> merged;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && Pair{s[i], s[i + 1]} == p) {
          merged.push_back(id);
          ++i;
        } else {
          merged.push_back(s[i]);
        }
      }
      s = std::move(merged);
      update(w, +1);
    }
  }

 private:
  void update(size_t w, int sign) {
    const std::vector<int32_t>& s = words_[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const Pair p{s[i], s[i + 1]};
      if (banned_.count(p)) continue;
      int64_t& c = counts_[p];
      c += sign * words_[w].weight;
      if (c == 0) counts_.erase(p);
      if (sign > 0) where_[p].push_back(w);
    }
  }

  std::vector<TrainWord>& words_;
  std::map<Pair, int64_t> counts_;  // ordered: the scan in best() breaks ties by id
  std::map<Pair, std::vector<size_t>> where_;
  std::set<Pair> banned_;
};

void BpeBuilder::train(std::vector<TrainWord> words, size_t n_merges) {
  PairCounts counts(words);
  Pair p;
  while (merges_.size() < n_merges && counts.best(&p)) {
    const int32_t id = add_token(tokens_[p.first] + tokens_[p.second]);
    if (id < 0) {
      counts.ban(p);
      continue;
    }
    merges_.push_back(p);
    counts.merge(p, id);
  }
}

void BpeBuilder::fill(size_t n_merges) {
  for (size_t left = 256; merges_.size() < n_merges && left < tokens_.size(); ++left)
    for (char c = 'a'; c <= 'z' && merges_.size() < n_merges; ++c) {
      const int32_t right = ids_.at(std::string(1, c));
      if (add_token(tokens_[left] + c) >= 0) merges_.push_back({int32_t(left), right});
    }
}

std::vector<std::string_view> split_ws(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\n')) ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\n') ++j;
    if (j > i) out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string capitalized(std::string_view w) {
  std::string s(w);
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = char(s[0] - 'a' + 'A');
  return s;
}

// The training corpus: every word in three spellings, every code piece once. Duplicates (a
// word listed twice, "I" capitalized) add up. Zipf weights: rank r weighs ~1/(r + 10).
std::vector<TrainWord> training_corpus(const BpeBuilder& b) {
  std::map<std::string, int64_t> weights;  // byte-level pre-token -> weight; ordered for determinism
  const std::vector<std::string_view> words = split_ws(kWords);
  for (size_t r = 0; r < words.size(); ++r) {
    const int64_t w = 1'000'000 / int64_t(r + 10);
    weights["Ġ" + std::string(words[r])] += w;            // mid-sentence: " the"
    weights["Ġ" + capitalized(words[r])] += w / 8;        // after ". ": " The"
    weights[capitalized(words[r])] += w / 16;             // at a line start: "The"
  }
  const std::vector<std::string_view> pieces = split_ws(kCodePieces);
  for (size_t r = 0; r < pieces.size(); ++r) weights[std::string(pieces[r])] += 200'000 / int64_t(r + 20);
  std::vector<TrainWord> corpus;
  for (const auto& [text, w] : weights) corpus.push_back({b.symbols_of(text), w});
  return corpus;
}

struct AddedToken {
  const char* content;
  bool special;
};

// Qwen3's ChatML tokens, in the id order the brief fixes: the last kDemoAddedTokens ids.
constexpr std::array<AddedToken, kDemoAddedTokens> kAdded = {{
    {"<|endoftext|>", true},
    {"<|im_start|>", true},
    {"<|im_end|>", true},
    {"<think>", false},
    {"</think>", false},
    {"<tool_call>", false},
    {"</tool_call>", false},
    {"<tool_response>", false},
    {"</tool_response>", false},
}};

// Qwen2/Qwen3's split: contractions, letters with one leading non-letter, single digits,
// punctuation runs with their newlines, newline runs, and spaces before a word kept with it.
constexpr const char* kSplitRegex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// ChatML in the Qwen3 layout, written for the demo (content is always a string here: the
// server flattens content parts before rendering).
constexpr const char* kChatTemplate = R"jinja({#- kiln demo model: ChatML, Qwen3 layout -#}
{%- set has_system = messages | length > 0 and messages[0].role == 'system' %}
{#- The system turn: the system message, then the tool list when tools are given. #}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if has_system %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif has_system %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- '<|im_start|>system\n' + message.content + '<|im_end|>\n' }}
        {%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- if message.reasoning_content %}
            {{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' }}
        {%- endif %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for call in message.tool_calls %}
                {%- set fn = call %}
                {%- if call.function %}
                    {%- set fn = call.function %}
                {%- endif %}
                {%- if message.content or not loop.first %}
                    {{- '\n' }}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
                {%- if fn.arguments is string %}
                    {{- fn.arguments }}
                {%- else %}
                    {{- fn.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {#- Consecutive tool results share one user turn. #}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
)jinja";

// use_regex false: the Split before it has already cut the words.
ordered_json byte_level() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

ordered_json added_token_json(const AddedToken& t, int64_t id) {
  ordered_json j;
  if (id >= 0) j["id"] = id;
  j["content"] = t.content;
  j["single_word"] = false;
  j["lstrip"] = false;
  j["rstrip"] = false;
  j["normalized"] = false;
  j["special"] = t.special;
  return j;
}

ordered_json tokenizer_json(const BpeBuilder& b, int64_t first_added) {
  ordered_json added = ordered_json::array();
  for (size_t i = 0; i < kAdded.size(); ++i) added.push_back(added_token_json(kAdded[i], first_added + int64_t(i)));
  // Appended to the object's vector directly: ordered_json's operator[] searches its keys
  // linearly, quadratic over a 200k-id vocabulary (30 s); the tokens are distinct already.
  ordered_json vocab = ordered_json::object();
  auto& entries = static_cast<ordered_json::object_t::Container&>(vocab.get_ref<ordered_json::object_t&>());
  entries.reserve(b.tokens().size());
  for (size_t id = 0; id < b.tokens().size(); ++id) entries.emplace_back(b.tokens()[id], id);
  ordered_json merges = ordered_json::array();
  for (const Pair& p : b.merges()) merges.push_back(ordered_json::array({b.tokens()[p.first], b.tokens()[p.second]}));
  ordered_json split = {{"type", "Split"},
                        {"pattern", {{"Regex", kSplitRegex}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level()}}}},
      {"post_processor", byte_level()},
      {"decoder", byte_level()},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                 {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                 {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}},
  };
}

// As transformers saves a Qwen2TokenizerFast: added_tokens_decoder keyed by id, no BOS.
ordered_json tokenizer_config_json(int64_t first_added) {
  ordered_json decoder = ordered_json::object();
  for (size_t i = 0; i < kAdded.size(); ++i)
    decoder[std::to_string(first_added + int64_t(i))] = added_token_json(kAdded[i], -1);
  return {
      {"add_bos_token", false},
      {"add_prefix_space", false},
      {"added_tokens_decoder", decoder},
      {"additional_special_tokens", {"<|im_start|>", "<|im_end|>"}},
      {"bos_token", nullptr},
      {"chat_template", kChatTemplate},
      {"clean_up_tokenization_spaces", false},
      {"eos_token", "<|im_end|>"},
      {"errors", "replace"},
      {"model_max_length", 4096},
      {"pad_token", "<|endoftext|>"},
      {"split_special_tokens", false},
      {"tokenizer_class", "Qwen2Tokenizer"},
      {"unk_token", nullptr},
  };
}

// Writes to a temporary and renames, so a reader never sees half a file.
Status write_file(const std::string& path, const std::string& text) {
  {
    std::ofstream f(path + ".tmp", std::ios::binary);
    f << text;
    if (!f) return internal_error("cannot write " + path);
  }
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
  if (ec) return internal_error("cannot write " + path + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

DemoSpecialIds demo_special_ids(int64_t vocab_size) {
  const auto first = int32_t(vocab_size - kDemoAddedTokens);
  return {.endoftext = first, .im_start = first + 1, .im_end = first + 2};
}

Status write_demo_tokenizer(const std::string& dir, int64_t vocab_size) {
  if (vocab_size < kDemoMinVocab || vocab_size > kDemoMaxVocab) {
    return invalid_argument("demo tokenizer: vocab_size must be in [" + std::to_string(kDemoMinVocab) + ", " +
                            std::to_string(kDemoMaxVocab) + "] (256 bytes + " + std::to_string(kDemoAddedTokens) +
                            " added tokens + at least " + std::to_string(kDemoMinMerges) + " merges), got " +
                            std::to_string(vocab_size));
  }
  const int64_t first_added = vocab_size - kDemoAddedTokens;
  const auto n_merges = size_t(first_added - 256);
  BpeBuilder b;
  b.train(training_corpus(b), n_merges);
  b.fill(n_merges);
  if (b.merges().size() != n_merges)  // fill() appends letters without bound; cannot run dry
    return internal_error("demo tokenizer: made " + std::to_string(b.merges().size()) + " merges, wanted " +
                          std::to_string(n_merges));
  KILN_RETURN_IF_ERROR(write_file(dir + "/tokenizer.json", tokenizer_json(b, first_added).dump(2) + "\n"));
  return write_file(dir + "/tokenizer_config.json", tokenizer_config_json(first_added).dump(2) + "\n");
}

}  // namespace kiln::cli
