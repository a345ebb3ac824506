// The official `@anthropic-ai/sdk` client against `kiln serve` on the demo model:
// messages (streaming and not, the event sequence), system prompts, stop sequences, a
// tool_use / tool_result round trip and thinking blocks (the model's output injected by
// the test hook), count_tokens, and errors as the SDK's error classes.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, requirePeer } from "./harness.mjs";

const { Anthropic, BadRequestError, NotFoundError, AuthenticationError } = requirePeer("@anthropic-ai/sdk");

let server;
let client;
const inject = (text) => ({ headers: { "X-Kiln-Test-Output": encodeURIComponent(text) } });

before(async () => {
  server = await startServer();
  client = new Anthropic({ apiKey: "unused", baseURL: server.url, maxRetries: 0, timeout: 60000 });
});
after(async () => {
  const r = await server.stop();
  assert.equal(r.code, 0, server.stderr());
});

test("a message comes back as text content with usage", async () => {
  const m = await client.messages.create({
    model: "kiln-demo",
    max_tokens: 10,
    system: "You are terse.",
    messages: [{ role: "user", content: [{ type: "text", text: "Tell me a story." }] }],
  });
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.equal(m.content[0].type, "text");
  assert.ok(m.content[0].text.length > 0);
  assert.ok(["max_tokens", "end_turn"].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens > 5);
  assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 10);
});

test("a message without a model gets the served one; a wrong model is not_found_error", async () => {
  // Greedy: a sampled end-of-sequence would cut the counted tokens short.
  const m = await client.messages.create({ max_tokens: 3, temperature: 0, messages: [{ role: "user", content: "Hi" }] });
  assert.equal(m.model, "kiln-demo");
  assert.equal(m.usage.output_tokens, 3);
  const streamed = await client.messages.stream({ max_tokens: 3, messages: [{ role: "user", content: "Hi" }] }).finalMessage();
  assert.equal(streamed.model, "kiln-demo");
  const counted = await client.messages.countTokens({ messages: [{ role: "user", content: "Hi" }] });
  assert.ok(counted.input_tokens > 0);
  await assert.rejects(client.messages.create({ model: "claude-x", max_tokens: 3, messages: [{ role: "user", content: "Hi" }] }),
    (e) => e instanceof NotFoundError && e.error?.error?.type === "not_found_error" && /'claude-x' does not exist/.test(e.message));
});

test("streaming: the SDK's accumulated message equals the events, in Anthropic's order", async () => {
  const output = "A short tale about a kiln.<|im_end|>";
  const stream = client.messages.stream(
    { model: "kiln-demo", max_tokens: 40, messages: [{ role: "user", content: "Story?" }] },
    inject(output),
  );
  const types = [];
  let text = "";
  stream.on("streamEvent", (e) => types.push(e.type));
  stream.on("text", (t) => (text += t));
  const final = await stream.finalMessage();
  assert.equal(text, "A short tale about a kiln.");
  assert.equal(final.content[0].text, text);
  assert.equal(final.stop_reason, "end_turn");
  assert.equal(types[0], "message_start");
  assert.equal(types[1], "content_block_start");
  assert.ok(types.includes("content_block_delta"));
  assert.deepEqual(types.slice(-3), ["content_block_stop", "message_delta", "message_stop"]);
  assert.ok(final.usage.output_tokens >= 5);
});

test("stop sequences end the reply and are reported", async () => {
  const m = await client.messages.create(
    { model: "kiln-demo", max_tokens: 40, stop_sequences: ["END", "three four"], messages: [{ role: "user", content: "Count." }] },
    inject("one two three four five<|im_end|>"),
  );
  assert.equal(m.content[0].text, "one two ");
  assert.equal(m.stop_reason, "stop_sequence");
  assert.equal(m.stop_sequence, "three four");
});

