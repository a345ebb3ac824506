// The oracle for kiln's Jinja engine: renders (template, context) jobs with
// @huggingface/jinja's Template, the engine of transformers.js.
//   NODE_PATH=$(scripts/npm-peers) node tests/tokenizer/peers/render.mjs JOBS.json
// JOBS.json: [{"template": "...", "context": {...}, "now": "2024-07-09T15:04"}, ...]
// ("now", optional: the local time strftime_now sees, in UTC). Prints one JSON line
// per job: {"ok": true, "output": "..."} or {"ok": false, "error": "...", "kind": "Error"}
// (kind: the JavaScript error class; TypeError / RangeError mean the reference itself
// crashed rather than reporting a template error).
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

process.env.TZ = "UTC";
const require = createRequire(import.meta.url);  // resolves through NODE_PATH
const { Template } = require("@huggingface/jinja");

// strftime_now calls `new Date()`; a job's "now" pins it.
const RealDate = Date;
let pinnedNow = null;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0 && pinnedNow !== null) super(pinnedNow);
    else super(...args);
  }
};

const jobs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const compiled = new Map();
const lines = [];
for (const job of jobs) {
  pinnedNow = job.now ? new RealDate(job.now + "Z").getTime() : null;
  let result;
  try {
    let template = compiled.get(job.template);
    if (template === undefined) {
      try {
        template = new Template(job.template);
      } catch (e) {
        template = e;
      }
      compiled.set(job.template, template);
    }
    if (template instanceof Error) throw template;
    // A lone surrogate cannot be UTF-8; Node's encoder writes U+FFFD for it as well.
    result = { ok: true, output: template.render(job.context).toWellFormed() };
  } catch (e) {
    result = { ok: false, error: String(e?.message ?? e), kind: e?.constructor?.name ?? typeof e };
  }
  lines.push(JSON.stringify(result));
}
process.stdout.write(lines.join("\n") + (lines.length ? "\n" : ""));
