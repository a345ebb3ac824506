// Bad input never crashes the server or leaks: thousands of malformed requests (broken
// JSON, wrong types, missing fields, bad numbers, invalid UTF-8, oversized bodies and
// prompts, unknown models, bad API keys, wrong methods and paths) each get a 4xx in the
// error format of the API they called; 200 clients that hang up mid-stream free their
// KV blocks; afterwards the server is alive and answers a normal request.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { startServer, metric, eventually } from "./harness.mjs";

const KEY = "hostile-key";
let server;
before(async () => {
  server = await startServer(["--api-key", KEY, "--max-request-bytes", "256KiB", "--max-model-len", "512", "--max-num-seqs", "64"]);
});
after(async () => {
  assert.equal((await server.stop()).code, 0, server.stderr());
});

// One raw HTTP request (node's http: no client-side validation of what we send).
function send({ method = "POST", path, body, headers = {} }) {
  return new Promise((resolve, reject) => {
    const url = new URL(server.url);
    const payload = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(body);
    const req = http.request(
      {
        host: url.hostname,
        port: url.port,
        method,
        path,
        headers: {
          authorization: `Bearer ${KEY}`,
          "content-type": "application/json",
          ...(payload ? { "content-length": payload.length } : {}),
          ...headers,
        },
        agent: false,
      },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode, type: res.headers["content-type"], body: Buffer.concat(chunks).toString() }));
        res.on("error", reject);
      },
    );
    req.setTimeout(30000, () => req.destroy(new Error(`timeout on ${method} ${path}`)));
    req.on("error", reject);
    if (payload) req.write(payload);
    req.end();
  });
}

const endpoints = {
  chat: "/v1/chat/completions",
  completion: "/v1/completions",
  messages: "/v1/messages",
  count: "/v1/messages/count_tokens",
};
const valid = {
  chat: { model: "kiln-demo", messages: [{ role: "user", content: "Hello" }], max_tokens: 4 },
  completion: { model: "kiln-demo", prompt: "Hello", max_tokens: 4 },
  messages: { model: "kiln-demo", max_tokens: 4, messages: [{ role: "user", content: "Hello" }] },
  count: { model: "kiln-demo", messages: [{ role: "user", content: "Hello" }] },
};

// Values that are wrong for each field, whatever the endpoint.
const wrong = {
  model: [1, true, {}, [], "gpt-4", "kiln-demo ", "x".repeat(5000)],
  messages: ["hi", 1, {}, [], [1], [null], [{}], [{ role: 1, content: "x" }], [{ role: "wizard", content: "x" }],
    [{ role: "user" }], [{ role: "user", content: 1 }], [{ role: "user", content: [1] }],
    [{ role: "user", content: [{ type: "image_url", image_url: { url: "http://x" } }] }],
    [{ role: "user", content: [{ type: "text", text: 5 }] }],
    [{ role: "assistant", content: "x", tool_calls: "no" }],
    [{ role: "assistant", content: "x", tool_calls: [{ function: { arguments: "{}" } }] }],
    [{ role: "user", content: [{ type: "tool_result" }] }],
    [{ role: "assistant", content: [{ type: "tool_use", id: "a", name: "f", input: "x" }] }]],
  prompt: [1, true, {}, [], [[]], [-1], [1e12], [1.5], [{}], [[1, "x"]], null],
  max_tokens: ["10", -1, 0, 1.5, 1e30, true, {}, [], 2 ** 40, 100000],
  max_completion_tokens: ["10", -5, 0, 0.5],
  temperature: ["hot", -1, 101, {}, [], true, -1e-9, 1e308],
  top_p: [0, -0.1, 1.5, "x", {}, false],
  top_k: [-2, 1.5, "x", 1e9, {}],
  min_p: [-0.1, 2, "x"],
  n: [0, -1, 1000, 1.5, "2", {}],
  stop: [1, [1], [""], {}, true, Array.from({ length: 40 }, (_, i) => "s" + i)],
  stop_sequences: [1, [2], [""], "", {}],
  seed: ["x", 1.5, {}, [], 1e30],
  logprobs: ["yes", {}, -1, 50],
  top_logprobs: [-1, 21, "x", 1.5],
  stream: ["true", 1, {}, []],
  stream_options: ["x", 1, { include_usage: "yes" }],
  presence_penalty: [3, -3, "x", {}],
  frequency_penalty: [2.5, -2.5, "x"],
  repetition_penalty: [0, -1, 11, "x"],
  tools: ["x", 1, [1], [{ type: "function" }], [{ type: "x" }], [{ type: "function", function: { name: "" } }],
    [{ name: "f" }], [{ name: "f", input_schema: 1 }], [{ type: "web_search_20250305", name: "s" }]],
  tool_choice: [1, "required", "sometimes", {}, { type: "any" }, { type: "function", function: { name: "f" } }, []],
  response_format: ["json", { type: "json_schema" }, {}, { type: 1 }, 1, { type: "json_schema", json_schema: { schema: { type: "object", not: {} } } }],
  json_schema: [1, "x", [], { type: "object", not: {} }, { type: "string", pattern: "(a" }],
  grammar: [1, "", "root ::= x", "root ::= (", "start ::= \"a\"", {}, ["root ::= \"a\""]],
  structured_outputs: [1, "x", [], { regex: "(a" }, { choice: [] }, { grammar: "root ::=" + " (".repeat(5) },
    { json: { type: "object", not: {} } }, { regex: "a", choice: ["a"] }, { what: 1 }],
  stop_token_ids: ["x", [-1], [1e9], [1.5], {}],
  ignore_eos: ["x", 1],
  skip_special_tokens: ["no"],
  chat_template_kwargs: ["x", 1, []],
  logit_bias: [{ 1: 5 }, "x"],
  echo: ["yes", 1],
  suffix: ["tail", 1],
  best_of: [5, "x"],
  system: [1, {}, [1], [{ type: "image" }]],
  thinking: ["on", { type: "maybe" }, 1],
};

