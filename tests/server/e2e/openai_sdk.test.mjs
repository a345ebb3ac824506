// The official `openai` npm client against `kiln serve` on the demo model: models,
// chat and completions (streaming and not), seeds, logprobs, n, stop strings, a tool-call
// round trip and reasoning content (the model's output injected by the test hook), and
// errors surfacing as the SDK's error classes.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, requirePeer } from "./harness.mjs";

const { OpenAI, BadRequestError, NotFoundError, AuthenticationError } = requirePeer("openai");

let server;
let client;
const inject = (text) => ({ headers: { "X-Kiln-Test-Output": encodeURIComponent(text) } });

before(async () => {
  server = await startServer();
  client = new OpenAI({ apiKey: "unused", baseURL: server.url + "/v1", maxRetries: 0, timeout: 60000 });
});
after(async () => {
  const r = await server.stop();
  assert.equal(r.code, 0, "the server drains and exits 0 on SIGTERM:\n" + server.stderr());
});

test("models lists the served model", async () => {
  const page = await client.models.list();
  assert.deepEqual(page.data.map((m) => m.id), ["kiln-demo"]);
  assert.equal((await client.models.retrieve("kiln-demo")).id, "kiln-demo");
  await assert.rejects(client.models.retrieve("other"), NotFoundError);
});

test("a request without a model gets the served one (chat and completions)", async () => {
  // The client does not insist on a model; llama.cpp tutorials leave it out.
  // Greedy, so that no sampled end-of-sequence cuts the counted tokens short (the demo's
  // generation_config samples at 0.7 with a fresh seed per request).
  const chat = await client.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], max_tokens: 3, temperature: 0 });
  assert.equal(chat.model, "kiln-demo");
  assert.equal(chat.usage.completion_tokens, 3);
  const completion = await client.completions.create({ prompt: "Once", max_tokens: 3, temperature: 0 });
  assert.equal(completion.model, "kiln-demo");
  assert.equal(completion.usage.completion_tokens, 3);
  const stream = await client.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], max_tokens: 3, stream: true, temperature: 0 });
  let chunks = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.model, "kiln-demo");
    ++chunks;
  }
  assert.ok(chunks >= 2, `${chunks} chunks`);
  // null and "" mean the same (vLLM's reading); a wrong name is still a 404 naming it.
  for (const model of [null, ""]) {
    const r = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 2 });
    assert.equal(r.model, "kiln-demo");
  }
  await assert.rejects(client.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 }),
    (e) => e instanceof NotFoundError && e.code === "model_not_found" && /'gpt-4o' does not exist/.test(e.message));
  await assert.rejects(client.completions.create({ model: "gpt-4o", prompt: "x", max_tokens: 2 }), NotFoundError);
});

test("chat completion returns text, usage and a finish reason", async () => {
  const r = await client.chat.completions.create({
    model: "kiln-demo",
    messages: [
      { role: "system", content: "You are terse." },
      { role: "user", content: [{ type: "text", text: "Tell me a story." }] },
    ],
    max_tokens: 12,
    seed: 7,
  });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.ok(r.choices[0].message.content.length > 0);
  assert.ok(["length", "stop"].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 5);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test("the same seed gives the same reply, streamed or not", async () => {
  const req = { model: "kiln-demo", messages: [{ role: "user", content: "Seeds?" }], max_tokens: 16, seed: 1234, temperature: 0.9 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = "";
  let finish = null;
  let usage = null;
  let role = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(role, "assistant");
  assert.equal(text, a.choices[0].message.content);
  assert.equal(finish, a.choices[0].finish_reason);
  assert.deepEqual(usage, a.usage);
});

test("n samples and logprobs", async () => {
  const r = await client.chat.completions.create({
    model: "kiln-demo",
    messages: [{ role: "user", content: "Give me options." }],
    max_tokens: 8,
    n: 3,
    seed: 5,
    logprobs: true,
    top_logprobs: 3,
  });
  assert.equal(r.choices.length, 3);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of r.choices) {
    const lp = c.logprobs.content;
    assert.ok(lp.length >= 1);
    for (const t of lp) {
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 3);
      for (let i = 1; i < 3; ++i) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
      assert.deepEqual(t.bytes, [...Buffer.from(t.token, "utf8")]);
    }
  }
  // Sample i is seeded with seed + i: three different draws.
  assert.equal(new Set(r.choices.map((c) => c.message.content)).size, 3);
});

test("completions: text, streaming, echo and token-id prompts", async () => {
  // ignore_eos and skip_special_tokens false (vLLM's): the text then holds every token.
  const r = await client.completions.create({ model: "kiln-demo", prompt: "Once upon a time", max_tokens: 10, seed: 3,
                                               logprobs: 2, ignore_eos: true, skip_special_tokens: false });
  assert.equal(r.object, "text_completion");
  assert.ok(r.choices[0].text.length > 0);
  assert.equal(r.choices[0].logprobs.tokens.length, r.usage.completion_tokens);
  assert.equal(r.choices[0].logprobs.tokens.join(""), r.choices[0].text);
  const stream = await client.completions.create({ model: "kiln-demo", prompt: "Once upon a time", max_tokens: 10, seed: 3,
                                                    ignore_eos: true, skip_special_tokens: false, stream: true });
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
  assert.equal(text, r.choices[0].text);
  const echo = await client.completions.create({ model: "kiln-demo", prompt: "Echo me", max_tokens: 3, echo: true });
  assert.ok(echo.choices[0].text.startsWith("Echo me"));
  const multi = await client.completions.create({ model: "kiln-demo", prompt: [[1, 2, 3], "Two"], max_tokens: 3, n: 2 });
  assert.equal(multi.choices.length, 4);
});

test("a stop string ends the reply before it, also when it spans tokens", async () => {
  const r = await client.chat.completions.create(
    { model: "kiln-demo", messages: [{ role: "user", content: "Count." }], max_tokens: 40, stop: ["three four"] },
    inject("one two three four five six<|im_end|>"),
  );
  assert.equal(r.choices[0].message.content, "one two ");
  assert.equal(r.choices[0].finish_reason, "stop");
  const stream = await client.chat.completions.create(
    { model: "kiln-demo", messages: [{ role: "user", content: "Count." }], max_tokens: 40, stop: ["three four"], stream: true },
    inject("one two three four five six<|im_end|>"),
  );
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.delta.content ?? "";
  assert.equal(text, "one two ");
});

test("the end-of-turn token ends the reply with finish_reason stop", async () => {
  const r = await client.chat.completions.create(
    { model: "kiln-demo", messages: [{ role: "user", content: "Hi" }], max_tokens: 40 },
    inject("Hello! How can I help?<|im_end|>"),
  );
  assert.equal(r.choices[0].message.content, "Hello! How can I help?");
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.equal(r.usage.completion_tokens > 3, true);
});

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  },
];
const call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>';

