// The edges a newcomer meets first: CORS (preflights for allowed and refused origins, the
// header on real and streamed replies, the default *), 404s that name the path, 405 with
// an Allow header, "not valid JSON" with a line and column, and the info log: one line per
// finished request with its token counts, and the engine's periodic line.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, eventually, requirePeer } from "./harness.mjs";
import kilnServe from "../../../scripts/lib/kiln-serve.js";

const { OpenAI } = requirePeer("openai");

const ALLOWED = "http://localhost:3000";
let server;
before(async () => {
  server = await startServer(["--allowed-origins", `${ALLOWED}/, http://app.example`, "--log-stats-interval", "0.2"],
    { env: { KILN_LOG: "info" } });
});
after(async () => {
  assert.equal((await server.stop()).code, 0, server.stderr());
});

// One raw request (node's http sends Origin and OPTIONS as given): the scripts' helper.
const send = kilnServe.request;

const preflight = (url, path, origin, requestHeaders = "authorization, content-type") =>
  send(url, { method: "OPTIONS", path, headers: { origin, "access-control-request-method": "POST",
    "access-control-request-headers": requestHeaders } });

test("a preflight from an allowed origin is 204 with the CORS headers, on every API route", async () => {
  for (const path of ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/models"]) {
    const r = await preflight(server.url, path, ALLOWED, "authorization, content-type, x-stainless-os");
    assert.equal(r.status, 204, `${path}: ${r.body}`);
    assert.equal(r.headers["access-control-allow-origin"], ALLOWED, path);
    assert.match(r.headers["access-control-allow-methods"], path === "/v1/models" ? /GET/ : /POST/, path);
    assert.match(r.headers["access-control-allow-methods"], /OPTIONS/, path);
    const allowed = r.headers["access-control-allow-headers"].toLowerCase().split(/,\s*/);
    for (const h of ["authorization", "content-type", "x-api-key", "anthropic-version", "x-stainless-os"])
      assert.ok(allowed.includes(h), `${path}: ${h} not in ${allowed}`);
    assert.ok(Number(r.headers["access-control-max-age"]) > 0, path);
    assert.equal(r.headers["vary"], "Origin", path);
  }
  assert.equal((await preflight(server.url, "/v1/chat/completions", "http://app.example")).status, 204);
});

test("a preflight from another origin is refused in the API's error format", async () => {
  const r = await preflight(server.url, "/v1/chat/completions", "http://evil.example");
  assert.equal(r.status, 403);
  assert.equal(r.headers["access-control-allow-origin"], undefined);
  assert.match(JSON.parse(r.body).error.message, /origin http:\/\/evil\.example is not allowed.*--allowed-origins/);
  const a = await preflight(server.url, "/v1/messages", "http://localhost:3001");
  assert.equal(a.status, 403);
  assert.equal(JSON.parse(a.body).error.type, "permission_error");
  // Not a route: a 404 whatever the origin.
  assert.equal((await preflight(server.url, "/v1/embeddings", ALLOWED)).status, 404);
});

test("real replies carry Access-Control-Allow-Origin for an allowed origin only, streamed or not", async () => {
  const body = JSON.stringify({ messages: [{ role: "user", content: "Hi" }], max_tokens: 2 });
  const ok = await send(server.url, { method: "POST", path: "/v1/chat/completions", body, headers: { origin: ALLOWED } });
  assert.equal(ok.status, 200, ok.body);
  assert.equal(ok.headers["access-control-allow-origin"], ALLOWED);
  const streamed = await send(server.url, { method: "POST", path: "/v1/messages", headers: { origin: "http://app.example" },
    body: JSON.stringify({ max_tokens: 2, stream: true, messages: [{ role: "user", content: "Hi" }] }) });
  assert.equal(streamed.status, 200, streamed.body);
  assert.match(streamed.headers["content-type"], /text\/event-stream/);
  assert.equal(streamed.headers["access-control-allow-origin"], "http://app.example");
  const error = await send(server.url, { method: "POST", path: "/v1/chat/completions", body: "{", headers: { origin: ALLOWED } });
  assert.equal(error.status, 400);
  assert.equal(error.headers["access-control-allow-origin"], ALLOWED, "errors too: a page can read why");
  const other = await send(server.url, { method: "POST", path: "/v1/chat/completions", body, headers: { origin: "http://evil.example" } });
  assert.equal(other.status, 200);
  assert.equal(other.headers["access-control-allow-origin"], undefined);
  const none = await send(server.url, { method: "POST", path: "/v1/chat/completions", body });
  assert.equal(none.headers["access-control-allow-origin"], undefined);
});

test("by default any origin is allowed (*); --allowed-origins none allows none", async () => {
  const open = await startServer();
  try {
    const r = await preflight(open.url, "/v1/chat/completions", "http://anything.example");
    assert.equal(r.status, 204);
    assert.equal(r.headers["access-control-allow-origin"], "*");
    assert.equal(r.headers["vary"], undefined);
    const models = await send(open.url, { path: "/v1/models", headers: { origin: "http://anything.example" } });
    assert.equal(models.headers["access-control-allow-origin"], "*");
  } finally {
    await open.stop();
  }
  const closed = await startServer(["--allowed-origins", "none"]);
  try {
    assert.equal((await preflight(closed.url, "/v1/chat/completions", "http://anything.example")).status, 403);
    // The server's own page needs no CORS: same origin.
    assert.equal((await send(closed.url, { path: "/" })).status, 200);
  } finally {
    await closed.stop();
  }
});