function expectError(res, path, what) {
  assert.ok(res.status >= 400 && res.status < 500, `${what}: status ${res.status}, body ${res.body.slice(0, 300)}`);
  assert.match(res.type ?? "", /application\/json/, `${what}: content type ${res.type}`);
  const j = JSON.parse(res.body);
  if (path.startsWith("/v1/messages")) {
    assert.equal(j.type, "error", what);
    assert.equal(typeof j.error.type, "string", what);
    assert.ok(j.error.message.length > 0, what);
  } else {
    assert.equal(typeof j.error.message, "string", what);
    assert.ok(j.error.message.length > 0, what);
    assert.equal(typeof j.error.type, "string", what);
  }
}

// Every case, as {path, body | raw, headers, method, what}.
function cases() {
  const out = [];
  for (const [name, path] of Object.entries(endpoints)) {
    const base = valid[name];
    for (const [field, values] of Object.entries(wrong)) {
      for (const v of values) {
        const body = { ...base, [field]: v };
        // Fields an endpoint does not read are ignored (as OpenAI-compatible servers do),
        // so a wrong value there is not an error: only send what this endpoint reads.
        if (!reads(name, field)) continue;
        if (v === null && field !== "prompt") continue;
        // Anthropic messages carry no tool_calls field (tool_use blocks instead): ignored there.
        if ((name === "messages" || name === "count") && JSON.stringify(v)?.includes("tool_calls")) continue;
        out.push({ path, body: JSON.stringify(body), what: `${path} ${field}=${JSON.stringify(v)?.slice(0, 60)}` });
      }
    }
    for (const field of required[name]) {
      const body = { ...base };
      delete body[field];
      out.push({ path, body: JSON.stringify(body), what: `${path} without ${field}` });
    }
    // Every proper prefix of a valid body is broken JSON (three shapes of body).
    const tools = name === "messages" || name === "count"
      ? [{ name: "f", input_schema: { type: "object", properties: { a: { type: "string" } } } }]
      : [{ type: "function", function: { name: "f", parameters: { type: "object" } } }];
    for (const shape of [{ ...base, temperature: 0.5, seed: 3 }, { ...base, tools }, { ...base, stream: true, top_p: 0.9 },
      { ...base, stop: ["\n\n", "END"], top_k: 20, min_p: 0.1, ignore_eos: false }]) {
      const text = JSON.stringify(shape);
      for (let n = 0; n < text.length; ++n) out.push({ path, body: text.slice(0, n), what: `${path} cut at ${n} of ${text}` });
    }
    for (const raw of ["", "null", "[]", "42", '"str"', "{'model': 1}", "{\"model\": NaN}", "{\"a\": Infinity}",
      "{\"a\": 1,}", "{\"a\" 1}", "\u0000", "{\"model\": \"kiln-demo\"} trailing", "[".repeat(1000) + "]".repeat(1000),
      "{\"a\":".repeat(200) + "1" + "}".repeat(200), '{"s": "\\ud800"}', '{"x": 1e999999}']) {
      out.push({ path, body: raw, what: `${path} body ${JSON.stringify(raw).slice(0, 40)}` });
    }
    // Invalid UTF-8 inside a string.
    const bad = Buffer.concat([Buffer.from(`{"model":"kiln-demo","max_tokens":2,"messages":[{"role":"user","content":"`),
      Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}],"prompt":"x"}')]);
    out.push({ path, raw: bad, what: `${path} invalid UTF-8` });
    // Oversized: the body (413), and a prompt over the maximum length (400).
    out.push({ path, body: JSON.stringify({ ...base, junk: "x".repeat(300 * 1024) }), what: `${path} 300 KiB body` });
    const long = "word ".repeat(3000);
    out.push({ path, body: JSON.stringify(name === "completion" ? { ...base, prompt: long } : { ...base, messages: [{ role: "user", content: long }] }),
      what: `${path} long prompt`, skip: name === "count" });
    // Authentication.
    out.push({ path, body: JSON.stringify(base), headers: { authorization: "Bearer wrong" }, what: `${path} wrong key` });
    out.push({ path, body: JSON.stringify(base), headers: { authorization: "" }, what: `${path} no key` });
    out.push({ path, body: JSON.stringify(base), headers: { authorization: "", "x-api-key": "wrong" }, what: `${path} wrong x-api-key` });
    out.push({ method: "GET", path, what: `GET ${path}` });
    out.push({ method: "PUT", path, body: JSON.stringify(base), what: `PUT ${path}` });
  }
  for (const p of ["/v1/nothing", "/v2/chat/completions", "/v1/messages/other", "/v1/models/unknown", "/%ff%fe"])
    out.push({ method: "GET", path: p, what: `GET ${p}` });
  return out.filter((c) => !c.skip);
}

