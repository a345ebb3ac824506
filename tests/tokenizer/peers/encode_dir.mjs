// Reference ids for a tokenizer in a directory (tokenizer.json + tokenizer_config.json), from
// @lenml/tokenizers, over given strings and the oracle corpus (corpus.mjs). Usage:
//   NODE_PATH=$(scripts/npm-peers) node tests/tokenizer/peers/encode_dir.mjs MODEL_DIR TEXTS.json
// TEXTS.json: a JSON list of strings. Prints one JSON line per string, first those of TEXTS.json,
// then makeCorpus(seed, the tokenizer's added tokens) and PROBES:
//   {"text", "ids" (add_special_tokens: false), "decoded" (decode(ids), no clean-up)}
import fs from "fs";
import path from "path";
import { createRequire } from "module";
import { makeCorpus, PROBES } from "./corpus.mjs";

const nodePath = (process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean)[0];
if (!nodePath || process.argv.length !== 4) {
  console.error("usage: NODE_PATH=$(scripts/npm-peers) node encode_dir.mjs MODEL_DIR TEXTS.json");
  process.exit(2);
}
const require = createRequire(path.join(nodePath, "noop.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");

const SEED = 20240611;  // encode.mjs's: the same corpus strings
const [dir, textsFile] = process.argv.slice(2);
const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const added = tokenizerJSON.added_tokens.map((t) => t.content);
const texts = JSON.parse(fs.readFileSync(textsFile, "utf8")).concat(makeCorpus(SEED, added), PROBES);

const lines = [];
for (const text of texts) {
  const ids = tok.encode(text, { add_special_tokens: false });
  const decoded = ids.length ? tok.decode(ids, { clean_up_tokenization_spaces: false }) : "";
  lines.push(JSON.stringify({ text, ids, decoded }));
}
process.stdout.write(lines.join("\n") + "\n");