test("an unknown path is a 404 naming it; another method on a route is a 405 with Allow", async () => {
  const e = await send(server.url, { method: "POST", path: "/v1/embeddings", body: "{}" });
  assert.equal(e.status, 404);
  assert.equal(JSON.parse(e.body).error.message, "no such endpoint: POST /v1/embeddings");
  const r = await send(server.url, { path: "/v1/responses" });
  assert.equal(JSON.parse(r.body).error.message, "no such endpoint: GET /v1/responses");
  const a = await send(server.url, { method: "POST", path: "/v1/messages/batches", body: "{}" });
  assert.equal(a.status, 404);
  assert.equal(JSON.parse(a.body).type, "error", "Anthropic's format under /v1/messages");
  assert.equal(JSON.parse(a.body).error.message, "no such endpoint: POST /v1/messages/batches");

  const g = await send(server.url, { path: "/v1/chat/completions" });
  assert.equal(g.status, 405);
  assert.equal(g.headers["allow"], "POST, OPTIONS");
  assert.match(JSON.parse(g.body).error.message, /^method not allowed: GET \/v1\/chat\/completions/);
  const m = await send(server.url, { method: "PUT", path: "/v1/messages", body: "{}" });
  assert.equal(m.status, 405);
  assert.equal(m.headers["allow"], "POST, OPTIONS");
  assert.equal(JSON.parse(m.body).error.type, "invalid_request_error");
  const p = await send(server.url, { method: "POST", path: "/v1/models", body: "{}" });
  assert.equal(p.status, 405);
  assert.equal(p.headers["allow"], "GET, HEAD, OPTIONS");
  assert.equal((await send(server.url, { method: "DELETE", path: "/health" })).status, 405);
});

test("a body that is not JSON says where it breaks; messages quote once", async () => {
  const r = await send(server.url, { method: "POST", path: "/v1/chat/completions",
    body: '{\n  "messages": [{"role": "user", "content": "Hi"}],\n  "max_tokens": 4,,\n}' });
  assert.equal(r.status, 400);
  assert.match(JSON.parse(r.body).error.message, /^the request body is not valid JSON \(UTF-8\) at line 3, column 19: /);
  const img = await send(server.url, { method: "POST", path: "/v1/chat/completions", body: JSON.stringify({
    messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "http://x" } }] }] }) });
  assert.equal(img.status, 400);
  assert.match(JSON.parse(img.body).error.message, /has type 'image_url': this model takes text only/);
  const anth = await send(server.url, { method: "POST", path: "/v1/messages", body: JSON.stringify({ max_tokens: 2,
    messages: [{ role: "user", content: [{ type: "image", source: {} }] }] }) });
  assert.equal(anth.status, 400);
  assert.match(JSON.parse(anth.body).error.message, /has type 'image', which a user message/);
});

test("KILN_LOG=info: a line per finished request with its token counts, and the engine's line", async () => {
  const client = new OpenAI({ apiKey: "unused", baseURL: server.url + "/v1", maxRetries: 0, timeout: 60000 });
  const r = await client.chat.completions.create({ messages: [{ role: "user", content: "Count" }], max_tokens: 7, ignore_eos: true });
  const line = await eventually(() => server.stderr().split("\n").find((l) => l.includes(`request ${r.id}:`)), { what: "the request's line" });
  const m = line.match(/^kiln info: request (\S+): prompt (\d+) tokens, output (\d+) tokens, TTFT ([\d.]+) ms, ([\d.]+) tok\/s, finish (\S+)$/);
  assert.ok(m, line);
  assert.equal(Number(m[2]), r.usage.prompt_tokens, line);
  assert.equal(Number(m[3]), 7, line);
  assert.ok(Number(m[4]) > 0 && Number(m[5]) > 0, line);
  assert.equal(m[6], "length", line);
  // A streamed message too, with Anthropic's id.
  const s = await send(server.url, { method: "POST", path: "/v1/messages",
    body: JSON.stringify({ max_tokens: 5, stream: true, ignore_eos: true, messages: [{ role: "user", content: "Hi" }] }) });
  const id = JSON.parse(s.body.split("\n").find((l) => l.startsWith("data: ")).slice(6)).message.id;
  await eventually(() => server.stderr().includes(`request ${id}: prompt `), { what: "the streamed request's line" });
  assert.match(server.stderr(), new RegExp(`request ${id}: prompt \\d+ tokens, output 5 tokens, TTFT [\\d.]+ ms, [\\d.]+ tok/s, finish length`));

  // The engine's line every 0.2 s while it works: keep it busy until one appears.
  let engineLine;
  for (let i = 0; i < 20 && !engineLine; ++i) {
    await client.completions.create({ prompt: "Once upon a time", max_tokens: 200, ignore_eos: true });
    engineLine = server.stderr().split("\n").find((l) => l.startsWith("kiln info: engine: "));
  }
  assert.ok(engineLine, server.stderr().slice(-2000));
  assert.match(engineLine, /^kiln info: engine: running \d+ seqs, waiting \d+ seqs, KV cache [\d.]+% used, prompt [\d.]+ tok\/s, generation [\d.]+ tok\/s \(last [\d.]+ s\)$/);
  const busy = server.stderr().split("\n").filter((l) => l.startsWith("kiln info: engine: ")).some((l) => /generation [1-9]/.test(l));
  assert.ok(busy, "some interval generated tokens");
});