// "model" is not required: a request without one gets the served model (the SDK tests).
const required = {
  chat: ["messages"],
  completion: ["prompt"],
  messages: ["messages", "max_tokens"],
  count: ["messages"],
};
function reads(name, field) {
  const common = ["model"];
  const openai = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop", "seed", "stream", "stream_options",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "stop_token_ids", "ignore_eos", "skip_special_tokens",
    "logit_bias", "best_of"];
  const table = {
    chat: [...common, ...openai, "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
      "response_format", "structured_outputs", "chat_template_kwargs"],
    completion: [...common, ...openai, "prompt", "logprobs", "echo", "suffix", "json_schema", "grammar",
      "response_format", "structured_outputs"],
    messages: [...common, "messages", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream", "tools",
      "tool_choice", "system", "thinking", "seed", "stop_token_ids"],
    count: [...common, "messages", "tools", "tool_choice", "system", "thinking"],
  };
  return table[name].includes(field);
}

test("thousands of malformed requests each get a 4xx in their API's format", async (t) => {
  const all = cases();
  assert.ok(all.length >= 2000, `${all.length} cases`);
  const statuses = {};
  let next = 0;
  async function worker() {
    while (next < all.length) {
      const c = all[next++];
      const res = await send({ method: c.method, path: c.path, body: c.raw ?? c.body, headers: c.headers });
      statuses[res.status] = (statuses[res.status] ?? 0) + 1;
      expectError(res, c.path, c.what);
    }
  }
  await Promise.all(Array.from({ length: 8 }, worker));
  t.diagnostic(`${all.length} malformed requests, statuses ${JSON.stringify(statuses)}`);
  // Each kind of failure was met, with its own status.
  for (const code of [400, 401, 404, 413]) assert.ok(statuses[code] > 0, `no ${code} in ${JSON.stringify(statuses)}`);
  assert.ok((await send({ method: "GET", path: "/health" })).status === 200);
});

test("200 clients that hang up mid-stream free their blocks", async () => {
  const hangUp = (i) =>
    new Promise((resolve, reject) => {
      const url = new URL(server.url);
      const body = JSON.stringify({
        model: "kiln-demo",
        stream: true,
        max_tokens: 400,
        ignore_eos: true,
        seed: i,
        messages: [{ role: "user", content: `Client ${i} says hello and then leaves.` }],
      });
      const req = http.request(
        { host: url.hostname, port: url.port, method: "POST", path: "/v1/chat/completions", agent: false,
          headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json", "content-length": Buffer.byteLength(body) } },
        (res) => {
          if (res.statusCode !== 200) return reject(new Error(`status ${res.statusCode}`));
          let seen = 0;
          res.on("data", () => {
            // Leave after a few chunks: the request is still generating.
            if (++seen === 3) {
              req.destroy();
              resolve();
            }
          });
          res.on("end", () => resolve());
        },
      );
      req.on("error", (e) => (e.code === "ECONNRESET" ? resolve() : reject(e)));
      req.setTimeout(60000, () => req.destroy(new Error("timeout")));
      req.end(body);
    });
  for (let batch = 0; batch < 4; ++batch)
    await Promise.all(Array.from({ length: 50 }, (_, i) => hangUp(batch * 50 + i)));
  await eventually(async () => (await metric(server.url, "kiln_kv_cache_blocks_used")) === 0, { what: "an empty KV pool", timeoutMs: 60000 });
  await eventually(async () => (await metric(server.url, "kiln_num_requests_in_flight")) === 0, { what: "no request in flight", timeoutMs: 60000 });
  assert.ok((await metric(server.url, "kiln_request_success_total", 'finished_reason="cancelled"')) >= 150, "the hang-ups were cancelled");
  // Alive and well.
  const res = await send({ path: "/v1/chat/completions", body: JSON.stringify(valid.chat) });
  assert.equal(res.status, 200, res.body);
  assert.equal(JSON.parse(res.body).choices[0].message.role, "assistant");
  // Its blocks return to the pool once the engine retires it, which may be just after the
  // response's last bytes reach the client.
  await eventually(async () => (await metric(server.url, "kiln_kv_cache_blocks_used")) === 0, { what: "an empty KV pool after the last request", timeoutMs: 60000 });
});
