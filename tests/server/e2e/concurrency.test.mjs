// Batching must not change results: 64 simultaneous streaming requests on the demo model
// (CPU reference) each equal the same request run alone, with the prefix cache on and
// off; afterwards every KV block is back in the pool. (CMake runs it again over two
// tensor-parallel ranks, and over two data-parallel replicas.)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, metric, eventually, readSse } from "./harness.mjs";

const N = 64;
const system = "You are a helpful assistant who answers every question in one short paragraph of plain English.";

// Requests differ in their question and sampling; they share the system prompt (full
// KV blocks the prefix cache can share).
function request(i) {
  const body = {
    model: "kiln-demo",
    messages: [
      { role: "system", content: system },
      { role: "user", content: `Question ${i}: what is ${i} times ${i + 3}?` },
    ],
    max_tokens: 16 + (i % 9),
    seed: 1000 + i,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (i % 4 === 0) body.temperature = 0;
  else body.temperature = 0.7 + (i % 5) / 10;
  if (i % 3 === 0) body.top_p = 0.9;
  if (i % 5 === 0) body.top_k = 40;
  if (i % 7 === 0) body.presence_penalty = 0.5;
  if (i % 11 === 0) body.frequency_penalty = 0.3;
  if (i % 13 === 0) body.repetition_penalty = 1.2;
  if (i % 6 === 0) body.min_p = 0.05;
  return body;
}

async function run(url, body) {
  const res = await fetch(url + "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  assert.equal(res.status, 200);
  let text = "";
  let finish = null;
  let usage = null;
  for (const { data } of await readSse(res)) {
    if (data === "[DONE]") continue;
    const chunk = JSON.parse(data);
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, completion_tokens: usage?.completion_tokens };
}

let cached;
let uncached;
before(async () => {
  [cached, uncached] = await Promise.all([
    startServer(["--max-num-seqs", "64"]),
    startServer(["--max-num-seqs", "64", "--no-enable-prefix-caching"]),
  ]);
});
after(async () => {
  for (const s of [cached, uncached]) assert.equal((await s.stop()).code, 0, s.stderr());
});

async function concurrent(server) {
  const steps0 = await metric(server.url, "kiln_engine_steps_total");
  const results = await Promise.all(Array.from({ length: N }, (_, i) => run(server.url, request(i))));
  const steps = (await metric(server.url, "kiln_engine_steps_total")) - steps0;
  return { results, steps };
}

test("64 concurrent streams equal each request alone; the prefix cache changes nothing", async () => {
  const together = await concurrent(cached);
  const tokens = together.results.reduce((n, r) => n + r.completion_tokens, 0);
  // They really ran as one batch: far fewer steps than tokens.
  assert.ok(together.steps < tokens / 4, `${together.steps} steps for ${tokens} tokens`);
  for (const r of together.results) {
    assert.ok(r.text.length > 0);
    assert.ok(["length", "stop"].includes(r.finish));
  }
  assert.ok((await metric(cached.url, "kiln_prefix_cache_hits_total")) > 0, "the shared system prompt was cached");
  // Every step counted once by kind, and timed; decode steps compute one token per sequence.
  const byKind = async (name, kind) => metric(cached.url, name, `kind="${kind}"`);
  const [decode, mixed] = [await byKind("kiln_engine_step_kind_total", "decode"), await byKind("kiln_engine_step_kind_total", "mixed")];
  assert.equal(await byKind("kiln_engine_step_kind_total", "verify"), 0, "no drafts here, so no verify steps");
  assert.equal(decode + mixed, await metric(cached.url, "kiln_engine_steps_total"));
  assert.ok(decode > 0 && mixed > 0, `${decode} decode and ${mixed} mixed steps`);
  const decodeTokens = await byKind("kiln_engine_step_tokens_total", "decode");
  const mixedTokens = await byKind("kiln_engine_step_tokens_total", "mixed");
  assert.ok(decodeTokens >= decode && mixedTokens > mixed, `${decodeTokens} / ${mixedTokens} tokens`);
  assert.equal(decodeTokens + mixedTokens, await metric(cached.url, "kiln_computed_tokens_total"));
  assert.ok((await byKind("kiln_engine_step_seconds_total", "decode")) > 0);
  assert.ok((await byKind("kiln_engine_step_seconds_total", "mixed")) > 0);

  for (let i = 0; i < N; ++i) {
    const alone = await run(cached.url, request(i));
    assert.deepEqual(alone, together.results[i], `request ${i} alone vs in the batch of ${N}`);
  }

  const off = await concurrent(uncached);
  assert.equal(await metric(uncached.url, "kiln_prefix_cache_hits_total"), 0);
  for (let i = 0; i < N; ++i) assert.deepEqual(off.results[i], together.results[i], `request ${i}, prefix cache off vs on`);

  // Data-parallel replicas (KILN_TEST_SERVER_ARGS="--data-parallel-size 2"): the 64 went to both.
  const dp = (process.env.KILN_TEST_SERVER_ARGS ?? "").match(/--data-parallel-size\s+(\d+)/);
  for (let r = 0; dp && r < Number(dp[1]); ++r) {
    const share = await metric(cached.url, "kiln_engine_generation_tokens_total", `engine="${r}"`);
    assert.ok(share > tokens / 8, `replica ${r} generated ${share} of the ${tokens}+ tokens`);
  }

  for (const s of [cached, uncached]) {
    await eventually(async () => (await metric(s.url, "kiln_kv_cache_blocks_used")) === 0, { what: "an empty KV pool" });
    assert.equal(await metric(s.url, "kiln_num_requests_running"), 0);
    assert.equal(await metric(s.url, "kiln_num_requests_in_flight"), 0);
  }
});
