// Deterministic test corpus for the tokenizer oracle (tests/tokenizer/tokenizer_peers_test.cpp).
// makeCorpus(seed, addedTokens) returns the same strings on every run: a shared part (prose,
// code, scripts, emoji, numbers, whitespace, look-alikes of special tokens, long words) and a
// part built from the tokenizer's own added tokens. Only characters of Unicode <= 13 are used
// so that every engine's tables (PCRE2 10.42, Oniguruma, ICU) agree on their classes.

export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = (
  "the of and to in is was he for it with as his on be at by had are but from or have an they " +
  "which one you were all her she there would their we him been has when who will no more if out " +
  "so up said what its about than into them can only other time new some could these two may " +
  "first then do any like my now over such our man me even most made after also did many off " +
  "before must well back through years much where your way down should because each just those " +
  "people how too little state good very make world still own see men work long get here between " +
  "both life being under never day same another know while last might us great old year come " +
  "tokenizer inference kernel throughput latency quantization attention transformer embedding " +
  "Hugging Face GPU CUDA NVIDIA PyTorch JSON HTTP API URL McDonald iPhone O'Neil naïve café résumé " +
  "coöperate façade jalapeño Zürich São Paulo Kraków Ærøskøbing"
).split(" ");

const CONTRACTIONS = ["don't", "it's", "I'M", "we'LL", "they'Re", "you've", "he'd", "can't",
  "Shouldn't", "IT'S", "o'clock", "rock'n'roll", "'tis", "'S", "y'all"];

const CJK = ["我们今天讨论分词器的实现细节。", "中文句子里没有空格，所以切分很重要", "机器学习模型需要大量的数据",
  "東京は日本の首都です。", "ひらがなとカタカナ、そして漢字を混ぜます", "コンピューターのプログラム",
  "한국어 문장도 테스트합니다.", "안녕하세요 여러분", "繁體中文與簡體中文", "「引用」と『二重引用』",
  "全角ＡＢＣ１２３！？", "数字123和English混合", "𠀀𠀁𪚥 (CJK Extension B)"];
const ARABIC = ["مرحبا بالعالم", "اللغة العربية جميلة جدا", "السَّلَامُ عَلَيْكُمْ", "٠١٢٣٤٥٦٧٨٩ أرقام",
  "هذا نص تجريبي مع English كلمات"];
const HINDI = ["नमस्ते दुनिया", "हिन्दी भाषा में लिखा गया वाक्य", "क्षत्रिय ज्ञान श्रृंगार", "द्विवेदी",
  "संस्कृतम् ॐ नमः शिवाय", "१२३४ अंक"];
const OTHER = ["Привет, мир! Съешь же ещё этих мягких французских булок.", "Γειά σου Κόσμε ΣΊΣΥΦΟΣ σοφός",
  "שלום עולם", "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง", "Tiếng Việt có dấu: Đường phố Hà Nội",
  "Ẓ̵̡̛̛̣̖̗͓̪̖̪̥̮̫̝̦̭̺ͅa̶l̷g̵o̷ text", "ÅÄÖ åäö ßẞ ŒœÆæ Ǆǅǆ ǈ", "ᚠᛇᚻ᛫ᛒᛦᚦ runes", "Ελληνικά ά έ ή"];
const EMOJI = ["😀", "🤖", "🔥", "👍🏽", "👍🏿", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "❤️",
  "🧑🏾‍🚀", "🫀", "✨", "🚀", "🙏🏻", "🤷‍♀️", "👁️‍🗨️", "©️", "☃", "♥", "★"];
const COMBINING = ["e\u0301", "a\u0308\u0304", "n\u0303", "o\u0302\u0323", "A\u030A", "\u0301",
  "i\u0307", "c\u0327\u0327", "u\u0308\u0301", "Å", "é", "Ω", "ﬁ", "Ⅻ", "①", "㎏", "ｶ", "ﾞ"];
const LOOKALIKES = ["<|im_start|>", "<|im_end|>", "<|endoftext|", "<|endoftext|>", "<think>",
  "</think>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<s>", "</s>", "[INST]",
  "[/INST]", "<bos>", "<eos>", "<start_of_turn>", "<|begin_of_text|>", "<|eot_id|>",
  "<｜User｜>", "<｜Assistant｜>", "<|im_start", "im_start|>", "<|", "|>", "<<|im_end|>>",
  "<0x0A>", "<unk>", "▁▁", "Ġhello", "Ċ"];
const PUNCT = [".", ",", "!", "?", ";", ":", "...", "—", "–", "-", "(", ")", "[", "]", "{", "}",
  "\"", "'", "`", "«", "»", "“", "”", "‘", "’", "…", "/", "\\", "@", "#", "$", "%", "^", "&",
  "*", "+", "=", "<", ">", "|", "~", "_", "¡", "¿", "§", "°", "±", "€", "£", "¥", "•"];
const SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\t\t", " \t ",
  "\u00a0", "\u3000", "\u2009", "\r", "\n\n\n", "    ", "\v", "\f"];