const tools = [
  {
    name: "get_weather",
    description: "Current weather in a city",
    input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
];
const call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>';

test("tool_use round trip", async () => {
  const messages = [{ role: "user", content: "Weather in Paris?" }];
  const m = await client.messages.create({ model: "kiln-demo", max_tokens: 60, tools, messages }, inject(call));
  assert.equal(m.stop_reason, "tool_use");
  const use = m.content.find((b) => b.type === "tool_use");
  assert.ok(use, JSON.stringify(m.content));
  assert.equal(use.name, "get_weather");
  assert.deepEqual(use.input, { city: "Paris" });

  messages.push({ role: "assistant", content: m.content });
  messages.push({ role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "21 degrees" }] });
  const answer = await client.messages.create(
    { model: "kiln-demo", max_tokens: 40, tools, messages },
    inject("It is 21 degrees.<|im_end|>"),
  );
  assert.equal(answer.content[0].text, "It is 21 degrees.");
  assert.equal(answer.stop_reason, "end_turn");
  assert.ok(answer.usage.input_tokens > m.usage.input_tokens);

  // Streamed: input_json_delta events build the same input.
  const stream = client.messages.stream({ model: "kiln-demo", max_tokens: 60, tools, messages: messages.slice(0, 1) }, inject(call));
  const final = await stream.finalMessage();
  const streamed = final.content.find((b) => b.type === "tool_use");
  assert.deepEqual(streamed.input, { city: "Paris" });
  assert.equal(final.stop_reason, "tool_use");
});

test("thinking comes back as a thinking block", async () => {
  const output = "<think>\nThe user greets me.\n</think>\n\nHello there!<|im_end|>";
  const req = { model: "kiln-demo", max_tokens: 60, messages: [{ role: "user", content: "Hi" }] };
  const m = await client.messages.create(req, inject(output));
  assert.deepEqual(m.content.map((b) => b.type), ["thinking", "text"]);
  assert.equal(m.content[0].thinking, "The user greets me.");
  assert.equal(m.content[1].text, "Hello there!");
  const final = await client.messages.stream(req, inject(output)).finalMessage();
  assert.deepEqual(final.content.map((b) => b.type), ["thinking", "text"]);
  assert.equal(final.content[0].thinking, "The user greets me.");
  assert.equal(final.content[1].text, "Hello there!");
  // A thinking block sent back is accepted as the turn's reasoning.
  const next = await client.messages.create({
    ...req,
    max_tokens: 4,
    messages: [...req.messages, { role: "assistant", content: m.content }, { role: "user", content: "And?" }],
  });
  assert.equal(next.type, "message");
});

test("count_tokens counts the prompt the same request would run", async () => {
  const body = { model: "kiln-demo", system: "Be brief.", messages: [{ role: "user", content: "How many tokens is this?" }] };
  const counted = await client.messages.countTokens(body);
  const m = await client.messages.create({ ...body, max_tokens: 1 });
  assert.equal(counted.input_tokens, m.usage.input_tokens);
  assert.ok(counted.input_tokens > 5);
});

test("errors surface as the SDK's error classes", async () => {
  const base = { model: "kiln-demo", max_tokens: 4, messages: [{ role: "user", content: "x" }] };
  await assert.rejects(client.messages.create({ ...base, max_tokens: undefined }), (e) => {
    assert.ok(e instanceof BadRequestError);
    assert.equal(e.error?.type, "error");
    assert.equal(e.error?.error?.type, "invalid_request_error");
    assert.match(e.message, /max_tokens/);
    return true;
  });
  await assert.rejects(client.messages.create({ ...base, model: "claude-9" }), NotFoundError);
  await assert.rejects(client.messages.create({ ...base, messages: [{ role: "robot", content: "x" }] }), BadRequestError);
  await assert.rejects(
    client.messages.create({ ...base, messages: [{ role: "user", content: [{ type: "image", source: {} }] }] }),
    (e) => e instanceof BadRequestError && /image/.test(e.message),
  );
  await assert.rejects(client.messages.create({ ...base, tools, tool_choice: { type: "tool", name: "nope" } }), BadRequestError);
  await assert.rejects(client.messages.create({ ...base, temperature: "hot" }), BadRequestError);
});

test("an API key is required when one is set (x-api-key)", async () => {
  const keyed = await startServer(["--api-key", "s3cret"]);
  try {
    const wrong = new Anthropic({ apiKey: "nope", baseURL: keyed.url, maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ model: "kiln-demo", max_tokens: 2, messages: [{ role: "user", content: "x" }] }), AuthenticationError);
    const right = new Anthropic({ apiKey: "s3cret", baseURL: keyed.url, maxRetries: 0 });
    const m = await right.messages.create({ model: "kiln-demo", max_tokens: 2, messages: [{ role: "user", content: "x" }] });
    assert.equal(m.type, "message");
  } finally {
    await keyed.stop();
  }
});