test("tool call round trip", async () => {
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];
  const r = await client.chat.completions.create({ model: "kiln-demo", messages, tools, max_tokens: 60 }, inject(call));
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.tool_calls.length, 1);
  const tc = choice.message.tool_calls[0];
  assert.equal(tc.type, "function");
  assert.equal(tc.function.name, "get_weather");
  assert.deepEqual(JSON.parse(tc.function.arguments), { city: "Paris" });
  assert.ok(tc.id.length > 0);

  // The result goes back; the model answers.
  messages.push(choice.message, { role: "tool", tool_call_id: tc.id, content: '{"temperature": 21}' });
  const answer = await client.chat.completions.create(
    { model: "kiln-demo", messages, tools, max_tokens: 40 },
    inject("It is 21 degrees in Paris.<|im_end|>"),
  );
  assert.equal(answer.choices[0].message.content, "It is 21 degrees in Paris.");
  assert.equal(answer.choices[0].finish_reason, "stop");
  assert.ok(answer.usage.prompt_tokens > r.usage.prompt_tokens);

  // Streamed, the call arrives as tool_calls deltas.
  const stream = await client.chat.completions.create(
    { model: "kiln-demo", messages: messages.slice(0, 1), tools, max_tokens: 60, stream: true },
    inject(call),
  );
  let name = "";
  let args = "";
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      for (const d of c.delta.tool_calls ?? []) {
        name += d.function?.name ?? "";
        args += d.function?.arguments ?? "";
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(name, "get_weather");
  assert.deepEqual(JSON.parse(args), { city: "Paris" });
  assert.equal(finish, "tool_calls");
});