function pick(rng, arr) {
  return arr[Math.floor(rng() * arr.length)];
}
function int(rng, lo, hi) {
  return lo + Math.floor(rng() * (hi - lo + 1));
}
function digits(rng, n) {
  let s = String(int(rng, 1, 9));
  while (s.length < n) s += String(int(rng, 0, 9));
  return n === 0 ? "" : s.slice(0, n);
}

function sentence(rng) {
  const n = int(rng, 3, 16);
  const out = [];
  for (let i = 0; i < n; ++i) {
    const r = rng();
    if (r < 0.08) out.push(pick(rng, CONTRACTIONS));
    else if (r < 0.12) out.push(digits(rng, int(rng, 1, 6)));
    else out.push(pick(rng, WORDS));
  }
  let s = out.join(" ");
  s = s[0].toUpperCase() + s.slice(1);
  return s + pick(rng, [".", ".", "!", "?", "...", ":", ";", ""]);
}

function ident(rng) {
  const parts = ["user", "count", "data", "tmp", "value", "result", "idx", "buf", "kv_cache",
    "n_tokens", "d_model", "MAX_LEN", "getValue", "HTTPServer", "x", "i", "_private", "__init__"];
  return pick(rng, parts) + (rng() < 0.3 ? String(int(rng, 0, 99)) : "");
}

function python(rng) {
  const ind = rng() < 0.8 ? "    " : "\t";
  const f = ident(rng), a = ident(rng), b = ident(rng);
  return `def ${f}(${a}, ${b}=None):\n${ind}"""Docstring: ${sentence(rng)}"""\n` +
    `${ind}if ${a} is None:\n${ind}${ind}return []\n${ind}for i in range(${int(rng, 1, 1000)}):\n` +
    `${ind}${ind}${b} = ${a}[i] * ${int(rng, 2, 99)} + 0.${digits(rng, 3)}  # comment ${pick(rng, WORDS)}\n` +
    `${ind}return {"key": ${b}, 'other': [${a}, ${int(rng, 0, 9)}]}\n`;
}

function cpp(rng) {
  const t = pick(rng, ["int", "float", "std::vector<int32_t>", "auto", "const char*", "size_t"]);
  const v = ident(rng);
  return `#include <vector>\n\ntemplate <typename T>\n${t} ${ident(rng)}(const T& ${v}) {\n` +
    `  for (size_t i = 0; i < ${v}.size(); ++i) {\n    if (${v}[i] != ${int(rng, 0, 255)}) return -1;  // ${sentence(rng)}\n` +
    `  }\n  return ${v}.size() >> ${int(rng, 1, 8)};\n}\n`;
}

function jsonText(rng) {
  const obj = { id: int(rng, 0, 1e6), name: pick(rng, WORDS), ok: rng() < 0.5, score: rng(),
    tags: [pick(rng, WORDS), pick(rng, CJK).slice(0, 4), pick(rng, EMOJI)], nested: { a: null, b: [1, 2, { c: "d" }] } };
  return JSON.stringify(obj, null, rng() < 0.5 ? 2 : 4);
}

function numbers(rng) {
  const out = [];
  for (let n = 1; n <= 30; ++n) out.push(digits(rng, n));
  return out;
}

function whitespaceMix(rng) {
  let s = "";
  const n = int(rng, 1, 8);
  for (let i = 0; i < n; ++i) s += pick(rng, SPACES) + (rng() < 0.6 ? pick(rng, WORDS) : "");
  return s;
}

function mixed(rng) {
  const pools = [WORDS, CJK, ARABIC, HINDI, OTHER, EMOJI, COMBINING, PUNCT, SPACES, LOOKALIKES];
  let s = "";
  const n = int(rng, 2, 12);
  for (let i = 0; i < n; ++i) {
    const pool = pick(rng, pools);
    s += pick(rng, pool);
    if (rng() < 0.5) s += " ";
  }
  return s;
}

function longWord(rng) {
  const kind = int(rng, 0, 9);
  const n = int(rng, 50, 1200);
  switch (kind) {
    case 0: return "a".repeat(n);
    case 1: return "ab".repeat(n >> 1);
    case 2: return "supercalifragilisticexpialidocious".repeat(int(rng, 2, 30));
    case 3: { let s = ""; while (s.length < n) s += String.fromCharCode(97 + int(rng, 0, 25)); return s; }
    case 4: return digits(rng, int(rng, 31, 300));
    case 5: return " ".repeat(n);
    case 6: return pick(rng, EMOJI).repeat(int(rng, 5, 60));
    case 7: return "中文".repeat(int(rng, 10, 200));
    case 8: return "https://example.com/" + "path/segment_".repeat(int(rng, 3, 30)) + "?q=" + digits(rng, 12);
    default: {  // base64-like blob
      const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
      let s = "";
      while (s.length < n) s += pick(rng, b64);
      return s + "==";
    }
  }
}

