// A client that hangs up is noticed whether or not it streams: non-streaming OpenAI chat
// and completions (n > 1, several prompts) and Anthropic messages whose clients leave
// after 0.3 s are cancelled, and their KV blocks freed, within an engine step plus the
// server's poll interval (50 ms), not left to generate to max_tokens for nobody.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { startServer, metric, eventually } from "./harness.mjs";

const POLL_MS = 50;          // kPumpWait in src/server/http_server.cpp
const SLACK_MS = 400;        // scheduling on two busy cores, and the /metrics round trip
let server;
before(async () => {
  server = await startServer(["--max-num-seqs", "64"]);
});
after(async () => {
  assert.equal((await server.stop()).code, 0, server.stderr());
});

// POSTs `body` and destroys the connection once `leave` resolves; resolves then (or with
// the status, should the reply come first: a failure of the test).
function postAndLeave(path, body, leave) {
  return new Promise((resolve, reject) => {
    const url = new URL(server.url);
    const payload = Buffer.from(JSON.stringify(body));
    const req = http.request(
      { host: url.hostname, port: url.port, method: "POST", path, agent: false,
        headers: { "content-type": "application/json", "content-length": payload.length } },
      (res) => resolve({ answered: res.statusCode }),
    );
    req.on("error", (e) => (e.code === "ECONNRESET" || req.destroyed ? resolve({ left: true }) : reject(e)));
    req.end(payload);
    leave.then(() => {
      req.destroy();
      resolve({ left: true });
    });
  });
}

const long = { max_tokens: 1500, ignore_eos: true, temperature: 0.8 };
const kinds = [
  { what: "chat", path: "/v1/chat/completions", count: 16, samples: 1,
    body: (i) => ({ model: "kiln-demo", messages: [{ role: "user", content: `Tell story ${i}.` }], seed: i, ...long }) },
  { what: "chat n=4", path: "/v1/chat/completions", count: 4, samples: 4,
    body: (i) => ({ model: "kiln-demo", messages: [{ role: "user", content: `Tell story ${i}.` }], n: 4, seed: i, ...long }) },
  { what: "completions", path: "/v1/completions", count: 16, samples: 1,
    body: (i) => ({ model: "kiln-demo", prompt: `Once upon a time ${i}`, seed: i, ...long }) },
  { what: "completions, 2 prompts n=2", path: "/v1/completions", count: 4, samples: 4,
    body: (i) => ({ model: "kiln-demo", prompt: [`Once ${i}`, `Later ${i}`], n: 2, seed: i, ...long }) },
  { what: "messages", path: "/v1/messages", count: 16, samples: 1,
    body: (i) => ({ model: "kiln-demo", messages: [{ role: "user", content: `Tell story ${i}.` }], ...long }) },
];

for (const kind of kinds) {
  test(`non-streaming ${kind.what}: clients that hang up after 0.3 s free their blocks`, async (t) => {
    const sequences = kind.count * kind.samples;
    const cancelled0 = await metric(server.url, "kiln_request_success_total", 'finished_reason="cancelled"');
    const closed0 = await metric(server.url, "kiln_http_requests_total", 'status="499"').catch(() => 0);
    let leaveNow;
    const leave = new Promise((r) => (leaveNow = r));
    const clients = Array.from({ length: kind.count }, (_, i) => postAndLeave(kind.path, kind.body(i), leave));
    // Every sequence is generating when the clients leave.
    await eventually(async () => (await metric(server.url, "kiln_num_requests_running")) === sequences,
      { what: `${sequences} sequences running`, timeoutMs: 30000 });
    await new Promise((r) => setTimeout(r, 300));
    assert.ok((await metric(server.url, "kiln_kv_cache_blocks_used")) > 0);
    const stepSeconds0 = await metric(server.url, "kiln_engine_step_seconds_total", 'kind="decode"');
    const steps0 = await metric(server.url, "kiln_engine_step_kind_total", 'kind="decode"');
    const t0 = performance.now();
    leaveNow();
    for (const r of await Promise.all(clients)) assert.deepEqual(r, { left: true }, "a reply came before the hang-up");
    // /metrics read back to back (a few ms each): the time is to the first read that shows
    // nothing running and no block used.
    let freedMs;
    for (;;) {
      const [running, blocks] = await Promise.all([metric(server.url, "kiln_num_requests_running"),
        metric(server.url, "kiln_kv_cache_blocks_used")]);
      freedMs = performance.now() - t0;
      if (running === 0 && blocks === 0) break;
      assert.ok(freedMs < 10000, `after 10 s: ${running} sequences running, ${blocks} KV blocks used`);
    }
    const stepMs = 1000 * ((await metric(server.url, "kiln_engine_step_seconds_total", 'kind="decode"')) - stepSeconds0) /
      Math.max(1, (await metric(server.url, "kiln_engine_step_kind_total", 'kind="decode"')) - steps0);
    t.diagnostic(`${kind.what}: ${sequences} sequences freed ${freedMs.toFixed(0)} ms after the hang-up ` +
      `(decode step ${stepMs.toFixed(1)} ms, poll ${POLL_MS} ms)`);
    assert.ok(freedMs < POLL_MS + 2 * stepMs + SLACK_MS, `freed after ${freedMs.toFixed(0)} ms`);
    await eventually(async () => (await metric(server.url, "kiln_request_success_total", 'finished_reason="cancelled"')) -
      cancelled0 === sequences, { what: `${sequences} sequences ended as cancelled` });
    assert.equal(await metric(server.url, "kiln_num_requests_in_flight"), 0);
    // Each hang-up is counted as status 499 (client closed request).
    await eventually(async () => (await metric(server.url, "kiln_http_requests_total", 'status="499"')) - closed0 ===
      kind.count, { what: `${kind.count} more responses counted as 499` });
  });
}

test("a client that stays gets its answer", async () => {
  const res = await fetch(server.url + "/v1/chat/completions", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "kiln-demo", messages: [{ role: "user", content: "Hi" }], max_tokens: 8, n: 2 }),
  });
  assert.equal(res.status, 200);
  const j = await res.json();
  assert.equal(j.choices.length, 2);
  assert.ok(j.usage.completion_tokens > 0);
});