// Structured output on /v1/completions (the chat endpoints': structured_chat.test.mjs): every reply at temperature 1 over several seeds,
// streamed or not, parses as JSON and holds to the schema (checked field by field here),
// with finish_reason "stop"; llama.cpp's json_schema field does the same; a schema keyword
// the grammar engine does not take is a 400 naming it and its path.
test("completions: response_format json_schema and json_schema give documents of the schema", async () => {
  const schema = {
    type: "object",
    properties: { name: { type: "string", maxLength: 10 }, n: { type: "integer", minimum: 0, maximum: 9 },
                  tags: { type: "array", items: { enum: ["a", "b"] }, maxItems: 2 } },
    required: ["name", "n", "tags"],
    additionalProperties: false,
  };
  const check = (text, what) => {
    let doc;
    assert.doesNotThrow(() => { doc = JSON.parse(text); }, `${what}: not JSON: ${text}`);
    assert.deepEqual(Object.keys(doc), ["name", "n", "tags"], `${what}: ${text}`);
    assert.equal(typeof doc.name, "string");
    assert.ok([...doc.name].length <= 10, `${what}: name ${doc.name}`);
    assert.ok(Number.isInteger(doc.n) && doc.n >= 0 && doc.n <= 9, `${what}: n ${doc.n}`);
    assert.ok(Array.isArray(doc.tags) && doc.tags.length <= 2 && doc.tags.every((t) => t === "a" || t === "b"), `${what}: tags`);
  };
  for (const seed of [1, 2, 3]) {
    const r = await client.completions.create({
      prompt: "A record:", max_tokens: 120, temperature: 1, seed,
      response_format: { type: "json_schema", json_schema: { name: "record", schema } },
    });
    check(r.choices[0].text, `seed ${seed}`);
    assert.equal(r.choices[0].finish_reason, "stop");
    const stream = await client.completions.create({
      prompt: "A record:", max_tokens: 120, temperature: 1, seed, stream: true,
      response_format: { type: "json_schema", json_schema: { name: "record", schema } },
    });
    let text = "";
    let finish = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, r.choices[0].text, "streamed = not streamed, same seed");
    assert.equal(finish, "stop");
  }
  const llama = await client.completions.create({ prompt: "A record:", max_tokens: 120, temperature: 1, seed: 9, json_schema: schema });
  check(llama.choices[0].text, "json_schema field");
  const object = await client.completions.create({ prompt: "{", max_tokens: 150, temperature: 1, seed: 4, response_format: { type: "json_object" } });
  if (object.choices[0].finish_reason === "stop") {
    assert.equal(typeof JSON.parse(object.choices[0].text), "object");
  } else {
    assert.equal(object.choices[0].finish_reason, "length");
    assert.ok(object.choices[0].text.startsWith("{"), object.choices[0].text);
  }
  await assert.rejects(
    client.completions.create({ prompt: "x", max_tokens: 5, response_format: { type: "json_schema", json_schema: { name: "bad", schema: { type: "object", patternProperties: { "^a": {} } } } } }),
    (e) => e instanceof BadRequestError && /patternProperties/.test(e.message) && /\/patternProperties/.test(e.message),
  );
});

test("reasoning comes back as reasoning_content", async () => {
  const output = "<think>\nThe user greets me.\n</think>\n\nHello there!<|im_end|>";
  const r = await client.chat.completions.create(
    { model: "kiln-demo", messages: [{ role: "user", content: "Hi" }], max_tokens: 60 },
    inject(output),
  );
  assert.equal(r.choices[0].message.reasoning_content, "The user greets me.");
  assert.equal(r.choices[0].message.content, "Hello there!");
  const stream = await client.chat.completions.create(
    { model: "kiln-demo", messages: [{ role: "user", content: "Hi" }], max_tokens: 60, stream: true },
    inject(output),
  );
  let reasoning = "";
  let content = "";
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      reasoning += c.delta.reasoning_content ?? "";
      content += c.delta.content ?? "";
    }
  }
  assert.equal(reasoning, "The user greets me.");
  assert.equal(content, "Hello there!");
});

test("errors surface as the SDK's error classes", async () => {
  const base = { model: "kiln-demo", messages: [{ role: "user", content: "x" }], max_tokens: 4 };
  await assert.rejects(client.chat.completions.create({ ...base, temperature: -1 }), (e) => {
    assert.ok(e instanceof BadRequestError);
    assert.equal(e.status, 400);
    assert.match(e.message, /temperature/);
    assert.equal(e.error?.param ?? e.param, "temperature");
    return true;
  });
  await assert.rejects(client.chat.completions.create({ ...base, model: "gpt-9" }), NotFoundError);
  await assert.rejects(client.chat.completions.create({ ...base, messages: [] }), BadRequestError);
  await assert.rejects(client.chat.completions.create({ ...base, max_tokens: 100000 }), (e) => {
    assert.ok(e instanceof BadRequestError);
    assert.match(e.message, /maximum context length is \d+ tokens/);
    return true;
  });
  await assert.rejects(
    client.chat.completions.create({ ...base, response_format: { type: "xml" } }),
    (e) => e instanceof BadRequestError && /response_format/.test(e.message),
  );
  await assert.rejects(client.chat.completions.create({ ...base, tools, tool_choice: { type: "function", function: { name: "x" } } }),
    BadRequestError);
  await assert.rejects(client.completions.create({ model: "kiln-demo", prompt: [99999], max_tokens: 2 }), BadRequestError);
});

test("an API key is required when one is set", async () => {
  const keyed = await startServer(["--api-key", "s3cret"]);
  try {
    const wrong = new OpenAI({ apiKey: "nope", baseURL: keyed.url + "/v1", maxRetries: 0 });
    await assert.rejects(wrong.models.list(), AuthenticationError);
    const right = new OpenAI({ apiKey: "s3cret", baseURL: keyed.url + "/v1", maxRetries: 0 });
    const r = await right.chat.completions.create({ model: "kiln-demo", messages: [{ role: "user", content: "x" }], max_tokens: 2 });
    assert.equal(r.choices.length, 1);
    // Health and metrics stay open for probes.
    assert.equal((await fetch(keyed.url + "/health")).status, 200);
  } finally {
    await keyed.stop();
  }
});