// Code points drawn from assigned, long-stable ranges, including C0 controls and DEL.
function soup(rng) {
  const ranges = [[0x20, 0x7e], [0x00, 0x1f], [0xa1, 0x17f], [0x370, 0x3ff], [0x400, 0x45f],
    [0x2000, 0x206f], [0x2190, 0x21ff], [0x2500, 0x257f], [0x3040, 0x309f], [0x4e00, 0x4fff],
    [0xac00, 0xad00], [0x1f600, 0x1f64f], [0x7f, 0x7f]];
  let s = "";
  const n = int(rng, 1, 40);
  for (let i = 0; i < n; ++i) {
    const [lo, hi] = pick(rng, ranges);
    let cp = int(rng, lo, hi);
    if (cp >= 0x2065 && cp <= 0x2069) cp = 0x2022;  // skip unassigned / late-assigned
    s += String.fromCodePoint(cp);
  }
  return s;
}

function shared(rng) {
  const out = [""];
  for (let i = 0; i < 300; ++i) {
    let p = sentence(rng);
    for (let k = int(rng, 0, 4); k > 0; --k) p += pick(rng, [" ", "  ", "\n", "\n\n"]) + sentence(rng);
    out.push(p);
  }
  for (let i = 0; i < 80; ++i) out.push(python(rng));
  for (let i = 0; i < 80; ++i) out.push(cpp(rng));
  for (let i = 0; i < 60; ++i) out.push(jsonText(rng));
  for (let i = 0; i < 120; ++i) out.push(pick(rng, CJK) + (rng() < 0.5 ? pick(rng, CJK) : ""));
  for (let i = 0; i < 60; ++i) out.push(pick(rng, ARABIC) + " " + pick(rng, ARABIC));
  for (let i = 0; i < 60; ++i) out.push(pick(rng, HINDI) + " " + pick(rng, HINDI));
  for (let i = 0; i < 60; ++i) out.push(pick(rng, OTHER));
  for (let i = 0; i < 120; ++i) {
    let s = "";
    for (let k = int(rng, 1, 6); k > 0; --k) s += pick(rng, EMOJI) + (rng() < 0.4 ? " " : "") + (rng() < 0.3 ? pick(rng, WORDS) : "");
    out.push(s);
  }
  for (let i = 0; i < 80; ++i) {
    let s = "";
    for (let k = int(rng, 1, 6); k > 0; --k) s += pick(rng, WORDS).slice(0, 3) + pick(rng, COMBINING);
    out.push(s);
  }
  for (let i = 0; i < 5; ++i) out.push(...numbers(rng));
  for (let i = 0; i < 40; ++i) {
    out.push(`${digits(rng, int(rng, 1, 4))},${digits(rng, 3)},${digits(rng, 3)}.${digits(rng, 2)}`);
    out.push(`-${digits(rng, int(rng, 1, 3))}.${digits(rng, int(rng, 1, 8))}e${int(rng, -30, 30)} ` +
      `v${int(rng, 0, 9)}.${int(rng, 0, 20)}.${int(rng, 0, 99)} 0x${int(rng, 0, 1e9).toString(16)}`);
  }
  for (let i = 0; i < 150; ++i) out.push(whitespaceMix(rng));
  for (let i = 0; i < 40; ++i) {
    const w = pick(rng, SPACES);
    out.push(w + sentence(rng) + (rng() < 0.5 ? w : pick(rng, SPACES)));
  }
  for (let i = 0; i < 120; ++i) {
    out.push(sentence(rng).replace(" ", " " + pick(rng, LOOKALIKES) + pick(rng, ["", " ", "\n"])));
  }
  for (let i = 0; i < 200; ++i) out.push(mixed(rng));
  for (let i = 0; i < 60; ++i) out.push(longWord(rng));
  for (let i = 0; i < 150; ++i) out.push(soup(rng));
  return out;
}

function withAddedTokens(rng, addedTokens) {
  const out = [];
  if (addedTokens.length === 0) return out;
  const glue = ["", " ", "  ", "\n", " \n", "\t", "x", "hello", "中", "😀", "\r\n"];
  for (let i = 0; i < 400; ++i) {
    const t = pick(rng, addedTokens);
    const r = int(rng, 0, 5);
    if (r === 0) out.push(t);
    else if (r === 1) out.push(pick(rng, glue) + t + pick(rng, glue));
    else if (r === 2) out.push(sentence(rng) + pick(rng, glue) + t + pick(rng, glue) + sentence(rng));
    else if (r === 3) out.push(t + pick(rng, addedTokens) + pick(rng, glue) + t);
    else if (r === 4) out.push(t.slice(0, Math.max(1, t.length - 1)) + " " + t.slice(1));  // broken copies
    else out.push(`${pick(rng, addedTokens)}user\n${sentence(rng)}${pick(rng, addedTokens)}\n${pick(rng, addedTokens)}assistant\n`);
  }
  return out;
}

export function makeCorpus(seed, addedTokens) {
  const rng = mulberry32(seed);
  const base = shared(rng);
  const own = withAddedTokens(mulberry32(seed ^ 0x9e3779b9), addedTokens);
  return base.concat(own);
}

// Strings on which the JS port and the Rust library are believed to differ (listed with the
// reasons in tests/data/tokenizer/disputed.jsonl): Oniguruma's \s (used by Rust) is Unicode
// White_Space, which takes U+0085 and not U+FEFF; the \s of JS regexes does the opposite.
export const PROBES = ["a \u0085b", "a \ufeffb"];
